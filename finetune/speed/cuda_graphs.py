"""--cuda_graphs: each micro-batch shape's forward, loss and backward captured once as a CUDA graph and
replayed for every later batch of that shape.

Why: on a GPU a BERT-base step at batch 32 is bound by Python launching kernels one by one
(docs/benchmarks.md); a replay launches them all in one call. Unlike --torch_compile_mode reduce-overhead,
nothing is compiled: a new shape costs two eager forward and backward passes (the warm-up) and the capture.

What a graph holds: zeroing the gradients, forward, loss, backward. What stays eager, a few launches: the
last window's averaging, clipping, the NaN guard, the fused AdamW step, the schedule. The gradients live in
fixed tensors that every graph zeroes and accumulates into, so the optimizer reads one set whatever the
shape; eager zero_grad is skipped. Parameters the first warm-up leaves without a gradient keep none, as in
eager steps (fused AdamW skips them). Every graph draws on one memory pool, kept through the run's
evaluations: one graph runs at a time, its inputs, the weights and the gradients live outside the pool,
and its output (the summed loss) is read before the next replay.

What cannot be captured is found before any capture begins: the warm-up's second pass runs with
torch's sync debug mode raising at the first wait for the device (a data-dependent shape, `.item()`),
and `auto` then trains eagerly with a note. A capture that fails after it began fails the run: CUDA's
generator and allocator are not left in a state to go on from. Python-side decisions (a random layer
drop drawn on the CPU) are frozen at capture; none of the measured encoders make one.

Dropout: replays advance CUDA's random offset as eager steps would, and the warm-up puts back the random
state it drew from, so a run resumed from a checkpoint draws the same masks.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from accelerate.utils import DistributedType, DynamoBackend

from finetune.config.train_config import TrainConfig
from finetune.errors import ConfigError, TrainingFailed

MOST_GRAPHS = 32
"""Shapes captured at most; later new shapes run eagerly (bucketed batches meet a handful)."""


def cuda_graphs_for(args: TrainConfig, accelerator) -> str:
    """`resolve_cuda_graphs` with this launch's facts, before the data and the model load (--padding_free
    auto is off wherever CUDA graphs could be on)."""
    alone = accelerator.num_processes == 1 and accelerator.distributed_type == DistributedType.NO
    compiled = accelerator.state.dynamo_plugin.backend != DynamoBackend.NO  # the flag or an accelerate config
    return resolve_cuda_graphs(
        args, accelerator.device.type, alone, accelerator.mixed_precision, compiled, args.padding_free
    )


def resolve_cuda_graphs(
    args: TrainConfig, device_type: str, alone: bool, mixed_precision: str, compiled: bool, padding_free: str
) -> str:
    """--cuda_graphs as "true" or "false". auto: on where a graph replays the whole micro-batch (one
    CUDA process without FSDP or DeepSpeed (`alone`), no accumulation, bucketed fixed shapes, a model
    not `compiled` by the flag or the accelerate config); `true` where that is not so is refused, naming
    what stands in the way. `padding_free`: the resolved choice."""
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
        (
            args.torch_compile or compiled,
            "an uncompiled model",
            "drop --torch_compile or the accelerate config's dynamo_config (reduce-overhead has graphs)",
        ),  # fmt: skip
        (padding_free in ("true", "varlen"), "padded batches", "use --padding_free false"),
        (args.pad_to_multiple_of == "1", "bucketed lengths", "use --pad_to_multiple_of 8 or 32"),
        (args.gradient_checkpointing, "no gradient checkpointing", "drop --gradient_checkpointing"),
        (mixed_precision == "fp16", "bf16 or fp32 (fp16's loss scaler is not captured)", "use bf16"),
    ]
    blocked = [(need, fix) for hit, need, fix in blockers if hit]
    if args.cuda_graphs == "true" and blocked:
        need, fix = blocked[0]
        raise ConfigError(f"--cuda_graphs true needs {need}; {fix}", flag="--cuda_graphs", fix=fix)
    return "false" if blocked else "true"


class NotCapturable(RuntimeError):
    """This micro-batch cannot be replayed from a graph: it waits for the device, or its shape gives
    gradients to other parameters than the first shape's."""


