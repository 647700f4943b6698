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
SIGNED_NIBBLES, the same for q in -8..7 stored as q + 8; BITS5/BITS6 (and signed twins, stored
as q + 16, q + 32), the low nibbles so and the bits above them in a plane of their own (`qh`);
INT8, one signed byte each; FP8, float8_e4m3fn values. The scale and offset are fp16 where every
value is exact in fp16, else fp32, or for the k-quants the file's own factors (a super-block's
fp16 unit times a sub-block's 6- or 8-bit code): the bytes a decode step reads (`nbytes`) stay
close to the file's.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from engine.weights.compressed import int_values
from engine.weights.gguf_blocks import BLOCKS, PARTS, Factored
from engine.weights.int4 import unpack_along_k, unpack_along_n
from engine.weights.packed import PackedWeight

NIBBLES, SIGNED_NIBBLES, INT8, FP8, BITS5, SIGNED_BITS5, BITS6, SIGNED_BITS6 = range(8)
KIND_NAMES = {NIBBLES: "uint4", SIGNED_NIBBLES: "int4", INT8: "int8", FP8: "fp8", BITS5: "uint5",
              SIGNED_BITS5: "int5", BITS6: "uint6", SIGNED_BITS6: "int6"}
# A kind's bits above the low nibble (kept in a plane of their own, `qh`) and what its stored
# value is above q (signed kinds store q + ZERO, so every stored value is unsigned).
HIGH_BITS = {BITS5: 1, SIGNED_BITS5: 1, BITS6: 2, SIGNED_BITS6: 2}
ZERO = {SIGNED_NIBBLES: 8, SIGNED_BITS5: 16, SIGNED_BITS6: 32}
# Unsigned kinds by width, then their signed twins: the narrowest that holds a weight's q.
_BY_WIDTH = [(4, NIBBLES, SIGNED_NIBBLES), (5, BITS5, SIGNED_BITS5), (6, BITS6, SIGNED_BITS6)]


@dataclass(frozen=True)
class GroupedWeight:
    kind: int  # NIBBLES, SIGNED_NIBBLES, INT8 or FP8
    shape: tuple[int, int]  # (N, K), nn.Linear's
    group: int  # G: inputs that share a scale (K: one per row)
    q: torch.Tensor  # uint8 (N, K / 2): low nibbles (all but INT8, FP8); int8 or float8_e4m3fn (N, K)
    scale: torch.Tensor  # (N, K / G) fp16 or fp32; with units, uint8 or int8 codes
    offset: torch.Tensor | None  # (N, K / G) like scale, or None (w = q * scale)
    format: str  # what it came from: "Q4_K", "AWQ", ...
    # k-quants: scale = scale_unit[n, g // unit] * scale[n, g] (and offset likewise), a
    # super-block's fp16 unit times a sub-block's small integer, as the file keeps them
    unit: int = 0  # groups a unit covers; 0: scale and offset hold the values themselves
    scale_unit: torch.Tensor | None = None  # (N, K / (G * unit)) fp16
    offset_unit: torch.Tensor | None = None
    # 5- and 6-bit kinds: the bits above the nibble, uint8 (N, K * HIGH_BITS / 8); element
    # 8 / HIGH_BITS * j + i in bits HIGH_BITS * i and up of byte j
    qh: torch.Tensor | None = None

    def tensors(self) -> tuple:
        return (self.q, self.scale, self.offset, self.scale_unit, self.offset_unit, self.qh)

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors() if t is not None)

    def to(self, device) -> "GroupedWeight":
        moved = replace(self, **{name: None if t is None else t.to(device)
                                 for name, t in zip(TENSORS, self.tensors())})
        return paired(moved) if is_paired(self) else moved


TENSORS = ("q", "scale", "offset", "scale_unit", "offset_unit", "qh")


