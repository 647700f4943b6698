"""GGUF block types: their sizes and the torch reference that decodes their raw bytes.

Each `parts_*` takes the blocks of a weight as llama.cpp stores them, a uint8 tensor of
(num_blocks, block_bytes), and returns their integer values, their scales and offsets (`PARTS`);
`compose` makes the (num_blocks, block_elements) float32 values of them. They follow ggml's
layouts (ggml-common.h) and repeat the arithmetic of the `gguf` package's numpy
`dequantize_blocks`, operation for operation and in float32, so the results are equal bit for
bit (tests/engine/test_packed_gguf.py). The GPU layout (grouped.py) is built from the same parts:
plain byte slicing, shifts and masks, no loop over blocks.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

QK_K = 256  # elements in a k-quant super-block
# GGUF type -> (elements per block, bytes per block); the same numbers as gguf.GGML_QUANT_SIZES.
BLOCKS = {
    "Q4_0": (32, 2 + 16),
    "Q4_1": (32, 2 + 2 + 16),
    "Q5_0": (32, 2 + 4 + 16),
    "Q5_1": (32, 2 + 2 + 4 + 16),
    "Q8_0": (32, 2 + 32),
    "Q2_K": (QK_K, QK_K // 16 + QK_K // 4 + 2 + 2),
    "Q3_K": (QK_K, QK_K // 8 + QK_K // 4 + 12 + 2),
    "Q4_K": (QK_K, 2 + 2 + 12 + QK_K // 2),
    "Q5_K": (QK_K, 2 + 2 + 12 + QK_K // 8 + QK_K // 2),
    "Q6_K": (QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2),
}


def _f16(b: torch.Tensor) -> torch.Tensor:
    """(n, 2) little-endian bytes -> (n, 1) float32."""
    return b.contiguous().view(torch.float16).float()


def _shifted(b: torch.Tensor, shifts: list[int], shape: tuple[int, ...]) -> torch.Tensor:
    """b >> each shift, the shifts along a new axis of `shape` (1 everywhere but one axis)."""
    return b >> torch.tensor(shifts, dtype=torch.uint8, device=b.device).reshape(shape)


def _nibbles(qs: torch.Tensor) -> torch.Tensor:
    """(n, 16) bytes -> (n, 32) values: the low nibbles are elements 0-15, the high ones 16-31."""
    return (_shifted(qs.reshape(qs.shape[0], 1, 16), [0, 4], (1, 2, 1)) & 0x0F).reshape(qs.shape[0], 32)


def _high_bits(qh: torch.Tensor) -> torch.Tensor:
    """(n, 4) bytes of one little-endian uint32 -> (n, 32) bits, bit j for element j."""
    word = qh.contiguous().view(torch.int32).to(torch.int64)  # (n, 1); int64 so bit 31 shifts down cleanly
    return (word >> torch.arange(32, dtype=torch.int64, device=qh.device)) & 1


class Factored(NamedTuple):
    """A k-quant's scales (or offsets) as its file keeps them: a super-block's fp16 `unit` (nb, 1)
    times each sub-block's small integer `code` (nb, groups), multiplied in float32."""
    unit: torch.Tensor
    code: torch.Tensor

    def value(self) -> torch.Tensor:
        return self.unit * self.code.float()


def value_of(t: "torch.Tensor | Factored | None") -> torch.Tensor | None:
    return t.value() if isinstance(t, Factored) else t


def _row(t: torch.Tensor, nb: int) -> torch.Tensor:
    return t.reshape(nb, -1)


def parts_q4_0(b: torch.Tensor) -> tuple:
    """x = d * (q - 8); block: d (f16), 16 bytes of 4-bit q."""
    return _nibbles(b[:, 2:18]).to(torch.int16) - 8, _f16(b[:, 0:2]), None, 32


