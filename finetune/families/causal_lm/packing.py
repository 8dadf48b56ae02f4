"""`--packing`: the training rows packed best-fit-decreasing into sequences of up to --max_length tokens,
each document kept apart from the others in its pack.

Apart means the same loss as unpacked, row for row: positions restart at 0 in every document, no token
attends to another document's (flash_attention_2, and sdpa on CUDA in half precision through torch's own
varlen kernel: one varlen row bounded per document; sdpa elsewhere and eager: a 4D block-causal mask),
and a document's first token is no target, so the token before it (the previous document's last)
predicts nothing. An attention implementation this cannot be built for is refused. The packs are a pure
function of (the encoded rows, --seed): built once, before the loaders, whose sampler then shuffles whole
packs per (seed, epoch), so a packed run resumes bitwise.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np
import torch
from datasets import Dataset

from finetune.errors import ConfigError
from finetune.families.causal_lm.batches import POSITIONS, target_positions
from finetune.families.causal_lm.conversations import IGNORE
from finetune.speed.attention import torch_varlen_features

VARLEN = ("flash_attention_2", "flash_attention_3")
"""transformers' flash attentions: `_flash_attention_forward` runs varlen from `cu_seq_lens_*` (or, for
a batch of one row, from position_ids that restart), with no attention_mask."""
MASKED = ("sdpa", "eager")
"""transformers hands a 4D `attention_mask` to these as it is (masking_utils' `_preprocess_mask_arguments`
returns a 4D mask untouched): sdpa takes it boolean (True: may attend), eager adds it to the scores,
so it wants 0 and the dtype's minimum. flex_attention would add a tensor mask to its scores too, but
refuses dropout in training; other implementations (kernels, remote code) ignore or reshape it."""
VARLEN_KEYS = ("cu_seq_lens_q", "cu_seq_lens_k", "max_length_q", "max_length_k")
DOCUMENTS = "document_lengths"
"""A pack's column: the token count of each of its documents, in order."""


@dataclass(frozen=True)
class PackedAttention:
    """How this run's model keeps a pack's documents apart."""

    varlen: bool
    """flash: the micro-batch's packs as one row, bounded by cu_seq_lens; else a 4D block-causal mask."""
    mask_dtype: torch.dtype | None = None
    """eager's additive mask dtype (the model's); None: sdpa's boolean mask."""
    torch_kernel: bool = False
    """varlen through torch's own kernel (`speed.attention.use_causal_varlen_attention`), not flash-attn's:
    sdpa on CUDA in bf16 or fp16, which otherwise gets the mask, [tokens, tokens] per pack."""


def packed_attention(model, max_length: int, device_type: str = "cpu", half: bool = False) -> PackedAttention:
    """The way `model` (before LoRA) keeps packed documents apart on `device_type`, `half` when its
    attention computes in bf16 or fp16; or a ConfigError: layers no mask reaches (chunked, linear), an
    attention for which no such mask is built, or a sliding window the 4D mask would widen to
    --max_length."""
    config = model.config
    implementation = config._attn_implementation
    kinds = set(getattr(config, "layer_types", None) or ())
    unmasked = sorted(kinds - {"full_attention", "sliding_attention"})  # chunked, linear (recurrent)
    if unmasked:
        raise ConfigError(
            f"--packing: {config.model_type}'s {', '.join(unmasked)} layers cannot keep packed documents "
            "apart; drop --packing",
            flag="--packing",
            fix="drop --packing",
        )
    if implementation in VARLEN:
        return PackedAttention(varlen=True)
    if implementation not in MASKED:
        raise ConfigError(
            f"--packing: attention {implementation} cannot be given a block-causal mask, so packed "
            "documents would attend to each other; use --attn_implementation sdpa (or flash_attention_2 "
            "on CUDA)",
            flag="--packing",
            fix="use --attn_implementation sdpa (or flash_attention_2 on CUDA)",
        )
    window = getattr(config, "sliding_window", None)
    sliding = getattr(config, "use_sliding_window", True) and (not kinds or "sliding_attention" in kinds)
    narrow = bool(window and sliding and window < max_length)  # a sliding window shorter than the packs
    kernel = torch_varlen_features() if device_type == "cuda" and half else frozenset()
    windowed = "window" in kernel and config.model_type in WINDOW_PASSED
    takes = "causal" in kernel and (windowed or not narrow)
    if implementation == "sdpa" and takes and _plain_attention(model):
        return PackedAttention(varlen=True, torch_kernel=True)
    if narrow:
        raise ConfigError(
            f"--packing: {config.model_type}'s sliding window of {window} tokens would widen to whole packs "
            f"under {implementation}'s block-causal mask; lower --max_length to {window}, or train on CUDA "
            "in bf16 (torch's varlen kernel keeps the window)",
            flag="--packing",
            fix=f"lower --max_length to {window}, or train on CUDA in bf16",
        )
    return PackedAttention(varlen=False, mask_dtype=model.dtype if implementation == "eager" else None)


