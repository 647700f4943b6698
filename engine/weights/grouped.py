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

from engine.weights.fp8 import dequantize_fp8  # noqa: F401  (the FP8 formula: weight.float() * scale)
from engine.weights.gguf_blocks import BLOCKS, QK_K
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
    format: str  # what it came from: "Q4_K", "AWQ", ... ("Q4_K+Q6_K" for a fused projection of two)

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


def _f16(b: torch.Tensor) -> torch.Tensor:
    return b.contiguous().view(torch.float16).float()


def _gguf_parts(p: PackedWeight) -> _Parts:
    """A GGUF weight's q, scale and offset, from the blocks, with each format's own arithmetic for
    the scales (as gguf_blocks.py: d * sc, dmin * m in float32)."""
    from engine.weights import gguf_blocks as gb

    n, k = p.shape
    kind = p.format
    b = p.data.reshape(-1, BLOCKS[kind][1])  # (blocks, bytes), row-major over (n, k)
    nb = b.shape[0]
    if kind in ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"):
        d = _f16(b[:, 0:2])  # (nb, 1)
        m = _f16(b[:, 2:4]) if kind in ("Q4_1", "Q5_1") else None
        if kind == "Q4_0":
            q = gb._nibbles(b[:, 2:18]).to(torch.int16) - 8
        elif kind == "Q4_1":
            q = gb._nibbles(b[:, 4:20]).to(torch.int16)
        elif kind == "Q5_0":
            q = (gb._nibbles(b[:, 6:22]) | (gb._high_bits(b[:, 2:6]).to(torch.uint8) << 4)).to(torch.int16) - 16
        elif kind == "Q5_1":
            q = (gb._nibbles(b[:, 8:24]) | (gb._high_bits(b[:, 4:8]).to(torch.uint8) << 4)).to(torch.int16)
        else:
            q = b[:, 2:34].contiguous().view(torch.int8).to(torch.int16)
        return _Parts(q.reshape(n, k), d.reshape(n, k // 32), None if m is None else m.reshape(n, k // 32), 32)
    if kind in ("Q4_K", "Q5_K"):
        d, dmin = _f16(b[:, 0:2]), _f16(b[:, 2:4])
        sc, mn = gb._scale_min_k4(b[:, 4:16])
        ds, dm = d * sc.float(), dmin * mn.float()  # (nb, 8)
        if kind == "Q4_K":
            q = gb._shifted(b[:, 16:144].reshape(nb, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 0x0F
        else:
            ql = (gb._shifted(b[:, 48:176].reshape(nb, 4, 1, 32), [0, 4], (1, 1, 2, 1)) & 0x0F).reshape(nb, 8, 32)
            qh = (gb._shifted(b[:, 16:48].reshape(nb, 1, 1, 32), list(range(8)), (1, 1, 8, 1)) & 1).reshape(nb, 8, 32)
            q = ql | (qh << 4)
        return _Parts(q.reshape(n, k).to(torch.int16), ds.reshape(n, k // 32), -dm.reshape(n, k // 32), 32)
    if kind == "Q6_K":
        sc = b[:, 192:208].contiguous().view(torch.int8).float()
        d = _f16(b[:, 208:210]) * sc  # (nb, 16)
        ql = (gb._shifted(b[:, 0:128].reshape(nb, 2, 1, 64), [0, 4], (1, 1, 2, 1)) & 0x0F).reshape(nb, 8, 32)
        qh = (gb._shifted(b[:, 128:192].reshape(nb, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3).reshape(nb, 8, 32)
        q = (ql | (qh << 4)).to(torch.int16) - 32
        return _Parts(q.reshape(n, k), d.reshape(n, k // 16), None, 16)
    if kind == "Q2_K":
        scales, qs = b[:, 0:16], b[:, 16:80]
        d, dmin = _f16(b[:, 80:82]), _f16(b[:, 82:84])
        dl, ml = d * (scales & 0x0F).float(), dmin * (scales >> 4).float()  # (nb, 16)
        q = gb._shifted(qs.reshape(nb, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)) & 3
        return _Parts(q.reshape(n, k).to(torch.int16), dl.reshape(n, k // 16), -ml.reshape(n, k // 16), 16)
    if kind == "Q3_K":
        hmask, qs, scales = b[:, 0:32], b[:, 32:96], b[:, 96:108]
        d = _f16(b[:, 108:110])
        low = gb._shifted(scales[:, 0:8].reshape(nb, 1, 8), [0, 4], (1, 2, 1)).reshape(nb, 16)
        high = gb._shifted(scales[:, 8:12].reshape(nb, 1, 4), [0, 2, 4, 6], (1, 4, 1)).reshape(nb, 16)
        sc = ((low & 0x0F) | ((high & 3) << 4)).to(torch.int8) - 32
        dl = d * sc.float()
        ql = (gb._shifted(qs.reshape(nb, 2, 1, 32), [0, 2, 4, 6], (1, 1, 4, 1)).reshape(nb, 16, 16) & 3).to(torch.int16)
        qh = (gb._shifted(hmask.reshape(nb, 1, 1, 32), list(range(8)), (1, 1, 8, 1)).reshape(nb, 16, 16) & 1) ^ 1
        q = ql - (qh.to(torch.int16) << 2)
        return _Parts(q.reshape(n, k), dl.reshape(n, k // 16), None, 16)
    raise ValueError(f"no grouped layout for GGUF {kind}")  # every BLOCKS type is handled above
    assert QK_K  # noqa


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


def _regroup(t: torch.Tensor | None, factor: int) -> torch.Tensor | None:
    return t if t is None or factor == 1 else t.repeat_interleave(factor, dim=1)


def _store_scale(t: torch.Tensor) -> torch.Tensor:
    """fp16 where that holds every value exactly, else fp32."""
    half = t.half()
    return half if torch.equal(half.float(), t) else t


def from_packed(parts: list[PackedWeight]) -> GroupedWeight:
    """One GroupedWeight for a projection stored as these row blocks (q, k, v or gate, up, in order;
    one part: a plain projection). Parts of different formats share the smallest group and the
    widest storage; an FP8 part cannot share with an integer one."""
    decoded = [parts_of(p) for p in parts]
    k = parts[0].shape[1]
    assert all(p.shape[1] == k for p in parts)
    fp8 = {d.fp8 for d in decoded}
    if len(fp8) > 1:
        raise ValueError("an FP8 projection part beside an integer one")
    group = min(d.group for d in decoded)
    offsets = any(d.offset is not None for d in decoded)
    q = torch.cat([d.q for d in decoded])
    scale = torch.cat([_regroup(d.scale, d.group // group) for d in decoded])
    offset = None
    if offsets:
        offset = torch.cat([torch.zeros_like(_regroup(d.scale, d.group // group)) if d.offset is None
                            else _regroup(d.offset, d.group // group) for d in decoded])
    if fp8 == {True}:
        kind, stored = FP8, q.to(torch.float8_e4m3fn)
    else:
        lo, hi = int(q.min()), int(q.max())
        if 0 <= lo and hi <= 15:
            kind, stored = NIBBLES, _pack_nibbles(q)
        elif -8 <= lo and hi <= 7:
            kind, stored = SIGNED_NIBBLES, _pack_nibbles(q + 8)
        else:
            kind, stored = INT8, q.to(torch.int8)
    fmt = "+".join(dict.fromkeys(p.format for p in parts))
    return GroupedWeight(kind, (q.shape[0], k), group, stored.contiguous(), _store_scale(scale.contiguous()),
                         None if offset is None else _store_scale(offset.contiguous()), fmt)


def grouped_blocks(parts: list[PackedWeight]) -> list[GroupedWeight]:
    """The row blocks of a projection stored as these parts (q, k, v or gate, up, in order): one
    GroupedWeight per run of parts of one format, so that a Q4_K_M file's Q4_K q and k and Q6_K v
    keep their own storage (one kernel launch each) instead of sharing the widest."""
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
