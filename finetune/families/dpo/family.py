"""`--task_type dpo`: preference tuning (DPO, IPO, SimPO; TRL's names) of a causal LM. The model is the
causal-LM family's (AutoModelForCausalLM, full or LoRA, the output layer only at target tokens); a
micro-batch's chosen and rejected sequences run in one forward; its loss is the pairs' summed loss (the
loop makes the update the mean over every pair of the window); its metrics are TRL's rewards/* and
logps/*; evaluation gives eval_loss and eval_rewards/*, each pair counted once on any number of
processes, against the same reference as training (--precompute_ref_log_probs: the precomputed one)."""

from __future__ import annotations

import contextlib
import functools
import math

import torch

from finetune.data.batching import build_dataloaders, resolve_pad_to_multiple_of
from finetune.distributed.fsdp import model_shares
from finetune.errors import ConfigError
from finetune.families.causal_lm.batches import head_at
from finetune.families.causal_lm.family import CausalLM
from finetune.families.causal_lm.generation import (
    PROMPTS,
    Prompts,
    check_generation,
    predict_completions,
    prompt_loaders,
    with_exact_match,
)
from finetune.families.dpo.collate import (
    PAIR_COLUMNS,
    PairCollator,
    SharedPrefixCollator,
    Targets,
    shares_prefixes,
)
from finetune.families.dpo.data import encode_pairs, load_preference_splits
from finetune.families.dpo.generation import prompt_splits
from finetune.families.dpo.loss import as_loss_reads, pair_losses, reward_metrics, sequence_logps
from finetune.families.dpo.precompute import precomputed_logps
from finetune.families.dpo.reference import Reference
from finetune.families.dpo.windows import WindowTotals
from finetune.families.family import Evaluator, MicroBatch, metric_choice
from finetune.model.flops import non_embedding_parameters
from finetune.model.lora import training_flops_per_token
from finetune.output.card import CardParts
from finetune.training.evaluation import EvaluationAbandoned, progress, without_autocast


