"""PackedWeight: a linear layer's weight kept in its quantized form, and `dequantize`, the torch
reference that turns any of them back into floats.

A PackedWeight holds the tensors a kernel that decodes the weight in place reads, laid out as the
checkpoint stores them (GGUF blocks, AWQ/GPTQ int32 words, FP8 bytes); the layouts and formulas
are documented beside each family's reference: engine/weights/gguf_blocks.py, int4.py, fp8.py.
For now every load dequantizes through `dequantize`; a GPU path keeps the PackedWeight instead.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from engine.errors import ModelLoadError
from engine.weights.fp8 import dequantize_fp8
from engine.weights.gguf_blocks import BLOCKS, dequantize_rows
from engine.weights.int4 import dequantize_awq, dequantize_gptq

FORMATS = (*BLOCKS, "AWQ", "GPTQ", "FP8")
_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class PackedWeight:
    format: str  # a GGUF block type ("Q4_K", ...), "AWQ", "GPTQ" or "FP8"
    shape: tuple[int, int]  # (N, K): outputs x inputs of the float weight it stands for (nn.Linear's)
    # Inputs that share one scale: the block (GGUF: 32 or 256), the group (AWQ/GPTQ; K when one
    # group spans the row), K for FP8 (one scale per row or per tensor).
    group_size: int
    # GGUF: uint8 (N, K / block * block_bytes), the blocks as stored; AWQ: int32 (K, N/8);
    # GPTQ: int32 (K/8, N); FP8: float8_e4m3fn (N, K).
    data: torch.Tensor
    scales: torch.Tensor | None = None  # AWQ/GPTQ: (K/G, N) half; FP8: () or (N, 1) float32; GGUF: in the blocks
    zeros: torch.Tensor | None = None  # AWQ/GPTQ: int32 (K/G, N/8), packed like the outputs of their qweight
    zero_offset: int = 0  # added to each stored zero point: 1 for GPTQ's original format (stores zero - 1)

    def __post_init__(self) -> None:
        assert self.format in FORMATS and self.shape[1] % self.group_size == 0, (self.format, self.shape)

    @property
    def nbytes(self) -> int:
        """The bytes the weight takes on the device: what one decode step reads."""
        return sum(t.numel() * t.element_size() for t in (self.data, self.scales, self.zeros) if t is not None)

    def to(self, device: torch.device | str) -> "PackedWeight":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return dataclasses.replace(self, data=move(self.data), scales=move(self.scales), zeros=move(self.zeros))


def dequantize(p: PackedWeight) -> torch.Tensor:
    """(N, K) float32: the weight `p` stands for, through the torch reference of its format (the
    formula its GPU kernel implements)."""
    if p.format in BLOCKS:
        return dequantize_rows(p.data, p.format)
    if p.format == "AWQ":
        return dequantize_awq(p.data, p.zeros, p.scales, p.group_size)
    if p.format == "GPTQ":
        return dequantize_gptq(p.data, p.zeros, p.scales, p.group_size, p.zero_offset)
    return dequantize_fp8(p.data, p.scales)


def gguf_weight(kind: str, data: torch.Tensor, shape: tuple[int, int]) -> PackedWeight:
    """The blocks of a GGUF tensor of `shape` (N, K), as the file stores them: (N, row bytes) uint8."""
    block, nbytes = BLOCKS[kind]
    assert data.dtype == torch.uint8 and tuple(data.shape) == (shape[0], shape[1] // block * nbytes)
    return PackedWeight(kind, shape, block, data)


def _check(where: str, name: str, t: torch.Tensor, shape: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> None:
    if tuple(t.shape) != shape:
        raise ModelLoadError(f"{where}.{name} has shape {tuple(t.shape)}, expected {shape}")
    if t.dtype not in dtypes:
        raise ModelLoadError(f"{where}.{name} is {str(t.dtype).removeprefix('torch.')}, expected "
                             + " or ".join(str(d).removeprefix("torch.") for d in dtypes))


def _groups(where: str, k: int, group_size: int) -> int:
    size = k if group_size == -1 else group_size
    if k % size:
        raise ModelLoadError(f"{where}: {k} inputs are not a whole number of groups of {size}")
    return size


def awq_weight(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int,
               where: str) -> PackedWeight:
    """AutoAWQ GEMM tensors: qweight (K, N/8), qzeros (K/G, N/8), scales (K/G, N). group_size -1: one group."""
    k, n = qweight.shape[0], scales.shape[-1]
    g = _groups(where, k, group_size)
    _check(where, "qweight", qweight, (k, n // 8), (torch.int32,))
    _check(where, "qzeros", qzeros, (k // g, n // 8), (torch.int32,))
    _check(where, "scales", scales, (k // g, n), _SCALE_DTYPES)
    return PackedWeight("AWQ", (n, k), g, qweight, scales, qzeros)


def gptq_weight(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
                group_size: int, zero_offset: int, where: str) -> PackedWeight:
    """GPTQ tensors: qweight (K/8, N), qzeros (K/G, N/8), scales (K/G, N), g_idx (K,). Only the
    trivial g_idx (input k in group k // G) is taken: act-order checkpoints reorder the groups."""
    k, n = qweight.shape[0] * 8, qweight.shape[-1]
    g = _groups(where, k, group_size)
    _check(where, "qweight", qweight, (k // 8, n), (torch.int32,))
    _check(where, "qzeros", qzeros, (k // g, n // 8), (torch.int32,))
    _check(where, "scales", scales, (k // g, n), _SCALE_DTYPES)
    if g_idx is not None:
        _check(where, "g_idx", g_idx, (k,), (torch.int32, torch.int64))
        if not torch.equal(g_idx.long(), torch.arange(k, device=g_idx.device) // g):
            raise ModelLoadError(f"{where}.g_idx reorders the groups (act-order, desc_act); act-order GPTQ "
                                 "checkpoints are not supported: use one quantized with desc_act false")
    return PackedWeight("GPTQ", (n, k), g, qweight, scales, qzeros, zero_offset)


def fp8_weight(weight: torch.Tensor, scale: torch.Tensor, where: str) -> PackedWeight:
    """weight (N, K) float8_e4m3fn; scale one number (per tensor) or N numbers (per output channel)."""
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ModelLoadError(f"{where}.weight is a {str(weight.dtype).removeprefix('torch.')} tensor of shape "
                             f"{tuple(weight.shape)}; FP8 checkpoints need float8_e4m3fn matrices")
    n, k = weight.shape
    if scale.numel() == 1:
        scale = scale.reshape(())
    elif scale.numel() == n and scale.dim() <= 2 and scale.shape[0] == n:
        scale = scale.reshape(n, 1)
    else:
        raise ModelLoadError(f"{where}.weight_scale has shape {tuple(scale.shape)}: expected one scale per "
                             f"tensor or one per output channel ({n}); block-wise FP8 scales are not supported")
    return PackedWeight("FP8", (n, k), k, weight, scale.float())
