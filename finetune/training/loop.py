"""The training loop, written once against `accelerate.Accelerator`: `train()` and one optimizer step."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import skip_first_batches
from tqdm.auto import tqdm

from finetune.config.train_config import TrainConfig
from finetune.data.batching import PLACEHOLDER
from finetune.distributed.signals import StopSignals
from finetune.errors import TrainingInterrupted
from finetune.families.family import MicroBatch
from finetune.output.tracking import MetricsLog
from finetune.speed.cuda_graphs import GraphedSteps
from finetune.training.best import _evaluate_and_keep_best, stopped_early
from finetune.training.checkpoint import PREFIX, TrainState, save_checkpoint
from finetune.training.divergence import diverged
from finetune.training.evaluation import EvaluationAbandoned
from finetune.training.meter import _fractional_epoch, _Meter, model_flops_utilization
from finetune.training.steps import StepPlan


@dataclass
class Run:
    """Everything `finetune.run.setup` builds for one run."""

    config: TrainConfig
    """What the run trains with: the flags, each auto and derived choice resolved (train_config.json)."""
    family: object
    """The task family (finetune.families): the micro-batch's loss and units, the evaluation."""
    task: object
    """The family's task: what the run learns, its metrics and evaluation splits (a `data.tasks.Task` for
    classification)."""
    accelerator: object
    model: object
    tokenizer: object
    optimizer: object
    scheduler: object
    train_loader: object
    eval_loaders: dict
    test_loader: object
    plan: StepPlan
    state: TrainState
    log: MetricsLog | None
    rows: dict
    """Rows per split after --max_*_samples, for the model card and the prediction check."""
    started_s: float
    """time.perf_counter() when setup began: the model card's wall time."""
    flops_per_token: int
    """6 x non-embedding parameters: the training FLOPs of one real token, for MFU."""
    given_flags: dict
    """The flags the user set (command line and YAML), as given: the model card's command."""
    first_nonfinite_step: torch.Tensor | None = None
    """On the device, set by train(): the first step whose gradient norm was NaN or inf (0: none).
    That step was skipped on the device; the run fails when the flag is next read (`_raise_if_diverged`)."""
    meter: _Meter | None = None
    """Set by train(): the open logging window and this segment's clock; a checkpoint keeps both."""
    graphs: GraphedSteps | None = None
    """--cuda_graphs: the micro-batches' forward and backward, replayed per shape (None: eager)."""
    saved_step: int | None = None
    """Set by train(): the step of the newest checkpoint this run wrote or was resumed from."""
    on_evaluation: Callable[[int, dict], bool] | None = None
    """Set by a caller's `build` hook (a sweep's trial, to prune): called on every rank with (step,
    evaluation) after each evaluation during training; True stops training there, as early stopping
    does, and the run finishes (export, results.json) as usual. It must answer the same on every rank."""