WINDOW_PASSED = frozenset({"mistral", "mixtral", "ministral", "qwen2", "qwen3", "phi3", "starcoder2",
                           "gemma3_text", "cohere2", "olmo3", "exaone4"})  # fmt: skip
"""Models whose attention layers hand their sliding window to the attention function, so the kernel can
keep it (each checked against sdpa's mask on the CPU, 2026-11-28); others with a window narrower than the
packs keep the mask, as Qwen2-MoE must: its layers pass none, and would attend to the whole pack."""


def _plain_attention(model) -> bool:
    """Whether the model's attention is softmax(q·kᵀ·scale)·v under its mask, all torch's varlen kernel
    computes: through transformers' attention functions, with no attention dropout (the kernel has
    none; GPT-2 names it attn_pdrop), logit soft-capping or sink logits."""
    config = model.config
    return (
        getattr(model, "_supports_attention_backend", False)
        and not getattr(config, "attention_dropout", 0.0)
        and not getattr(config, "attn_pdrop", 0.0)
        and getattr(config, "attn_logit_softcapping", None) is None
        and not any(hasattr(module, "sinks") for module in model.modules())
    )


def best_fit_decreasing(lengths: list[int], capacity: int, seed: int) -> list[list[int]]:
    """Packs of row indices, none over `capacity` tokens: the rows, longest first (equal lengths in an
    order seeded by `seed`), each into the open pack it fills best (least room left), or a new one.
    Deterministic: the same lengths, capacity and seed give the same packs."""
    if any(length > capacity for length in lengths):
        raise ValueError(f"a row is longer than the packs' {capacity} tokens")
    generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(lengths), generator=generator).tolist()
    order.sort(key=lambda i: -lengths[i])  # stable: ties keep the seeded order
    packs: list[list[int]] = []
    rooms: list[int] = []  # the distinct room left in open packs, ascending
    by_room: dict[int, list[int]] = {}  # room left: the open packs with it (a stack)
    for row in order:
        size = lengths[row]
        at = bisect.bisect_left(rooms, size)
        if at < len(rooms):  # the tightest open pack it fits
            room = rooms[at]
            pack = by_room[room].pop()
            if not by_room[room]:
                del by_room[room], rooms[at]
        else:
            pack, room = len(packs), capacity
            packs.append([])
        packs[pack].append(row)
        room -= size
        if room:  # a full pack takes nothing more
            if room not in by_room:
                bisect.insort(rooms, room)
            by_room.setdefault(room, []).append(pack)
    return packs


def pack_rows(split: Dataset, capacity: int, seed: int) -> tuple[Dataset, dict]:
    """The encoded training rows as packs: `input_ids` and `labels` concatenated (each document's first
    label -100: nothing before it in the pack is its context), `length`, and `document_lengths`; and
    the task line's counts: packs, capacity and fill (real tokens over packs x capacity)."""
    columns = split.select_columns(["input_ids", "labels", "length"]).to_dict()
    packs = best_fit_decreasing(columns["length"], capacity, seed)
    packed = {"input_ids": [], "labels": [], "length": [], DOCUMENTS: []}
    for pack in packs:
        ids, labels = [], []
        for row in pack:
            ids += columns["input_ids"][row]
            labels += [IGNORE, *columns["labels"][row][1:]]
        packed["input_ids"].append(ids)
        packed["labels"].append(labels)
        packed["length"].append(len(ids))
        packed[DOCUMENTS].append([columns["length"][row] for row in pack])
    fill = sum(packed["length"]) / (len(packs) * capacity)
    return Dataset.from_dict(packed), {"packs": len(packs), "capacity": capacity, "fill": fill}


