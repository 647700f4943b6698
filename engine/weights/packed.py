"""PackedWeight: a linear layer's weight kept in its quantized form, and `dequantize`, the torch
reference that turns any of them back into floats.

A PackedWeight holds the tensors a kernel that decodes the weight in place reads, laid out as the
checkpoint stores them (GGUF blocks, AWQ/GPTQ int32 words, FP8 bytes); the layouts and formulas
are documented beside each family's reference: engine/weights/gguf_blocks.py, int4.py, fp8.py.
For now every load dequantizes through `dequantize`; a GPU path keeps the PackedWeight instead.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch

from engine.errors import ModelLoadError
from engine.quant_config import GROUP_SIZES
from engine.weights.compressed import dequantize_int, zero_points
from engine.weights.fp8 import dequantize_fp8
from engine.weights.gguf_blocks import BLOCKS, dequantize_rows
from engine.weights.int4 import dequantize_awq, dequantize_gptq

FORMATS = (*BLOCKS, "AWQ", "GPTQ", "FP8", "INT")
_SCALE_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class PackedWeight:
    format: str  # a GGUF block type ("Q4_K", ...), "AWQ", "GPTQ", "FP8" or "INT" (compressed-tensors')
    shape: tuple[int, int]  # (N, K): outputs x inputs of the float weight it stands for (nn.Linear's)
    # Inputs that share one scale: the block (GGUF: 32 or 256), the group (AWQ/GPTQ; K when one
    # group spans the row), K for FP8 (one scale per row or per tensor; with blocks, the largest
    # divisor of K that a block's inputs are a whole number of).
    group_size: int
    # GGUF: uint8 (N, K / block * block_bytes), the blocks as stored; AWQ: int32 (K, N/8);
    # GPTQ: int32 (K/8, N); FP8: float8_e4m3fn (N, K); INT: int32 words (N, K * bits / 32) or int8 (N, K).
    data: torch.Tensor
    # AWQ/GPTQ: (K/G, N) half; FP8: () or (N, 1) float32, or (N / rows, K / inputs) a block;
    # INT: (N, K/G) as stored; GGUF: in the blocks
    scales: torch.Tensor | None = None
    # AWQ/GPTQ: int32 (K/G, N/8), packed like the outputs of their qweight; INT: int8 (N, K/G) or None
    zeros: torch.Tensor | None = None
    zero_offset: int = 0  # added to each stored zero point: 1 for GPTQ's original format (stores zero - 1)
    bits: int = 4  # INT: the integers' width (4 or 8)
    block: tuple[int, int] | None = None  # FP8 with a scale a block of (rows, inputs)

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
    if p.format == "INT":
        return dequantize_int(p.data, p.scales, p.zeros, p.group_size, p.bits, p.shape[1])
    return dequantize_fp8(p.data, p.scales, p.block)


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


def fp8_weight(weight: torch.Tensor, scale: torch.Tensor, where: str, block: tuple[int, int] | None = None,
               scale_name: str = "weight_scale") -> PackedWeight:
    """weight (N, K) float8_e4m3fn; scale one number (per tensor), N numbers (per output channel),
    or with `block` (rows, inputs) one a block: (ceil(N / rows), ceil(K / inputs)), the edges'
    blocks cut short."""
    if weight.dtype != torch.float8_e4m3fn or weight.dim() != 2:
        raise ModelLoadError(f"{where}.weight is a {str(weight.dtype).removeprefix('torch.')} tensor of shape "
                             f"{tuple(weight.shape)}; FP8 checkpoints need float8_e4m3fn matrices")
    n, k = weight.shape
    if scale.dtype not in _SCALE_DTYPES:
        raise ModelLoadError(f"{where}.{scale_name} is {str(scale.dtype).removeprefix('torch.')}; expected "
                             "float32, bfloat16 or float16 scales")
    grid = None if block is None else (-(-n // block[0]), -(-k // block[1]))
    if grid is not None and scale.dim() == 2 and tuple(scale.shape) == grid:
        return PackedWeight("FP8", (n, k), math.gcd(k, block[1]), weight, scale.float().contiguous(), block=block)
    if scale.numel() == 1:
        scale = scale.reshape(())
    elif scale.numel() == n and scale.dim() <= 2 and scale.shape[0] == n:
        scale = scale.reshape(n, 1)
    else:
        expected = f"a ({grid[0]}, {grid[1]}) grid of blocks" if grid else \
            f"one scale per tensor or one per output channel ({n})"
        raise ModelLoadError(f"{where}.{scale_name} has shape {tuple(scale.shape)}: expected {expected}")
    return PackedWeight("FP8", (n, k), k, weight, scale.float())


def int_weight(data: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor | None, shape: torch.Tensor | None,
               g_idx: torch.Tensor | None, where: str) -> PackedWeight:
    """compressed-tensors integer weights (engine/weights/compressed.py): `weight_packed` int32
    words with `weight_shape`, or `weight` int8 one a byte; the scale, the zero point and the
    group size as the tensors' shapes say."""
    if data.dtype == torch.int8 and data.dim() == 2:
        (n, k), bits = data.shape, 8
    elif data.dtype == torch.int32 and data.dim() == 2 and shape is not None and shape.numel() == 2:
        n, k = (int(v) for v in shape.reshape(-1).tolist())
        cols = {-(-k // 8): 4, -(-k // 4): 8}
        if n != data.shape[0] or data.shape[1] not in cols:
            raise ModelLoadError(f"{where}.weight_packed has shape {tuple(data.shape)}, which is neither 4- nor "
                                 f"8-bit integers packed in int32 words for weight_shape ({n}, {k})")
        bits = cols[data.shape[1]]
    else:
        raise ModelLoadError(f"{where}: an integer weight is int8 `weight` or int32 `weight_packed` with its "
                             f"weight_shape; found {str(data.dtype).removeprefix('torch.')} {tuple(data.shape)}")
    if scale.dtype not in _SCALE_DTYPES:
        raise ModelLoadError(f"{where}.weight_scale is {str(scale.dtype).removeprefix('torch.')}; expected "
                             "float32, bfloat16 or float16 scales")
    if scale.numel() == 1:
        scale = scale.reshape(1, 1).expand(n, 1)
    if scale.dim() != 2 or scale.shape[0] != n or scale.shape[1] < 1 or k % scale.shape[1]:
        raise ModelLoadError(f"{where}.weight_scale has shape {tuple(scale.shape)}: expected ({n}, groups) with "
                             f"{k} inputs a whole number of groups")
    groups = scale.shape[1]
    g = k // groups
    if groups > 1 and g not in GROUP_SIZES:
        raise ModelLoadError(f"{where}: groups of {g} inputs are not supported (32, 64, 128 or per channel)")
    if g_idx is not None:
        order = g_idx.reshape(-1).long()
        if not (torch.equal(order, torch.arange(k, device=order.device) // g) or bool((order == -1).all())):
            raise ModelLoadError(f"{where}.weight_g_idx reorders the groups (act-order); act-order checkpoints are "
                                 "not supported: use one quantized without actorder group")
    zeros = None if zero is None else zero_points(zero, bits, n, groups, where)
    if zeros is not None and not bool(zeros.any()):
        zeros = None  # all zero: the symmetric case
    return PackedWeight("INT", (n, k), g, data.contiguous(), scale.contiguous(), zeros, bits=bits)
