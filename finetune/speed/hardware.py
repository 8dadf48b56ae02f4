"""What this machine computes fast: native bf16 (CUDA, or AVX512-BF16/AMX CPUs)."""

from __future__ import annotations

import torch


def bf16_is_fast() -> bool:
    """CUDA with bf16 tensor cores, or a CPU with native bf16 matrix instructions (AVX512-BF16/AMX).

    Not oneDNN's `_is_mkldnn_bf16_supported()`: it is also true on plain AVX-512 CPUs (Skylake to
    Ice Lake Xeons), which emulate bf16 and train slower in it than in fp32 (docs/log.md, 2026-11-23).
    """
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    native = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # private; absent on older torch
    return any(getattr(torch.cpu, probe, lambda: False)() for probe in native)