def parts_q4_1(b: torch.Tensor) -> tuple:
    """x = d * q + m; block: d, m (f16), 16 bytes of 4-bit q."""
    return _nibbles(b[:, 4:20]).to(torch.int16), _f16(b[:, 0:2]), _f16(b[:, 2:4]), 32


def parts_q5_0(b: torch.Tensor) -> tuple:
    """x = d * (q - 16), q = low nibble | high bit << 4; block: d, 32 high bits (uint32), 16 bytes of nibbles."""
    q = (_nibbles(b[:, 6:22]) | (_high_bits(b[:, 2:6]).to(torch.uint8) << 4)).to(torch.int16) - 16
    return q, _f16(b[:, 0:2]), None, 32


def parts_q5_1(b: torch.Tensor) -> tuple:
    """x = d * q + m, q = low nibble | high bit << 4; block: d, m, 32 high bits, 16 bytes of nibbles."""
    q = (_nibbles(b[:, 8:24]) | (_high_bits(b[:, 4:8]).to(torch.uint8) << 4)).to(torch.int16)
    return q, _f16(b[:, 0:2]), _f16(b[:, 2:4]), 32


def parts_q8_0(b: torch.Tensor) -> tuple:
    """x = q * d; block: d (f16), 32 int8 q."""
    return b[:, 2:34].contiguous().view(torch.int8).to(torch.int16), _f16(b[:, 0:2]), None, 32


def parts_q2_k(b: torch.Tensor) -> tuple:
    """Super-block of 16 sub-blocks of 16: x = d * sc * q - dmin * m, 4-bit sc and m per sub-block,
    2-bit q. Bytes: scales (sc | m << 4) [16], q [64], d, dmin (f16)."""
    n = b.shape[0]
    scales, qs = b[:, 0:16], b[:, 16:80]
    d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
    q = _shifted(qs.reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
    # -(dmin * m) is (-dmin) * m exactly
    return _row(q, n).to(torch.int16), Factored(d, scales & 0x0F), Factored(-dmin, scales >> 4), 16


def parts_q3_k(b: torch.Tensor) -> tuple:
    """Super-block of 16 sub-blocks of 16: x = d * (sc - 32) * q, 6-bit sc, 3-bit q whose high bit is
    stored inverted (an unset bit subtracts 4). Bytes: hmask [32], low 2 bits [64], scales [12], d."""
    n = b.shape[0]
    hmask, qs, scales = b[:, 0:32], b[:, 32:96], b[:, 96:108]
    d = _f16(b[:, 108:110])
    # The 12 scale bytes: low nibbles of sc 0-15 in bytes 0-7 (two per byte), their 2 high bits in 8-11.
    low = _shifted(scales[:, 0:8].reshape(n, 1, 8), [0, 4], (1, 2, 1)).reshape(n, 16)
    high = _shifted(scales[:, 8:12].reshape(n, 1, 4), [0, 2, 4, 6], (1, 4, 1)).reshape(n, 16)
    sc = ((low & 0x0F) | ((high & 3) << 4)).to(torch.int8) - 32
    ql = (_shifted(qs.reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)).reshape(n, 16, 16) & 3).to(torch.int16)
    qh = (_shifted(hmask.reshape(n, 1, 1, 32), list(range(8)), (1, 1, 8, 1)).reshape(n, 16, 16) & 1) ^ 1
    return _row(ql - (qh.to(torch.int16) << 2), n), Factored(d, sc), None, 16


