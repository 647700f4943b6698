"""Small building blocks of the decoder: RMSNorm and the gated MLP."""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama convention: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); the sum is the new residual stream."""
        h = x if residual is None else x + residual
        return rms_norm(h, self.weight, self.eps), h


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one projection."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False):
        super().__init__()
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias)
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias)

    # checkpoint module name -> (row offset, rows) inside gate_up_proj
    def packed_shards(self) -> dict[str, tuple[str, int, int]]:
        I = self.intermediate
        return {"gate_proj": ("gate_up_proj", 0, I), "up_proj": ("gate_up_proj", I, I)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