def restarting_positions(document_lengths: list[int], width: int) -> np.ndarray:
    """0, 1, ... within each document, and again over the padding after them (a segment of its own)."""
    segments = [*document_lengths, width - sum(document_lengths)]
    return np.concatenate([np.arange(n, dtype=np.int64) for n in segments])


class PackedCollator:
    """Training packs (rows with `document_lengths`) as the model keeps their documents apart; other
    rows (evaluation's) go to `rows`, the family's row collator, unchanged.

    Either layout carries position_ids restarting per document, `labels` shifted (the collator's),
    a 2D `attention_mask` of the real tokens (the loop counts tokens from it; the model is not given
    it) and `documents`, the micro-batch's documents as an int (the loop's rows: no device read).
    Mask layout: the packs padded to one width, as `rows` pads rows; `forward_inputs` builds the
    block-causal mask on the device. Varlen layout: every pack's tokens in one row with no padding,
    `cu_seq_lens_q`/`_k` bounding each document and `max_length_q`/`_k` fixed at --max_length, as
    transformers' flash path reads them (no per-layer search of position_ids)."""

    def __init__(self, rows, varlen: bool, max_length: int):
        self.rows = rows
        self.varlen = varlen
        self.max_length = max_length

    def __call__(self, features: list[dict]) -> dict:
        if DOCUMENTS not in features[0]:
            return self.rows(features)
        lengths = [f[DOCUMENTS] for f in features]
        documents = sum(len(pack) for pack in lengths)
        if self.varlen:
            batch = self._one_row(features, lengths)
        else:
            batch = self.rows([{k: v for k, v in f.items() if k != DOCUMENTS} for f in features])
            width = batch["input_ids"].shape[1]
            positions = np.stack([restarting_positions(pack, width) for pack in lengths])
            batch["position_ids"] = torch.from_numpy(positions)
        batch["documents"] = documents
        return batch

    def _one_row(self, features: list[dict], lengths: list[list[int]]) -> dict:
        flat = [n for pack in lengths for n in pack]
        ids = np.concatenate([f["input_ids"] for f in features]).astype(np.int64)
        # Each pack's labels shifted within it; its last token predicts nothing.
        labels = np.concatenate([[*f["labels"][1:], IGNORE] for f in features]).astype(np.int64)
        positions = np.concatenate([np.arange(n, dtype=np.int64) for n in flat])
        bounds = torch.from_numpy(np.concatenate([[0], np.cumsum(flat)]).astype(np.int32))
        batch = {
            "input_ids": torch.from_numpy(ids).unsqueeze(0),
            "attention_mask": torch.ones(1, len(ids), dtype=torch.int64),
            "labels": torch.from_numpy(labels).unsqueeze(0),
            "position_ids": torch.from_numpy(positions).unsqueeze(0),
            "cu_seq_lens_q": bounds,
            "cu_seq_lens_k": bounds.clone(),
        }
        batch["max_length_q"] = batch["max_length_k"] = self.max_length
        batch[POSITIONS] = target_positions(labels)
        return batch


def block_causal_mask(position_ids: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """[rows, 1, tokens, tokens] on position_ids' device, built there (no host read): a token may see the
    earlier tokens of its own document (a document starts where its position is 0). dtype None: sdpa's
    boolean (True: may attend); else eager's additive 0 and the dtype's minimum."""
    documents = (position_ids == 0).cumsum(dim=-1)
    same = documents[:, :, None] == documents[:, None, :]
    width = position_ids.shape[-1]
    causal = torch.ones(width, width, dtype=torch.bool, device=position_ids.device).tril()
    allowed = (same & causal).unsqueeze(1)
    if dtype is None:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill(
        ~allowed, torch.finfo(dtype).min
    )


def forward_inputs(batch: dict, attention: PackedAttention) -> dict:
    """The model's inputs for a packed micro-batch: ids and restarting positions, with the varlen bounds
    (flash) or the block-causal mask (sdpa, eager) in place of the 2D mask."""
    inputs = {"input_ids": batch["input_ids"], "position_ids": batch["position_ids"]}
    if attention.varlen:
        inputs.update({key: batch[key] for key in VARLEN_KEYS})
    else:
        inputs["attention_mask"] = block_causal_mask(batch["position_ids"], attention.mask_dtype)
    return inputs
