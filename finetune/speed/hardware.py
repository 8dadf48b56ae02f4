"""What this machine computes fast. Every CPU-dependent choice reads the CPU through `cpu_features()`,
one probe point, so a test can put any CPU class under every rule (tests/unit/test_cpu_classes.py).

The classes this project's machines come in, and what the rules make of them:

| class (examples)                       | amx | avx512_bf16 | avx512 | bf16 auto | padding-free auto |
| -------------------------------------- | --- | ----------- | ------ | --------- | ----------------- |
| AMX Xeon (Sapphire Rapids and later)   | yes | yes         | yes    | bf16      | off               |
| AVX512-BF16 (Zen 4, Zen 5, Cooper Lake) | no  | yes         | yes    | bf16      | on                |
| AVX-512 without BF16 (Skylake-Ice Lake) | no  | no          | yes    | fp32      | on                |
| AVX2 (Zen 2, Zen 3; or older)          | no  | no          | no     | fp32      | on                |
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class CpuFeatures(NamedTuple):
    amx: bool
    """AMX tiles: bf16 matrix units (Sapphire Rapids and later Xeons)."""
    avx512_bf16: bool
    """AVX512-BF16: native bf16 dot products (Cooper Lake, Zen 4 and later)."""
    avx512: bool
    """AVX-512 (torch's CPU kernels run their AVX512 build)."""
    avx2: bool
    """AVX2 at least (torch's CPU kernels run their AVX2 or AVX512 build; not on ARM or older x86)."""


def cpu_features() -> CpuFeatures:
    """This CPU, as torch probes it. The bf16 probes are private and absent on older torch: False there."""
    probe = lambda name: bool(getattr(torch.cpu, name, lambda: False)())  # noqa: E731
    capability = torch.backends.cpu.get_cpu_capability()
    return CpuFeatures(
        amx=probe("_is_amx_tile_supported"),
        avx512_bf16=probe("_is_avx512_bf16_supported"),
        avx512=capability == "AVX512",
        avx2=capability in ("AVX2", "AVX512"),
    )


def bf16_is_fast() -> bool:
    """CUDA with bf16 tensor cores, or a CPU with native bf16 matrix instructions (AVX512-BF16 or AMX).

    Not oneDNN's `_is_mkldnn_bf16_supported()`: it is also true on plain AVX-512 CPUs (Skylake to
    Ice Lake Xeons), which emulate bf16 and train slower in it than in fp32 (docs/log.md, 2026-11-23).
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    features = cpu_features()
    return features.avx512_bf16 or features.amx


def cpu_has_amx() -> bool:
    return cpu_features().amx


def cpu_class() -> str:
    """The class of this CPU, as the table above names it (results.json's `cpu_class`)."""
    features = cpu_features()
    if features.amx:
        return "AMX"
    if features.avx512_bf16:
        return "AVX512-BF16"
    if features.avx512:
        return "AVX-512"
    return "AVX2" if features.avx2 else "baseline"  # baseline: older x86, or not x86 (ARM)
