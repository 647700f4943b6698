"""FP8 weight-only checkpoints: float8 e4m3 weights with one scale per tensor or per output channel,
and the torch reference that decodes them."""

from __future__ import annotations

import torch


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """weight (N, K) float8_e4m3fn, scale () per tensor or (N, 1) per channel -> (N, K) float32:
    w = weight * scale. Every e4m3 value is exact in float32, so the only rounding is the product's."""
    return weight.float() * scale.float()
