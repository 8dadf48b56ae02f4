"""The Accelerator for this machine: CPU or GPU, precision, world size, trackers; a restarted job's
process group."""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import (
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DistributedType,
    parse_flag_from_env,
)

from finetune.config.train_config import TrainConfig
from finetune.distributed.fsdp import engage_fsdp_on_cpu, gate_lifted, reduce_in_fp32
from finetune.distributed.gloo_address import check_gloo_address
from finetune.distributed.launch_env import launcher_world_size
from finetune.distributed.ranks import check_world_size
from finetune.errors import ConfigError
from finetune.speed.compile import dynamo_plugin
from finetune.speed.hardware import bf16_is_fast, cpu_class


def resolve_mixed_precision(requested: str) -> str:
    """`auto`: a launcher/config that asks for bf16 or fp16 wins, else bf16 where it is fast, else fp32."""
    if requested != "auto":
        return requested
    launcher = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
    if launcher != "no":
        return launcher
    return "bf16" if bf16_is_fast() else "no"


def build_accelerator(config: TrainConfig, trackers: list[str]) -> Accelerator:
    """Collective: the Accelerator (it joins the launcher's process group), or a ConfigError for a
    launch that would not train one model."""
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
    if not torch.cuda.is_available():
        check_gloo_address()  # every rank, before the process group that would wait 30 minutes
    join_restarted_job()
    # A run starts from Accelerate's defaults. Its singletons outlive an earlier run in this process (a
    # notebook's, a script's, the last seed's), and an Accelerator asking another precision than that
    # run's is refused ("AcceleratorState has already been initialized").
    fresh_accelerate_state()
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
    # An FSDP config shards on CPU too (Accelerate alone would run it as DDP there).
    engage_fsdp_on_cpu(accelerator)
    reduce_in_fp32(accelerator)  # bf16 compute, fp32 gradient reduction (GPU and CPU alike)
    lone = accelerator.distributed_type == DistributedType.NO and parse_flag_from_env("ACCELERATE_USE_FSDP")
    if lone:
        print("notice: the accelerate config asks for FSDP, but one process has nothing to shard across")
    if torch.cuda.is_available():
        # TF32 matmuls on Ampere+ cost ~nothing in accuracy for fine-tuning and are several times faster.
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return accelerator


def join_restarted_job() -> None:
    """Collective: after a torchrun/`accelerate launch --max_restarts` restart, join the process group
    under a store prefix of this attempt.

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


def describe_runtime(accelerator) -> dict:
    return {
        "world_size": accelerator.num_processes,
        "distributed_type": accelerator.distributed_type.value,  # NO, MULTI_CPU, MULTI_GPU, FSDP, ...
        "device": str(accelerator.device),
        "mixed_precision": accelerator.mixed_precision,
        **({"fsdp_gate_lifted": True} if gate_lifted(accelerator) else {}),
        # What the CPU rules saw (finetune/speed/hardware.py): results from another class differ in speed.
        **({"cpu_class": cpu_class()} if accelerator.device.type == "cpu" else {}),
        **({"torch_threads": torch.get_num_threads()} if accelerator.device.type == "cpu" else {}),
    }


def fresh_accelerate_state() -> None:
    """Before another run in this process (the next seed or trial): Accelerate keeps process-wide
    singletons (precision, accumulation, the active dataloaders) that the next Accelerator would reuse.
    The process group stays: every rank calls this between the same two runs."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def leave_process_group() -> None:
    """Collective: a study's runs kept the launcher's process group (`run_config(keep_process_group=True)`:
    one made again in the same job can read the first one's stale addresses from the launcher's store);
    at the study's end every rank leaves it together."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
