"""The Accelerator for this machine: CPU or GPU, precision, world size, trackers."""

from __future__ import annotations

import ctypes
import hashlib
import os
import signal
import sys
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    gather_object,
)

from finetune.compile import dynamo_plugin
from finetune.config import ConfigError, TrainConfig


def bf16_is_fast() -> bool:
    """CUDA with bf16 tensor cores, or a CPU with native bf16 matrix instructions (AVX512-BF16/AMX).

    Not oneDNN's `_is_mkldnn_bf16_supported()`: it is also true on plain AVX-512 CPUs (Skylake to
    Ice Lake Xeons), which emulate bf16 and train slower in it than in fp32 (docs/log.md, 2026-11-23).
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    native = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private; absent on older torch
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in native)


def resolve_mixed_precision(requested: str) -> str:
    """`auto`: a launcher/config that asks for bf16 or fp16 wins, else bf16 where it is fast, else fp32."""
    if requested != "auto":
        return requested
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher != "no":
        return launcher
    return "bf16" if bf16_is_fast() else "no"


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_MAX = -1, -4


def _glibc_mallopt():
    try:
        return ctypes.CDLL("libc.so.6").mallopt
    except (OSError, AttributeError):
        return None


def is_glibc() -> bool:
    return _glibc_mallopt() is not None


def keep_freed_memory() -> bool:
    """Have glibc keep freed memory for the next allocation instead of handing it back to the kernel.

    Each training step allocates the word embeddings' dense gradient afresh (vocab x hidden: 47 MB
    for MiniLM). glibc serves blocks over its mmap threshold with mmap and unmaps them when freed, so
    every step the kernel maps and zero-fills those pages again. What it costs: memory freed after the
    peak stays with the process. Process-wide and not undone: a run that does not want it never calls
    it, which leaves glibc's adaptive thresholds alone. False where libc is not glibc.
    """
    mallopt = _glibc_mallopt()
    if mallopt is None:
        return False
    kept = {_M_MMAP_MAX: 0, _M_TRIM_THRESHOLD: 2**31 - 1}  # the largest C int mallopt takes
    return all(mallopt(option, value) == 1 for option, value in kept.items())


def resolve_keep_freed_memory(requested: str, device_type: str, mixed_precision: str) -> str:
    """--keep_freed_memory as "true" or "false". auto: on for CPU training in bf16, where the page
    faults it saves pay; off in fp32, where they did not (docs/benchmarks.md). GPUs: off."""
    if requested != "auto":
        return requested
    return "true" if device_type == "cpu" and mixed_precision == "bf16" else "false"


def build_accelerator(config: TrainConfig, trackers: list[str]) -> Accelerator:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible not in (None, "", "-1") and not torch.cuda.is_available():
        raise ConfigError(
            f"the accelerate config asks for GPU(s) {visible} but this machine has no CUDA GPU; "
            "use --config_file accelerate_configs/cpu.yaml (or cpu_multiprocess.yaml)"
        )
    if config.ddp_comm_hook == "bf16" and not torch.cuda.is_available():
        raise ConfigError(
            "--ddp_comm_hook bf16 needs CUDA GPUs with NCCL; use fp16 (works over gloo) or none"
        )
    join_restarted_job()
    ddp = DistributedDataParallelKwargs(
        bucket_cap_mb=config.ddp_bucket_cap_mb,
        find_unused_parameters=config.ddp_find_unused_parameters,
        gradient_as_bucket_view=config.ddp_gradient_as_bucket_view,
        comm_hook=DDPCommunicationHookType("no" if config.ddp_comm_hook == "none" else config.ddp_comm_hook),
    )
    accelerator = Accelerator(
        kwargs_handlers=[ddp],
        # Without CUDA, Accelerate must be told it is on CPU: otherwise processes started by a
        # multi-GPU launcher each come up as rank 0 of 1 and train independent replicas.
        cpu=not torch.cuda.is_available(),
        mixed_precision=resolve_mixed_precision(config.mixed_precision),
        gradient_accumulation_steps=config.gradient_accumulation_steps,
        log_with=trackers or None,
        project_dir=config.output_dir,
        # The schedule is sized in real optimizer steps; by default Accelerate would step it
        # num_processes times per update (the official examples multiply the length to match).
        step_scheduler_with_optimizer=False,
        # None: an accelerate config's dynamo_config (if any) decides.
        dynamo_plugin=dynamo_plugin(config, torch.cuda.is_available()) if config.torch_compile else None,
    )
    check_world_size(launcher_world_size(), accelerator.num_processes)
    if torch.cuda.is_available():
        # TF32 matmuls on Ampere+ cost ~nothing in accuracy for fine-tuning and are several times faster.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return accelerator


def join_restarted_job() -> None:
    """After a torchrun/`accelerate launch --max_restarts` restart, join the process group under a
    store prefix of this attempt.

    The elastic agent keeps one TCPStore for the whole job and the workers' process group reads its
    peers' addresses from it without an attempt prefix (pytorch/pytorch#135712): a restarted rank
    can read the dead attempt's address and fail with "Connection refused" or hang. Every local
    worker of an attempt shares TORCHELASTIC_RESTART_COUNT; Accelerate then uses this group as is.
    """
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if attempt == 0 or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return
    world_size = int(os.environ["WORLD_SIZE"])
    store = torch.distributed.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size, is_master=False
    )
    torch.distributed.init_process_group(
        "nccl" if torch.cuda.is_available() else "gloo",
        store=torch.distributed.PrefixStore(f"finetune/attempt_{attempt}", store),
        rank=int(os.environ["RANK"]),
        world_size=world_size,
    )


def launcher_rank() -> int:
    """This process's global rank as the launcher set it (0 without one), before the Accelerator exists."""
    return int(os.environ.get("RANK", "0"))


