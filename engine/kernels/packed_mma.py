"""packed_mma_gemv: out = x @ W.T for 1 to 16 rows with W kept quantized, x rounded to int8 and
multiplied on the tensor cores in integers; packed_mma_ref beside it (the weight's exact values
times the same rounded x, in float32).

The batch-invariant GEMV of a quantized target with a draft loaded. packed_gemv decodes each
weight to float, rounds it to bf16 and takes a bf16 dot; this kernel never makes the weight a
float. Each row's x is rounded to int8 in vectors of 32 inputs (one scale a vector, max|x| / 127,
as packed_row_gemv's int8 x), the stored values (the nibbles with their high bits, or int8) go to
an int8 tensor-core dot against it, and the exact int32 sums of each 32-input chunk are scaled
once: sum(w x) ~ sx (s sum(u xq) + (o - ZERO s) sum(xq)), with s and o the chunk's scale and
offset (for groups of 16, each half of the chunk its own). Rows are padded to 16 and every row's
sums are its own (integers, then the same float steps in the same order whatever rows came with
it), so a verify row has the bits of the one-row step it stands for. K may be split over programs;
the last of a column tile adds the shares in a fixed order (packed_gemv's sum_splits).

Serves every kind with an integer value (INT8_X_KINDS): nibbles, the 5- and 6-bit kinds, int8.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import triton_interpreting
from engine.weights.grouped import INT8, ZERO, GroupedWeight, dequantize_grouped

MAX_ROWS = 16
X_VECTOR = 32  # inputs of x that share one int8 scale: one int8 dot's K


@dataclass(frozen=True)
class MmaTile:
    block_n: int = 64  # output columns a program (the dot's long side)
    block_k: int = 128  # inputs a loop step (chunks of X_VECTOR inside)
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


def default_mma_tile(n: int, k: int) -> MmaTile:
    """64 columns a program over steps of 128 inputs (shorter where K needs it), K split in the
    fewest of 1, 2, 4, 8 or 16 shares that give 512 programs or more."""
    block_k = next(b for b in (128, 64, 32) if k % b == 0)
    steps, tiles = k // block_k, -(-n // 64)
    splits = [s for s in (1, 2, 4, 8, 16) if steps % s == 0]
    return MmaTile(64, block_k, next((s for s in splits if tiles * s >= 512), splits[-1]))


def mma_kernel_fits(weight: GroupedWeight) -> bool:
    """The weights this kernel serves: an integer kind (not FP8) whose groups hold whole chunks of
    32 inputs or halves of one (16), over a K of whole chunks."""
    from engine.kernels.packed_gemv import INT8_X_KINDS

    k = weight.shape[1]
    return weight.kind in INT8_X_KINDS and k % X_VECTOR == 0 and (weight.group % X_VECTOR == 0 or weight.group == 16)


@functools.cache
def _mma_kernel():
    import triton
    import triton.language as tl

    from engine.kernels import packed_gemv

    packed_gemv._kernel()  # binds packed_gemv.sum_splits
    global sum_splits
    sum_splits = packed_gemv.sum_splits

    @triton.jit
    def packed_mma_kernel(x_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
                          num_rows, N, stride_x, stride_q, stride_h, stride_s, stride_u, stride_out,
                          ZERO: tl.constexpr, G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                          HIGH: tl.constexpr, ONE_BYTE: tl.constexpr, HAS_BIAS: tl.constexpr,
                          SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, DOT_INT8: tl.constexpr):
        XV: tl.constexpr = 32  # X_VECTOR
        BLOCK_M: tl.constexpr = 16
        SUB: tl.constexpr = 16 if G == 16 else 32  # inputs of a chunk that share a weight scale
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_rows = tl.where(n_ok, offs_n, 0)  # clamped, not masked: the loads stay vectorized
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < num_rows
        i32 = tl.arange(0, XV)
        acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            for c in tl.static_range(0, BLOCK_K, XV):
                k0 = pid_k * K_PER_SPLIT + kk + c
                # the chunk's stored values u (q + ZERO), (BLOCK_N, 32)
                if ONE_BYTE:  # int8, signed as stored
                    u = tl.load(q_ptr + w_rows[:, None] * stride_q + (k0 + i32)[None, :]).to(tl.int8, bitcast=True)
                else:  # two nibbles a byte: element 2j low, 2j + 1 high
                    b = tl.load(q_ptr + w_rows[:, None] * stride_q + (k0 // 2 + tl.arange(0, XV // 2))[None, :])
                    b = b.to(tl.int32)
                    u = tl.reshape(tl.join(b & 0x0F, b >> 4), (BLOCK_N, XV))
                    if HIGH > 0:  # the bits above the nibble, 8 / HIGH a byte, the first lowest
                        offs_h = k0 * HIGH // 8 + tl.arange(0, XV * HIGH // 8)
                        hb = tl.load(qh_ptr + w_rows[:, None] * stride_h + offs_h[None, :]).to(tl.int32)
                        if HIGH == 1:
                            h = tl.join(tl.join(tl.join(hb & 1, (hb >> 4) & 1), tl.join((hb >> 2) & 1, (hb >> 6) & 1)),
                                        tl.join(tl.join((hb >> 1) & 1, (hb >> 5) & 1),
                                                tl.join((hb >> 3) & 1, hb >> 7)))
                        else:
                            h = tl.join(tl.join(hb & 3, (hb >> 4) & 3), tl.join((hb >> 2) & 3, hb >> 6))
                        u = u | (tl.reshape(h, (BLOCK_N, XV)) << 4)
                    u = u.to(tl.int8)
                # the rows' x over the chunk, rounded to int8 with one scale a row
                xv = tl.load(x_ptr + rows[:, None] * stride_x + (k0 + i32)[None, :], mask=row_ok[:, None],
                             other=0.0).to(tl.float32)
                amax = tl.max(tl.abs(xv), axis=1)
                inv = 127.0 / tl.maximum(amax, 1e-30)  # a chunk of zeros rounds to zeros
                # + 1.5 * 2^23 rounds to an integer in the float's low bits
                xq = (xv * inv[:, None] + 12582912.0).to(tl.int32, bitcast=True) - 0x4B400000
                sx = amax * (1.0 / 127.0)
                for j in tl.static_range(XV // SUB):
                    if SUB == XV:
                        uj = u
                        xj = xq
                    else:  # groups of 16: each half of the chunk on its own
                        half = (i32 // SUB) == j
                        uj = tl.where(half[None, :], u, 0).to(tl.int8)
                        xj = tl.where(half[None, :], xq, 0)
                    if DOT_INT8:
                        d = tl.dot(uj, tl.trans(xj.to(tl.int8)), out_dtype=tl.int32)
                    else:  # Triton's interpreter: the same integers in float32 (exact below 2^24)
                        d = tl.dot(uj.to(tl.float32), tl.trans(xj.to(tl.float32)), input_precision="ieee")
                        d = d.to(tl.int32)
                    qs = tl.sum(xj, axis=1)  # the rounded inputs' own sum, for the offsets
                    g = (k0 + j * SUB) // G
                    s = tl.load(s_ptr + w_rows * stride_s + g).to(tl.float32)
                    if UNIT > 0:  # codes times their super-block's unit, in float32 as the reference
                        s = tl.load(su_ptr + w_rows * stride_u + g // UNIT).to(tl.float32) * s
                    # the int32 sums made floats by their bits (|d| < 2^22): 2^23 + 2^22 + d
                    df = (d + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
                    if HAS_OFFSET or ZERO != 0:
                        o = -ZERO * s
                        if HAS_OFFSET:
                            ow = tl.load(o_ptr + w_rows * stride_s + g).to(tl.float32)
                            if UNIT > 0:
                                ow = tl.load(ou_ptr + w_rows * stride_u + g // UNIT).to(tl.float32) * ow
                            o = o + ow
                        t = df * s[:, None] + o[:, None] * qs.to(tl.float32)[None, :]
                    else:
                        t = df * s[:, None]
                    acc += t * sx[None, :]
        acc = tl.trans(acc)  # (BLOCK_M, BLOCK_N)
        out_mask = row_ok[:, None] & n_ok[None, :]
        if SPLIT_K > 1:
            # part: (SPLIT_K, num_rows, N) fp32; the last program of a column tile sums it in order
            part = part_ptr + rows[:, None] * N + offs_n[None, :]
            last, acc = sum_splits(acc, part, pid_k, count_ptr + pid_n, num_rows, N, out_mask, SPLIT_K)
            if last:
                if HAS_BIAS:
                    acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                         mask=out_mask)
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                     mask=out_mask)

    return packed_mma_kernel


def packed_mma_gemv(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                    tile: MmaTile | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M <= 16, K) bf16 or fp16 (fp32 under the interpreter), weight a GroupedWeight of an
    integer kind on x's device -> (M, N) in x's dtype: the weights' exact values times x rounded
    to int8 per 32 inputs a row, each row's bits its own (batch-invariant)."""
    from engine.kernels.packed_gemv import _split_buffers, _weight_args

    m, k = x.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_ROWS and k == weight.shape[1] and x.stride(1) == 1
    assert mma_kernel_fits(weight), (weight.kind, weight.group, k)
    tile = tile or default_mma_tile(n, k)
    assert tile.block_k % X_VECTOR == 0 and k % (tile.block_k * tile.split_k) == 0, (k, tile)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    tiles = -(-n // tile.block_n)
    part, counters = _split_buffers(tile.split_k, m, n, tiles, out)
    args = _weight_args(weight)
    args["ZERO"] = 0 if weight.kind == INT8 else ZERO.get(weight.kind, 0)  # int8 multiplies as stored
    args.pop("FP8")
    interpreting = triton_interpreting()
    _mma_kernel()[(tiles, tile.split_k)](
        x, b_ptr=bias if bias is not None else out, out_ptr=out, part_ptr=part, count_ptr=counters, num_rows=m,
        N=n, stride_x=x.stride(0), stride_out=out.stride(0), **args, HAS_BIAS=bias is not None,
        SPLIT_K=tile.split_k, K_PER_SPLIT=k // tile.split_k, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        DOT_INT8=not interpreting, num_warps=tile.num_warps, num_stages=1 if interpreting else tile.num_stages)
    return out


def rounded_x(x: torch.Tensor, vector: int = X_VECTOR) -> torch.Tensor:
    """x as the int8 paths round it, in float32: each vector of `vector` inputs of a row to int8
    with one scale, max|x| / 127, to nearest."""
    b = x.float().reshape(-1, vector)
    amax = b.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(b * inv) * (amax * (1.0 / 127.0))).reshape(x.shape)


def packed_mma_ref(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The weight's exact values (dequantize_grouped, float32) times x rounded as the kernel
    rounds it, in float32, then x's dtype."""
    out = F.linear(rounded_x(x), dequantize_grouped(weight).float(), None if bias is None else bias.float())
    return out.to(x.dtype)


sum_splits = None  # bound by _mma_kernel()

__all__ = ["MmaTile", "default_mma_tile", "mma_kernel_fits", "packed_mma_gemv", "packed_mma_ref", "rounded_x"]
