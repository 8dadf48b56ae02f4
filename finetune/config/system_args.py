"""The system group of flags: precision, the speed paths, memory, compilation, data workers, DDP."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from finetune.errors import ConfigError

MixedPrecision = Literal["auto", "no", "bf16", "fp16"]
DropoutKernel = Literal["auto", "packed", "torch"]
AutoSwitch = Literal["auto", "true", "false"]
PaddingFree = Literal["auto", "true", "false", "varlen"]
TorchCompileMode = Literal["default", "reduce-overhead", "max-autotune"]
DdpCommHook = Literal["none", "fp16", "bf16"]


@dataclass(frozen=True)
class SystemArgs:
    """System and speed: precision, the speed paths, memory, compilation, data workers, DDP."""

    mixed_precision: MixedPrecision = "auto"
    """auto (the accelerate config's bf16/fp16, else bf16 where the device multiplies it natively, else fp32),
    no, bf16 or fp16."""
    pad_to_multiple_of: str = "auto"
    """Pad each batch's length up to a multiple of N tokens (capped at --max_length), so a compiled model
    meets few shapes: 32 gives 4 at --max_length 128. auto: 8 on CUDA (tensor cores), none on CPU (padding
    there is only extra work). A number also has attention masks built without asking the device whether a
    batch holds padding (no wait per forward)."""
    keep_freed_memory: AutoSwitch = "auto"
    """On CPU with glibc, keep freed memory in the heap for reuse: no page faults re-mapping each step's
    embedding gradient, at the cost of keeping memory freed after the peak. auto: on when the CPU trains in
    bf16, where the saved faults pay; off in fp32, where they do not (docs/benchmarks.md); false leaves
    glibc's own behaviour untouched."""
    gradient_checkpointing: bool = False
    """Recompute each layer's activations in the backward pass instead of storing them: less memory, one more
    forward pass of compute per step."""
    torch_compile: bool = False
    """Compile the model with torch.compile (inductor; static shapes over --pad_to_multiple_of buckets). Pays
    off only on long GPU runs, where the steps saved outweigh the compile time (docs/benchmarks.md gives the
    break-even); on CPU eager is faster. Evaluation runs the model uncompiled."""
    torch_compile_mode: TorchCompileMode | None = None
    """torch.compile mode; setting it implies --torch_compile. reduce-overhead replays forward and backward as
    CUDA graphs (pair it with --pad_to_multiple_of 32); unset: torch's default."""
    torch_compile_regional: bool = False
    """With --torch_compile, compile each repeated encoder layer once and reuse it (Accelerate's regional
    compilation): shorter compiles, graph breaks between layers."""
    full_determinism: bool = False
    """Deterministic kernels only (HF Trainer's flag: transformers' enable_full_determinism; slower). On CUDA
    two runs of the same flags otherwise differ in the last bits, so a resumed run cannot match an unbroken
    one bit for bit; on CPU they match without it."""
    dataloader_num_workers: int = 0
    """Worker processes feeding each training process."""
    peak_tflops: float | None = None
    """Peak TFLOP/s of one device in the training precision, for MFU in logs and results.json (bf16 dense:
    H100 SXM 989, A100 312; `make bench` measures a CPU's); unset: no MFU."""
    ddp_bucket_cap_mb: int = 25
    """Gradient bucket size in MB for DDP all-reduce."""
    ddp_find_unused_parameters: bool = False
    """Let DDP tolerate parameters without gradients (slower; only for models that need it)."""
    ddp_gradient_as_bucket_view: bool = True
    """Gradients as views into DDP's buckets: saves one gradient-sized copy of memory."""
    ddp_comm_hook: DdpCommHook = "none"
    """Compress gradients for all-reduce: none, fp16 or bf16 (halves traffic, for slow interconnects)."""
    config: str | None = None
    """YAML file holding any of these keys; command-line flags override it. Paths in it are read from the
    working directory, as on the command line (not from the file's folder)."""
    debug: bool = False
    """Show full Python tracebacks for errors instead of one line."""

    def __post_init__(self):
        """Checks of this group's flags alone; --torch_compile_mode implies --torch_compile."""
        if self.dataloader_num_workers < 0:
            raise ConfigError(f"--dataloader_num_workers must be >= 0, got {self.dataloader_num_workers}")
        if self.ddp_bucket_cap_mb <= 0:
            raise ConfigError(f"--ddp_bucket_cap_mb must be a positive integer, got {self.ddp_bucket_cap_mb}")
        if self.peak_tflops is not None and self.peak_tflops <= 0:
            raise ConfigError(f"--peak_tflops must be > 0 or left unset, got {self.peak_tflops}")
        if self.pad_to_multiple_of != "auto" and not (
            self.pad_to_multiple_of.isdigit() and int(self.pad_to_multiple_of) > 0
        ):
            raise ConfigError(
                f"--pad_to_multiple_of must be a positive integer or auto, got {self.pad_to_multiple_of!r}"
            )
        if self.torch_compile_mode is not None:
            object.__setattr__(self, "torch_compile", True)  # as in transformers' TrainingArguments
