"""Ops: the fused GPU kernels or their torch references, chosen once from the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .kernels.activation import silu_and_mul, silu_and_mul_ref
from .kernels.attention import decode_attention
from .kernels.gemv import GemvConfig, gemv
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

    @classmethod
    def for_device(cls, device: torch.device) -> "Ops":
        if device.type == "cuda" and _has_triton():
            return cls(add_rms_norm, silu_and_mul, rope_and_cache, decode_attention, _row_linear)
        return cls(add_rms_norm_ref, silu_and_mul_ref, None, None)


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


# Four output columns by 512-element steps, no split: the fastest M = 1 tile for the o_proj
# and down shapes of both the 8B and the SmolLM2 models in the same benchmark.
_ROW_GEMV = GemvConfig(block_n=4, block_k=512, split_k=1, num_warps=4, num_stages=3)


def _row_linear(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    if x.shape[0] != 1 or x.dtype != torch.bfloat16:
        return linear(x)
    return gemv(x, linear.weight, linear.bias, config=_ROW_GEMV)
