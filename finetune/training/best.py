"""The best evaluation: kept during training (best_model/, early stopping), put back into the model at
the end (--load_best_model_at_end)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from finetune.config.train_config import TrainConfig
from finetune.distributed.signals import StopSignals
from finetune.errors import TrainingFailed
from finetune.model.lora import ADAPTER_DIR, is_peft_model, with_adapter_weights
from finetune.model.quantization import load_all_but_quantized, quantized_layers
from finetune.output.export import export_model
from finetune.output.writing import writing
from finetune.training.checkpoint import BEST_MODEL_DIR, BEST_RECORD, TrainState
from finetune.training.evaluation import autocasts, without_autocast
from finetune.training.meter import _fractional_epoch

if TYPE_CHECKING:  # annotations only: training/loop.py imports this module
    from finetune.training.loop import Run


def _evaluate_and_keep_best(run: Run, evaluate, stop: StopSignals, progress) -> None:
    """Collective: one evaluation, logged (metrics.jsonl, trackers, progress bar); a new best is
    exported to best_model/; the early-stopping count is updated. A stop signal abandons it
    (`EvaluationAbandoned`)."""
    accelerator, config, state = run.accelerator, run.config, run.state
    scores = evaluate(run.model, run.eval_loaders, lambda: stop.requested(accelerator))  # the family's
    result = {"step": state.global_step, "epoch": _fractional_epoch(run), **scores}
    improved = _keep_best_and_count(config, state, result)
    if accelerator.is_main_process:
        run.log.log(result)
    if accelerator.is_local_main_process:  # the progress bar's own line, on the machine's first rank
        name = config.metric_for_best_model
        progress.write(
            f"step {state.global_step}: {name} {result[name]:.4f}"
            + (" (best so far)" if improved else f" (best {state.best_metric:.4f} at step {state.best_step})")
        )
    if improved:
        # Collective: the best weights so far, kept whatever checkpoint rotation removes.
        best_dir = Path(config.output_dir) / BEST_MODEL_DIR
        export_model(accelerator, run.model, run.tokenizer, str(best_dir), config.gguf_file)
        if accelerator.is_main_process:  # which step they are from: --load_best_model_at_end checks it
            with writing("the best model", config.output_dir):
                (best_dir / BEST_RECORD).write_text(json.dumps(result, indent=2))
    if stopped_early(config, state) and accelerator.is_main_process:
        progress.write(
            f"early stopping at step {state.global_step}: {config.metric_for_best_model} did not improve by "
            f"more than {config.early_stopping_threshold} for {state.early_stopping_patience_counter} "
            f"evaluations in a row (--early_stopping_patience {config.early_stopping_patience}); best "
            f"{state.best_metric:.4f} at step {state.best_step}"
        )


def _keep_best_and_count(config: TrainConfig, state: TrainState, result: dict) -> bool:
    """Records the evaluation in `state`: the best one by --metric_for_best_model (any improvement) and
    the early-stopping count (as transformers' EarlyStoppingCallback: it restarts only when the best is
    beaten by more than --early_stopping_threshold). Returns whether this is the new best."""
    score, best = result[config.metric_for_best_model], state.best_metric
    better = best is None or (score > best if config.greater_is_better else score < best)
    if best is None or (better and abs(score - best) > config.early_stopping_threshold):
        state.early_stopping_patience_counter = 0
    else:
        state.early_stopping_patience_counter += 1
    if better:
        state.best_metric, state.best_step, state.best_evaluation = score, state.global_step, result
    state.last_evaluation, state.last_eval_step = result, state.global_step
    return better


def stopped_early(config: TrainConfig, state: TrainState) -> bool:
    """Whether --early_stopping_patience ran out (also in a resumed run's checkpointed counters)."""
    patience = config.early_stopping_patience
    return patience is not None and state.early_stopping_patience_counter >= patience


def best_model_step(output_dir: str) -> int | None:
    """The step whose weights output_dir/best_model holds, per its record; None without one."""
    try:
        return json.loads((Path(output_dir) / BEST_MODEL_DIR / BEST_RECORD).read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load_best_model(accelerator, model, output_dir: str) -> None:
    """Collective: the weights in output_dir/best_model put back into the prepared model (Hugging Face
    Trainer's load_best_model_at_end). Under FSDP2 rank 0 reads them and broadcasts the shards."""
    folder = Path(output_dir) / BEST_MODEL_DIR
    unwrapped = accelerator.unwrap_model(model, keep_torch_compile=False)
    lora = is_peft_model(unwrapped)
    # best_model/ is merged; under LoRA its adapter/ holds what was trained, put into the full state.
    full = accelerator.get_state_dict(model, unwrap=True) if lora else None  # collective under FSDP
    state = {}
    if accelerator.is_main_process or not accelerator.is_fsdp2:  # DDP: every rank reads its own copy
        state = _with_best_adapter(unwrapped, full, folder) if lora else _best_weights(folder)
    if accelerator.is_fsdp2:
        from accelerate.utils.fsdp_utils import fsdp2_load_full_state_dict

        fsdp2_load_full_state_dict(accelerator, model, state)
    else:
        if not lora:
            _check_fits(unwrapped, state, folder)
        # A merged checkpoint leaves out tied weights (_check_fits allows for them), a LoRA state nothing.
        if quantized_layers(unwrapped):  # --load_in_4bit/8bit: the frozen quantized base stays as it is
            load_all_but_quantized(unwrapped, state)
        else:
            unwrapped.load_state_dict(state, strict=lora)
    accelerator.wait_for_everyone()


def _with_best_adapter(model, full: dict, folder: Path) -> dict:
    try:
        return with_adapter_weights(model, full, folder / ADAPTER_DIR)
    except (OSError, ValueError) as error:
        raise TrainingFailed(
            f"{folder}: cannot read its LoRA adapter ({error}); rerun with --overwrite_output_dir"
        ) from None


def _best_weights(folder: Path) -> dict:
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    # save_pretrained writes one file, or shards listed in an index for large models.
    files = (
        sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
        if index.is_file()
        else [folder / "model.safetensors"]
    )
    return {k: v for f in files for k, v in load_file(f).items()}


def _check_fits(model, loaded: dict, folder: Path) -> None:
    own = model.state_dict()
    # save_pretrained leaves out a weight tied to another one (the same storage): not missing.
    stored = {t.data_ptr() for name, t in own.items() if name in loaded}
    missing = [name for name, t in own.items() if name not in loaded and t.data_ptr() not in stored]
    unexpected = sorted(set(loaded) - set(own))
    if missing or unexpected:
        raise TrainingFailed(
            f"{folder} does not fit the model being trained (missing {missing[:3]}, unexpected "
            f"{unexpected[:3]}); it is left by another run: rerun with --overwrite_output_dir"
        )


def use_best_model(run: Run) -> dict:
    """Collective: with --load_best_model_at_end, the best weights (best_model/) put back into the model
    for the export, the predictions and the Hub, as Hugging Face Trainer does. Returns the evaluation
    of the model that stays: the best, or the last one."""
    config, state, accelerator = run.config, run.state, run.accelerator
    if not (config.load_best_model_at_end and state.best_evaluation):
        return state.last_evaluation or {}
    if state.best_step != state.global_step:
        if best_model_step(config.output_dir) != state.best_step:  # read by every rank: the same file
            if accelerator.is_main_process:
                print(
                    f"--load_best_model_at_end: {Path(config.output_dir) / BEST_MODEL_DIR} does not hold the "
                    f"best model (step {state.best_step}; was the checkpoint resumed in another folder?): "
                    f"the model exported is the last one, from step {state.global_step}"
                )
            return state.last_evaluation or {}
        load_best_model(accelerator, run.model, config.output_dir)
    if accelerator.is_main_process:
        print(
            f"--load_best_model_at_end: exporting{' and predicting with' if run.test_loader else ''} the "
            f"best model, from step {state.best_step} ({config.metric_for_best_model} "
            f"{state.best_metric:.4f}); the last step was {state.global_step}"
        )
    return state.best_evaluation


def as_exported(run: Run, exported: dict) -> dict:
    """Collective: `exported` (use_best_model's evaluation) as the exported model scores. Evaluations during
    training run under autocast where Accelerate applies it (--mixed_precision bf16 or fp16 over fp32
    weights), for speed; the export computes in its weights' dtype, as `pipeline` runs it, and autocast's
    rounding moves the loss and can flip a near-tie's prediction. So then the model is evaluated once more,
    without autocast, on the loaders the family evaluates under it (completions are generated without it
    already), and those figures replace training's; step and epoch stay (the exported model's)."""
    model = run.accelerator.unwrap_model(run.model, keep_torch_compile=False)
    if not exported or not autocasts(model):
        return exported
    return {**exported, **evaluate_as_exported(run, run.family.autocast_loaders(run.eval_loaders))}


def evaluate_as_exported(run: Run, eval_loaders: dict) -> dict:
    """Collective: the family's evaluation of the model on `eval_loaders` without autocast, as the exported
    weights compute: results.json's figures (an evaluate-only run's too)."""
    evaluate = run.family.evaluator(run.task, run.accelerator)
    with without_autocast(run.accelerator.unwrap_model(run.model, keep_torch_compile=False)):
        return evaluate(run.model, eval_loaders)


def training_outcome(run: Run, exported: dict) -> dict:
    """results.json's account of the evaluations: the best, the last, which one the exported model is,
    and why training ended."""
    config, state = run.config, run.state
    early = stopped_early(config, state)
    return {
        "best_evaluation": state.best_evaluation,
        "last_evaluation": state.last_evaluation,
        "exported_model_step": exported.get("step", state.global_step),
        "stopped_early": early,
        "early_stopping_step": state.global_step if early else None,
    }
