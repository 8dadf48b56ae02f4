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

import os
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


def busy_cores_notice(load_1min: float, cores: int, threads: int) -> str | None:
    """A line when the 1-minute load average is above the `cores` this process may run on (other jobs
    share them) while torch runs `threads` intra-op threads: each op's threads then wait for each other's
    turn on a core. On this project's 2 shared cores, with other jobs running, the same 10 steps took
    171.8 s with torch's default threads and 12.1 s with OMP_NUM_THREADS=1; `make bench-threads` measured
    one thread 1.7x faster beside one CPU-bound neighbour and 5.1x beside two, 1.46x slower beside none
    (docs/log.md, 2026-12-02; not yet applied by the product). None when the cores are free or one thread
    runs."""
    if threads <= 1 or load_1min <= cores:
        return None
    return (
        f"note: the cores are busy (1-minute load average {load_1min:.1f} on the {cores} this process may "
        f"use) and torch runs {threads} threads per process, which then wait on each other; "
        "OMP_NUM_THREADS=1 can be several times faster here"
    )


def cores_load() -> tuple[float, int]:
    """The 1-minute load average and the cores this process may run on (its affinity, not the machine's)."""
    return os.getloadavg()[0], len(os.sched_getaffinity(0))
