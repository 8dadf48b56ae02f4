"""--cuda_graphs: each micro-batch shape's forward, loss and backward captured once as a CUDA graph and
replayed for every later batch of that shape.

Why: on a GPU a BERT-base step at batch 32 is bound by Python launching its ~1,500 kernels one by one
(docs/benchmarks.md); a replay launches them all in one call. Unlike --torch_compile_mode reduce-overhead,
nothing is compiled: a new shape costs one eager forward and backward (the warm-up) and the capture.

What a graph holds: zeroing the gradients, forward, loss, backward. What stays eager, a few launches: the
last window's averaging, clipping, the NaN guard, the fused AdamW step, the schedule. The gradients live in
fixed tensors that every graph zeroes and accumulates into, so the optimizer reads one set whatever the
shape; eager zero_grad is skipped. Every graph draws on one memory pool: one graph runs at a time, its
inputs, the weights and the gradients live outside the pool, and its output (the summed loss) is read
before the next replay.

Dropout: replays advance CUDA's random offset as eager steps would, and the warm-up puts back the random
state it drew from, so a run resumed from a checkpoint draws the same masks.
"""

from __future__ import annotations

import functools

import torch

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError, TrainingFailed
from finetune.training.evaluation import loss_sum

MOST_GRAPHS = 32
"""Shapes captured at most; later new shapes run eagerly (bucketed batches meet a handful)."""


def resolve_cuda_graphs(args: TrainConfig, device_type: str, alone: bool, mixed_precision: str) -> str:
    """--cuda_graphs as "true" or "false". auto: on where a graph replays the whole micro-batch (one
    CUDA process without FSDP or DeepSpeed (`alone`), no accumulation, bucketed fixed shapes, eager
    model); `true` where that is not so is refused, naming what stands in the way."""
    if args.cuda_graphs == "false" or not args.do_train:
        return "false"
    blockers = [
        (device_type != "cuda", "a CUDA device", "drop it on this machine"),
        (
            not alone,
            "one process without FSDP or DeepSpeed (they communicate inside backward)",
            "drop it with several processes",
        ),  # fmt: skip
        (
            args.gradient_accumulation_steps > 1 or args.auto_find_batch_size,
            "no gradient accumulation",
            "drop --gradient_accumulation_steps and --auto_find_batch_size, or --cuda_graphs",
        ),  # fmt: skip
        (args.torch_compile, "an uncompiled model", "drop --torch_compile (reduce-overhead has graphs)"),
        (args.padding_free in ("true", "varlen"), "padded batches", "use --padding_free false"),
        (args.pad_to_multiple_of == "1", "bucketed lengths", "use --pad_to_multiple_of 8 or 32"),
        (args.gradient_checkpointing, "no gradient checkpointing", "drop --gradient_checkpointing"),
        (mixed_precision == "fp16", "bf16 or fp32 (fp16's loss scaler is not captured)", "use bf16"),
    ]
    blocked = [(need, fix) for hit, need, fix in blockers if hit]
    if args.cuda_graphs == "true" and blocked:
        need, fix = blocked[0]
        raise ConfigError(f"--cuda_graphs true needs {need}; {fix}", flag="--cuda_graphs", fix=fix)
    return "false" if blocked else "true"


