"""--chunked_loss: the output layer and cross-entropy run over chunks of the target tokens, so no
[targets, vocabulary] tensor is ever whole: not the logits, not their fp32 copy, not the softmax's
gradient. The forward hands the output layer nothing (`hidden_at` keeps its input at the targets), and
`chunked_target_loss` applies it chunk by chunk, each chunk's logits recomputed in the backward pass
instead of kept (torch's non-reentrant checkpoint).

Why a checkpoint per chunk and not a fused kernel that computes the gradients in the forward (Liger's
fused linear cross-entropy, Cut-CE): the chunk calls the model's own output layer as a module, so LoRA
or modules_to_save on it, a head tied to the embeddings and autocast all take the path the unchunked
forward takes, and its gradients reach every parameter through autograd once per backward (DDP's
buckets see one gradient per parameter: a reentrant checkpoint would run a backward per chunk). A fused
kernel reads `lm_head.weight` alone and misses an adapter on the head, and each model's final soft-cap
must be re-implemented in it (Cut-CE's Gemma 2 patch skipped it, apple/ml-cross-entropy#48). torchtune's
chunked cross-entropy keeps every chunk's bf16 logits for the backward, so its memory still grows with
targets x vocabulary. The cost here: one more forward matmul of the output layer per chunk."""

from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from finetune.errors import ConfigError
from finetune.families.causal_lm.conversations import IGNORE

CHUNK_LOGITS = 1 << 25
"""Logits per chunk by default: 128 MB in fp32 (about as much again for their gradient), whatever the
vocabulary; a 2,048-token row's logits over a 49k vocabulary are 400 MB."""
TILE = 128
"""Default chunks are a multiple of this many tokens: a GPU matmul's row tiles, filled."""


def chunk_tokens_for(vocab_size: int, asked: int | None) -> int:
    """--chunked_loss_tokens, or as many target tokens as make CHUNK_LOGITS logits, in whole TILEs
    (640 at a 49,152-token vocabulary, 256 at 128,256)."""
    if asked is not None:
        return asked
    return max(TILE, CHUNK_LOGITS // vocab_size // TILE * TILE)


class Head:
    """The output layer as the model's forward applies it: the layer called as a module (with its LoRA or
    modules_to_save wrapper; under FSDP2 past its unit's hooks, `_unhooked`), then the final soft-cap
    of a model that has one (Gemma 2's tanh(logits / cap) * cap, as transformers writes it), both under
    `autocast` (the forward's, as `hidden_at` found it: Accelerate autocasts the model's forward alone);
    the logits in fp32, as `target_loss` casts them."""

    def __init__(self, model, autocast=contextlib.nullcontext):
        self.layer = model.get_output_embeddings()
        self.softcap = getattr(model.config, "final_logit_softcapping", None)
        self.autocast = autocast

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        with self.autocast():
            logits = _unhooked(self.layer)(hidden)
            if self.softcap is not None:
                logits = logits / self.softcap
                logits = torch.tanh(logits)
                logits = logits * self.softcap
        return logits.float()


def _unhooked(layer):
    """The output layer to call after the forward: the module itself, or under FSDP2 where Accelerate
    shards it in a unit of its own (its `fully_shard([final norm, lm_head])`, kept unsharded after the
    forward) its `forward` without the unit's hooks. Called as a module, each chunk would open a new
    pass of that unit, whose post-backward hook on the chunk's input then reduce-scatters and frees the
    unit's parameters when the chunk's gradient reaches it, before the final norm's backward reads its
    weight (SIGSEGV on freed storage). Unhooked, the chunks read the weight the forward gathered, their
    gradients accumulate on it, and the forward's own hook (after the norm's backward) reduces them."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(layer, FSDPModule):
        return layer
    group = layer._get_fsdp_state()._fsdp_param_group
    if group is not None and not group.is_unsharded:  # a unit that reshards after its forward
        raise ConfigError(
            "--chunked_loss under FSDP2: the output layer's FSDP unit frees its parameters after the "
            "forward, and the chunks run after it; use --chunked_loss false",
            flag="--chunked_loss",
            fix="use --chunked_loss false",
        )
    return layer.forward


class Kept(list):
    """`hidden_at`'s output-layer inputs, and the autocast the forward ran the layer under (`autocast`: a
    context factory for `Head`), so the chunks round as that forward would have: Accelerate's autocast in
    training, none where an evaluation runs the forward as the export computes (training/evaluation.py
    without_autocast)."""

    autocast = contextlib.nullcontext


@contextlib.contextmanager
def hidden_at(model, positions: torch.Tensor):
    """While a forward runs: the output layer's input at `positions` (flat, in rows x tokens: the targets),
    [targets, hidden], appended to the yielded `Kept`; the layer itself gets none of it (an empty
    [1, 0, hidden]), so the forward makes no logits. Only for models `chunks_the_loss` accepted."""
    kept = Kept()

    def keep(_module, args):
        hidden = args[0]
        device = hidden.device.type
        if torch.is_autocast_enabled(device):
            kept.autocast = functools.partial(torch.autocast, device, torch.get_autocast_dtype(device))
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        kept.append(picked)
        return (picked[:0].unsqueeze(0), *args[1:])

    handle = model.get_output_embeddings().register_forward_pre_hook(keep)
    try:
        yield kept
    finally:
        handle.remove()


def _summed(head: Head, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    # Summed, not averaged: a chunk of no targets adds 0 (a mean would be 0/0, NaN)
    return F.cross_entropy(head(hidden), targets, reduction="sum")


def chunked_target_loss(
    head: Head, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """`batches.target_loss`'s (summed cross-entropy in fp32, the targets' count as float64) from the
    targets' hidden states, `chunk_tokens` at a time, each chunk's logits recomputed in the backward (the
    checkpoint restores the forward's RNG, so dropout in an adapter on the head draws the same mask, and
    its autocast). Targets that fit one chunk are computed whole: nothing to save, nothing recomputed."""
    count = (targets != IGNORE).sum(dtype=torch.float64)
    if hidden.shape[0] <= chunk_tokens:
        return _summed(head, hidden, targets), count
    # split, not slicing: one backward node joins the chunks' gradients, not a zero-filled copy per chunk
    chunks = zip(hidden.split(chunk_tokens), targets.split(chunk_tokens), strict=True)
    step = functools.partial(_summed, head)
    losses = [checkpoint(step, part, wanted, use_reentrant=False) for part, wanted in chunks]
    return torch.stack(losses).sum(), count


def chunked_token_losses(head: Head, hidden: torch.Tensor, targets: torch.Tensor, chunk_tokens: int):
    """Each target's cross-entropy, float64, `chunk_tokens` at a time (evaluation: no gradient kept)."""
    parts = zip(hidden.split(chunk_tokens), targets.split(chunk_tokens), strict=True)
    return torch.cat([F.cross_entropy(head(h), t, reduction="none").double() for h, t in parts])