def train(run: Run, stop: StopSignals):
    """Collective: optimizer steps until `plan.total_updates` or early stopping, evaluating on
    --eval_strategy.

    Returns the run's training seconds and evaluation seconds, each summed over its segments (a resumed
    run adds the seconds its checkpoint recorded); the evaluations are in `run.state`. A stop signal ends
    the run after the current step with a checkpoint and `TrainingInterrupted`. It ends with a checkpoint
    of the last step (`_keep_for_export`): a stop during the export loses no training.
    """
    accelerator, model, config, plan, state = run.accelerator, run.model, run.config, run.plan, run.state
    world_size = accelerator.num_processes
    full_window = config.per_device_train_batch_size * config.gradient_accumulation_steps * world_size
    evaluate = run.family.evaluator(run.task, accelerator)  # collective
    run.first_nonfinite_step = torch.zeros((), dtype=torch.int64, device=accelerator.device)
    window_samples, window_units = 0, None  # rows (and the loss's units) in this update so far
    # A context manager: the bar is closed before any error message is printed.
    with tqdm(
        total=plan.total_updates,
        initial=state.global_step,
        desc="train",
        unit="step",
        disable=not accelerator.is_local_main_process,
    ) as progress:
        meter = run.meter = _Meter(accelerator, state)  # starts this segment's clock
        run.saved_step = state.global_step or None  # a resumed run's is its checkpoint's step
        if state.for_export:  # resumed from the checkpoint written for the export: training is over
            return meter.run_seconds()
        # Resumed from a checkpoint whose evaluation a stop signal abandoned: that step's evaluation first.
        meter.exclude(_evaluate_if_due(run, evaluate, stop, progress))  # collective
        model.train()
        halted = False  # early stopping or on_evaluation ended training mid-epoch
        for epoch in range(state.epoch, plan.num_epochs):
            if stopped_early(config, state):
                break
            state.epoch = epoch
            run.train_loader.set_epoch(epoch)
            # Resume mid-epoch: the same (seed, epoch) order, minus the micro-batches already done.
            batches = (
                skip_first_batches(run.train_loader, state.micro_batches_in_epoch)
                if state.micro_batches_in_epoch
                else run.train_loader
            )
            for batch in batches:
                if state.global_step >= plan.total_updates:  # also: resumed after the last step
                    break
                with accelerator.accumulate(model):  # no gradient all-reduce until the window's last one
                    step = _forward_backward(run, batch)
                window_samples += step.rows
                units = step.units
                if units is not None:  # on the device: target tokens, or the rows' loss weights
                    window_units = units if window_units is None else window_units + units
                state.micro_batches_in_epoch += 1
                if step.rows:  # a placeholder's (0) adds nothing: the log counts real rows and tokens
                    meter.add(step.loss_sum, step.tokens, step.rows, units)
                if step.metrics:  # a placeholder's zeros too: every rank's window names the same ones
                    meter.add_metrics(step.metrics)
                if not accelerator.sync_gradients:  # the same on every rank: the window goes on
                    continue
                # Collective; on the device.
                meter.grad_norm = _optimizer_step(run, window_samples, full_window, window_units)
                state.global_step += 1
                window_samples, window_units = 0, None
                progress.update(1)
                halted = after_update(run, evaluate, stop, progress)  # collective: log, evaluate, checkpoint
                if halted:
                    break
            if halted:
                break  # mid-epoch: the state stays at the step where it stopped
            state.epoch, state.micro_batches_in_epoch = epoch + 1, 0
            if config.checkpoint_every_epoch:
                _save(run)
            if state.global_step >= plan.total_updates:
                break
    _raise_if_diverged(run)  # before the caller exports the model
    meter.flush(accelerator, state)  # collective: pairs not yet logged still count toward throughput
    seconds = meter.run_seconds()  # the export's checkpoint is not training time
    _keep_for_export(run, stop)  # collective
    return seconds


def _keep_for_export(run: Run, stop: StopSignals) -> None:
    """Collective: training is over; unless a checkpoint already holds its last step, one written for the
    export (`TrainState.for_export`, without rotation), so that a stop from here until results.json is
    written costs no training: the relaunch with --resume_from_checkpoint auto resumes it and exports.
    A stop signal since the last step's check stops the run here, as one during training does."""
    state = run.state
    if run.saved_step != state.global_step:
        state.for_export = True
        _save(run, rotate=False)
    signal_name = stop.requested(run.accelerator)
    if signal_name:
        checkpoint = Path(run.config.output_dir) / f"{PREFIX}{state.global_step}"
        raise TrainingInterrupted(signal_name, state.global_step, checkpoint)


def after_update(run: Run, evaluate, stop: StopSignals, progress) -> bool:
    """Collective: what follows an optimizer update, in this order: the log line when one is due (rank 0
    writes it), the evaluation when one is due, the checkpoint when one is due, a stop signal's checkpoint
    and `TrainingInterrupted`. Returns whether early stopping (or `run.on_evaluation`) ends training here."""
    accelerator, config, state, meter = run.accelerator, run.config, run.state, run.meter
    if state.global_step % config.logging_steps == 0 or state.global_step == run.plan.total_updates:
        record = _train_record(run, meter)  # collective; reads the device
        if accelerator.is_main_process:
            run.log.log(record)
        progress.set_postfix(loss=f"{record['loss']:.4f}", samples_s=f"{record['samples_per_second']:.0f}")
    # Before the checkpoint, so one written at this step holds this evaluation's counters.
    meter.exclude(_evaluate_if_due(run, evaluate, stop, progress))  # collective
    _checkpoint_or_stop(run, stop)  # collective
    evaluated = state.last_eval_step == state.global_step  # just now: a step is never evaluated twice
    hook = run.on_evaluation
    if evaluated and hook is not None and hook(state.global_step, state.last_evaluation):  # collective
        return True
    return stopped_early(config, state)


