"""DPO's reference model: the policy with its adapters disabled (--use_peft: no second copy), or a frozen
copy of the starting model (or --ref_model_name_or_path), in eval mode, never updated; none for simpo."""

from __future__ import annotations

import contextlib
import copy

import torch
from accelerate.utils import DistributedType
from transformers import AutoModelForCausalLM

from finetune.distributed.fsdp import shard_frozen
from finetune.errors import ConfigError
from finetune.families.causal_lm.batches import head_at
from finetune.families.dpo.collate import Targets
from finetune.families.dpo.loss import sequence_logps
from finetune.hub import hub_error
from finetune.training.evaluation import autocasts_now, without_autocast


class Reference:
    """Where a pair's reference log-probs come from (`kind`: adapters, copy or none)."""

    def __init__(self, args, model, loading: dict):
        self.model = None
        """The frozen copy (kind copy), placed and cast by `prepare` as the policy is."""
        self.evaluated: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}
        """`scored`'s: (split, autocast, the pairs' rows) -> their log-probs and counts."""
        if args.loss_type == "simpo":
            self.kind = "none"
        elif args.use_peft:
            self.kind = "adapters"
        else:
            self.kind = "copy"
            self.model = (
                _load_reference(args, model, loading) if args.ref_model_name_or_path else copy.deepcopy(model)
            )
            self.model.eval()
            self.model.requires_grad_(False)  # never in the optimizer, never updated

    def scored(self, accelerator, policy, batch: dict, targets: Targets, head_at_targets: bool, split: str,
               rows: torch.Tensor):  # fmt: skip
        """`logps`, or for an evaluated split what an earlier evaluation of the same pairs computed: the
        reference never changes and an evaluation's batches are the same each time, so each evaluation
        after the first runs the policy alone. Kept per autocast (the exported model's evaluation runs
        without); under FSDP always computed, the sharded forward being a collective of every rank."""
        if split == "train" or self.kind == "none" or accelerator.distributed_type == DistributedType.FSDP:
            return self.logps(accelerator, policy, batch, targets, head_at_targets)
        autocast = autocasts_now(accelerator.unwrap_model(policy, keep_torch_compile=False))
        key = (split, autocast, tuple(rows.tolist()))  # evaluation only: its batches are read on the host
        if key not in self.evaluated:
            self.evaluated[key] = self.logps(accelerator, policy, batch, targets, head_at_targets)
        return self.evaluated[key]

    def describe(self, args) -> str:
        """The backbone record's line."""
        if self.kind == "none":
            return "none (simpo is reference-free)"
        if self.kind == "adapters":
            return "the policy with its LoRA adapters disabled"
        return f"a frozen copy of {args.ref_model_name_or_path or args.model_name_or_path}"

    def prepare(self, accelerator) -> None:
        """Collective under FSDP (it shards the copy): the copy placed on the device and cast as the policy
        is; kept out of the checkpoints' models (it is the starting model, never changed)."""
        if self.model is None:
            return
        self.model = shard_frozen(accelerator, self.model)  # prepare_model alone leaves it whole
        self.model = accelerator.prepare_model(self.model, evaluation_mode=True)
        accelerator._models.remove(self.model)  # save_state writes each model it lists

    def logps(self, accelerator, policy, batch: dict, targets: Targets, head_at_targets: bool):
        """The reference's summed log-probs of every sequence of the batch and their target counts (no
        gradient, eval mode: no dropout); None for simpo."""
        if self.kind == "none":
            return None
        if self.kind == "adapters":
            model = accelerator.unwrap_model(policy)  # the autocast wrapper kept
            disabled = model.disable_adapter()
        else:
            model, disabled = self.model, contextlib.nullcontext()
            if not autocasts_now(accelerator.unwrap_model(policy, keep_torch_compile=False)):
                # The exported policy's evaluation (no autocast): the copy computes as the policy does,
                # or a policy equal to its reference would score rewards of autocast's rounding.
                disabled = without_autocast(accelerator.unwrap_model(model, keep_torch_compile=False))
        hooked = accelerator.unwrap_model(model) if head_at_targets else None
        training = model.training
        model.eval()
        try:
            with torch.no_grad(), disabled, head_at(hooked, targets.positions):
                logits = model(**batch, use_cache=False).logits
            summed, counts, _ = sequence_logps(logits, targets)
        finally:
            model.train(training)
        return summed, counts


def _load_reference(args, model, loading: dict):
    """--ref_model_name_or_path, loaded as the policy is (dtype, attention), refused where its vocabulary
    is not the policy's (its log-probs would be of other tokens)."""
    name = args.ref_model_name_or_path
    options = {k: v for k, v in loading.items() if k not in ("gguf_file", "quantization_config")}
    try:
        reference = AutoModelForCausalLM.from_pretrained(name, **options)
    except OSError as error:
        raise hub_error(name, error) from None
    mine, theirs = model.config.vocab_size, reference.config.vocab_size
    if mine != theirs:
        raise ConfigError(
            f"--ref_model_name_or_path {name} has a vocabulary of {theirs} tokens, the policy {mine}; give a "
            "reference with the policy's tokenizer",
            flag="--ref_model_name_or_path",
        )
    return reference
