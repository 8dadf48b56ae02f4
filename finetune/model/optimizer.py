"""The optimizer: fused AdamW, no weight decay below 2-D."""

from __future__ import annotations

import torch


def build_optimizer(
    model: torch.nn.Module,
    learning_rate: float,
    weight_decay: float,
    betas: tuple[float, float] = (0.9, 0.999),
    epsilon: float = 1e-8,
) -> torch.optim.AdamW:
    # Biases and LayerNorm weights (every tensor below 2-D) are not decayed: decay would only
    # pull them towards zero, where they mean "no shift" and "no scale".
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    # One fused kernel per step instead of one per tensor; torch has it on CPU and CUDA.
    return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, eps=epsilon, fused=True)
