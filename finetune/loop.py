"""The training loop and evaluation, written once against `accelerate.Accelerator`."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import evaluate as hf_evaluate
import torch
import torch.nn.functional as F
from accelerate import skip_first_batches
from tqdm.auto import tqdm

from finetune.checkpoint import (
    BEST_MODEL_DIR,
    TrainState,
    complete_checkpoints,
    export_model,
    save_checkpoint,
)
from finetune.config import TrainConfig
from finetune.runtime import StopSignals, TrainingFailed, TrainingInterrupted
from finetune.steps import StepPlan
from finetune.tracking import MetricsLog

METRICS_DIR = Path(__file__).parent / "metrics"


def load_metric(name: str, accelerator):
    # The metric module ships with the package, so this needs no Hub; rank 0 copies it into the
    # modules cache first so ranks do not race on that copy.
    with accelerator.main_process_first():
        return hf_evaluate.load(str(METRICS_DIR / name))


@dataclass
class Run:
    """Everything `finetune.mnli.setup` builds for one run."""

    config: TrainConfig
    accelerator: object
    model: object
    tokenizer: object
    optimizer: object
    scheduler: object
    train_loader: object
    eval_loaders: dict
    plan: StepPlan
    state: TrainState
    log: MetricsLog | None


def train(run: Run, stop: StopSignals):
    """Optimizer steps until `plan.total_updates`, evaluating after every epoch.

    Returns the last evaluation, the training seconds and the evaluation seconds. A stop signal
    ends the run after the current step with a checkpoint and `TrainingInterrupted`.
    """
    accelerator, model, optimizer, scheduler = run.accelerator, run.model, run.optimizer, run.scheduler
    config, plan, state, log = run.config, run.plan, run.state, run.log
    train_loader, eval_loaders = run.train_loader, run.eval_loaders
    world_size = accelerator.num_processes
    device = accelerator.device
    full_window = config.per_device_train_batch_size * config.gradient_accumulation_steps * world_size
    metric = load_metric("accuracy", accelerator)
    # Per-rank sums since the last log line, kept on the device so the hot path never waits for
    # the GPU; they are reduced across ranks only when a line is logged.
    loss_since_log = torch.zeros((), device=device, dtype=torch.float64)
    tokens_since_log = torch.zeros((), device=device, dtype=torch.float64)
    samples_since_log = 0
    window_samples = 0
    last_eval: dict = {}
    # A context manager: the bar is closed before any error message is printed.
    with tqdm(
        total=plan.total_updates,
        initial=state.global_step,
        desc="train",
        unit="step",
        disable=not accelerator.is_local_main_process,
    ) as progress:
        tic = time.perf_counter()
        log_tic = tic
        eval_seconds = 0.0
        model.train()
        for epoch in range(state.epoch, plan.num_epochs):
            state.epoch = epoch
            train_loader.set_epoch(epoch)
            # Resume mid-epoch: the same (seed, epoch) order, minus the micro-batches already done.
            batches = (
                skip_first_batches(train_loader, state.micro_batches_in_epoch)
                if state.micro_batches_in_epoch
                else train_loader
            )
            for batch in batches:
                labels = batch.pop("labels")
                with accelerator.accumulate(model):
                    logits = model(**batch).logits
                    loss_sum = F.cross_entropy(logits.float(), labels, reduction="sum")
                    # Scaled as the mean over a full micro-batch; Accelerate divides by the accumulation
                    # steps and DDP averages over ranks, so a full window yields the mean over its pairs.
                    accelerator.backward(loss_sum / config.per_device_train_batch_size)
                    window_samples += labels.shape[0]
                    state.micro_batches_in_epoch += 1
                    loss_since_log += loss_sum.detach()
                    tokens_since_log += batch["attention_mask"].sum()
                    samples_since_log += labels.shape[0]
                    if accelerator.sync_gradients:
                        if accelerator.gradient_state.end_of_dataloader:  # every rank at once
                            _average_over_real_window(accelerator, model, window_samples, full_window)
                        # With clipping off the norm is still measured (max inf): it is the NaN guard.
                        grad_norm = accelerator.clip_grad_norm_(
                            model.parameters(), config.max_grad_norm or math.inf
                        )
                        if not math.isfinite(grad_norm):  # identical on every rank after the all-reduce
                            raise _diverged(state.global_step + 1, config.output_dir)
                        optimizer.step()
                        scheduler.step()
                        optimizer.zero_grad(set_to_none=True)
                        state.global_step += 1
                        window_samples = 0
                        progress.update(1)
                        if (
                            state.global_step % config.logging_steps == 0
                            or state.global_step == plan.total_updates
                        ):
                            loss_total, samples, tokens = _reduce_sums(
                                accelerator, loss_since_log, samples_since_log, tokens_since_log
                            )
                            loss_since_log.zero_(), tokens_since_log.zero_()
                            samples_since_log = 0
                            now = time.perf_counter()
                            state.samples_seen += samples
                            state.tokens_seen += tokens
                            record = {
                                "step": state.global_step,
                                "epoch": round(
                                    epoch + state.micro_batches_in_epoch / plan.micro_batches_per_epoch, 4
                                ),
                                "loss": loss_total / samples,
                                "learning_rate": scheduler.get_last_lr()[0],
                                "grad_norm": float(grad_norm),
                                "samples_per_second": samples / (now - log_tic),
                                "tokens_per_second": tokens / (now - log_tic),
                            }
                            log_tic = now
                            if accelerator.is_main_process:
                                log.log(record)
                            progress.set_postfix(
                                loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_second']:.0f}"
                            )
                        checkpoint = None
                        if (
                            config.checkpoint_every_n_steps
                            and state.global_step % config.checkpoint_every_n_steps == 0
                        ):
                            checkpoint = save_checkpoint(
                                accelerator, config.output_dir, state, world_size, config.save_total_limit
                            )
                        signal_name = stop.requested(accelerator)
                        if signal_name:
                            checkpoint = checkpoint or save_checkpoint(
                                accelerator, config.output_dir, state, world_size, config.save_total_limit
                            )
                            raise TrainingInterrupted(signal_name, state.global_step, checkpoint)
                if state.global_step >= plan.total_updates:
                    break
            eval_tic = time.perf_counter()
            last_eval = {
                "step": state.global_step,
                "epoch": epoch + 1,
                **evaluate_splits(accelerator, model, eval_loaders, metric),
            }
            if accelerator.is_main_process:
                log.log(last_eval)
            score = last_eval[config.metric_for_best_model]
            if state.best_metric is None or score > state.best_metric:
                state.best_metric, state.best_step = score, state.global_step
                # Collective: the best weights so far, kept whatever checkpoint rotation removes.
                export_model(accelerator, model, run.tokenizer, str(Path(config.output_dir) / BEST_MODEL_DIR))
            log_tic = time.perf_counter()
            eval_seconds += log_tic - eval_tic  # evaluation time is not training throughput
            state.epoch, state.micro_batches_in_epoch = epoch + 1, 0
            if config.checkpoint_every_epoch:
                save_checkpoint(accelerator, config.output_dir, state, world_size, config.save_total_limit)
            if state.global_step >= plan.total_updates:
                break
    # Pairs not yet logged (none when the last step logged) still count toward throughput.
    _, samples, tokens = _reduce_sums(accelerator, loss_since_log, samples_since_log, tokens_since_log)
    state.samples_seen += samples
    state.tokens_seen += tokens
    return last_eval, time.perf_counter() - tic - eval_seconds, eval_seconds


def _average_over_real_window(accelerator, model, window_samples: int, full_window: int) -> None:
    """Collective. The epoch's last window may hold fewer pairs (fewer micro-batches, a short last
    batch): rescale its gradients so the update is the mean over the pairs it really saw, not
    their sum divided by a full window (what accumulate alone, HF Trainer and Lightning do)."""
    seen = accelerator.reduce(torch.tensor(window_samples, device=accelerator.device), "sum").item()
    if seen != full_window:
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(full_window / seen)


def _diverged(step: int, output_dir: str) -> TrainingFailed:
    """Raised before the optimizer step, so no NaN reaches the weights or a checkpoint."""
    latest = complete_checkpoints(output_dir)
    last_good = latest[-1] if latest else "none (set --checkpointing_steps)"
    return TrainingFailed(
        f"the loss became NaN or inf at step {step}; the last good checkpoint is {last_good}; "
        "lower --learning_rate or --max_grad_norm, or use bf16 instead of fp16"
    )


def _reduce_sums(accelerator, loss, samples: int, tokens) -> tuple[float, int, int]:
    """Collective: every rank contributes its sums since the last log line."""
    local = torch.stack([loss, torch.tensor(float(samples), device=loss.device, dtype=loss.dtype), tokens])
    loss_total, samples_total, tokens_total = accelerator.reduce(local, "sum").tolist()
    return loss_total, int(samples_total), int(tokens_total)


def evaluate_splits(accelerator, model, eval_loaders: dict, metric) -> dict:
    """Collective: `eval_<split>_accuracy` and `eval_<split>_samples` for every evaluation split."""
    results = {}
    for name, loader in eval_loaders.items():
        result = evaluate(accelerator, model, loader, metric)
        short = name.removeprefix("validation_")
        results.update(
            {f"eval_{short}_accuracy": result["accuracy"], f"eval_{short}_samples": result["samples"]}
        )
    return results


def evaluate(accelerator, model, loader, metric) -> dict:
    """Collective: accuracy over the whole split, each row counted exactly once across ranks."""
    model.eval()
    predictions, references = [], []
    with torch.no_grad():
        for batch in loader:
            labels = batch.pop("labels")
            logits = model(**batch).logits
            # gather_for_metrics drops the rows Accelerate repeated to give every rank equal batches.
            preds, refs = accelerator.gather_for_metrics((logits.argmax(dim=-1), labels))
            predictions.append(preds.cpu())
            references.append(refs.cpu())
    model.train()
    predictions, references = torch.cat(predictions), torch.cat(references)
    result = metric.compute(predictions=predictions.numpy(), references=references.numpy())
    return {"accuracy": float(result["accuracy"]), "samples": len(references)}