def chunks_the_loss(model) -> bool:
    """Whether `Head` applied to what `hidden_at` keeps gives the model's own logits, tried as
    `batches.heads_at_targets` tries the output layer (three tokens, two picked out of order, eager
    attention, fp32 or half tolerance): a model that scales its logits after the layer other than by
    a final soft-cap (Cohere's logit_scale, Granite's logits_scaling), or whose forward fails on an empty
    output layer, fails it and keeps the whole loss."""
    weight = getattr(model.get_output_embeddings(), "weight", None)
    if not isinstance(weight, torch.Tensor):
        return False
    ids = torch.tensor([[1, 2, 3]], device=weight.device)
    picks = torch.tensor([2, 0], device=weight.device)
    tolerance = 1e-4 if weight.dtype == torch.float32 else 2e-2
    training, attention = model.training, model.config._attn_implementation
    model.eval()
    model.config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            full = model(input_ids=ids).logits.float()[0].index_select(0, picks)
            with hidden_at(model, picks) as kept:
                empty = model(input_ids=ids).logits
            chunked = Head(model)(kept[0])
        return (
            empty.numel() == 0
            and chunked.shape == full.shape
            and torch.allclose(chunked, full, rtol=tolerance, atol=tolerance)
        )
    except Exception:  # noqa: BLE001  (whatever fails: the model keeps the whole loss)
        return False
    finally:
        model.config._attn_implementation = attention
        model.train(training)


def resolve_chunked_loss(args, model, head_at_targets: bool, compiled: bool) -> int | None:
    """--chunked_loss for this model: the target tokens per chunk, or None (off). auto is on wherever it
    can be: the unit tests give the same loss and gradients, its cost is one recomputed matmul per chunk
    of a micro-batch that holds more than one (one that fits a chunk runs whole, unchanged), and what it
    saves is the batch's largest tensor; its speed is to be measured. true is refused where it cannot be.
    Under FSDP2 too: `Head` calls the output layer past its unit's hooks (`_unhooked`); tested on 2 CPU
    ranks against DDP's unchunked run (tests/e2e/test_sft_composes.py)."""
    if args.chunked_loss == "false":
        return None
    if compiled:
        why = "a compiled model's forward keeps its output layer (a hook would recompile it)"
    elif not head_at_targets or not chunks_the_loss(model):
        why = (
            f"{model.config.model_type}'s logits are not its output layer's alone (a scale after it, or a "
            "layer the forward calls otherwise)"
        )
    else:
        vocabulary = model.get_output_embeddings().weight.shape[0]  # the logits' width
        return chunk_tokens_for(vocabulary, args.chunked_loss_tokens)
    if args.chunked_loss == "true":
        raise ConfigError(
            f"--chunked_loss true: {why}; use --chunked_loss auto (whole logits here) or false",
            flag="--chunked_loss",
            fix="use --chunked_loss auto or false",
        )
    return None
