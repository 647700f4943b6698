"""Ops: the fused GPU kernels or their torch references, chosen once from the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .kernels.activation import silu_and_mul, silu_and_mul_ref
from .kernels.attention import decode_attention
from .kernels.gemv import MAX_ROWS, GemvConfig, gemv
from .kernels.norm import add_rms_norm, add_rms_norm_ref
from .kernels.rope import rope_and_cache


@dataclass(frozen=True)
class Ops:
    add_rms_norm: Callable  # (x, residual | None, weight, eps) -> (normed, x + residual)
    silu_and_mul: Callable  # (T, 2I) -> (T, I)
    rope_and_cache: Callable | None  # (q, k, v, cos_sin, positions, k_cache, v_cache) -> rotated q; None: unfused
    attention: Callable | None  # (q, k_cache, v_cache, positions, scale) -> out; graph safe; None: torch
    # (x, linear) -> linear(x) for the o_proj and down projections of a single-token step;
    # None: the nn.Linear itself (cuBLAS). On the H200 our GEMV beat cuBLAS there
    # (benchmarks/results/h200_gemv.json: 8B o_proj 11.1 vs 13.2 us, SmolLM2 down 2.3 vs 4.8 us).
    row_linear: Callable | None = None
    # (x, linear) -> linear(x) for the other projections and lm_head: cuBLAS, or in batch-invariant
    # mode the GEMV that gives each of up to 16 rows the same bits whatever the row count.
    linear: Callable = lambda x, linear: linear(x)
    invariance: "BatchInvariance | None" = None

    @classmethod
    def for_device(cls, device: torch.device) -> "Ops":
        if device.type == "cuda" and _has_triton():
            inv = BatchInvariance()
            return cls(add_rms_norm, silu_and_mul, rope_and_cache, decode_attention, inv.row_linear, inv.linear, inv)
        return cls(add_rms_norm_ref, silu_and_mul_ref, None, None)

    def set_batch_invariant(self, on: bool) -> None:
        """Speculation verifies k+1 rows where plain decoding runs one: in bf16, cuBLAS picks other
        kernels for other row counts and the last bits differ, enough to flip a near-tie argmax.
        With this on, every projection of a step of up to 16 rows runs one GEMV tile whose
        per-row arithmetic is the same for any row count, so greedy speculation reproduces plain
        decoding token for token. Set before graphs are captured. No-op without kernels (CPU)."""
        if self.invariance is not None:
            self.invariance.on = on


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# Four output columns by 512-element steps, no split: the fastest M = 1 tile for the o_proj
# and down shapes of both the 8B and the SmolLM2 models in the same benchmark.
_ROW_GEMV = GemvConfig(block_n=4, block_k=512, split_k=1, num_warps=4, num_stages=3)


class BatchInvariance:
    """The switch Ops.set_batch_invariant flips, read on every projection call."""

    def __init__(self):
        self.on = False

    def _invariant(self, x: torch.Tensor) -> bool:
        return self.on and x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16

    def row_linear(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        if self._invariant(x):
            return gemv(x, linear.weight, linear.bias, invariant=True)
        if x.shape[0] != 1 or x.dtype != torch.bfloat16:
            return linear(x)
        return gemv(x, linear.weight, linear.bias, config=_ROW_GEMV)

    def linear(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        if self._invariant(x):
            return gemv(x, linear.weight, linear.bias, invariant=True)
        return linear(x)