class GraphedSteps:
    """The training micro-batches of one run as CUDA graphs, one per shape (see the module's docstring):
    any family's `step`, built by its `step_graphs`."""

    def __init__(self, accelerator, model, step: Callable[[dict], torch.Tensor], strict: bool):
        self.accelerator, self.model = accelerator, model
        self.step = step
        """The family's micro-batch, run eagerly: its inputs (the model's, its targets) to its summed loss,
        the gradients accumulated (the loss divided by the full micro-batch, as the eager step does).
        What a graph captures; nothing in it may wait for the device (copy constants to it first)."""
        self.strict = strict
        """--cuda_graphs true: a shape that cannot be captured fails the run (auto: eager from then on)."""
        self.graphs: dict[tuple, tuple[dict, torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.trainable = [p for p in model.parameters() if p.requires_grad]
        self.grads: list[torch.Tensor] | None = None
        """The fixed gradients every graph writes; set by the first warm-up, with `written` (their
        parameters) and `unwritten` (the trainable ones it gave no gradient)."""
        self.pool = torch.cuda.graph_pool_handle()
        self.stream = torch.cuda.Stream()
        self.eager_only = False

    @property
    def zeroes_gradients(self) -> bool:
        """Whether the graphs zero the gradients (so the loop must not replace them): False once `auto`
        fell back to eager steps, which the loop zeroes as it does without graphs."""
        return not self.eager_only

    def forward_backward(self, inputs: dict):
        """The micro-batch's summed loss (valid until the next call), its gradients in the parameters'
        `.grad` (this micro-batch's alone: no accumulation). `inputs`: `step`'s, tensors of fixed shapes."""
        if self.eager_only:
            return self._step(inputs, zero=False)
        if self.grads and self.grads[0] is not self.written[0].grad:
            # The graphs write into the tensors they captured: after an eager zero_grad(set_to_none=True)
            # the optimizer would read new ones that no replay writes (one check, not one per tensor).
            raise RuntimeError("--cuda_graphs: the parameters' gradients were replaced after capture")
        key = tuple((name, tuple(t.shape), t.dtype) for name, t in inputs.items())
        entry = self.graphs.get(key)
        if entry is None and len(self.graphs) >= MOST_GRAPHS:
            return self._step(inputs)
        if entry is None:
            entry = self._capture(key, inputs)
            if entry is None:  # auto, and this shape cannot be captured: eager from now on
                return self._step(inputs, zero=False)
        static, graph, summed = entry
        for name, tensor in inputs.items():
            static[name].copy_(tensor, non_blocking=True)
        for parameter in self.unwritten:  # an eager step past MOST_GRAPHS may have given one a gradient
            parameter.grad = None
        graph.replay()
        return summed

    def _step(self, inputs: dict, zero: bool = True) -> torch.Tensor:
        """What a graph holds, run eagerly: zero the fixed gradients (parameters without one keep none,
        as after eager's zero_grad), forward, loss, backward."""
        if zero and self.grads is not None:
            torch._foreach_zero_(self.grads)
            for parameter in self.unwritten:  # nothing to capture: their gradients stay None
                parameter.grad = None
        return self.step(dict(inputs)).detach()

    def _capture(self, key: tuple, inputs: dict):
        """Warm up this shape eagerly on the capture stream (lazy initialisation must not happen inside a
        capture), the second time with every wait for the device raising; put the random state back;
        capture. Returns the entry, or None where auto gives up before capturing."""
        static = {name: tensor.clone() for name, tensor in inputs.items()}  # outside the pool
        random_state = torch.cuda.get_rng_state()
        try:
            self._warm_up(static)
        except NotCapturable as error:
            torch.cuda.set_rng_state(random_state)
            return self._not_capturable(key, error)
        torch.cuda.set_rng_state(random_state)
        current = torch.cuda.current_stream()
        try:
            graph, summed = record_graph(functools.partial(self._step, static), self.pool, self.stream)
        except torch.OutOfMemoryError:
            raise  # the run's own out-of-memory advice
        except RuntimeError as error:
            raise TrainingFailed(
                f"--cuda_graphs: capturing a batch of shape {_shapes(key)} failed ({_first_line(error)}); "
                "use --cuda_graphs false"
            ) from error
        finally:
            torch.cuda.set_stream(current)  # a failed capture leaves its stream current
        self.graphs[key] = (static, graph, summed)
        return self.graphs[key]

    def _warm_up(self, static: dict) -> None:
        """This micro-batch eagerly on the capture stream, twice: as it comes (an error there is the
        model's own, raised as it is), then with every wait for the device raising, noting which
        parameters get a gradient (two eager steps per shape). The first shape's decides the fixed
        gradients; a later shape must give gradients to the same parameters. Raises NotCapturable."""
        fresh = self.grads is None
        if fresh:
            for parameter in self.trainable:
                parameter.grad = None
        self.stream.wait_stream(torch.cuda.current_stream())
        previous = torch.cuda.get_sync_debug_mode()
        received = set()  # ids: a set of tensors would compare two of them with == on a hash collision
        hooks = [p.register_post_accumulate_grad_hook(lambda p: received.add(id(p))) for p in self.trainable]
        try:
            with torch.cuda.stream(self.stream):
                self._step(static)  # lazy initialisation (kernels, handles) may wait for the device once
                received.clear()
                torch.cuda.set_sync_debug_mode("error")
                try:
                    self._step(static)  # what a replay would hold: no wait for the device allowed
                except torch.OutOfMemoryError:
                    raise
                except RuntimeError as error:
                    raise NotCapturable(_first_line(error)) from error
        finally:
            torch.cuda.set_sync_debug_mode(previous)
            torch.cuda.current_stream().wait_stream(self.stream)
            for hook in hooks:
                hook.remove()
        if fresh:
            self.written = [p for p in self.trainable if id(p) in received]
            self.unwritten = [p for p in self.trainable if id(p) not in received]
            self.grads = [p.grad for p in self.written]
        elif received != {id(p) for p in self.written}:
            raise NotCapturable("this batch shape gives gradients to other parameters than the first")

    def _not_capturable(self, key: tuple, error: NotCapturable) -> None:
        """--cuda_graphs true: the run fails naming the shape. auto: a note (rank 0 prints; nothing
        collective here), and eager steps from now on."""
        reason = _first_line(error)
        if self.strict:
            raise TrainingFailed(
                f"--cuda_graphs true: a batch of shape {_shapes(key)} cannot be captured ({reason}); "
                "use --cuda_graphs false"
            ) from error
        self.eager_only = True
        self.graphs.clear()  # and their memory pool
        for parameter in self.trainable:  # the warm-up's gradients go; the loop zeroes them from now on
            parameter.grad = None
        if self.accelerator.is_main_process:
            print(f"note: --cuda_graphs auto: cannot capture this model ({reason}); training goes on eagerly")


def record_graph(step, pool, stream) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """`step()` captured, not run, as a CUDA graph; its output tensor, which every replay overwrites."""
    graph = torch.cuda.CUDAGraph()
    # thread_local: a DataLoader's pin-memory thread (--dataloader_num_workers > 0) allocating pinned host
    # memory mid-capture would otherwise break the capture and then its own next batch (torch's "global").
    with torch.cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
        output = step()
    return graph, output


def _shapes(key: tuple) -> dict:
    return {name: shape for name, shape, _ in key}


def _first_line(error: BaseException) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__
