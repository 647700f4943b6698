"""GroupedWeight: the one layout every quantized format takes on the GPU, and its torch reference.

Every format localchat reads decodes, per group of G consecutive inputs of an output row, as

    w[n, k] = q[n, k] * scale[n, k // G]  (+ offset[n, k // G])

with q a small integer (or an FP8 value) and the arithmetic in float32: GGUF's blocks (d * q + m,
d * sc * q - dmin * m, d * (q - 8), ...), AWQ/GPTQ's (q - z) * s = q * s - z * s and FP8's q * s.
`from_packed` rewrites a PackedWeight that way, once, at load; `dequantize_grouped` is the
reference a kernel that decodes the layout in place implements (kernels/packed_gemv.py), and it
equals each format's own reference (packed.dequantize, itself equal to `gguf`'s numpy dequantize
for GGUF) value for value: each product q * scale is exact in float32 for these formats (an
fp16 scale times a small integer), and so is every sum the formats' own formulas form in one
order and this one in another.

Storage (`kind`): NIBBLES, q in 0..15 two to a byte (element 2j in the low nibble of byte j);
SIGNED_NIBBLES, the same for q in -8..7 stored as q + 8; INT8, one signed byte each; FP8,
float8_e4m3fn values. The scale and offset are fp16 where every value is exact in fp16, else
fp32: the bytes a decode step reads (`nbytes`) stay close to the file's.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.weights.gguf_blocks import BLOCKS, PARTS
from engine.weights.int4 import unpack_along_k, unpack_along_n
from engine.weights.packed import PackedWeight

NIBBLES, SIGNED_NIBBLES, INT8, FP8 = 0, 1, 2, 3
KIND_NAMES = {NIBBLES: "uint4", SIGNED_NIBBLES: "int4", INT8: "int8", FP8: "fp8"}


@dataclass(frozen=True)
class GroupedWeight:
    kind: int  # NIBBLES, SIGNED_NIBBLES, INT8 or FP8
    shape: tuple[int, int]  # (N, K), nn.Linear's
    group: int  # G: inputs that share a scale (K: one per row)
    q: torch.Tensor  # uint8 (N, K / 2) for nibbles; int8 or float8_e4m3fn (N, K)
    scale: torch.Tensor  # (N, K / G) fp16 or fp32
    offset: torch.Tensor | None  # (N, K / G) fp16 or fp32, or None (w = q * scale)
    format: str  # what it came from: "Q4_K", "AWQ", ...

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.q, self.scale, self.offset) if t is not None)

    def to(self, device) -> "GroupedWeight":
        move = lambda t: None if t is None else t.to(device)  # noqa: E731
        return GroupedWeight(self.kind, self.shape, self.group, move(self.q), move(self.scale), move(self.offset),
                             self.format)


@dataclass(frozen=True)
class _Parts:
    """A format's decoding before storage: q (N, K) int16 or float32 (FP8), scale and offset
    (N, K / G) float32 (offset None: none)."""
    q: torch.Tensor
    scale: torch.Tensor
    offset: torch.Tensor | None
    group: int
    fp8: bool = False


def _gguf_parts(p: PackedWeight) -> _Parts:
    """A GGUF weight's q, scale and offset: its type's parts (gguf_blocks.PARTS), by output row."""
    n, k = p.shape
    q, scale, offset, group = PARTS[p.format](p.data.reshape(-1, BLOCKS[p.format][1]))
    rows = lambda t: None if t is None else t.reshape(n, -1)  # noqa: E731
    return _Parts(rows(q), rows(scale), rows(offset), group)


def _int4_parts(p: PackedWeight) -> _Parts:
    """AWQ/GPTQ: (q - z) * s = q * s - z * s, both products exact in float32."""
    if p.format == "AWQ":
        q, z = unpack_along_n(p.data, interleaved=True), unpack_along_n(p.zeros, interleaved=True)
    else:
        q, z = unpack_along_k(p.data), unpack_along_n(p.zeros) + p.zero_offset
    s = p.scales.float()  # (K/G, N)
    return _Parts(q.t().to(torch.int16).contiguous(), s.t().contiguous(), (-(z.float() * s)).t().contiguous(),
                  p.group_size)


def parts_of(p: PackedWeight) -> _Parts:
    if p.format in BLOCKS:
        return _gguf_parts(p)
    if p.format in ("AWQ", "GPTQ"):
        return _int4_parts(p)
    n, k = p.shape
    scale = p.scales.float().reshape(-1, 1).expand(n, 1).contiguous()  # per tensor or per row: one a row
    return _Parts(p.data.float(), scale, None, k, fp8=True)


def _store_scale(t: torch.Tensor) -> torch.Tensor:
    """fp16 where that holds every value exactly, else fp32."""
    half = t.half()
    return half if torch.equal(half.float(), t) else t


def from_packed(parts: list[PackedWeight]) -> GroupedWeight:
    """One GroupedWeight for the row blocks of a projection stored in one format (q, k, v or gate,
    up, in order; one part: a plain projection): the same group and the same offsets for all."""
    if len({p.format for p in parts}) != 1:
        raise ValueError("from_packed takes the parts of one format (grouped_blocks splits the others)")
    decoded = [parts_of(p) for p in parts]
    k = parts[0].shape[1]
    assert all(p.shape[1] == k and d.group == decoded[0].group for p, d in zip(parts, decoded))
    q = torch.cat([d.q for d in decoded])
    scale = torch.cat([d.scale for d in decoded])
    offset = None if decoded[0].offset is None else torch.cat([d.offset for d in decoded])
    if decoded[0].fp8:
        kind, stored = FP8, q.to(torch.float8_e4m3fn)
    else:
        lo, hi = int(q.min()), int(q.max())
        if 0 <= lo and hi <= 15:
            kind, stored = NIBBLES, _pack_nibbles(q)
        elif -8 <= lo and hi <= 7:
            kind, stored = SIGNED_NIBBLES, _pack_nibbles(q + 8)
        else:
            kind, stored = INT8, q.to(torch.int8)
    return GroupedWeight(kind, (q.shape[0], k), decoded[0].group, stored.contiguous(), _store_scale(scale.contiguous()),
                         None if offset is None else _store_scale(offset.contiguous()), parts[0].format)


def grouped_blocks(parts: list[PackedWeight]) -> list[GroupedWeight]:
    """The row blocks of a projection stored as these parts (q, k, v or gate, up, in order): one
    GroupedWeight per run of parts of one format, so that a Q4_K_M file's Q4_K q and k and Q6_K v
    keep their own storage (one kernel launch each)."""
    runs: list[list[PackedWeight]] = []
    for p in parts:
        if runs and runs[-1][-1].format == p.format:
            runs[-1].append(p)
        else:
            runs.append([p])
    return [from_packed(run) for run in runs]


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def rows_of(g: GroupedWeight, start: int, stop: int) -> GroupedWeight:
    """Output rows start..stop - 1 of `g` (views, no copy)."""
    cut = lambda t: None if t is None else t[start:stop]  # noqa: E731
    return GroupedWeight(g.kind, (stop - start, g.shape[1]), g.group, g.q[start:stop], g.scale[start:stop],
                         cut(g.offset), g.format)


def unpack_q(g: GroupedWeight) -> torch.Tensor:
    """(N, K) float32 q values."""
    if g.kind in (NIBBLES, SIGNED_NIBBLES):
        b = g.q
        q = torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(b.shape[0], -1).float()
        return q - 8 if g.kind == SIGNED_NIBBLES else q
    return g.q.float()


def dequantize_grouped(g: GroupedWeight) -> torch.Tensor:
    """(N, K) float32: q * scale (+ offset), per group, in float32."""
    n, k = g.shape
    q = unpack_q(g).reshape(n, k // g.group, g.group)
    w = q * g.scale.float().unsqueeze(-1)
    if g.offset is not None:
        w = w + g.offset.float().unsqueeze(-1)
    return w.reshape(n, k)
