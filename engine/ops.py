"""Ops: the fused GPU kernels or their torch references, chosen once from the device."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from .kernels.activation import silu_and_mul, silu_and_mul_ref
from .kernels.attention import decode_attention
from .kernels.norm import add_rms_norm, add_rms_norm_ref
from .kernels.rope import rope_and_cache


@dataclass(frozen=True)
class Ops:
    add_rms_norm: Callable  # (x, residual | None, weight, eps) -> (normed, x + residual)
    silu_and_mul: Callable  # (T, 2I) -> (T, I)
    rope_and_cache: Callable | None  # (q, k, v, cos_sin, positions, k_cache, v_cache) -> rotated q; None: unfused
    attention: Callable | None  # (q, k_cache, v_cache, positions, scale) -> out; graph safe; None: torch

    @classmethod
    def for_device(cls, device: torch.device) -> "Ops":
        if device.type == "cuda" and _has_triton():
            return cls(add_rms_norm, silu_and_mul, rope_and_cache, decode_attention)
        return cls(add_rms_norm_ref, silu_and_mul_ref, None, None)


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True
