"""Small building blocks of the decoder: RMSNorm and the gated MLP."""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from engine.packed_linear import projection_device


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Llama convention: normalise in fp32, cast back, then scale."""
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float, add_rms_norm=None):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        self.kernel = add_rms_norm  # the Triton kernel on CUDA; None: plain torch

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Returns (norm(x + residual), x + residual); the sum is the new residual stream."""
        if self.kernel is not None:
            return self.kernel(x, residual, self.weight, self.eps)
        h = x if residual is None else x + residual
        return rms_norm(h, self.weight, self.eps), h


class GatedMLP(nn.Module):
    """down(silu(gate(x)) * up(x)), with gate and up fused into one projection."""

    def __init__(self, hidden: int, intermediate: int, bias: bool = False, silu_and_mul=None, row_linear=None,
                 linear=None):
        super().__init__()
        self.intermediate = intermediate
        self.silu_and_mul = silu_and_mul
        self.row_linear = row_linear  # Ops.row_linear: the GEMV for single-token steps on CUDA
        self.linear = linear  # Ops.linear: batch-invariant projections in a target a draft verifies with
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=bias, device=projection_device())
        self.down_proj = nn.Linear(intermediate, hidden, bias=bias, device=projection_device())

    # checkpoint module name -> (row offset, rows) inside gate_up_proj
    def packed_shards(self) -> dict[str, tuple[str, int, int]]:
        I = self.intermediate
        return {"gate_proj": ("gate_up_proj", 0, I), "up_proj": ("gate_up_proj", I, I)}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = self.linear(x, self.gate_up_proj) if self.linear else self.gate_up_proj(x)
        return self.down(gate_up)

    def down(self, gate_up: torch.Tensor) -> torch.Tensor:
        """(T, 2I) [gate | up] -> down_proj(silu(gate) * up)."""
        if self.silu_and_mul is not None:
            act = self.silu_and_mul(gate_up)
            return self.row_linear(act, self.down_proj) if self.row_linear else self.down_proj(act)
        gate, up = gate_up.chunk(2, dim=-1)
        return self.down_proj(F.silu(gate) * up)