def _scale_min_k4(scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K/Q5_K's 12 scale bytes -> the 6-bit scale and min of each of the 8 sub-blocks, (n, 8) each.
    Bytes 0-3 hold sc 0-3 (low 6 bits), 4-7 m 0-3; bytes 8-11 the low nibbles of sc 4-7 and of m 4-7,
    whose high 2 bits sit in the top bits of bytes 0-3 and 4-7."""
    s = scales.reshape(-1, 3, 4)
    d, m, md = s[:, 0], s[:, 1], s[:, 2]
    sc = torch.cat([d & 0x3F, (md & 0x0F) | ((d >> 2) & 0x30)], dim=-1)
    mn = torch.cat([m & 0x3F, (md >> 4) | ((m >> 2) & 0x30)], dim=-1)
    return sc, mn


def parts_q4_k(b: torch.Tensor) -> tuple:
    """Super-block of 8 sub-blocks of 32: x = d * sc * q - dmin * m, 4-bit q. Bytes: d, dmin (f16),
    scales [12], q [128] (each 32 bytes: low nibbles one sub-block, high nibbles the next)."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    q = _shifted(b[:, 16:144].reshape(n, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 0x0F
    return _row(q, n).to(torch.int16), Factored(d, sc), Factored(-dmin, mn), 32


def parts_q5_k(b: torch.Tensor) -> tuple:
    """Q4_K plus a fifth bit: q = nibble | bit << 4, bit i of qh byte j for element j of sub-block i.
    Bytes: d, dmin, scales [12], qh [32], q [128]."""
    n = b.shape[0]
    d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
    sc, mn = _scale_min_k4(b[:, 4:16])
    ql = (_shifted(b[:, 48:176].reshape(n, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    qh = (_shifted(b[:, 16:48].reshape(n, 1, 1, 32), list(range(8)), (1, 1, 8, 1)) & 1).reshape(n, 8, 32)
    return _row(ql | (qh << 4), n).to(torch.int16), Factored(d, sc), Factored(-dmin, mn), 32


def parts_q6_k(b: torch.Tensor) -> tuple:
    """Super-block of 16 sub-blocks of 16: x = d * sc * (q - 32), int8 sc, 6-bit q (4 low bits in ql,
    2 high bits in qh). Bytes: ql [128], qh [64], scales [16], d (f16)."""
    n = b.shape[0]
    sc = b[:, 192:208].contiguous().view(torch.int8)
    ql = (_shifted(b[:, 0:128].reshape(n, 2, 1, 64), [0, 4], (1, 1, 2, 1)) & 0x0F).reshape(n, 8, 32)
    qh = (_shifted(b[:, 128:192].reshape(n, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3).reshape(n, 8, 32)
    return _row(ql | (qh << 4), n).to(torch.int16) - 32, Factored(_f16(b[:, 208:210]), sc), None, 16


# Each type's blocks -> (q (nb, block) int16, scale (nb, block / G) float32 or Factored, offset
# likewise or None, G): x = q * scale (+ offset) in float32, group by group, which is each type's
# formula above in the operations and order of gguf's numpy dequantize (x - y being x + (-y)
# exactly). The k-quants keep their scales Factored, as the file does: the GPU layout stores them so.
PARTS = {
    "Q4_0": parts_q4_0, "Q4_1": parts_q4_1, "Q5_0": parts_q5_0, "Q5_1": parts_q5_1, "Q8_0": parts_q8_0,
    "Q2_K": parts_q2_k, "Q3_K": parts_q3_k, "Q4_K": parts_q4_k, "Q5_K": parts_q5_k, "Q6_K": parts_q6_k,
}


def compose(q: torch.Tensor, scale: "torch.Tensor | Factored", offset: "torch.Tensor | Factored | None",
            group: int) -> torch.Tensor:
    """(n, elements) float32 values of q * scale (+ offset), each scale and offset over `group`
    consecutive elements."""
    n = q.shape[0]
    scale, offset = value_of(scale), value_of(offset)
    x = q.float().reshape(n, -1, group) * scale.reshape(n, -1, 1)
    if offset is not None:
        x = x + offset.reshape(n, -1, 1)
    return x.reshape(n, -1)


def dequantize_rows(data: torch.Tensor, kind: str) -> torch.Tensor:
    """(N, K / block * block_bytes) uint8 rows of `kind` blocks -> (N, K) float32."""
    return compose(*PARTS[kind](data.reshape(-1, BLOCKS[kind][1]))).reshape(data.shape[0], -1)
