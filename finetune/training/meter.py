"""Loss, samples (and their loss weights), tokens and seconds since the last log line, kept on the
device; epochs and MFU as metrics.jsonl writes them."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import torch

from finetune.training.checkpoint import TrainState

if TYPE_CHECKING:  # annotations only: training/loop.py imports this module
    from finetune.training.loop import Run


class _Meter:
    """Per-rank sums since the last log line, kept on the device so the hot path never waits for
    the GPU; they are reduced across ranks only when a line is logged or a checkpoint written. Also
    this segment's clock: training and evaluation seconds since train() began."""

    def __init__(self, accelerator, state: TrainState):
        device = accelerator.device
        # Resumed: the window the checkpoint left open, summed over ranks, goes on in rank 0's sums
        # (a line adds every rank's), so the next line covers the same steps as an unbroken run's.
        window = (state.log_window if accelerator.is_main_process else None) or {}
        self.loss = torch.tensor(window.get("loss_sum", 0.0), device=device, dtype=torch.float64)
        self.tokens = torch.tensor(float(window.get("tokens", 0)), device=device, dtype=torch.float64)
        self.samples = window.get("samples", 0)
        # The loss's weights summed (--window_loss_weighting document); 0 when each pair weighs 1, so an
        # unweighted step adds nothing here (no extra kernel launch a step on a GPU).
        self.weights = torch.tensor(float(window.get("weights", 0.0)), device=device, dtype=torch.float64)
        # The family's named (sum, count) pairs (`MicroBatch.metrics`), in the order first added.
        self.metrics = {
            name: torch.tensor(pair, device=device, dtype=torch.float64)
            for name, pair in window.get("metrics", {}).items()
        }
        self.grad_norm = torch.zeros((), device=device)
        """The last step's gradient norm, on the device until a line is logged."""
        self.started = time.perf_counter()
        self.since = self.started - window.get("seconds", 0.0)
        """Start of the open window's training time (evaluations pushed it on)."""
        self.eval_seconds = 0.0
        """This segment's evaluation seconds."""
        self.earlier_s = (state.train_runtime_s, state.eval_runtime_s)
        """Training and evaluation seconds of the run's earlier segments (0 in a fresh run)."""

    def exclude(self, eval_seconds: float) -> None:
        """Evaluation time is neither training time nor window throughput."""
        self.since += eval_seconds
        self.eval_seconds += eval_seconds

    def run_seconds(self) -> tuple[float, float]:
        """The run's training and evaluation seconds so far, this segment's plus the earlier ones'."""
        train_s = time.perf_counter() - self.started - self.eval_seconds
        return self.earlier_s[0] + train_s, self.earlier_s[1] + self.eval_seconds

    def keep_in(self, accelerator, state: TrainState) -> None:
        """Collective (one all-reduce and read, at a checkpoint: a wait anyway): the open window's sums
        over every rank and the run's seconds into `state`, for a run resumed from it."""
        (loss_total, samples, tokens, weights), metrics = self._reduced(accelerator)
        seconds = time.perf_counter() - self.since
        state.log_window = {
            "loss_sum": loss_total,
            "samples": int(samples),
            "tokens": int(tokens),
            "weights": weights,
            "seconds": seconds,
        }
        if metrics:  # absent for the families without metrics: their checkpoints stay as they were
            state.log_window["metrics"] = metrics
        state.train_runtime_s, state.eval_runtime_s = self.run_seconds()

    def add(self, summed_loss: torch.Tensor, tokens: torch.Tensor, samples: int, weights=None):
        """`summed_loss` of `samples` pairs and `tokens` real tokens; `weights`: the sum of their loss
        weights (None: 1 each)."""
        self.loss += summed_loss.detach()
        self.tokens += tokens
        self.samples += samples
        if weights is not None:
            self.weights += weights

    def add_metrics(self, metrics: dict) -> None:
        """A micro-batch's named (sum, count) pairs, added on the device (a placeholder's are zeros: every
        rank holds the same names, so the all-reduce's sizes agree)."""
        for name, (total, count) in metrics.items():
            pair = torch.stack([total.detach().to(torch.float64), count.detach().to(torch.float64)])
            kept = self.metrics.get(name)
            self.metrics[name] = pair if kept is None else kept + pair

    def _reduced(self, accelerator) -> tuple[list[float], dict[str, list[float]]]:
        """Collective: one all-reduce of the loss, samples, tokens, weights and every metric's pair, read
        once: ([loss, samples, tokens, weights], {name: [sum, count]})."""
        samples = torch.tensor(float(self.samples), device=self.loss.device, dtype=self.loss.dtype)
        names = list(self.metrics)
        parts = [self.loss, samples, self.tokens, self.weights]
        if names:  # the families without metrics reduce the same 4 values as before
            parts += [value for name in names for value in self.metrics[name]]
        values = accelerator.reduce(torch.stack(parts), "sum").tolist()
        metrics = {name: values[4 + 2 * i : 6 + 2 * i] for i, name in enumerate(names)}
        return values[:4], metrics

    def flush(self, accelerator, state: TrainState) -> tuple[float, int, int, float, dict]:
        """Collective: every rank's sums, added to the run's totals: (the loss's weighted mean, pairs,
        tokens, seconds, {metric: its sum over its count})."""
        (loss_total, samples, tokens, weights), metrics = self._reduced(accelerator)
        state.samples_seen += int(samples)
        state.tokens_seen += int(tokens)
        now = time.perf_counter()
        seconds, self.since = now - self.since, now
        self.loss.zero_(), self.tokens.zero_(), self.weights.zero_()
        for pair in self.metrics.values():
            pair.zero_()
        self.samples = 0
        means = {name: total / count for name, (total, count) in metrics.items() if count}
        return loss_total / (weights or max(samples, 1)), int(samples), int(tokens), seconds, means


def _fractional_epoch(run: Run) -> float:
    """Epochs done, with the micro-batches of the one in progress (metrics.jsonl's `epoch`)."""
    state = run.state
    return round(state.epoch + state.micro_batches_in_epoch / run.plan.micro_batches_per_epoch, 4)


def model_flops_utilization(run: Run, tokens_per_second: float, key: str) -> dict:
    """{key: useful-token MFU} (real tokens only, over the peak of every device), or {} without
    --peak_tflops."""
    peak = run.config.peak_tflops
    if peak is None:
        return {}
    return {key: run.flops_per_token * tokens_per_second / (peak * 1e12 * run.accelerator.num_processes)}