def launcher_world_size() -> int:
    """How many processes the launcher started (1 without one), before the Accelerator exists."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def check_world_size(launched: int, joined: int) -> None:
    """Several launched processes that did not join one group would train independent replicas."""
    if launched > 1 and joined != launched:
        raise ConfigError(
            f"the launcher started {launched} processes but Accelerate sees {joined}: "
            "they would train independent copies; check distributed_type and num_processes "
            "in the accelerate config"
        )


def replicas_identical(accelerator, model) -> bool:
    """Collective: whether every rank holds bit-identical parameters (hashes gathered to all ranks)."""
    digest = hashlib.sha256()
    for tensor in accelerator.unwrap_model(model).state_dict().values():
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return len(set(gather_object([digest.hexdigest()]))) == 1


def describe_runtime(accelerator) -> dict:
    return {
        "world_size": accelerator.num_processes,
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
    }


def run_summary(accelerator, config: TrainConfig, plan, resume, global_step: int) -> str:
    """One line, printed once by the main process: what this job really got, every speed path named."""
    job = (
        f"world_size={accelerator.num_processes} device={accelerator.device} "
        f"mixed_precision={accelerator.mixed_precision} "
    )
    weights = f"torch_dtype={config.torch_dtype} attn_implementation={config.attn_implementation}"
    if not config.do_train:
        return job + (
            f"evaluation only: per_device_eval_batch={config.per_device_eval_batch_size} "
            f"padding_free={config.padding_free} pad_to_multiple_of={config.pad_to_multiple_of} "
            f"torch_compile={str(config.torch_compile).lower()} {weights}"
        )
    line = job + (
        f"per_device_batch={config.per_device_train_batch_size} global_batch={plan.global_batch_size} "
        f"steps={plan.total_updates} "
        f"(warmup {plan.warmup_updates}, {plan.updates_per_epoch}/epoch) "
        f"dropout_kernel={config.dropout_kernel} padding_free={config.padding_free} "
        f"keep_freed_memory={config.keep_freed_memory} torch_compile={str(config.torch_compile).lower()} "
        f"pad_to_multiple_of={config.pad_to_multiple_of} "
        f"group_by_length={str(config.group_by_length).lower()} fused_adamw=true "
        f"{weights} gradient_checkpointing={str(config.gradient_checkpointing).lower()}"
    )
    return line + (f" resuming from {resume} at step {global_step}" if resume else "")


class TrainingFailed(Exception):
    """The run cannot go on (out of memory, NaN loss, a failed write); the message says what to do."""


class TrainingInterrupted(Exception):
    """Raised on every rank after a stop signal, once the checkpoint is safely written."""

    def __init__(self, signal_name: str, step: int, checkpoint: Path):
        self.exit_code = 128 + signal.Signals[signal_name].value
        super().__init__(
            f"stopped by {signal_name} after step {step}; checkpoint saved to {checkpoint}; "
            "continue with the same command plus --resume_from_checkpoint auto"
        )


class StopSignals:
    """SIGTERM (preemption) and SIGINT (Ctrl-C) only set a flag; the loop stops at the next step.

    A second Ctrl-C stops at once, without a checkpoint.
    """

    def __init__(self):
        self.received: str | None = None
        self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGTERM, signal.SIGINT)}

    def _handle(self, signum, frame):
        if self.received == "SIGINT" and signum == signal.SIGINT:
            # At once: no step finishes, no checkpoint is written (a half-written one stays under its
            # .partial name, so `auto` never takes it), no traceback.
            print(
                "\nerror: stopped by a second Ctrl-C; no new checkpoint written", file=sys.stderr, flush=True
            )
            os._exit(128 + signal.SIGINT)
        self.received = signal.Signals(signum).name

    def requested(self, accelerator) -> str | None:
        """Collective with several processes: a signal seen by any rank stops all at the same step."""
        if accelerator.num_processes == 1:
            return self.received
        seen = torch.tensor([self.received is not None], dtype=torch.float32, device=accelerator.device)
        if accelerator.reduce(seen, "sum").item() == 0:
            return None
        return self.received or "SIGTERM"  # a peer's signal; preemption is the usual cause

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