def _forward_backward(run: Run, batch: dict) -> MicroBatch:
    """One micro-batch's record, its gradients accumulated: the family's
    step, replayed as a CUDA graph (--cuda_graphs) or eager. Collective under DDP: backward all-reduces
    on the window's last micro-batch.

    A placeholder (data/batching.py RankBatches: this rank has no row left in the epoch's last global
    batch) runs its row with a loss divided by inf, so its gradients are zeros (backward is linear in
    the loss's gradient) and it meets the other ranks' all-reduce; it counts 0 rows, 0 units, 0 tokens and
    zero metrics.

    A family with `normalises_windows` (a loss of terms over different units: DPO's pairs and RPO's chosen
    tokens) is given `window`, (epoch, the window's index in it: micro-batches done // accumulation, as
    Accelerate's `accumulate` syncs from each epoch's start), and divides each term by its window total
    itself (the order is a pure function of seed and epoch: no collective); the loop does not rescale."""
    divisor = run.config.per_device_train_batch_size
    placeholder = batch.pop(PLACEHOLDER, False)
    if placeholder:
        divisor = math.inf  # never with --cuda_graphs: they run on one process, which has no placeholder
    window = {}
    if getattr(run.family, "normalises_windows", False):  # a loss of several terms, each over its window
        accumulation = run.config.gradient_accumulation_steps
        window["window"] = (run.state.epoch, run.state.micro_batches_in_epoch // accumulation)
    step = run.family.forward_backward(
        run.model, run.accelerator, run.task, batch, divisor, run.graphs, **window
    )
    if placeholder:
        units = None if step.units is None else torch.zeros_like(step.units)
        metrics = {name: (torch.zeros_like(a), torch.zeros_like(b)) for name, (a, b) in step.metrics.items()}
        return MicroBatch(torch.zeros_like(step.loss_sum), units, 0, torch.zeros_like(step.tokens), metrics)
    return step


def _optimizer_step(run: Run, window_samples: int, full_window: int, window_units=None) -> torch.Tensor:
    """Collective: one update from the accumulated gradients; returns their norm, on the device.

    Nothing here waits for the device. A NaN or inf norm (identical on every rank after the
    all-reduce) is the NaN guard: the update is skipped on the device (fused AdamW's `found_inf`;
    in fp16 GradScaler skips it itself) and the step is kept in `run.first_nonfinite_step`, read at
    the next log line, checkpoint or evaluation, which fail the run naming that step."""
    accelerator, model, config = run.accelerator, run.model, run.config
    # A family that normalises its terms over the window's own totals (`normalises_windows`) has already.
    rescales = not getattr(run.family, "normalises_windows", False)
    if rescales and (accelerator.gradient_state.end_of_dataloader or window_units is not None):
        _average_over_real_window(accelerator, model, window_samples, full_window, window_units)
    # With clipping off the norm is still measured (max inf): it is the NaN guard.
    grad_norm = whole_norm(accelerator.clip_grad_norm_(model.parameters(), config.max_grad_norm or math.inf))
    nonfinite = ~torch.isfinite(grad_norm)
    first = run.first_nonfinite_step
    first.copy_(torch.where(nonfinite & (first == 0), run.state.global_step + 1, first))
    if accelerator.scaler is None:
        # torch's fused Adam/AdamW step reads this attribute (GradScaler sets it in fp16) and
        # leaves weights, moments and step count as they were where it is 1.
        getattr(run.optimizer, "optimizer", run.optimizer).found_inf = nonfinite.float()
    run.optimizer.step()
    run.scheduler.step()
    if run.graphs is None or not run.graphs.zeroes_gradients:  # graphs zero the fixed ones they write
        run.optimizer.zero_grad(set_to_none=True)
    return grad_norm.detach()


def whole_norm(grad_norm: torch.Tensor) -> torch.Tensor:
    """Collective under FSDP2: its gradient norm comes back as a DTensor, which the NaN guard's plain
    tensors cannot mix with; `full_tensor()` gives every rank the norm over all shards (an all-reduce on
    the device, no host wait). Any other norm is returned as it is."""
    full_tensor = getattr(grad_norm, "full_tensor", None)  # DTensor's; no import of torch.distributed
    return grad_norm if full_tensor is None else full_tensor()


def _raise_if_diverged(run: Run) -> None:
    """A host read of the device's NaN flag (every rank holds the same): TrainingFailed naming the
    first non-finite step. Called where the loop waits anyway: log lines, checkpoints, evaluation."""
    if run.first_nonfinite_step is not None:
        step = int(run.first_nonfinite_step)
        if step:
            raise diverged(step, run.config, run.accelerator.mixed_precision)


def _train_record(run: Run, meter: _Meter) -> dict:
    """Collective: the metrics.jsonl line for the steps since the last one (reads the device)."""
    _raise_if_diverged(run)
    loss, samples, tokens, seconds, metrics = meter.flush(run.accelerator, run.state)
    return {
        "step": run.state.global_step,
        "epoch": _fractional_epoch(run),
        "loss": loss,
        "learning_rate": run.scheduler.get_last_lr()[0],
        "grad_norm": float(meter.grad_norm),
        "samples_per_second": samples / seconds,
        "tokens_per_second": tokens / seconds,
        **model_flops_utilization(run, tokens / seconds, "mfu"),
        **metrics,  # the family's (DPO's rewards/*), each its window's sum over its count
    }


def _checkpoint_or_stop(run: Run, stop: StopSignals) -> None:
    """Collective: the --checkpointing_steps checkpoint; after a stop signal on any rank, a
    checkpoint (unless this step just wrote one) and `TrainingInterrupted` on every rank."""
    accelerator, config, state = run.accelerator, run.config, run.state
    every = config.checkpoint_every_n_steps
    checkpoint = None
    if every and state.global_step % every == 0:
        checkpoint = _save(run)
    signal_name = stop.requested(accelerator)
    if signal_name:
        raise TrainingInterrupted(signal_name, state.global_step, checkpoint or _save(run))


def _save(run: Run, rotate: bool = True) -> Path:
    """Collective: a checkpoint of this step, with the open logging window and the run's seconds;
    `rotate`: then --save_total_limit removes the oldest."""
    _raise_if_diverged(run)  # no checkpoint after a non-finite step
    run.meter.keep_in(run.accelerator, run.state)  # collective
    config, world_size = run.config, run.accelerator.num_processes
    limit = config.save_total_limit if rotate else None
    saved = save_checkpoint(run.accelerator, config.output_dir, run.state, world_size, limit, run.optimizer)
    run.saved_step = run.state.global_step
    return saved


def _evaluation_due(config: TrainConfig, plan: StepPlan, state: TrainState) -> bool:
    """Whether this step is evaluated: --eval_strategy's steps, and always the last one, never twice."""
    step = state.global_step
    if config.eval_strategy == "no" or step == 0 or state.last_eval_step == step:
        return False
    if step == plan.total_updates:
        return True
    if config.eval_strategy == "epoch":
        return state.micro_batches_in_epoch == plan.micro_batches_per_epoch
    return step % config.eval_steps == 0


def _evaluate_if_due(run: Run, evaluate, stop: StopSignals, progress) -> float:
    """Collective: the evaluation this step is due (see `_evaluation_due`), if any; its seconds.

    A stop signal abandons it: a checkpoint of this step (which the resumed run evaluates) and
    `TrainingInterrupted` on every rank."""
    if not _evaluation_due(run.config, run.plan, run.state):
        return 0.0
    _raise_if_diverged(run)  # no evaluation, hence no best_model/, of skipped-step weights
    tic = time.perf_counter()
    try:
        _evaluate_and_keep_best(run, evaluate, stop, progress)
    except EvaluationAbandoned:  # on every rank
        run.meter.exclude(time.perf_counter() - tic)  # the checkpoint's training seconds leave it out
        signal_name = stop.received or "SIGTERM"  # a peer's signal; preemption is the usual cause
        raise TrainingInterrupted(signal_name, run.state.global_step, _save(run)) from None
    return time.perf_counter() - tic


def _average_over_real_window(
    accelerator, model, window_samples: int, full_window: int, window_units: torch.Tensor | None = None
) -> None:
    """Collective. The epoch's last window may hold fewer pairs (fewer micro-batches, a short last
    batch): rescale its gradients so the update is the mean over the pairs it really saw, not
    their sum divided by a full window (what accumulate alone, HF Trainer and Lightning do).
    `window_units` (every window of a family whose loss is over units: target tokens, or
    --window_loss_weighting document's weights): this rank's units summed, so the update is the sum of
    every rank's losses over every rank's units (the loss's mean per target token, or the pairs'
    weighted mean), whatever the window's cut: the units' sum replaces the count of pairs. With
    several processes the scale stays on the device: no wait for it."""
    if accelerator.num_processes == 1 and window_units is None:
        if window_samples == full_window:
            return
        scale = full_window / window_samples
    else:
        seen = window_units
        if seen is None:
            seen = torch.tensor(window_samples, device=accelerator.device, dtype=torch.float64)
        scale = full_window / accelerator.reduce(seen, "sum")
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    torch._foreach_mul_(grads, scale)
