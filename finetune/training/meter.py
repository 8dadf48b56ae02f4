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
        samples = torch.tensor(float(self.samples), device=self.loss.device, dtype=self.loss.dtype)
        loss_total, samples, tokens, weights = accelerator.reduce(
            torch.stack([self.loss, samples, self.tokens, self.weights]), "sum"
        ).tolist()
        seconds = time.perf_counter() - self.since
        state.log_window = {
            "loss_sum": loss_total,
            "samples": int(samples),
            "tokens": int(tokens),
            "weights": weights,
            "seconds": seconds,
        }
        state.train_runtime_s, state.eval_runtime_s = self.run_seconds()

    def add(self, summed_loss: torch.Tensor, attention_mask: torch.Tensor, samples: int, weights=None):
        """`summed_loss` of `samples` pairs; `weights`: the sum of their loss weights (None: 1 each)."""
        self.loss += summed_loss.detach()
        self.tokens += attention_mask.sum()
        self.samples += samples
        if weights is not None:
            self.weights += weights

    def flush(self, accelerator, state: TrainState) -> tuple[float, int, int, float]:
        """Collective: every rank's sums, added to the run's totals: (the loss's weighted mean, pairs,
        tokens, seconds)."""
        samples = torch.tensor(float(self.samples), device=self.loss.device, dtype=self.loss.dtype)
        loss_total, samples, tokens, weights = accelerator.reduce(
            torch.stack([self.loss, samples, self.tokens, self.weights]), "sum"
        ).tolist()
        state.samples_seen += int(samples)
        state.tokens_seen += int(tokens)
        now = time.perf_counter()
        seconds, self.since = now - self.since, now
        self.loss.zero_(), self.tokens.zero_(), self.weights.zero_()
        self.samples = 0
        return loss_total / (weights or max(samples, 1)), int(samples), int(tokens), seconds


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