class GraphedSteps:
    """The training micro-batches of one run as CUDA graphs, one per shape (see the module's docstring)."""

    def __init__(self, accelerator, model, task, batch_divisor: int, strict: bool):
        self.accelerator, self.model, self.task = accelerator, model, task
        self.batch_divisor = batch_divisor
        """The loss is divided by the full micro-batch, as the eager step does."""
        self.strict = strict
        """--cuda_graphs true: a shape that cannot be captured fails the run (auto: eager from then on)."""
        self.graphs: dict[tuple, tuple[dict, torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.grads: list[torch.Tensor] | None = None
        trainable = next(p for p in model.parameters() if p.requires_grad)
        self.first_grad_of = lambda: trainable.grad
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.eager_only = False

    def forward_backward(self, batch: dict, labels: torch.Tensor, weight: torch.Tensor | None):
        """The micro-batch's summed loss (valid until the next call), its gradients in the parameters'
        `.grad` (this micro-batch's alone: no accumulation)."""
        inputs = {**batch, "labels": labels} | ({} if weight is None else {"weight": weight})
        if self.grads is None:
            self.grads = _fixed_gradients(self.model)
        elif self.grads[0] is not self.first_grad_of():
            # The graphs write into the tensors they captured: after an eager zero_grad(set_to_none=True)
            # the optimizer would read new ones that no replay writes (one check, not one per tensor).
            raise RuntimeError("--cuda_graphs: the parameters' gradients were replaced after capture")
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in inputs.items())
        entry = self.graphs.get(key)
        if entry is None and (self.eager_only or len(self.graphs) >= MOST_GRAPHS):
            return self._step(inputs)
        if entry is None:
            entry = self._capture(key, inputs)
            if entry is None:  # auto, and this shape could not be captured: eager from now on
                return self._step(inputs)
        static, graph, summed = entry
        for name, tensor in inputs.items():
            static[name].copy_(tensor, non_blocking=True)
        graph.replay()
        return summed

    def _step(self, inputs: dict) -> torch.Tensor:
        """What a graph holds, run eagerly: zero the fixed gradients, forward, loss, backward."""
        torch._foreach_zero_(self.grads)
        batch = dict(inputs)
        labels, weight = batch.pop("labels"), batch.pop("weight", None)
        summed = loss_sum(self.model(**batch).logits, labels, self.task, weight)
        self.accelerator.backward(summed / self.batch_divisor)
        return summed.detach()

    def _capture(self, key: tuple, inputs: dict):
        """Warm up this shape eagerly on the capture stream (lazy initialisation must not happen inside a
        capture), put the random state back, and capture. Returns the entry, or None where auto gives up."""
        static = {name: tensor.clone() for name, tensor in inputs.items()}  # outside the pool
        random_state = torch.cuda.get_rng_state()
        try:
            self.stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(self.stream):
                self._step(static)
            torch.cuda.current_stream().wait_stream(self.stream)
            torch.cuda.set_rng_state(random_state)
            graph, summed = record_graph(functools.partial(self._step, static), self.pool, self.stream)
        except RuntimeError as error:  # an operation that cannot be captured (a host read, a pageable copy)
            torch.cuda.set_rng_state(random_state)
            reason = str(error).splitlines()[0][:200]
            if self.strict:
                raise TrainingFailed(
                    f"--cuda_graphs true: a batch of shape {dict((n, s) for n, s, _ in key)} could not be "
                    f"captured ({reason}); use --cuda_graphs false"
                ) from error
            self.eager_only = True
            if self.accelerator.is_main_process:  # rank 0 only prints; nothing collective here
                print(f"note: --cuda_graphs auto: capture failed ({reason}); training continues eagerly")
            return None
        self.graphs[key] = (static, graph, summed)
        return self.graphs[key]


def record_graph(step, pool, stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step()` captured, not run, as a CUDA graph; its output tensor, which every replay overwrites."""
    graph = torch.cuda.CUDAGraph()
    # thread_local: a DataLoader's pin-memory thread (--dataloader_num_workers > 0) allocating pinned host
    # memory mid-capture would otherwise break the capture and then its own next batch (torch's "global").
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        output = step()
    return graph, output


def _fixed_gradients(model) -> list[torch.Tensor]:
    """Every trainable parameter's gradient, made zeros if missing: the tensors every graph writes."""
    grads = []
    for parameter in model.parameters():
        if parameter.requires_grad:
            if parameter.grad is None:
                parameter.grad = torch.zeros_like(parameter)
            grads.append(parameter.grad)
    return grads
