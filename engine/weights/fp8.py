"""FP8 weight-only checkpoints: float8 e4m3 weights with one scale per tensor, per output channel
or per block of (rows, inputs) (DeepSeek-V3's and Qwen3's FP8 files: `weight_scale_inv`, which
despite its name multiplies), and the torch reference that decodes them."""

from __future__ import annotations

import torch


def block_scales(scale: torch.Tensor, block: tuple[int, int], n: int, k: int) -> torch.Tensor:
    """(N, K) float32: each weight's scale from a (ceil(N / rows), ceil(K / inputs)) grid."""
    rows, inputs = block
    return scale.float().repeat_interleave(rows, dim=0)[:n].repeat_interleave(inputs, dim=1)[:, :k]


def dequantize_fp8(weight: torch.Tensor, scale: torch.Tensor, block: tuple[int, int] | None = None
                   ) -> torch.Tensor:
    """weight (N, K) float8_e4m3fn, scale () per tensor, (N, 1) per channel or a grid of blocks ->
    (N, K) float32: w = weight * scale. Every e4m3 value is exact in float32, so the only rounding
    is the product's."""
    if block is not None:
        scale = block_scales(scale, block, *weight.shape)
    return weight.float() * scale.float()
