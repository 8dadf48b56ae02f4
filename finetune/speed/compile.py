"""torch.compile settings: mode, static shapes over length buckets, regional compilation, the cache.

With `--pad_to_multiple_of` buckets a run meets a handful of batch shapes, so each is compiled once
without dynamic shapes (which CUDA graphs, `reduce-overhead`, need anyway) and later batches replay it.
Inductor's FX graph cache (on by default; TORCHINDUCTOR_CACHE_DIR, default /tmp/torchinductor_<user>)
keeps the compiled code, so the next run on the same shapes skips most compile time.
"""

from __future__ import annotations

import math

import torch
from accelerate.utils import TorchDynamoPlugin

from finetune.config.train_config import TrainConfig
from finetune.data.batching import resolve_pad_to_multiple_of

# Above this many bucket lengths, shapes stay dynamic: every length would otherwise be compiled.
MOST_STATIC_LENGTHS = 8


def bucket_lengths(config: TrainConfig, on_gpu: bool) -> int | None:
    """How many batch lengths the collator can produce, or None when unbucketed (every length)."""
    multiple = int(resolve_pad_to_multiple_of(config.pad_to_multiple_of, on_gpu))
    return math.ceil(config.max_length / multiple) if multiple > 1 else None


def dynamo_plugin(config: TrainConfig, on_gpu: bool) -> TorchDynamoPlugin:
    """Accelerate's compile settings for this run: inductor, `--torch_compile_mode`, regional
    compilation if asked; static shapes when the buckets are few (`MOST_STATIC_LENGTHS`), else
    dynamic ones as before. Raises dynamo's recompile limit (process-wide) to cover the static
    graphs: per length, full and short batches, training and evaluation."""
    lengths = bucket_lengths(config, on_gpu)
    static = lengths is not None and lengths <= MOST_STATIC_LENGTHS
    if static:
        graphs = 4 * lengths + 4
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, graphs)
    return TorchDynamoPlugin(
        backend="inductor",
        mode=config.torch_compile_mode or "default",
        dynamic=not static,
        use_regional_compilation=config.torch_compile_regional,
    )


def compile_counts() -> tuple[int, int, int]:
    """The compile caches' counters so far in this process (FX graph hits and misses, AOTAutograd
    hits); torch never resets them, so a run reports the difference from its start."""
    counters = torch._dynamo.utils.counters
    inductor = counters["inductor"]
    return (
        inductor["fxgraph_cache_hit"],
        inductor["fxgraph_cache_miss"],
        counters["aot_autograd"]["autograd_cache_hit"],
    )


def compile_cache_line(since: tuple[int, int, int] = (0, 0, 0)) -> str:
    """What the compile caches served this run (counted from `since`, `compile_counts()` at its start):
    one line for the run's log."""
    hits, misses, aot_hits = (now - then for now, then in zip(compile_counts(), since, strict=True))
    reused = "compile cache hit" if hits else "compile cache missed"
    return (
        f"torch.compile: {reused}: {hits} graph(s) from inductor's FX graph cache, {misses} compiled, "
        f"{aot_hits} AOTAutograd cache hit(s)"
    )