class DPO:
    name = "dpo"
    pipeline_tag = "text-generation"
    captures_cuda_graphs = False
    done_in_export = {}

    def __init__(self):
        self.lm = CausalLM()
        """The model as the causal-LM family builds and exports it."""
        self.reference: Reference | None = None
        """Set by `build_model`."""
        self.head_at_targets = False
        self.prefix_sharing = False
        """--prefix_sharing as resolved (`_prefix_sharing`): the collator's layout (collate.py)."""
        self.options = None
        """(loss_type, beta, simpo_gamma), set by `load`."""
        self.rpo_alpha = None
        self.normalises_windows = False
        """--rpo_alpha: the loss is two terms over different units (pairs, chosen target tokens), each
        divided by its window's total here (`windows.WindowTotals`), so the loop does not rescale."""
        self.totals: WindowTotals | None = None
        self.precompute = None
        """--precompute_ref_log_probs: (the resolved config, the encoded splits, the collator), kept by
        `dataloaders` for `after_prepare`."""
        self.precomputed: dict | None = None
        """{split: {"logps": [rows, 2], "counts": [rows, 2]}}: the reference's, by the pairs' `row`."""
        self.reference_shares: list[dict] | None = None
        """Under FSDP: each rank's share of the frozen copy (`after_prepare`), as fsdp_shards is the
        policy's; the record's `fsdp_reference_shards`."""

    def load(self, config):
        if config.chat_template:
            from finetune.families.causal_lm.family import _check_chat_template

            _check_chat_template(config.chat_template)
        self.options = (config.loss_type, config.beta, config.simpo_gamma)
        self.rpo_alpha = config.rpo_alpha
        self.normalises_windows = bool(config.rpo_alpha)
        task, splits = load_preference_splits(config)
        check_generation(config, task, splits)  # before the model loads: no validation pairs to generate
        return task, splits

    def choose_metric(self, config, task, splits: dict) -> dict:
        generated = ["eval_exact_match"] if config.predict_with_generate else []
        return metric_choice(config, splits, ["eval_loss", *task.metric_keys(), *generated], "eval_loss")

    def check(self, config, task, splits: dict) -> None:
        """--predict_with_generate without validation pairs refused in `load`, as SFT refuses it."""

    def build_model(self, args, task, accelerator, loading: dict, bf16_native: bool, cuda_graphs: str):
        model, tokenizer, backbone, speed = self.lm.build_model(
            args, task, accelerator, loading, bf16_native, cuda_graphs
        )
        # One forward of both sides' logits at their targets; the chunked loss is the SFT family's alone.
        self.lm.chunk_tokens = None
        speed["chunked_loss"], speed["chunked_loss_tokens"] = "false", None
        self.head_at_targets = self.lm.head_at_targets
        if args.disable_dropout:
            backbone["dropout"] = f"off ({_without_dropout(model)} modules; --disable_dropout)"
        self.prefix_sharing = _prefix_sharing(args.prefix_sharing, model)
        speed["prefix_sharing"] = str(self.prefix_sharing).lower()
        self.reference = Reference(args, model, loading)
        backbone["reference"] = self.reference.describe(args)
        return model, tokenizer, backbone, speed

    def after_prepare(self, accelerator, model) -> None:
        """Collective: the reference placed, cast (and sharded) as the prepared policy; with
        --precompute_ref_log_probs its log-probs of every pair (`precompute.py`), and a frozen copy let go."""
        self.reference.prepare(accelerator)
        if self.reference.model is not None:  # train_config.json's: what each rank holds of the copy
            self.reference_shares = model_shares(accelerator, self.reference.model)
        if self.precompute is None:
            return
        config, splits, collator = self.precompute

        def compute(batch, split: str):
            targets = Targets.pop(batch)
            # The evaluated splits' as results.json's evaluation of the exported policy computes (no
            # autocast: evaluate_as_exported); training's as the training forward does.
            unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
            exported = contextlib.nullcontext() if split == "train" else without_autocast(unwrapped)
            with exported:
                return self.reference.logps(accelerator, model, batch, targets, self.head_at_targets)

        was_training = model.training
        found = precomputed_logps(accelerator, config, splits, collator, compute)
        device = accelerator.device  # read by each micro-batch's row numbers, already on the device
        self.precomputed = {name: {k: v.to(device) for k, v in kept.items()} for name, kept in found.items()}
        model.train(was_training)
        self.precompute = None
        self.reference.model = None  # every pair's log-probs are kept: the copy's memory is freed

    def flops_per_token(self, model, use_peft: bool) -> int:
        """The policy's training FLOPs per token (6N; LoRA's own count) and the reference's forward (2N)
        where it runs per micro-batch."""
        non_embedding = non_embedding_parameters(model)
        trained = training_flops_per_token(model, non_embedding) if use_peft else 6 * non_embedding
        per_step = self.reference.kind != "none" and self.precomputed is None  # precomputed: once, before
        return trained + (2 * non_embedding if per_step else 0)

    def tokenize(self, task, splits: dict, tokenizer, config, accelerator) -> dict:
        """The encoded pairs, and the prompts generation reads (`generation.prompt_splits`)."""
        pairs = {name: split for name, split in splits.items() if name != "test"}
        encoded = encode_pairs(task, pairs, tokenizer, config, accelerator)
        return {**encoded, **prompt_splits(task, splits, tokenizer, config)}

    def dataloaders(self, tokenized: dict, tokenizer, config, world_size: int, on_gpu: bool, model) -> dict:
        multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
        if self.prefix_sharing:
            collator = SharedPrefixCollator(tokenizer.pad_token_id, multiple)
        else:
            collator = PairCollator(tokenizer.pad_token_id, multiple, config.max_length)
        prompts = {name: split for name, split in tokenized.items() if isinstance(split, Prompts)}
        tokenized = {name: split for name, split in tokenized.items() if name not in prompts}
        loaders = build_dataloaders(
            tokenized, tokenizer, config, world_size, on_gpu, collator=collator, columns=PAIR_COLUMNS
        )
        if config.precompute_ref_log_probs and self.reference.kind != "none":
            scored = {
                name: split.select_columns([c for c in PAIR_COLUMNS if c in split.column_names])
                for name, split in tokenized.items()
            }
            self.precompute = (config, scored, collator)
        if self.normalises_windows and "train" in loaders:
            chosen = tokenized["train"].select_columns(["chosen_targets"]).to_dict()["chosen_targets"]
            order = loaders["train"].batch_sampler  # data/batching.py RankBatches, before prepare wraps it
            self.totals = WindowTotals(order, {"chosen_tokens": chosen}, config.gradient_accumulation_steps)
        return {**loaders, **prompt_loaders(prompts, tokenizer.pad_token_id, config, on_gpu)}

    def forward_backward(
        self, model, accelerator, task, batch: dict, batch_divisor: int, graphs=None, window=None
    ):
        """The micro-batch's pairs' summed loss, its rows the pairs (units None: the loop makes the update
        the mean over every pair of the window, however it is cut), and the pairs' rewards/* and logps/*
        sums. With --rpo_alpha (`window` given): the pairs' loss over the window's pairs plus alpha x the
        chosen targets' cross-entropy over the window's chosen target tokens, each total counted from the
        epoch's order (`WindowTotals`), so both are means over the whole window on any cut."""
        scores, chosen, rejected, pairs, tokens, chosen_nll = self._scores(model, accelerator, batch, "train")
        summed = scores.losses.sum()
        metrics = reward_metrics(scores, chosen, rejected)
        if window is None:
            accelerator.backward(summed / batch_divisor)
            return MicroBatch(summed.detach(), None, pairs, tokens, metrics)
        totals = self.totals.of(*window)
        loss = summed / totals["pairs"] + self.rpo_alpha * chosen_nll / totals["chosen_tokens"]
        # accelerate divides by the accumulation steps and DDP averages over the ranks: undone here; a
        # placeholder (batch_divisor inf) weighs nothing.
        weight = 0.0 if math.isinf(batch_divisor) else accelerator.gradient_accumulation_steps
        accelerator.backward(loss * (weight * accelerator.num_processes))
        metrics["nll_loss"] = (chosen_nll.detach().double(), chosen_nll.new_tensor(totals["chosen_tokens"]))
        # The log's loss is the mean per pair: each window's pairs times its loss, over the pairs.
        return MicroBatch(loss.detach() * totals["pairs"], None, pairs, tokens, metrics)

    def _scores(self, model, accelerator, batch: dict, split: str):
        """The pairs' scores (loss, rewards), the policy's log-probs as the loss reads them, the pair
        count, the real tokens and the chosen targets' summed cross-entropy. `split`: train (the policy's
        forward keeps its graph) or the evaluated split (whose precomputed reference log-probs it reads)."""
        loss_type, beta, gamma = self.options
        grad = split == "train"
        targets = Targets.pop(batch)
        rows = batch.pop("row")
        precomputed = None
        if self.precomputed is not None:
            kept = self.precomputed[split]
            sums, counts = kept["logps"][rows], kept["counts"][rows]
            reads = as_loss_reads(sums, counts, loss_type)
            precomputed = reads[:, 0], reads[:, 1]
        tokens, pairs = targets.real_tokens, targets.counts.shape[0] // 2
        hooked = accelerator.unwrap_model(model) if self.head_at_targets else None
        with torch.set_grad_enabled(grad), head_at(hooked, targets.positions):
            logits = model(**batch, use_cache=False).logits
        logps, counts, each = sequence_logps(logits, targets)
        # RPO's SFT term: the chosen sequences' (the first `pairs`) target cross-entropies summed
        chosen_nll = (each * (targets.sequences < pairs)).sum()
        logps = as_loss_reads(logps, counts, loss_type)
        ref_chosen = ref_rejected = None
        if precomputed:
            ref_chosen, ref_rejected = precomputed
        else:
            found = self.reference.scored(
                accelerator, model, batch, targets, self.head_at_targets, split, rows
            )
            if found is not None:
                ref = as_loss_reads(*found, loss_type)
                ref_chosen, ref_rejected = ref[:pairs], ref[pairs:]
        chosen, rejected = logps[:pairs], logps[pairs:]
        scores = pair_losses(chosen, rejected, ref_chosen, ref_rejected, loss_type, beta, gamma)
        return scores, chosen, rejected, pairs, tokens, chosen_nll

    def evaluator(self, task, accelerator) -> Evaluator:
        """The pairs' scores, and with --predict_with_generate eval_exact_match (SFT's)."""
        return with_exact_match(functools.partial(self._evaluate, accelerator=accelerator), accelerator)

    def _evaluate(self, model, eval_loaders: dict, should_stop=None, *, accelerator) -> dict:
        """Collective: eval_loss (the mean loss per pair), eval_rewards/accuracies, margins, chosen and
        rejected, over every pair of the split once (gathered without Accelerate's repeated rows)."""
        model = getattr(model, "_orig_mod", model)
        model.eval()
        results = {}
        for split, loader in eval_loaders.items():
            kept = {"loss": [], "chosen": [], "rejected": []}
            with progress(accelerator, loader, "eval") as batches:
                for batch in batches:
                    if should_stop is not None and should_stop():  # every rank, at the same batch
                        model.train()
                        raise EvaluationAbandoned
                    scores, *_ = self._scores(model, accelerator, batch, split)
                    gathered = accelerator.gather_for_metrics(
                        (scores.losses.detach(), scores.chosen_rewards, scores.rejected_rewards)
                    )
                    for name, values in zip(kept, gathered, strict=True):
                        kept[name].append(values.double())
            loss, chosen, rejected = (torch.cat(kept[name]) for name in kept)
            prefix = "eval" if split == "validation" else f"eval_{split}"
            margins = chosen - rejected
            results[f"{prefix}_loss"] = loss.mean().item()
            results[f"{prefix}_rewards/accuracies"] = (margins > 0).double().mean().item()
            results[f"{prefix}_rewards/margins"] = margins.mean().item()
            results[f"{prefix}_rewards/chosen"] = chosen.mean().item()
            results[f"{prefix}_rewards/rejected"] = rejected.mean().item()
            results[f"{prefix}_samples"] = int(loss.numel())
        model.train()
        return results

    def autocast_loaders(self, eval_loaders: dict) -> dict:
        """The scored splits: --predict_with_generate's prompts are generated without autocast already."""
        return {name: loader for name, loader in eval_loaders.items() if not name.endswith(PROMPTS)}

    def predict(self, accelerator, model, loader, task, num_rows: int) -> list[dict]:
        """Collective: the test prompts' greedy completions (SFT's predictions.jsonl)."""
        return predict_completions(accelerator, model, loader)  # each of the num_rows once, checked

    def card_parts(self, config, task, results: dict) -> CardParts:
        model = config.hub_model_id or config.output_dir
        use = (
            "from transformers import pipeline",
            "",
            f'generate = pipeline("text-generation", model="{model}")',
            'prompt = "..."  # written as the training pairs\' prompts are',
            'print(generate(prompt, max_new_tokens=64, return_full_text=False)[0]["generated_text"])',
        )
        trained_on = (
            f"preference pairs ({config.loss_type} loss, beta {config.beta:g}, reference: "
            f"{self.reference.describe(config) if self.reference else 'none'})"
        )
        accuracy = results.get("eval_rewards/accuracies")
        exported = ()
        if accuracy is not None:  # the exported policy's, against the run's reference
            margin = results.get("eval_rewards/margins", float("nan"))
            exported = (
                f"- Reward accuracy on the validation pairs: {accuracy:.3f} (mean margin {margin:.3f})",
            )
        return CardParts(
            pipeline_tag=self.pipeline_tag, tag="dpo", trained_on=trained_on, use=use, exported=exported
        )

    def subject(self, config) -> str:
        return "preference tuning"

    def record_extras(self, task) -> dict:
        return {"fsdp_reference_shards": self.reference_shares} if self.reference_shares else {}

    def fit_batch_size(self, config, model, train, tokenizer, accelerator) -> tuple[dict, str]:
        raise NotImplementedError(
            "--auto_find_batch_size is refused for dpo (sequence_classification/flags.py OWNED)"
        )

    def step_graphs(self, args, config, accelerator, model, task) -> None:
        """No CUDA graphs (`captures_cuda_graphs`)."""

    def finish(self, run) -> dict:
        """Nothing: the export is the trained policy."""
        return {}


def _without_dropout(model) -> int:
    """Every dropout of `model` set to 0 (TRL's disable_dropout_in_model, and the attention's own rate,
    which Llama-style layers read from an attribute, not a module): how many modules changed."""
    changed = 0
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout) and module.p:
            module.p, changed = 0.0, changed + 1
        if isinstance(getattr(module, "attention_dropout", None), float) and module.attention_dropout:
            module.attention_dropout, changed = 0.0, changed + 1
    return changed


def _prefix_sharing(requested: str, model) -> bool:
    """--prefix_sharing: auto and true where the model passes `shares_prefixes`; true refused where not."""
    if requested == "false":
        return False
    shared = shares_prefixes(model)
    if requested == "true" and not shared:
        raise ConfigError(
            "--prefix_sharing true: this model's attention does not give a pair the same log-probs with "
            f"its shared tokens run once (attention {getattr(model.config, '_attn_implementation', None)}; "
            "it needs sdpa and no sliding window); use --prefix_sharing auto",
            flag="--prefix_sharing",
            fix="use --prefix_sharing auto",
        )
    return shared
