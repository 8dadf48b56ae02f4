"""What every family's evaluation shares: its progress bar, the stop that abandons it, and the forward
without Accelerate's autocast that the exported model computes."""

from __future__ import annotations

import contextlib

from tqdm.auto import tqdm


def progress(accelerator, loader, desc: str):
    """A progress bar over `loader`'s batches, made as training's is (on each machine's first rank, to
    stderr): evaluation, generation and prediction can take minutes. Nested under the training bar it is
    cleared when done (`leave=None`: kept only as the one bar), so an evaluate-only or predicting run keeps
    its final line and a training run only its `step N: ...` lines. A context manager: closed before any
    error message."""
    return tqdm(loader, desc=desc, unit="batch", leave=None, disable=not accelerator.is_local_main_process)


class EvaluationAbandoned(Exception):
    """A stop signal arrived during evaluation: it is dropped, not finished, so the checkpoint comes
    within seconds (a preemption notice gives ~30 s)."""


def autocasts(model) -> bool:
    """Whether Accelerate runs the (unwrapped) model's forward under autocast (`--mixed_precision` bf16 or
    fp16): then evaluations during training round where the exported weights do not."""
    return "forward" in model.__dict__ and getattr(model, "_original_forward", None) is not None


def autocasts_now(model) -> bool:
    """Whether the (unwrapped) model's forward runs under Accelerate's autocast at this moment: it
    `autocasts` and is not inside `without_autocast`."""
    return autocasts(model) and model.__dict__["forward"] is not model._original_forward


@contextlib.contextmanager
def without_autocast(model):
    """The model's (unwrapped) forward without Accelerate's autocast (`--mixed_precision bf16` over fp32
    weights): what the exported model computes, in its weights' dtype, for predictions that must be its
    own (`pipeline` answers as predictions.jsonl; a generated token rounded otherwise would change every
    token after it)."""
    if not autocasts(model):
        yield
        return
    wrapped, model.forward = model.forward, model._original_forward
    try:
        yield
    finally:
        model.forward = wrapped