def _side_by_side(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """a and b (N, M) of one dtype as two views of one (N, M, 2) buffer: a[n, m] and b[n, m]
    adjacent in memory."""
    both = torch.stack([a, b], dim=-1)
    return both[..., 0], both[..., 1]


def can_pair(g: GroupedWeight) -> bool:
    """A k-quant with offsets and no bits above the nibble (Q2_K, Q4_K): byte codes for its scales
    and offsets, fp16 units. (Q5_K, whose one-row steps also read a plane of high bits, ran 0.8%
    slower paired on the 8B shape, where Q4_K_M ran 4.3% faster: docs/performance.md.)"""
    return (g.unit > 0 and g.offset is not None and g.kind not in HIGH_BITS
            and g.scale.dtype == g.offset.dtype == torch.uint8
            and g.scale_unit.dtype == g.offset_unit.dtype == torch.float16)


def paired(g: GroupedWeight) -> GroupedWeight:
    """`g` with its scale and offset codes side by side, and its two units side by side, where it
    can be (can_pair): the one-row kernel then reads a group's four factors in two loads
    (kernels/packed_gemv.py, PAIRED). Values unchanged; every other reader goes through strides."""
    if not can_pair(g) or is_paired(g):
        return g
    scale, offset = _side_by_side(g.scale, g.offset)
    scale_unit, offset_unit = _side_by_side(g.scale_unit, g.offset_unit)
    return replace(g, scale=scale, offset=offset, scale_unit=scale_unit, offset_unit=offset_unit)


def is_paired(g: GroupedWeight) -> bool:
    """Whether `g`'s codes and units sit side by side (paired())."""
    def adjacent(a, b):
        return (a.stride(-1) == 2 and b.stride() == a.stride() and a.stride(0) == 2 * a.shape[1]
                and b.data_ptr() == a.data_ptr() + a.element_size())
    return can_pair(g) and adjacent(g.scale, g.offset) and adjacent(g.scale_unit, g.offset_unit)


@dataclass(frozen=True)
class _Parts:
    """A format's decoding before storage: q (N, K) int16 or float32 (FP8), scale and offset
    (N, K / G) float32 or Factored (units (N, K / (G * unit)), codes (N, K / G)); offset None: none."""
    q: torch.Tensor
    scale: "torch.Tensor | Factored"
    offset: "torch.Tensor | Factored | None"
    group: int
    fp8: bool = False


def _gguf_parts(p: PackedWeight) -> _Parts:
    """A GGUF weight's q, scale and offset: its type's parts (gguf_blocks.PARTS), by output row."""
    n, k = p.shape
    q, scale, offset, group = PARTS[p.format](p.data.reshape(-1, BLOCKS[p.format][1]))

    def rows(t):
        if isinstance(t, Factored):
            return Factored(t.unit.reshape(n, -1), t.code.reshape(n, -1))
        return None if t is None else t.reshape(n, -1)
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


def _int_parts(p: PackedWeight) -> _Parts:
    """compressed-tensors integers: (q - zp) * s = q * s - zp * s, both products exact in float32."""
    q = int_values(p.data, p.bits, p.shape[1])
    s = p.scales.float()
    offset = None if p.zeros is None else (-(p.zeros.float() * s)).contiguous()
    return _Parts(q.contiguous(), s.contiguous(), offset, p.group_size)


def _fp8_parts(p: PackedWeight) -> _Parts:
    n, k = p.shape
    if p.block is None:  # per tensor or per row: one a row
        return _Parts(p.data.float(), p.scales.float().reshape(-1, 1).expand(n, 1).contiguous(), None, k, fp8=True)
    # a block's scale repeated for each of its rows, and for each group of its inputs
    g = p.group_size
    starts = torch.arange(0, k, g, device=p.scales.device)
    scale = p.scales.float().repeat_interleave(p.block[0], dim=0)[:n][:, starts // p.block[1]]
    return _Parts(p.data.float(), scale.contiguous(), None, g, fp8=True)


def parts_of(p: PackedWeight) -> _Parts:
    if p.format in BLOCKS:
        return _gguf_parts(p)
    if p.format in ("AWQ", "GPTQ"):
        return _int4_parts(p)
    if p.format == "INT":
        return _int_parts(p)
    return _fp8_parts(p)


def _store_scale(t: torch.Tensor) -> torch.Tensor:
    """fp16 where that holds every value exactly, else fp32."""
    half = t.half()
    return half if torch.equal(half.float(), t) else t


def _store_codes(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.uint8 if int(t.min()) >= 0 else torch.int8)


def _cat_factored(items: list) -> tuple:
    """(values, units, units' groups): the parts' scales (or offsets), stored as their values
    (fp16 where exact, else fp32) or, factored, as codes (uint8 or int8) beside fp16 units."""
    if items[0] is None:
        return None, None, 0
    if isinstance(items[0], Factored):
        units = torch.cat([f.unit for f in items])
        codes = torch.cat([f.code for f in items])
        return _store_codes(codes).contiguous(), _store_scale(units.contiguous()), codes.shape[1] // units.shape[1]
    return _store_scale(torch.cat(items).contiguous()), None, 0


def _storage(p: PackedWeight) -> tuple:
    """What parts must share to be one GroupedWeight: their format, group, whether they have
    offsets, and their width (a compressed-tensors checkpoint may quantize q and v differently)."""
    return p.format, p.group_size, p.zeros is None, p.bits, p.block is None


def from_packed(parts: list[PackedWeight]) -> GroupedWeight:
    """One GroupedWeight for the row blocks of a projection stored in one format (q, k, v or gate,
    up, in order; one part: a plain projection): the same group and the same offsets for all."""
    if len({_storage(p) for p in parts}) != 1:
        raise ValueError("from_packed takes the parts of one format (grouped_blocks splits the others)")
    decoded = [parts_of(p) for p in parts]
    k = parts[0].shape[1]
    assert all(p.shape[1] == k and d.group == decoded[0].group for p, d in zip(parts, decoded))
    q = torch.cat([d.q for d in decoded])
    scale, scale_unit, unit = _cat_factored([d.scale for d in decoded])
    offset, offset_unit, offset_per = _cat_factored([d.offset for d in decoded])
    assert offset is None or offset_per == unit, "a factored scale comes with a factored offset"
    qh = None
    if decoded[0].fp8:
        kind, stored = FP8, q.to(torch.float8_e4m3fn)
    else:
        kind, stored = INT8, None
        lo, hi = int(q.min()), int(q.max())
        for bits, unsigned, signed in _BY_WIDTH:
            half = 1 << (bits - 1)
            if 0 <= lo and hi < 2 * half:
                kind = unsigned
            elif -half <= lo and hi < half:
                kind = signed
            else:
                continue
            u = (q + ZERO.get(kind, 0)).to(torch.uint8)
            stored = _pack_nibbles(u & 0x0F)
            if bits > 4:
                qh = _pack_bits(u >> 4, HIGH_BITS[kind])
            break
        if stored is None:
            stored = q.to(torch.int8)
    return paired(GroupedWeight(kind, (q.shape[0], k), decoded[0].group, stored.contiguous(), scale, offset,
                                parts[0].format, unit, scale_unit, offset_unit, qh))


def grouped_blocks(parts: list[PackedWeight]) -> list[GroupedWeight]:
    """The row blocks of a projection stored as these parts (q, k, v or gate, up, in order): one
    GroupedWeight per run of parts of one format, so that a Q4_K_M file's Q4_K q and k and Q6_K v
    keep their own storage (one kernel launch each)."""
    runs: list[list[PackedWeight]] = []
    for p in parts:
        if runs and _storage(runs[-1][-1]) == _storage(p):
            runs[-1].append(p)
        else:
            runs.append([p])
    return [from_packed(run) for run in runs]


def _pack_nibbles(q: torch.Tensor) -> torch.Tensor:
    q = q.to(torch.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()


def _pack_bits(h: torch.Tensor, bits: int) -> torch.Tensor:
    """(N, K) values of `bits` bits -> (N, K * bits / 8) uint8, 8 / bits a byte, the first lowest."""
    per = 8 // bits
    h = h.to(torch.uint8).reshape(h.shape[0], -1, per)
    out = torch.zeros(h.shape[:2], dtype=torch.uint8, device=h.device)
    for i in range(per):
        out |= h[:, :, i] << (bits * i)
    return out


def _unpack_bits(b: torch.Tensor, bits: int) -> torch.Tensor:
    per = 8 // bits
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=b.device)
    return ((b.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)).reshape(b.shape[0], b.shape[1] * per)


def rows_of(g: GroupedWeight, start: int, stop: int) -> GroupedWeight:
    """Output rows start..stop - 1 of `g` (views, no copy)."""
    return replace(g, shape=(stop - start, g.shape[1]),
                   **{name: None if t is None else t[start:stop] for name, t in zip(TENSORS, g.tensors())})


def select_rows(g: GroupedWeight, rows: torch.Tensor) -> GroupedWeight:
    """Output rows `rows` (int64, any order, repeats allowed) of `g`: an embedding's lookup."""
    return replace(g, shape=(rows.shape[0], g.shape[1]),
                   **{name: None if t is None else t.index_select(0, rows) for name, t in zip(TENSORS, g.tensors())})


def unpack_q(g: GroupedWeight) -> torch.Tensor:
    """(N, K) float32 q values."""
    if g.kind in (INT8, FP8):
        return g.q.float()
    b = g.q
    q = torch.stack([b & 0x0F, b >> 4], dim=-1).reshape(b.shape[0], -1).to(torch.int16)
    if g.kind in HIGH_BITS:
        q = q | (_unpack_bits(g.qh, HIGH_BITS[g.kind]).to(torch.int16) << 4)
    return (q - ZERO.get(g.kind, 0)).float()


def dequantize_grouped(g: GroupedWeight) -> torch.Tensor:
    """(N, K) float32: q * scale (+ offset), per group, in float32."""
    n, k = g.shape
    q = unpack_q(g).reshape(n, k // g.group, g.group)
    w = q * scale_values(g.scale, g.scale_unit, g.unit).unsqueeze(-1)
    if g.offset is not None:
        w = w + scale_values(g.offset, g.offset_unit, g.unit).unsqueeze(-1)
    return w.reshape(n, k)


def scale_values(stored: torch.Tensor, units: torch.Tensor | None, unit: int) -> torch.Tensor:
    """(N, K / G) float32 scales (or offsets): the stored values, or each unit times its codes."""
    if units is None:
        return stored.float()
    return units.float().repeat_interleave(unit, dim=1) * stored.float()
