"""packed_rows_gemv: out = x @ W.T for 1 to 16 rows with W kept quantized and x rounded to int8,
batch-invariant by construction; packed_rows_ref beside it (the weight's exact values times the
same rounded x, in float32).

The GEMV of a quantized target with a draft loaded, whose verify rows must keep the bits of the
one-row steps they stand for. Two launches:
- quantize_rows rounds each row of x to int8 in vectors of 32 inputs (one scale a vector,
  max|x| / 127, to nearest), once for every block of the projection. It stores the int8 values as
  32-bit words in the order the weights' words meet them (for nibbles, a word of the even inputs
  of 8 beside one of the odd, as the low and high nibbles split), the vectors' scales, and the
  sums of the rounded values per 16 inputs (for the offsets).
- The GEMV: each thread owns one output column and every LANES-th vector of 32 inputs of its K
  share, loads its vector's weight words (16 bytes of nibbles, with their plane of high bits for
  the 5- and 6-bit kinds; 32 bytes of int8), and for every row multiplies them by the row's words
  in integer dot products (dp4a: four byte products a word, exact), then scales the sum once:
  sum(w x) ~ sx (s sum(u xq) + (o - ZERO s) sum(xq)), s and o the chunk's scale and offset (each
  half of the vector its own for groups of 16). Each (row, column, lane) adds its terms in K order
  in one thread; the LANES partial sums of a column then add pairwise in a fixed tree, and split
  K's shares in split order (packed_gemv's sum_splits). No sum ever mixes rows or depends on how a
  tensor is spread over threads, so a row's result has the same bits whatever rows came with it,
  whichever of the compiled row counts (1, 2, 4, 8, 16) runs it.

Serves every kind with integer values (packed_gemv.INT8_X_KINDS): nibbles, the 5- and 6-bit kinds,
int8; not FP8 (packed_gemv's bf16 dots serve it).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import triton_interpreting
from engine.kernels.rounded_x import round_helper
from engine.weights.grouped import INT8, ZERO, GroupedWeight, dequantize_grouped

MAX_ROWS = 16
X_VECTOR = 32  # inputs of x that share one int8 scale
ROW_BUCKETS = (1, 2, 4, 8, 16)  # the row counts compiled; a call runs the smallest that holds its rows
dp4a = spread1 = spread2 = sum_splits = row_term = pair_rows = rows_stack = round_vectors = None  # bound by _kernels()


@dataclass(frozen=True)
class RowsTile:
    block_n: int = 16  # output columns a program, one a thread of each lane
    lanes: int = 8  # threads of a column, each every lanes-th vector of the share
    split_k: int = 1
    unroll: int = 1  # vectors a lane takes an iteration (their loads in flight together)
    num_warps: int = 4
    num_stages: int = 3


def default_rows_tile(n: int, k: int) -> RowsTile:
    """16 columns a program, 8 lanes a column (four warps), K split in the fewest of 1, 2, 4 or 8
    shares (whole vectors, at least 4 a lane) that give 1,024 programs or more."""
    tiles = -(-n // 16)
    vectors = k // X_VECTOR
    splits = [s for s in (1, 2, 4, 8) if vectors % s == 0 and vectors // s >= 32] or [1]
    return RowsTile(16, 8, next((s for s in splits if tiles * s >= 1024), splits[-1]))


def rows_kernel_fits(weight: GroupedWeight) -> bool:
    """An integer kind (not FP8) whose groups hold whole vectors of 32 inputs, or halves of one
    (16), over a K of whole vectors."""
    from engine.kernels.packed_gemv import INT8_X_KINDS

    return (weight.kind in INT8_X_KINDS and weight.shape[1] % X_VECTOR == 0
            and (weight.group % X_VECTOR == 0 or weight.group == 16))


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    from engine.kernels import packed_gemv

    packed_gemv._row_kernel()  # binds packed_gemv's dp4a, spread1, spread2 and sum_splits
    global dp4a, spread1, spread2, sum_splits, row_term, pair_rows, rows_stack, round_vectors
    round_vectors = round_helper()  # engine/kernels/rounded_x.py
    dp4a, spread1, spread2 = packed_gemv.dp4a, packed_gemv.spread1, packed_gemv.spread2
    sum_splits = packed_gemv.sum_splits

    @triton.jit
    def quantize_kernel(x_ptr, xq_ptr, sx_ptr, qs_ptr, num_rows, stride_x, vectors, NIBBLE_ORDER: tl.constexpr,
                        R: tl.constexpr, BLOCK_V: tl.constexpr):
        """Row program_id(0)'s vectors BLOCK_V * program_id(1) on: int8 words (8 a vector), scales,
        sums per 16, each vector's R rows side by side (a row past num_rows all zeros)."""
        r = tl.program_id(0)
        v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
        v_ok = v < vectors
        i = tl.arange(0, 32)
        # the row test as a block, not a scalar: newer Triton interpreters refuse a block & scalar mask
        in_row = v_ok & (r + 0 * v < num_rows)
        x = tl.load(x_ptr + r * stride_x + v[:, None] * 32 + i[None, :], mask=in_row[:, None], other=0.0).to(tl.float32)
        words, scales, q = round_vectors(x, BLOCK_V, NIBBLE_ORDER)
        tl.store(sx_ptr + v * R + r, scales, mask=v_ok)
        qs = tl.sum(tl.reshape(q, (BLOCK_V, 2, 16)), axis=2)
        tl.store(qs_ptr + (v[:, None] * R + r) * 2 + tl.arange(0, 2)[None, :], qs, mask=v_ok[:, None])
        tl.store(xq_ptr + (v[:, None] * R + r) * 8 + tl.arange(0, 8)[None, :], words, mask=v_ok[:, None])

    @triton.jit
    def row_term(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE: tl.constexpr,
                 ASM: tl.constexpr, SUBV: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr,
                 R: tl.constexpr, MASKED: tl.constexpr):
        """Row r's (BLOCK_N, LANES) terms of this step: sx (s sum(u xq) + o sum(xq)) for each
        column and lane's vector (zeros for a lane past the share's end). x's data lie a vector's
        R rows side by side, so a row's sit at constant offsets from its vector's."""
        vr = (v * R + r)[None, :] + nz[:, None]  # (BLOCK_N, LANES): the same for every column
        xw = (vr * 8)[:, :, None, None] + word4  # (BLOCK_N, LANES, SUBV, WPS), as the weights' words
        if ONE_BYTE:  # a word of 4 inputs against each weight word, signed as stored
            xa = tl.load(xq_ptr + xw)
            isum = tl.sum(dp4a(lo_e, xa, tl.zeros_like(xa), True, ASM), axis=3)
        else:  # the even inputs' word and the odd inputs' word against each weight word
            qe = tl.load(xq_ptr + xw)
            qo = tl.load(xq_ptr + xw + 4)
            isum = tl.sum(dp4a(lo_o, qo, dp4a(lo_e, qe, tl.zeros_like(qe), False, ASM), False, ASM), axis=3)
        # the rounded inputs' sums per 16, (BLOCK_N, LANES, 2): each half's, or the vector's
        qs = tl.load(qs_ptr + (vr * 2)[:, :, None] + tl.arange(0, 2)[None, None, :])
        if SUBV == 1:
            qs = tl.reshape(tl.sum(qs, axis=2), (BLOCK_N, LANES, 1))
        sx = tl.load(sx_ptr + vr)
        # the int32 sums made floats by their bits (|sum| < 2^22): 2^23 + 2^22 + sum
        isf = (isum + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
        qsf = (qs + 0x4B400000).to(tl.float32, bitcast=True) - 12582912.0
        t = isf * s + qsf * o  # (BLOCK_N, LANES, SUBV)
        if SUBV == 2:  # two halves: one add, either order the same
            t = tl.sum(t, axis=2)
        else:
            t = tl.reshape(t, (BLOCK_N, LANES))
        t = t * sx
        if MASKED:
            t = tl.where(v_in[None, :], t, 0.0)
        return t

    @triton.jit
    def pair_rows(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE: tl.constexpr,
                  ASM: tl.constexpr, SUBV: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr,
                  R: tl.constexpr, MASKED: tl.constexpr, COUNT: tl.constexpr):
        """Rows r .. r + COUNT - 1 (COUNT 2 or 4) stacked by joins, (BLOCK_N, LANES, 2[, 2])."""
        a = tl.join(row_term(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM, SUBV,
                             BLOCK_N, LANES, R, MASKED),
                    row_term(r + 1, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM,
                             SUBV, BLOCK_N, LANES, R, MASKED))
        if COUNT == 4:
            b = tl.join(row_term(r + 2, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM,
                                 SUBV, BLOCK_N, LANES, R, MASKED),
                        row_term(r + 3, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM,
                                 SUBV, BLOCK_N, LANES, R, MASKED))
            a = tl.join(a, b)
        return a

    @triton.jit
    def rows_stack(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE: tl.constexpr,
                   ASM: tl.constexpr, SUBV: tl.constexpr, BLOCK_N: tl.constexpr, LANES: tl.constexpr,
                   R: tl.constexpr, MASKED: tl.constexpr, COUNT: tl.constexpr):
        """The terms of rows r .. r + COUNT - 1, (BLOCK_N, LANES, COUNT), stacked by joins: row
        r + i at the position of i's bits reversed (rows_kernel's stores undo it)."""
        if COUNT == 1:
            st = row_term(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM, SUBV,
                          BLOCK_N, LANES, R, MASKED)
        elif COUNT <= 4:
            st = pair_rows(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM, SUBV,
                           BLOCK_N, LANES, R, MASKED, COUNT)
        elif COUNT == 8:
            st = tl.join(pair_rows(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE, ASM,
                                   SUBV, BLOCK_N, LANES, R, MASKED, 4),
                         pair_rows(r + 4, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE,
                                   ASM, SUBV, BLOCK_N, LANES, R, MASKED, 4))
        else:
            st = tl.join(tl.join(pair_rows(r, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4,
                                           ONE_BYTE, ASM, SUBV, BLOCK_N, LANES, R, MASKED, 4),
                                 pair_rows(r + 4, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4,
                                           ONE_BYTE, ASM, SUBV, BLOCK_N, LANES, R, MASKED, 4)),
                         tl.join(pair_rows(r + 8, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4,
                                           ONE_BYTE, ASM, SUBV, BLOCK_N, LANES, R, MASKED, 4),
                                 pair_rows(r + 12, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4,
                                           ONE_BYTE, ASM, SUBV, BLOCK_N, LANES, R, MASKED, 4)))
        return tl.reshape(st, (BLOCK_N, LANES, COUNT))

    @triton.jit
    def rows_kernel(xq_ptr, sx_ptr, qs_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr,
                    count_ptr, num_rows, N, vectors, stride_q, stride_h, stride_s, stride_u, stride_out,
                    ZERO: tl.constexpr, G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                    HIGH: tl.constexpr, ONE_BYTE: tl.constexpr, HAS_BIAS: tl.constexpr, ASM: tl.constexpr,
                    SPLIT_K: tl.constexpr, SHARE: tl.constexpr, R: tl.constexpr, BLOCK_N: tl.constexpr,
                    LANES: tl.constexpr, UNROLL: tl.constexpr, SG: tl.constexpr, UG: tl.constexpr,
                    PAIRED: tl.constexpr):
        # The weights' tensors are (BLOCK_N, LANES, SUBV, WPS): columns, lanes, the vector's halves
        # with a scale each (2 for groups of 16, else 1), a half's words. Each row's terms are
        # computed on that shape (its x loaded at the same places for every column, so every
        # tensor keeps the weights' layout) and stacked along a last axis of R rows by joins.
        WPV: tl.constexpr = 8 if ONE_BYTE else 4  # weight words a vector of 32 inputs
        SUBV: tl.constexpr = 2 if G == 16 else 1
        WPS: tl.constexpr = WPV // SUBV
        QPH: tl.constexpr = 4 // HIGH if HIGH > 0 else 1  # weight words a word of high bits serves
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        n4 = tl.where(n_ok, offs_n, 0)[:, None, None, None]  # (BLOCK_N, 1, 1, 1), clamped, not masked
        nz = offs_n * 0
        lanes = tl.arange(0, LANES)
        h4 = tl.arange(0, SUBV)[None, None, :, None]
        word4 = h4 * WPS + tl.arange(0, WPS)[None, None, None, :]  # a word's place in its vector
        q_words = q_ptr.to(tl.pointer_type(tl.int32))
        h_words = qh_ptr.to(tl.pointer_type(tl.int32))
        acc = tl.zeros([BLOCK_N, LANES, R], tl.float32)
        # UNROLL vectors a lane an iteration, their loads issued together (a lane's vectors still
        # added in K order, so the sums do not depend on UNROLL)
        for it in range(0, SHARE, LANES * UNROLL):
            for u in tl.static_range(UNROLL):
                v = pid_k * SHARE + it + u * LANES + lanes  # the vector each lane takes
                v_in = (it + u * LANES + lanes) < SHARE
                if SHARE % (LANES * UNROLL) != 0:  # a lane past the share's end reads its first again
                    v = tl.where(v_in, v, pid_k * SHARE)
                v4 = v[None, :, None, None]
                w = tl.load(q_words + n4 * (stride_q // 4) + v4 * WPV + word4)  # (BLOCK_N, LANES, SUBV, WPS)
                g = (v4 * 32 + h4 * 16) // G  # each half's group (the same one unless groups are 16)
                s = tl.load(s_ptr + n4 * stride_s + g * SG).to(tl.float32)
                if UNIT > 0:  # codes times their super-block's unit, in float32 as the reference
                    s = tl.load(su_ptr + n4 * stride_u + (g // UNIT) * UG).to(tl.float32) * s
                o = -ZERO * s
                if HAS_OFFSET:
                    ow = tl.load(o_ptr + n4 * stride_s + g * SG).to(tl.float32)
                    if UNIT > 0:
                        ow = tl.load(ou_ptr + n4 * stride_u + (g // UNIT) * UG).to(tl.float32) * ow
                    o = o + ow
                s = tl.reshape(s, (BLOCK_N, LANES, SUBV))
                o = tl.reshape(o, (BLOCK_N, LANES, SUBV))
                lo_e = w  # int8: the words as stored
                lo_o = w
                if not ONE_BYTE:
                    lo_e = w & 0x0F0F0F0F
                    lo_o = (w >> 4) & 0x0F0F0F0F
                    if HIGH > 0:
                        # a word of high bits serves QPH weight words: each weight word's, shifted so
                        # that element i's bits sit at HIGH * i
                        hw = tl.load(h_words + n4 * (stride_h // 4) + v4 * HIGH + word4 // QPH)
                        hw = hw >> ((word4 % QPH) * (8 * HIGH))
                        if HIGH == 2:  # each element's 2 high bits to bits 4-5 of its byte
                            lo_e = lo_e | (spread2(hw & 0x3333) << 4)
                            lo_o = lo_o | (spread2((hw >> 2) & 0x3333) << 4)
                        else:
                            lo_e = lo_e | (spread1(hw & 0x55) << 4)
                            lo_o = lo_o | (spread1((hw >> 1) & 0x55) << 4)
                acc += rows_stack(0, xq_ptr, sx_ptr, qs_ptr, lo_e, lo_o, s, o, v, v_in, nz, word4, ONE_BYTE,
                                  ASM, SUBV, BLOCK_N, LANES, R, SHARE % (LANES * UNROLL) != 0, R)
        # the lanes' sums pairwise, (0 + 1) + (2 + 3) and so on: each step a sum of two, whose
        # order cannot matter, so the tree is the same however the lanes sit in the threads
        t = tl.permute(acc, (0, 2, 1))  # (BLOCK_N, R, LANES)
        if LANES >= 2:
            t = tl.sum(tl.reshape(t, (BLOCK_N, R, LANES // 2, 2)), axis=3)
        if LANES >= 4:
            t = tl.sum(tl.reshape(t, (BLOCK_N, R, LANES // 4, 2)), axis=3)
        if LANES >= 8:
            t = tl.sum(tl.reshape(t, (BLOCK_N, R, LANES // 8, 2)), axis=3)
        if LANES >= 16:
            t = tl.sum(tl.reshape(t, (BLOCK_N, R, LANES // 16, 2)), axis=3)
        if LANES >= 32:
            t = tl.sum(tl.reshape(t, (BLOCK_N, R, LANES // 32, 2)), axis=3)
        total = tl.trans(tl.reshape(t, (BLOCK_N, R)))  # (R, BLOCK_N), its rows in stacking order
        # the joins stacked row 0 + 2 r1 + 4 r2 + 8 r3 at position r3 + 2 r2 + 4 r1 + 8 r0 (a
        # bit reversal): each position's row
        f = tl.arange(0, R)
        rows = f * 0
        if R >= 2:
            LOG: tl.constexpr = 1 if R == 2 else (2 if R == 4 else (3 if R == 8 else 4))
            for b in tl.static_range(LOG):
                rows = rows | (((f >> b) & 1) << (LOG - 1 - b))
        out_mask = (rows[:, None] < num_rows) & n_ok[None, :]
        if SPLIT_K > 1:
            part = part_ptr + rows[:, None] * N + offs_n[None, :]
            last, total = sum_splits(total, part, pid_k, count_ptr + pid_n, num_rows, N, out_mask, SPLIT_K)
            if last:
                if HAS_BIAS:
                    total += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], total.to(out_ptr.dtype.element_ty),
                         mask=out_mask)
        else:
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], total.to(out_ptr.dtype.element_ty),
                     mask=out_mask)

    return quantize_kernel, rows_kernel


def row_bucket(m: int) -> int:
    """The compiled row count a call of m rows runs (ROW_BUCKETS)."""
    return next(b for b in ROW_BUCKETS if b >= m)


def quantize_rows(x: torch.Tensor, nibble_order: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (M, K) rounded to int8 per vector of 32 inputs a row, for R = row_bucket(M) rows (those
    past M zeros), each vector's rows side by side: words (K / 32, R, 8) int32 in the order the
    weights' words meet them (nibble_order: a word of the even inputs of 8 beside one of the odd;
    else in input order), scales (K / 32, R) fp32, sums of the rounded values per 16 inputs
    (K / 32, R, 2) int32."""
    m, k = x.shape
    assert k % X_VECTOR == 0 and x.stride(1) == 1
    vectors, rows = k // X_VECTOR, row_bucket(m)
    words = torch.empty((vectors, rows, 8), dtype=torch.int32, device=x.device)
    scales = torch.empty((vectors, rows), dtype=torch.float32, device=x.device)
    sums = torch.empty((vectors, rows, 2), dtype=torch.int32, device=x.device)
    block_v = 32
    _kernels()[0][(rows, -(-vectors // block_v))](x, words, scales, sums, m, x.stride(0), vectors,
                                                  NIBBLE_ORDER=nibble_order, R=rows, BLOCK_V=block_v, num_warps=4)
    return words, scales, sums


def nibble_order(weight: GroupedWeight) -> bool:
    """Whether the weight's words hold nibbles (x's words in the even-odd order), not int8."""
    return weight.kind != INT8


def packed_rows_gemv(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                     tile: RowsTile | None = None, out: torch.Tensor | None = None,
                     xq: tuple | None = None) -> torch.Tensor:
    """x (M <= 16, K) bf16 or fp16 (fp32 under the interpreter), weight a GroupedWeight of an
    integer kind on x's device -> (M, N) in x's dtype: the weights' exact values times x rounded to
    int8 per 32 inputs a row, each row's bits its own. xq: quantize_rows(x, nibble_order(weight)),
    where the caller shares it between blocks."""
    from engine.kernels.packed_gemv import _split_buffers, _weight_args

    m, k = x.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_ROWS and k == weight.shape[1] and x.stride(1) == 1
    assert rows_kernel_fits(weight), (weight.kind, weight.group, k)
    tile = tile or default_rows_tile(n, k)
    vectors = k // X_VECTOR
    assert vectors % tile.split_k == 0, (k, tile)
    if xq is None:
        xq = quantize_rows(x, nibble_order(weight))
    words, scales, sums = xq
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    tiles = -(-n // tile.block_n)
    part, counters = _split_buffers(tile.split_k, m, n, tiles, out)
    args = _weight_args(weight)
    args["ZERO"] = 0 if weight.kind == INT8 else ZERO.get(weight.kind, 0)  # int8 multiplies as stored
    del args["FP8"]
    interpreting = triton_interpreting()
    bucket = row_bucket(m)
    assert words.shape[1] == bucket, "xq: quantize_rows of these rows"
    _kernels()[1][(tiles, tile.split_k)](
        words, scales, sums, b_ptr=bias if bias is not None else out, out_ptr=out, part_ptr=part,
        count_ptr=counters, num_rows=m, N=n, vectors=vectors, stride_out=out.stride(0), **args,
        HAS_BIAS=bias is not None, ASM=not interpreting, SPLIT_K=tile.split_k, SHARE=vectors // tile.split_k,
        R=bucket, BLOCK_N=tile.block_n, LANES=tile.lanes, UNROLL=tile.unroll, num_warps=tile.num_warps,
        num_stages=1 if interpreting else tile.num_stages,
        # no multiply-add fused: the compiler fuses where the expression allows, which differs
        # between the row counts' kernels (one row adds its terms straight into the sums)
        enable_fp_fusion=False)
    return out


def rounded_x(x: torch.Tensor, vector: int = X_VECTOR) -> torch.Tensor:
    """x as the int8 paths round it, in float32: each vector of `vector` inputs of a row to int8
    with one scale, max|x| / 127, to nearest."""
    b = x.float().reshape(-1, vector)
    amax = b.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(b * inv) * (amax * (1.0 / 127.0))).reshape(x.shape)


def packed_rows_ref(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The weight's exact values (dequantize_grouped, float32) times x rounded as the kernel
    rounds it, in float32, then x's dtype."""
    out = F.linear(rounded_x(x), dequantize_grouped(weight).float(), None if bias is None else bias.float())
    return out.to(x.dtype)


__all__ = ["ROW_BUCKETS", "RowsTile", "default_rows_tile", "nibble_order", "packed_rows_gemv", "packed_rows_ref",
           "quantize_rows", "rounded_x", "rows_kernel_fits"]
