"""packed_gemv: out = x @ W.T for 1 to 16 rows with W kept quantized (a GroupedWeight), decoded
tile by tile inside the kernel; packed_gemv_ref beside it (the weight dequantized by the torch
reference and rounded to x's dtype, then a plain matmul: what the dequantize-at-load path runs).

One program owns BLOCK_N output columns of every row over a 1 / SPLIT_K share of K. Each K step
loads the step's quantized bytes (low nibbles, and for 5- and 6-bit kinds the plane of high
bits), its groups' scales and offsets (the k-quants' codes times their super-block's unit),
decodes w = q * scale (+ offset) in float32, rounds it to bf16 (the very weight the
dequantize-at-load path multiplies) and takes a tensor-core dot with the rows, padded to 16: a
row's result does not depend on how many rows came with it, so a verify row has the bits of the
decode step it stands for (batch invariance, as the bf16 tiles). Split K: each program stores
its partial sums and the last of a column tile to finish adds them in a fixed order (a counter
per tile, left at zero): no host sync, safe inside CUDA graphs.

Beside it, each with the same reference: packed_row_gemv, one row on CUDA cores (an engine with
no draft, which needs no batch invariance); packed_matmul, the same kernel over blocks of rows
for a prefill of any length; dequantize_packed, the weight decoded into a dense tensor
(dequantize_grouped's values, rounded once); packed_embed_rows, rows of it by index (an
embedding lookup).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import next_pow2, pdl_args, triton_interpreting
from engine.kernels.gemv import _MAX_TILES, PREFETCH_LINES, _tile_counters
from engine.kernels.rounded_x import RoundedX
from engine.weights.grouped import (
    BITS5, BITS6, FP8, HIGH_BITS, INT8, KIND_NAMES, NIBBLES, SIGNED_BITS5, SIGNED_BITS6, SIGNED_NIBBLES, ZERO,
    GroupedWeight, dequantize_grouped, is_paired,
)

MAX_ROWS = 16
sum_splits = None  # bound by _kernel()
decode_tile = prefetch_rows = None  # bound by _kernel()


@dataclass(frozen=True)
class PackedTile:
    block_n: int  # output columns a program (the dot's long side)
    block_k: int  # inputs a K step
    split_k: int = 1  # programs along K per column tile (a fixed-order sum by the last one)
    num_warps: int = 4
    num_stages: int = 3
    # True: q made a float by its bits (2^23 + q, less 2^23), False: by a conversion instruction
    magic: bool = True


SHORT_K = 2048  # below this K, default_tile(short=True) takes the short-K tile
SHORT_SPLIT = 6
# A short K with this many 64-column tiles or more (a small model's tied lm_head: 768 of them
# for the demo's 49,152 x 576) fills the GPU without a split: 64 columns over steps of 64, K
# whole, 2 warps. The demo's lm_head packed as Q4_1 on an H100 (bench_packed.py --config
# --lm-head --roles lm_head --sweep): 15.6 us at one row and 15.7 at 16 against 26.0 and 35.0
# on the split tile.
SHORT_WIDE_TILES = 512


def default_tile(n: int, k: int, group: int, short: bool = True) -> PackedTile:
    """64 columns a program over 128-input steps (shorter where K or the groups need them), K split
    in the fewest of 1, 2, 3, 4, 8 or 16 shares (dividing the steps) that give 512 programs or more
    (the most where none does).
    On an H200 (benchmarks/bench_packed.py --sweep; docs/performance.md) the 8B shape's qkv,
    o_proj and down ran fastest split in eight (Q4_K_M down 34.3 us against 46.9 in four), its
    gate_up (448 column tiles) in two to four.
    short: a K under SHORT_K (a small model's) takes 32 columns a program on 2 warps, K in
    SHORT_SPLIT shares of the longest step that divides them, where one does (the demo's shape on
    an H100, bench_packed.py --config --sweep: its four projections 0.4-0.7 us faster each at one
    row, none slower at 16), or with SHORT_WIDE_TILES column tiles of 64 or more, those tiles
    over steps of 64 unsplit."""
    if short and k < SHORT_K:
        if -(-n // 64) >= SHORT_WIDE_TILES and k % 64 == 0 and (64 % group == 0 or group % 64 == 0):
            return PackedTile(64, 64, 1, 2)
        for block_k in (128, 64, 32):
            if k % (block_k * SHORT_SPLIT) == 0 and (block_k % group == 0 or group % block_k == 0):
                return PackedTile(32, block_k, SHORT_SPLIT, 2)
    block_k = _step_k(k, group, 128)
    steps, tiles = k // block_k, -(-n // 64)
    splits = [s for s in (1, 2, 3, 4, 8, 16) if steps % s == 0]
    return PackedTile(64, block_k, next((s for s in splits if tiles * s >= 512), splits[-1]))


@functools.cache
def _kernel():
    global sum_splits, decode_tile, prefetch_rows  # the kernels call these by this module's names
    import triton
    import triton.language as tl

    from engine.kernels import gemv

    gemv._kernels()
    sum_splits, prefetch_rows = gemv.sum_splits, gemv.prefetch_rows

    @triton.jit
    def decode_tile(q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, w_rows, k0, stride_q, stride_h, stride_s, stride_u,
                    ONE_BYTE: tl.constexpr, FP8: tl.constexpr, HIGH: tl.constexpr, ZERO: tl.constexpr,
                    G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr, MAGIC: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SG: tl.constexpr, UG: tl.constexpr):
        """(BLOCK_N, BLOCK_K) float32 weights of rows w_rows, inputs k0..k0 + BLOCK_K - 1: q * scale
        (+ offset) in float32, dequantize_grouped's values."""
        GROUPS: tl.constexpr = BLOCK_K // G if G < BLOCK_K else 1  # groups a K step spans
        SUB: tl.constexpr = BLOCK_K // GROUPS
        if ONE_BYTE:  # int8 or fp8, one a byte
            offs_q = k0 + tl.arange(0, BLOCK_K)
            q = tl.load(q_ptr + w_rows[:, None] * stride_q + offs_q[None, :])
            if FP8:
                qf = q.to(tl.float32)
            else:
                u = q.to(tl.int32) + 128  # stored unsigned from here: int8 + 128
        else:  # two nibbles a byte: element 2j low, 2j + 1 high
            offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
            b = tl.load(q_ptr + w_rows[:, None] * stride_q + offs_b[None, :]).to(tl.int32)
            u = tl.reshape(tl.join(b & 0x0F, b >> 4), (BLOCK_N, BLOCK_K))
            if HIGH > 0:  # the bits above the nibble, 8 / HIGH a byte, the first lowest
                offs_h = k0 * HIGH // 8 + tl.arange(0, BLOCK_K * HIGH // 8)
                hb = tl.load(qh_ptr + w_rows[:, None] * stride_h + offs_h[None, :]).to(tl.int32)
                if HIGH == 1:
                    h = tl.join(tl.join(tl.join(hb & 1, (hb >> 4) & 1), tl.join((hb >> 2) & 1, (hb >> 6) & 1)),
                                tl.join(tl.join((hb >> 1) & 1, (hb >> 5) & 1), tl.join((hb >> 3) & 1, hb >> 7)))
                else:
                    h = tl.join(tl.join(hb & 3, (hb >> 4) & 3), tl.join((hb >> 2) & 3, hb >> 6))
                u = u | (tl.reshape(h, (BLOCK_N, BLOCK_K)) << 4)
        if not FP8:
            if MAGIC:
                # 2^23 + u as a float32's bits, less 2^23 + ZERO: q exactly, with an OR and
                # a subtraction in place of a conversion instruction per weight (on the H200
                # within 1% of the conversion: kept as the default, the other as a tile option)
                qf = ((u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + ZERO))
            else:
                qf = (u - ZERO).to(tl.float32)
        offs_g = k0 // G + tl.arange(0, GROUPS)
        s = tl.load(s_ptr + w_rows[:, None] * stride_s + offs_g[None, :] * SG).to(tl.float32)
        if UNIT > 0:  # codes times their super-block's unit, in float32 as the reference
            offs_u = offs_g // UNIT
            s = tl.load(su_ptr + w_rows[:, None] * stride_u + offs_u[None, :] * UG).to(tl.float32) * s
        w = tl.reshape(qf, (BLOCK_N, GROUPS, SUB)) * s[:, :, None]
        if HAS_OFFSET:
            o = tl.load(o_ptr + w_rows[:, None] * stride_s + offs_g[None, :] * SG).to(tl.float32)
            if UNIT > 0:
                o = tl.load(ou_ptr + w_rows[:, None] * stride_u + offs_u[None, :] * UG).to(tl.float32) * o
            w = w + o[:, :, None]
        return tl.reshape(w, (BLOCK_N, BLOCK_K))

    @triton.jit
    def packed_kernel(x_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr, count_ptr,
                      num_rows, N, stride_x, stride_q, stride_h, stride_s, stride_u, stride_out,
                      K: tl.constexpr, ONE_BYTE: tl.constexpr, FP8: tl.constexpr, HIGH: tl.constexpr, ZERO: tl.constexpr,
                      G: tl.constexpr, UNIT: tl.constexpr,
                      HAS_OFFSET: tl.constexpr,
                      HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr, MAGIC: tl.constexpr,
                      SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      SG: tl.constexpr, UG: tl.constexpr, PAIRED: tl.constexpr,
                      USE_PDL: tl.constexpr = 0, PF_LINES: tl.constexpr = 1):
        # program_id(2): the block of BLOCK_M rows (a decode or verify step has one; a prefill
        # through this kernel, packed_matmul, several, and no split K)
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_rows = tl.where(n_ok, offs_n, 0)  # clamped, not masked: the loads stay vectorized
        if USE_PDL:
            # no kernel of a step writes weights: this program's first PF_LINES lines of them, and
            # the line of its first scales (and offsets), are requested into L2 while the kernel
            # before may still run; x and every store come after the wait. The next kernel is
            # launched right after the wait (1) or after this program's stores (2).
            kb = pid_k * (K_PER_SPLIT if ONE_BYTE else K_PER_SPLIT // 2)
            prefetch_rows(q_ptr, w_rows, stride_q, kb, kb + (K_PER_SPLIT if ONE_BYTE else K_PER_SPLIT // 2), N, False,
                          128, PF_LINES)
            g0 = (pid_k * K_PER_SPLIT // G) * SG
            prefetch_rows(s_ptr, w_rows, stride_s, g0, g0 + 1, N, False, 1, 1)
            if HAS_OFFSET:
                prefetch_rows(o_ptr, w_rows, stride_s, g0, g0 + 1, N, False, 1, 1)
            tl.extra.cuda.gdc_wait()
            if USE_PDL == 1:
                tl.extra.cuda.gdc_launch_dependents()
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < num_rows
        acc_t = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            k0 = pid_k * K_PER_SPLIT + kk
            w = decode_tile(q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, w_rows, k0, stride_q, stride_h, stride_s,
                            stride_u, ONE_BYTE, FP8, HIGH, ZERO, G, UNIT, HAS_OFFSET, MAGIC, BLOCK_N, BLOCK_K, SG, UG)
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=row_ok[:, None], other=0.0)
            if DOT_F32:
                acc_t += tl.dot(w.to(a.dtype).to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
            else:
                acc_t += tl.dot(w.to(a.dtype), tl.trans(a))
        acc = tl.trans(acc_t)
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
        if USE_PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def dequant_kernel(q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, out_ptr, ids_ptr, N, stride_q, stride_h,
                       stride_s, stride_u, stride_out, ONE_BYTE: tl.constexpr, FP8: tl.constexpr, HIGH: tl.constexpr,
                       ZERO: tl.constexpr, G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SG: tl.constexpr, UG: tl.constexpr,
                       PAIRED: tl.constexpr, BY_IDS: tl.constexpr = False, USE_PDL: tl.constexpr = False):
        """out (N, K) in out's dtype: the weight decoded tile by tile (dequantize_grouped's values,
        rounded once); BY_IDS: out (N, K) the weight's rows ids[0..N-1] (an embedding lookup)."""
        if USE_PDL:  # the ids are the kernel before's output
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        if BY_IDS:
            w_rows = tl.load(ids_ptr + offs_n, mask=n_ok, other=0).to(tl.int64)
        else:
            w_rows = tl.where(n_ok, offs_n, 0)
        k0 = tl.program_id(1) * BLOCK_K
        w = decode_tile(q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, w_rows, k0, stride_q, stride_h, stride_s,
                        stride_u, ONE_BYTE, FP8, HIGH, ZERO, G, UNIT, HAS_OFFSET, True, BLOCK_N, BLOCK_K, SG, UG)
        offs_k = k0 + tl.arange(0, BLOCK_K)
        tl.store(out_ptr + offs_n[:, None] * stride_out + offs_k[None, :], w.to(out_ptr.dtype.element_ty),
                 mask=n_ok[:, None])

    return packed_kernel, dequant_kernel


@dataclass(frozen=True)
class RowTile:
    """A one-row packed launch's tile (packed_row_gemv)."""
    block_n: int  # output columns a program
    block_k: int  # inputs a K step
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3
    vec: int = 16  # bytes of packed weights a thread loads at once


def default_row_tile(n: int, k: int, group: int, per_word: int = 8) -> RowTile:
    """4 rows a program, K not split, in steps of 4,096 inputs with 16-byte loads where K allows,
    else 2,048 with 8-byte loads, the last step past K's end where K is longer but no multiple of
    2,048 (3,584: Qwen2.5-7B's hidden size); int8 8 rows over steps of 4,096 wherever K reaches
    one (its last step past K's end where it must); a shorter K takes the longest step that divides it,
    warps only as many as its vectors fill (a small model's gets one warp, its threads over more
    rows). per_word: weights a 32-bit word holds (8 nibbles, 4 bytes).
    On an H200 (docs/performance.md) those were the fastest tiles or within 4% of them on the 8B
    shape's four projections in AWQ, Q4_K_M and Q4_0; steps whose vectors leave threads over
    ran 2x-6x slower."""
    def tile(block_k: int) -> RowTile:
        vec = 16 if block_k == 4096 else 8
        vectors = block_k // (per_word * min(vec // 4, min(group, block_k) // per_word))
        warps = max(1, min(4, vectors // 32))
        return RowTile(max(4, 32 * warps // vectors), block_k, num_warps=warps, vec=vec)

    def fits(block_k: int) -> bool:
        return block_k % group == 0 or group % block_k == 0

    if per_word == 4 and k >= 4096 and fits(4096) and k % min(group, 4096) == 0:
        # int8: 8 rows over 4,096-input steps, the last past K's end where K needs it (the 8B's
        # layer 78.6 us against 84.9 with the nibbles' tiles on an H200; docs/performance.md)
        return RowTile(8, 4096, vec=16)
    for block_k in (4096, 2048):
        if k % block_k == 0 and fits(block_k):
            return tile(block_k)
    if k > 2048 and fits(2048) and k % min(group, 2048) == 0:
        return tile(2048)
    for block_k in (1024, 512, 256, 128, 64, 32, 16):
        if k % block_k == 0 and fits(block_k):
            return tile(block_k)
    raise ValueError(f"no K step fits K = {k} with groups of {group}")


# The kinds packed_row_gemv can multiply by int8 x: nibbles, the 5- and 6-bit kinds (their high
# bits spread into each byte), int8
INT8_X_KINDS = (NIBBLES, SIGNED_NIBBLES, BITS5, SIGNED_BITS5, BITS6, SIGNED_BITS6, INT8)


def _per_word(kind: int) -> int:
    return 4 if kind in (INT8, FP8) else 8


def tile_group(k: int, group: int) -> int:
    """The group the one-row kernel's chunks keep inside: the weight's own, or where one scale
    serves a whole row (FP8, AWQ/GPTQ without groups) the largest power of two up to 512 that
    divides K, so that K is whole chunks and a step of 4,096 can end past K's end (14,336)."""
    return math.gcd(k, 512) if group == k else group


def row_tile_for(weight: GroupedWeight) -> RowTile:
    """The tile packed_row_gemv takes for this weight when none is given."""
    n, k = weight.shape
    return default_row_tile(n, k, tile_group(k, weight.group), _per_word(weight.kind))


def row_kernel_fits(weight: GroupedWeight) -> bool:
    """The weights the one-row kernel serves: every kind (nibbles, the 5- and 6-bit kinds with
    their plane of high bits, int8, FP8) over any K it has a tile for (row_kernel_k)."""
    k = weight.shape[1]
    return row_kernel_k(k, tile_group(k, weight.group))


def row_kernel_k(k: int, group: int) -> bool:
    """Whether the one-row kernel has a tile for a K (with groups of `group`): K whole vectors of
    32 inputs and a step that divides it. A short K (a small model's) gets one-warp tiles; on the
    demo's shape (K of 576 and 1,536, Q4_1) they decode 1.63x faster than packed_gemv on an H200
    (docs/performance.md)."""
    if k % 32:
        return False
    try:
        default_row_tile(1, k, group)
    except ValueError:
        return False
    return True


def row_kernel_wide(k: int, group: int) -> bool:
    """Whether a K fills the one-row kernel's four warps (2,048 and longer): the widths at which a
    packed one-row step was measured faster than the same weights as bf16 (the 8B and 7B shapes;
    the demo's short K decodes at 0.83x of bf16 packed), which the loader's auto rule counts."""
    return k >= 2048 and row_kernel_k(k, group) and default_row_tile(1, k, group).num_warps == 4


@functools.cache
def _row_kernel():
    # the kernel calls these by this module's names; tl a name of the module too, since Triton's
    # interpreter looks for it there when packed_rows' kernel calls dp4a and the spreads
    global x_pair, dp4a, spread1, spread2, row_step, row_body, pdl_wait, pdl_enter, chain_wait, tl
    import triton
    import triton.language as tl

    _kernel()  # binds sum_splits

    @triton.jit
    def x_pair(word, odd, X_KIND: tl.constexpr):
        """A pair of x's inputs as float32: word's halves (bf16 or fp16), or word and odd (fp32)."""
        if X_KIND == 2:
            xe = word
            xo = odd
        elif X_KIND == 0:  # bf16: a float32's upper half
            xe = (word << 16).to(tl.float32, bitcast=True)
            xo = (word & -65536).to(tl.float32, bitcast=True)
        else:
            xe = (word & 0xFFFF).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
            xo = (word >> 16).to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32)
        return xe, xo

    @triton.jit
    def spread2(h):
        """2-bit fields at bits 0, 4, 8, 12 moved to 0, 8, 16, 24 (one a byte)."""
        t = (h & 0x33) | ((h & 0x3300) << 8)
        return (t & 0x00030003) | ((t & 0x00300030) << 4)

    @triton.jit
    def spread1(h):
        """Bits 0, 2, 4, 6 moved to 0, 8, 16, 24 (one a byte)."""
        t = (h & 0x5) | ((h & 0x50) << 12)
        return (t & 0x00010001) | ((t & 0x00040004) << 6)

    @triton.jit
    def dp4a(a, b, c, SIGNED_A: tl.constexpr, ASM: tl.constexpr):
        """c + the sum of a's 4 bytes (unsigned, or signed) times b's (signed): PTX's dp4a, or the
        same integers by shifts (Triton's interpreter)."""
        if ASM:
            if SIGNED_A:
                r = tl.inline_asm_elementwise("dp4a.s32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                              dtype=tl.int32, is_pure=True, pack=1)
            else:
                r = tl.inline_asm_elementwise("dp4a.u32.s32 $0, $1, $2, $3;", "=r,r,r,r", [a, b, c],
                                              dtype=tl.int32, is_pure=True, pack=1)
        else:
            r = c
            for i in tl.static_range(4):
                if SIGNED_A:
                    r += ((a << (24 - 8 * i)) >> 24) * ((b << (24 - 8 * i)) >> 24)
                else:
                    r += ((a >> (8 * i)) & 0xFF) * ((b << (24 - 8 * i)) >> 24)
        return r

    @triton.jit
    def pdl_wait(PDL: tl.constexpr):
        """The wait for the previous kernel's writes, and with PDL 1 the early launch of the next
        kernel (PDL 2 launches it after this program's stores instead)."""
        tl.extra.cuda.gdc_wait()
        if PDL == 1:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def chain_wait(wait_ptr, wait_for):
        """WAIT == CHAIN_WAIT's wait: until the counter at wait_ptr reaches wait_for, for a launch
        whose programs run after others of the same launch (benchmarks/bench_chained_rows.py);
        a poll bound stops a miscounted chain from hanging the GPU."""
        spins = 0
        while (tl.load(wait_ptr, volatile=True) < wait_for) & (spins < 1 << 24):
            spins += 1
        tl.atomic_add(wait_ptr, 0, sem="acquire")

    @triton.jit
    def pdl_enter(pid_n, pid_k, q_ptr, N, stride_q, ONE_BYTE: tl.constexpr, K_PER_SPLIT: tl.constexpr,
                  BLOCK_N: tl.constexpr, PF_LINES: tl.constexpr, PDL: tl.constexpr, WAIT: tl.constexpr = True):
        """A PDL launch's start: the program's packed bytes requested into L2 (a kernel never
        writes weights), then pdl_wait, unless WAIT is off (EARLY_W: the first K step waits after
        its weights' loads instead)."""
        BYTES: tl.constexpr = K_PER_SPLIT if ONE_BYTE else K_PER_SPLIT // 2
        rows = tl.minimum(pid_n * BLOCK_N + tl.arange(0, BLOCK_N), N - 1)
        lines = tl.minimum(tl.arange(0, PF_LINES) * 128, BYTES - 1)
        ptrs = q_ptr.to(tl.pointer_type(tl.uint8)) + rows[:, None] * stride_q + pid_k * BYTES + lines[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
        if WAIT:
            pdl_wait(PDL)

    @triton.jit
    def row_step(acc, kk, PARTIAL: tl.constexpr, pid_n, pid_k, x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr,
                 ou_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask, ZERO: tl.constexpr,
                 G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr, HIGH: tl.constexpr,
                 ONE_BYTE: tl.constexpr, FP8: tl.constexpr, XQ: tl.constexpr, ASM: tl.constexpr,
                 X_KIND: tl.constexpr, K_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 CHUNK: tl.constexpr, VEC: tl.constexpr, SG: tl.constexpr, UG: tl.constexpr, PAIRED: tl.constexpr,
                 WAIT: tl.constexpr = 0, wait_ptr=None, wait_for=0):
        """One K step (kk: its first input past the share's; PARTIAL: the step passes the share's end)
        of row_body's program: acc plus the step's sums. WAIT > 0: the PDL wait (pdl_wait) comes
        after the step's weights are requested and before x is; WAIT == CHAIN_WAIT: the wait is
        chain_wait(wait_ptr, wait_for) instead."""
        # A K step is C chunks of CHUNK inputs, each inside one group (one scale, one offset a
        # chunk and row), read as 32-bit words of EPW weights (8 nibbles: element 8j + i in
        # nibble i of word j; or 4 bytes), VEC words a load. Tensors are (WD, C, BLOCK_N, VEC):
        # a chunk's vectors, the chunks, the rows, a vector's words. Threads spread over the
        # vectors and chunks (that order: the weights' layout and x's come out the same, so
        # nothing is exchanged through shared memory) and each holds the same words of every row
        # it has, so that the rows share its x. x's words of a weight word are loaded at once
        # and split.
        # Each stored value u (q + ZERO, BITS bits) is placed at the top of the mantissa of 1.0,
        # v = 1 + u / 2^BITS: its low nibble (or byte) by a shift and one LOP3 (the mask coming
        # in a register, since a LOP3 takes one immediate), the 5- and 6-bit kinds' high bits by
        # another shift and LOP3; int8's sign bit is flipped in the same LOP3 (u = q + 128). v is
        # multiplied by its x (one FMA), and a chunk's scale and offset are applied once a thread:
        # sum(w x) = 2^BITS s sum(v x) + (o - (2^BITS + ZERO) s) sum(x).
        # FP8 bytes are converted by the hardware, a word at a time: two e4m3 pairs to f16 pairs,
        # then each half to float32 (exact: f16 holds every e4m3 value, subnormals too), v = q
        # and sum(w x) = s sum(v x).
        # XQ (all but FP8): x's inputs of each vector (one thread's EPW VEC, inside
        # one chunk) are rounded to int8 with one scale, x ~ sx xq, sx = max|x| / 127, and a word
        # of 8 nibbles meets them in two dp4a (4 byte products summed into an int32 each): its
        # low nibbles (elements 0, 2, 4, 6 after one LOP3) against the even inputs' bytes, the
        # high ones against the odd: sum(w x) ~ sx (s sum(u xq) + (o - ZERO s) sum(xq)), exact
        # integer sums: the core some 0.6 instructions a weight where the float path's takes 3. The 5- and
        # 6-bit kinds first move each element's high bits (at HIGH i) to bits 4 and up of its
        # byte (spread1, spread2: a few shifts and LOP3s a word). A word of int8 meets its 4
        # inputs in one dp4a, signed as stored (no ZERO).
        EPW: tl.constexpr = 4 if ONE_BYTE else 8
        BITS: tl.constexpr = 8 if ONE_BYTE else 4 + HIGH
        LOW: tl.constexpr = 23 - BITS  # the stored value's lowest bit in v
        C: tl.constexpr = BLOCK_K // CHUNK
        WD: tl.constexpr = CHUNK // EPW // VEC
        QPH: tl.constexpr = 4 // HIGH if HIGH > 0 else 1  # weight words a word of high bits serves
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        n3 = tl.where(n_ok, offs_n, 0)[None, None, :]  # clamped, not masked: no predicates
        n4 = n3[:, :, :, None]
        c3 = tl.arange(0, C)[None, :, None]
        wd3 = tl.arange(0, WD)[:, None, None]
        v4 = tl.arange(0, VEC)[None, None, None, :]
        word4 = (wd3 * VEC)[:, :, :, None] + v4  # (WD, 1, 1, VEC): a word's index in its chunk
        t5 = tl.arange(0, EPW // 2)[None, None, None, None, :]
        q_words = q_ptr.to(tl.pointer_type(tl.int32))
        h_words = qh_ptr.to(tl.pointer_type(tl.int32))
        k0 = pid_k * K_PER_SPLIT + kk
        kc = k0 + c3 * CHUNK  # each chunk's first input, (1, C, 1)
        if PARTIAL:
            # a last step past K's end (K not a multiple of the step): the chunks beyond it
            # read the last chunk again, unmasked, and their sums are multiplied by zero
            k_end = pid_k * K_PER_SPLIT + K_PER_SPLIT
            c_in = kc < k_end
            kc = tl.minimum(kc, k_end - CHUNK)
        g = kc // G + 0 * wd3  # loaded in the weights' layout: no exchange between threads
        if PAIRED:
            # a k-quant's scale and offset codes side by side (one 16-bit load), and its
            # super-block's two fp16 units side by side (one 32-bit load): two loads, not four,
            # the products as below
            cw = tl.load(s_ptr.to(tl.pointer_type(tl.int16)) + n3 * (stride_s // 2) + g).to(tl.int32)
            uw = tl.load(su_ptr.to(tl.pointer_type(tl.int32)) + n3 * (stride_u // 2) + g // UNIT)
            su = (uw & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            ou = ((uw >> 16) & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            s = su * (cw & 0xFF).to(tl.float32)
            o = ou * ((cw >> 8) & 0xFF).to(tl.float32)
        else:
            s = tl.load(s_ptr + n3 * stride_s + g * SG).to(tl.float32)
            if UNIT > 0:
                s = tl.load(su_ptr + n3 * stride_u + (g // UNIT) * UG).to(tl.float32) * s
            o = s
            if HAS_OFFSET:
                o = tl.load(o_ptr + n3 * stride_s + g * SG).to(tl.float32)
                if UNIT > 0:
                    o = tl.load(ou_ptr + n3 * stride_u + (g // UNIT) * UG).to(tl.float32) * o
        kc4 = kc[:, :, :, None]
        w = tl.load(q_words + n4 * (stride_q // 4) + kc4 // EPW + word4)  # (WD, C, BLOCK_N, VEC)
        if HIGH > 0:
            # a word of high bits serves QPH weight words: each weight word's word, shifted so
            # that element i's bits sit at HIGH * i
            hw = tl.load(h_words + n4 * (stride_h // 4) + kc4 * HIGH // 32 + word4 // QPH)
            hw = hw >> ((word4 % QPH) * (8 * HIGH))
        if FP8:
            if ASM:
                f0, f1, f2, f3 = tl.inline_asm_elementwise(
                    "{.reg .b16 l, h, a0, a1, b0, b1; .reg .b32 a, b; mov.b32 {l, h}, $4;"
                    " cvt.rn.f16x2.e4m3x2 a, l; cvt.rn.f16x2.e4m3x2 b, h; mov.b32 {a0, a1}, a;"
                    " mov.b32 {b0, b1}, b; cvt.f32.f16 $0, a0; cvt.f32.f16 $1, a1; cvt.f32.f16 $2, b0;"
                    " cvt.f32.f16 $3, b1;}",
                    "=r,=r,=r,=r,r", [w], dtype=(tl.float32, tl.float32, tl.float32, tl.float32),
                    is_pure=True, pack=1)
            else:  # Triton's interpreter: the same values through Triton's conversion
                f0 = (w & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
                f1 = ((w >> 8) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
                f2 = ((w >> 16) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
                f3 = ((w >> 24) & 0xFF).to(tl.uint8).to(tl.float8e4nv, bitcast=True).to(tl.float32)
        if WAIT > 0:
            # the weights and their factors are never written by a kernel: requested before the
            # wait, their round trip overlaps the kernel before this one; x only after it
            if WAIT == 8:  # CHAIN_WAIT
                chain_wait(wait_ptr, wait_for)
            else:
                pdl_wait(WAIT)
        dot = tl.zeros([WD, C, BLOCK_N, VEC], tl.float32)
        xsum = tl.zeros([WD, C, 1, VEC], tl.float32)
        xi = (kc4 + EPW * word4)[:, :, :, :, None] + 2 * t5  # (WD, C, 1, VEC, EPW / 2): inputs 8j + 2t
        if X_KIND == 2:
            if EPW == 8:
                x02, x13 = tl.split(tl.reshape(tl.load(x_ptr + xi), (WD, C, 1, VEC, 2, 2)))
                xo02, xo13 = tl.split(tl.reshape(tl.load(x_ptr + xi + 1), (WD, C, 1, VEC, 2, 2)))
            else:
                x0, x1 = tl.split(tl.load(x_ptr + xi))
                xo0, xo1 = tl.split(tl.load(x_ptr + xi + 1))
        elif X_KIND == 3:
            # x rounded already (RoundedX): a vector of 32 inputs, which a thread's EPW * VEC
            # inputs lie inside, is 8 int8 words and one fp32 scale. For the nibbles the even
            # inputs' 4 words, then the odd inputs' 4: a thread's words of each kind lie side by
            # side (one vector load each, as the weights' words); for int8 weights 4 inputs a
            # word in order. The address is written so that the compiler sees that.
            first4 = (wd3 * (EPW * VEC))[:, :, :, None]  # (WD, 1, 1, 1): a thread vector's first input past kc
            if EPW == 8:
                p4 = kc4 + first4  # a multiple of EPW * VEC
                if EPW * VEC == 32:  # a whole vector: its 8 words in order
                    at = p4 // 4 + v4
                else:  # a part of one: 16 inputs (VEC 2) or 8
                    at = (p4 // 32) * 8 + ((p4 // (EPW * VEC)) % (32 // (EPW * VEC))) * VEC + v4
                qe = tl.load(x_ptr + at)
                qo = tl.load(x_ptr + at + 4)
            else:
                qe = tl.load(x_ptr + kc4 // 4 + word4)
            sx = tl.reshape(tl.load(sx_ptr + (kc4 + first4) // 32), (WD, C, 1))
        else:
            # x's words of each weight word (16 or 8 bytes), split into its pairs
            xw = (kc4 // 2 + (EPW // 2) * word4)[:, :, :, :, None] + t5
            xs = tl.load(x_ptr.to(tl.pointer_type(tl.int32)) + xw)
            if EPW == 8:
                x02, x13 = tl.split(tl.reshape(xs, (WD, C, 1, VEC, 2, 2)))
            else:
                x0, x1 = tl.split(xs)
        if X_KIND == 3:
            pass
        elif EPW == 8:
            x0, x2 = tl.split(x02)
            x1, x3 = tl.split(x13)
            if X_KIND == 2:
                xo0, xo2 = tl.split(xo02)
                xo1, xo3 = tl.split(xo13)
        if X_KIND < 2:  # (stand-ins: the odd inputs come from the same words)
            xo0, xo1, xo2, xo3 = x0, x1, x0, x1
            if EPW == 8:
                xo2, xo3 = x2, x3
        if XQ and X_KIND != 3:
            amax = tl.zeros([WD, C, 1, VEC], tl.float32)
            for t in tl.static_range(EPW // 2):
                xe, xo = x_pair(x0 if t == 0 else (x1 if t == 1 else (x2 if t == 2 else x3)),
                                xo0 if t == 0 else (xo1 if t == 1 else (xo2 if t == 2 else xo3)), X_KIND)
                amax = tl.maximum(amax, tl.maximum(tl.abs(xe), tl.abs(xo)))
            amax = tl.max(amax, axis=3, keep_dims=True)  # (WD, C, 1, 1): a vector's
            inv = 127.0 / tl.maximum(amax, 1e-30)  # a vector of zeros rounds to zeros
            qe = tl.zeros([WD, C, 1, VEC], tl.int32)
            qo = tl.zeros([WD, C, 1, VEC], tl.int32)
            for t in tl.static_range(EPW // 2):
                xe, xo = x_pair(x0 if t == 0 else (x1 if t == 1 else (x2 if t == 2 else x3)),
                                xo0 if t == 0 else (xo1 if t == 1 else (xo2 if t == 2 else xo3)), X_KIND)
                # + 1.5 * 2^23 rounds to an integer in the float's low bits; its low byte is
                # the int8 (two's complement where negative)
                be = (xe * inv + 12582912.0).to(tl.int32, bitcast=True) & 0xFF
                bo = (xo * inv + 12582912.0).to(tl.int32, bitcast=True) & 0xFF
                if EPW == 8:  # even inputs' bytes in qe, odd in qo, as the nibbles split
                    qe = qe | (be << (8 * t))
                    qo = qo | (bo << (8 * t))
                else:  # int8: the 4 inputs of a word in order
                    qe = qe | (be << (16 * t)) | (bo << (16 * t + 8))
            sx = tl.reshape(amax, (WD, C, 1)) * (1.0 / 127.0)
        if XQ:
            zeros = tl.zeros([WD, C, BLOCK_N, VEC], tl.int32)
            ones = tl.full([WD, C, 1, VEC], 0x01010101, tl.int32)
            if EPW == 8:
                lo_e = w & 0x0F0F0F0F
                lo_o = (w >> 4) & 0x0F0F0F0F
                if HIGH == 2:  # each element's 2 high bits to bits 4-5 of its byte
                    lo_e = lo_e | (spread2(hw & 0x3333) << 4)
                    lo_o = lo_o | (spread2((hw >> 2) & 0x3333) << 4)
                elif HIGH == 1:
                    lo_e = lo_e | (spread1(hw & 0x55) << 4)
                    lo_o = lo_o | (spread1((hw >> 1) & 0x55) << 4)
                isum = dp4a(lo_o, qo, dp4a(lo_e, qe, zeros, False, ASM), False, ASM)
                # the rounded inputs' own sum for the offsets: the result is then exactly
                # the weights' values times the rounded x (x's own sum errs more where
                # ZERO is not 0)
                qsum = dp4a(ones, qo, dp4a(ones, qe, tl.zeros([WD, C, 1, VEC], tl.int32), False, ASM), False, ASM)
            else:  # int8 bytes, signed as stored: no offset (q x, not u x)
                isum = dp4a(w, qe, zeros, True, ASM)
                qsum = dp4a(ones, qe, tl.zeros([WD, C, 1, VEC], tl.int32), False, ASM)
        for t in tl.static_range(0 if XQ else EPW // 2):  # pair t of each word: elements 2t and 2t + 1
            xe, xo = x_pair(x0 if t == 0 else (x1 if t == 1 else (x2 if t == 2 else x3)),
                            xo0 if t == 0 else (xo1 if t == 1 else (xo2 if t == 2 else xo3)), X_KIND)
            for e in tl.static_range(2):
                i = 2 * t + e  # the element's place in its word
                at = (32 // EPW) * i  # its low bits' place in the word
                if at <= LOW:
                    lo = (w << (LOW - at)) & low_mask
                else:
                    lo = (w >> (at - LOW)) & low_mask
                if FP8:
                    v = (f0 if i == 0 else (f1 if i == 1 else (f2 if i == 2 else f3))).to(tl.int32, bitcast=True)
                elif ONE_BYTE:
                    v = lo ^ 0x3FC00000  # 1.0's bits, and u = q + 128: the sign bit flipped
                elif HIGH > 0:
                    # two LOP3s: (lo & mask) ^ 1.0 as the nibbles', then | (hs & high_mask).
                    # With an OR in place of the XOR the compiler moves the constant last
                    # and needs a third.
                    v = (lo ^ 0x3F800000) | ((hw << (LOW + 4 - HIGH * i)) & high_mask)
                else:
                    v = lo | 0x3F800000
                xv = xe if e == 0 else xo
                dot += v.to(tl.float32, bitcast=True) * xv
            if not FP8:
                xsum += xe + xo
        if FP8:
            s_b = s
        elif XQ:
            s_b = s
            o_b = -(0 if ONE_BYTE else ZERO) * s
            if HAS_OFFSET:
                o_b += o
        else:
            o_b = -((1 << BITS) + ZERO) * s
            if HAS_OFFSET:
                o_b += o
            s_b = s * (1 << BITS)
        if PARTIAL:
            s_b = tl.where(c_in, s_b, 0.0)
            if not FP8:
                o_b = tl.where(c_in, o_b, 0.0)
        if FP8:
            acc += tl.sum(dot, axis=3) * s_b
        elif XQ:
            if ONE_BYTE and not HAS_OFFSET:
                acc += tl.sum(isum, axis=3).to(tl.float32) * s_b * sx
            else:
                acc += (tl.sum(isum, axis=3).to(tl.float32) * s_b + tl.sum(qsum, axis=3).to(tl.float32) * o_b) * sx
        else:
            acc += tl.sum(dot, axis=3) * s_b + o_b * tl.sum(xsum, axis=3)
        return acc


    @triton.jit
    def row_body(pid_n, pid_k, x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr,
                 count_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask, ZERO: tl.constexpr,
                 G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr, HIGH: tl.constexpr,
                 ONE_BYTE: tl.constexpr, FP8: tl.constexpr, XQ: tl.constexpr, ASM: tl.constexpr,
                 HAS_BIAS: tl.constexpr, X_KIND: tl.constexpr,
                 SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr,
                 SG: tl.constexpr, UG: tl.constexpr, PAIRED: tl.constexpr, WAIT: tl.constexpr = 0,
                 wait_ptr=None, wait_for=0):
        """One program of the one-row kernel: column tile pid_n, K share pid_k (packed_row_kernel
        below; packed_row_kernel2 runs two blocks of one projection in one launch). WAIT > 0: the
        PDL wait (pdl_wait(WAIT)) after the first K step's weight loads; WAIT == CHAIN_WAIT:
        chain_wait(wait_ptr, wait_for) there instead."""
        EPW: tl.constexpr = 4 if ONE_BYTE else 8
        C: tl.constexpr = BLOCK_K // CHUNK
        WD: tl.constexpr = CHUNK // EPW // VEC
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        acc = tl.zeros([WD, C, BLOCK_N], tl.float32)
        # the steps unrolled, loads into registers: every load's address is then its base plus a
        # constant (the steps as a loop that Triton pipelines through shared memory ran 0.14x-0.55x
        # as fast on an H100: docs/performance.md)
        for kk in tl.static_range(0, K_PER_SPLIT, BLOCK_K):
            acc = row_step(acc, kk, kk + BLOCK_K > K_PER_SPLIT, pid_n, pid_k, x_ptr, sx_ptr, q_ptr, qh_ptr,
                           s_ptr, o_ptr, su_ptr, ou_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask,
                           high_mask, ZERO, G, UNIT, HAS_OFFSET, HIGH, ONE_BYTE, FP8, XQ, ASM, X_KIND, K_PER_SPLIT,
                           BLOCK_N, BLOCK_K, CHUNK, VEC, SG, UG, PAIRED, WAIT if kk == 0 else 0, wait_ptr, wait_for)
        total = tl.sum(tl.sum(acc, axis=0), axis=0)
        total = tl.reshape(total, (1, BLOCK_N))
        offs_o = offs_n[None, :]
        out_mask = n_ok[None, :]
        if SPLIT_K > 1:
            last, total = sum_splits(total, part_ptr + offs_o, pid_k, count_ptr + pid_n, 1, N, out_mask, SPLIT_K)
            if last:
                if HAS_BIAS:
                    total += tl.load(b_ptr + offs_o, mask=out_mask, other=0.0).to(tl.float32)
                tl.store(out_ptr + offs_o, total.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            if HAS_BIAS:
                total += tl.load(b_ptr + offs_o, mask=out_mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + offs_o, total.to(out_ptr.dtype.element_ty), mask=out_mask)


    @triton.jit
    def packed_row_kernel(x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr,
                          count_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask,
                          ZERO: tl.constexpr, G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                          HIGH: tl.constexpr, ONE_BYTE: tl.constexpr, FP8: tl.constexpr, XQ: tl.constexpr,
                          ASM: tl.constexpr, HAS_BIAS: tl.constexpr, X_KIND: tl.constexpr,
                          SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                          BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr, SG: tl.constexpr,
                          UG: tl.constexpr, PAIRED: tl.constexpr, PDL: tl.constexpr = 0, PF_LINES: tl.constexpr = 1,
                          EARLY_W: tl.constexpr = 0):
        # EARLY_W (with PDL): the first K step's weights loaded before the PDL wait, not only their
        # first lines requested into L2
        if PDL > 0:
            pdl_enter(tl.program_id(0), tl.program_id(1), q_ptr, N, stride_q, ONE_BYTE, K_PER_SPLIT, BLOCK_N,
                      PF_LINES, PDL, not EARLY_W)
        row_body(tl.program_id(0), tl.program_id(1), x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr,
                 out_ptr, part_ptr, count_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask,
                 ZERO, G, UNIT, HAS_OFFSET, HIGH, ONE_BYTE, FP8, XQ, ASM, HAS_BIAS, X_KIND, SPLIT_K,
                 K_PER_SPLIT, BLOCK_N, BLOCK_K, CHUNK, VEC, SG, UG, PAIRED, PDL if EARLY_W else 0)
        if PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()

    @triton.jit
    def packed_row_kernel2(x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr, part_ptr,
                           count_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask,
                           ZERO: tl.constexpr, G: tl.constexpr, UNIT: tl.constexpr, HAS_OFFSET: tl.constexpr,
                           HIGH: tl.constexpr, ONE_BYTE: tl.constexpr, FP8: tl.constexpr, XQ: tl.constexpr,
                           ASM: tl.constexpr, HAS_BIAS: tl.constexpr, X_KIND: tl.constexpr,
                           SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, CHUNK: tl.constexpr, VEC: tl.constexpr, SG: tl.constexpr,
                           UG: tl.constexpr, PAIRED: tl.constexpr, q_ptr_b, qh_ptr_b, s_ptr_b, o_ptr_b,
                           su_ptr_b, ou_ptr_b, b_ptr_b, out_ptr_b, part_ptr_b, count_ptr_b, N_b, stride_q_b,
                           stride_h_b, stride_s_b, stride_u_b, low_mask_b, high_mask_b, ZERO_b: tl.constexpr,
                           G_b: tl.constexpr, UNIT_b: tl.constexpr, HAS_OFFSET_b: tl.constexpr,
                           HIGH_b: tl.constexpr, ONE_BYTE_b: tl.constexpr, FP8_b: tl.constexpr,
                           XQ_b: tl.constexpr, HAS_BIAS_b: tl.constexpr, SPLIT_K_b: tl.constexpr,
                           K_PER_SPLIT_b: tl.constexpr, BLOCK_N_b: tl.constexpr, BLOCK_K_b: tl.constexpr,
                           CHUNK_b: tl.constexpr, VEC_b: tl.constexpr, SG_b: tl.constexpr, UG_b: tl.constexpr,
                           PAIRED_b: tl.constexpr, TILES_A: tl.constexpr, PDL: tl.constexpr = 0,
                           PF_LINES: tl.constexpr = 1, EARLY_W: tl.constexpr = 0):
        # Two blocks of one projection (a Q4_K_M file's Q4_K q and k and Q6_K v) in one launch:
        # programs 0 .. TILES_A - 1 take the first block's column tiles, the rest the second's,
        # each block with its own kind, tile and split of K (the grid's K axis is the larger split)
        pid = tl.program_id(0)
        pid_k = tl.program_id(1)
        if PDL > 0:
            if pid < TILES_A:
                pdl_enter(pid, tl.minimum(pid_k, SPLIT_K - 1), q_ptr, N, stride_q, ONE_BYTE, K_PER_SPLIT, BLOCK_N,
                          PF_LINES, PDL, not EARLY_W)
            else:
                pdl_enter(pid - TILES_A, tl.minimum(pid_k, SPLIT_K_b - 1), q_ptr_b, N_b, stride_q_b, ONE_BYTE_b,
                          K_PER_SPLIT_b, BLOCK_N_b, PF_LINES, PDL, not EARLY_W)
        if pid < TILES_A:
            if pid_k < SPLIT_K:
                row_body(pid, pid_k, x_ptr, sx_ptr, q_ptr, qh_ptr, s_ptr, o_ptr, su_ptr, ou_ptr, b_ptr, out_ptr,
                         part_ptr, count_ptr, N, stride_q, stride_h, stride_s, stride_u, low_mask, high_mask,
                         ZERO, G, UNIT, HAS_OFFSET, HIGH, ONE_BYTE, FP8, XQ, ASM, HAS_BIAS, X_KIND, SPLIT_K,
                         K_PER_SPLIT, BLOCK_N, BLOCK_K, CHUNK, VEC, SG, UG, PAIRED, PDL if EARLY_W else 0)
        else:
            if pid_k < SPLIT_K_b:
                row_body(pid - TILES_A, pid_k, x_ptr, sx_ptr, q_ptr_b, qh_ptr_b, s_ptr_b, o_ptr_b, su_ptr_b, ou_ptr_b,
                         b_ptr_b, out_ptr_b, part_ptr_b, count_ptr_b, N_b, stride_q_b, stride_h_b, stride_s_b,
                         stride_u_b, low_mask_b, high_mask_b, ZERO_b, G_b, UNIT_b, HAS_OFFSET_b, HIGH_b,
                         ONE_BYTE_b, FP8_b, XQ_b, ASM, HAS_BIAS_b, X_KIND, SPLIT_K_b, K_PER_SPLIT_b, BLOCK_N_b,
                         BLOCK_K_b, CHUNK_b, VEC_b, SG_b, UG_b, PAIRED_b, PDL if EARLY_W else 0)
        if PDL == 2:
            tl.extra.cuda.gdc_launch_dependents()

    return packed_row_kernel, packed_row_kernel2


def rounds_x(weight: GroupedWeight) -> bool | None:
    """The order a RoundedX must have for this weight's one-row launch (True: nibbles), or None
    where the weight takes x in its own precision (FP8)."""
    return weight.kind != INT8 if weight.kind in INT8_X_KINDS else None


def packed_row_gemv(x: torch.Tensor | RoundedX, weight: GroupedWeight, bias: torch.Tensor | None = None,
                    tile: RowTile | None = None, out: torch.Tensor | None = None,
                    int8_x: bool = False, pdl: int = 0) -> torch.Tensor:
    """One row: x (1, K) -> (1, N), the weight decoded on CUDA cores and summed per lane (no
    tensor-core padding to 16 rows). Not batch-invariant with packed_gemv (another summation
    order): the path of an engine with no draft loaded, whose rows never need a verify step's
    bits. Values within rounding of packed_gemv_ref.
    int8_x: every kind but FP8 multiplies x rounded to int8 (one scale per 16-32 inputs) by
    integer dot products (dp4a), as llama.cpp's kernels do: the weights' exact values times that
    x, within x's rounding of the reference. A RoundedX x: the same integer products, x rounded
    once before the launch (vectors of 32 inputs; in the kernel, of the thread's 16 or 32).
    pdl: programmatic dependent launch (row_pdl_args); the same values."""
    if out is None:
        out = torch.empty((1, weight.shape[0]), dtype=x.dtype, device=x.device)
    grid, args, launch = _row_args(x, weight, bias, tile, out, int8_x)
    _row_kernel()[0][grid](_x_arg(x), **args, **launch, **row_pdl_args(x.device, pdl))
    return out


def _x_arg(x: torch.Tensor | RoundedX) -> torch.Tensor:
    return x.words if isinstance(x, RoundedX) else x


CHAIN_WAIT = 8  # row_body's WAIT that waits on a counter of the same launch (chain_wait), not on PDL
ROW_PDL_EARLY_W = 4  # a bit of row_pdl_args' pdl: the first K step's weights loaded before the wait


def row_pdl_args(device, pdl: int) -> dict:
    """The one-row kernels' PDL arguments: pdl's low bits 1 (the next kernel launched right after
    the wait), 2 (after this program's stores) or 0, where the device supports it; before the wait
    each row's first PREFETCH_LINES 128-byte lines of its share are requested, as the bf16 GEMV
    does (a share shorter than that requests its last line again), and with ROW_PDL_EARLY_W set the
    program loads its first K step's weights before the wait too (x only after it)."""
    mode = pdl & 3
    if not mode or "launch_pdl" not in pdl_args(device, True):
        return {}
    return dict(PDL=mode, launch_pdl=True, PF_LINES=PREFETCH_LINES, EARLY_W=int(bool(pdl & ROW_PDL_EARLY_W)))


def packed_row_gemv_blocks(x: torch.Tensor | RoundedX, blocks: list[GroupedWeight], biases: list,
                           outs: list[torch.Tensor],
                           int8_x: bool = False, tiles: tuple | None = None, pdl: int = 0) -> None:
    """packed_row_gemv of two blocks of one projection (each its own kind and tile: `tiles`, or
    each block's default) in one launch, writing outs[i] = x @ blocks[i].T (+ biases[i]): the same
    programs as two launches, so the same values (blocks_fit_one_launch says when it applies)."""
    assert len(blocks) == len(biases) == len(outs) == 2
    tiles = tiles or (None, None)
    grid_a, args_a, launch_a = _row_args(x, blocks[0], biases[0], tiles[0], outs[0], int8_x)
    grid_b, args_b, launch_b = _row_args(x, blocks[1], biases[1], tiles[1], outs[1], int8_x)
    assert launch_a == launch_b, (launch_a, launch_b)
    if args_a["SPLIT_K"] > 1 and args_b["SPLIT_K"] > 1:
        # the split-K counters are one buffer per device: the second block's tiles count after
        # the first's
        assert grid_a[0] + grid_b[0] <= _MAX_TILES
        args_b["count_ptr"] = args_b["count_ptr"][grid_a[0]:]
    shared = ("ASM", "X_KIND", "sx_ptr")
    assert all(args_a[k] is args_b[k] or args_a[k] == args_b[k] for k in shared)
    _row_kernel()[1][(grid_a[0] + grid_b[0], max(grid_a[1], grid_b[1]))](
        _x_arg(x), **args_a, **{f"{k}_b": v for k, v in args_b.items() if k not in shared}, TILES_A=grid_a[0],
        **launch_a, **row_pdl_args(x.device, pdl))


def blocks_fit_one_launch(blocks: list[GroupedWeight]) -> bool:
    """Two blocks the one-row kernel serves (row_kernel_fits) whose default tiles launch alike
    (warps and stages): packed_row_gemv_blocks runs them in one launch."""
    if len(blocks) != 2 or not all(row_kernel_fits(b) for b in blocks):
        return False
    a, b = (row_tile_for(w) for w in blocks)
    return (a.num_warps, a.num_stages) == (b.num_warps, b.num_stages)


def row_tile_fits_weight(weight: GroupedWeight, tile: RowTile) -> bool:
    """Whether packed_row_gemv takes this tile for the weight (the conditions _row_args asserts):
    K whole shares of whole chunks, a chunk inside one group and whole words of weights and of
    high bits."""
    k = weight.shape[1]
    group = tile_group(k, weight.group)
    chunk = min(group, tile.block_k)
    high = HIGH_BITS.get(weight.kind, 0)
    return (k % tile.split_k == 0 and (k // tile.split_k) % chunk == 0 and tile.block_k % chunk == 0
            and group % chunk == 0 and chunk % _per_word(weight.kind) == 0 and chunk * high % 32 == 0)


def _row_args(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None, tile: RowTile | None,
              out: torch.Tensor, int8_x: bool) -> tuple[tuple[int, int], dict, dict]:
    """A one-row launch of `weight` into out (1, N): its grid (column tiles, K shares), the
    kernel's arguments past x by name, and the launch options (warps, stages)."""
    m, k = x.shape
    n = weight.shape[0]
    rounded = isinstance(x, RoundedX)
    assert m == 1 and k == weight.shape[1] and (rounded or x.stride(1) == 1)
    assert not rounded or rounds_x(weight) == x.nibble_order, (KIND_NAMES[weight.kind], x.nibble_order)
    per_word = _per_word(weight.kind)
    group = tile_group(k, weight.group)
    tile = tile or row_tile_for(weight)
    chunk = min(group, tile.block_k)
    high = HIGH_BITS.get(weight.kind, 0)
    # K's shares whole chunks (the last step of a share may pass its end); a chunk whole words
    # of weights, and of high bits
    assert k % tile.split_k == 0 and (k // tile.split_k) % chunk == 0 and tile.block_k % chunk == 0, (k, tile)
    assert group % chunk == 0 and chunk % per_word == 0 and chunk * high % 32 == 0, (weight.group, tile)
    assert out.shape == (1, n) and out.stride(1) == 1 and out.dtype == x.dtype
    tiles = -(-n // tile.block_n)
    vec = min(max(1, tile.vec // 4), chunk // per_word)  # in words
    part, counters = _split_buffers(tile.split_k, 1, n, tiles, out)
    bits = 8 if per_word == 4 else 4 + high
    low = 23 - bits
    x_kind = 3 if rounded else {torch.bfloat16: 0, torch.float16: 1, torch.float32: 2}[x.dtype]
    args = dict(sx_ptr=x.scales if rounded else x, b_ptr=bias if bias is not None else out, out_ptr=out,
                part_ptr=part, count_ptr=counters, N=n,
                **_weight_args(weight), low_mask=((1 << (32 // per_word)) - 1) << low,
                high_mask=((1 << high) - 1) << (low + 4), XQ=rounded or (int8_x and weight.kind in INT8_X_KINDS),
                ASM=not triton_interpreting(), HAS_BIAS=bias is not None, X_KIND=x_kind, SPLIT_K=tile.split_k,
                K_PER_SPLIT=k // tile.split_k, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, CHUNK=chunk, VEC=vec)
    return (tiles, tile.split_k), args, dict(num_warps=tile.num_warps,
                                             num_stages=1 if triton_interpreting() else tile.num_stages)


def packed_gemv(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                tile: PackedTile | None = None, out: torch.Tensor | None = None, pdl: int = 0,
                short: bool = True) -> torch.Tensor:
    """x (M <= 16, K) bf16 (or fp16; fp32 under the interpreter), weight a GroupedWeight on x's
    device -> (M, N) in x's dtype, fp32 accumulation. out: an (M, N) view to write into (a row
    block of a wider projection's output), unit stride along N. pdl: programmatic dependent
    launch, the next kernel launched after the wait (1) or the stores (2), 0 without
    (KernelOptions.packed_gemv_pdl), the same values; short: default_tile's short-K tile
    (KernelOptions.packed_short_tiles), the same values for every row count of one K."""
    m, k = x.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_ROWS and k == weight.shape[1] and x.stride(1) == 1
    assert weight.kind != FP8 or x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) >= (8, 9)
    tile = tile or default_tile(n, k, weight.group, short)
    assert k % (tile.block_k * tile.split_k) == 0, (k, tile)
    assert tile.block_k % weight.group == 0 or weight.group % tile.block_k == 0
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    tiles = -(-n // tile.block_n)
    part, counters = _split_buffers(tile.split_k, m, n, tiles, out)
    interpreting = triton_interpreting()
    _kernel()[0][(tiles, tile.split_k, 1)](
        x, b_ptr=bias if bias is not None else out, out_ptr=out, part_ptr=part, count_ptr=counters, num_rows=m,
        N=n, stride_x=x.stride(0), stride_out=out.stride(0), K=k, **_weight_args(weight), HAS_BIAS=bias is not None,
        DOT_F32=x.dtype == torch.float32 or interpreting, MAGIC=tile.magic,
        SPLIT_K=tile.split_k, K_PER_SPLIT=k // tile.split_k,
        BLOCK_M=MAX_ROWS, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps,
        num_stages=1 if interpreting else tile.num_stages, **_pdl_mode(x.device, pdl),
        PF_LINES=_prefetch_lines(k // tile.split_k, weight.kind))
    return out


def _pdl_mode(device, pdl: int) -> dict:
    """packed_kernel's USE_PDL (0, 1 or 2) and launch option: 0 where PDL is off or unsupported."""
    args = pdl_args(device, bool(pdl))
    return {**args, "USE_PDL": pdl if args["USE_PDL"] else 0}


def _prefetch_lines(k_per_split: int, kind: int) -> int:
    """The 128-byte lines of a row's weights that packed_kernel requests before its PDL wait: its
    whole share of K, at most 8 lines (a power of two)."""
    span = k_per_split if kind in (INT8, FP8) else k_per_split // 2
    return min(8, next_pow2(-(-span // 128)))


@dataclass(frozen=True)
class MatmulTile:
    """A long step's tile (packed_matmul): BLOCK_M rows by BLOCK_N columns, K in BLOCK_K steps."""
    block_m: int = 64
    block_n: int = 128
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 3


def _weight_args(weight: GroupedWeight) -> dict:
    """The weight's arguments to the kernels, by their parameter names: pointers, strides and
    constexprs (a tensor the format lacks stands in by another, never read)."""
    paired = is_paired(weight)
    assert all(t.is_contiguous() for t in (weight.q, weight.qh) if t is not None)
    assert paired or all(t.is_contiguous() for t in weight.tensors() if t is not None)
    units = weight.scale_unit if weight.unit else weight.scale
    high = weight.qh if weight.qh is not None else weight.q
    return dict(q_ptr=weight.q, qh_ptr=high, s_ptr=weight.scale,
                o_ptr=weight.offset if weight.offset is not None else weight.scale, su_ptr=units,
                ou_ptr=weight.offset_unit if weight.offset_unit is not None else units,
                stride_q=weight.q.stride(0), stride_h=high.stride(0), stride_s=weight.scale.stride(0),
                stride_u=units.stride(0), ONE_BYTE=weight.kind in (INT8, FP8), FP8=weight.kind == FP8,
                HIGH=HIGH_BITS.get(weight.kind, 0), ZERO=128 if weight.kind == INT8 else ZERO.get(weight.kind, 0),
                G=weight.group, UNIT=weight.unit, HAS_OFFSET=weight.offset is not None,
                SG=weight.scale.stride(1), UG=units.stride(1), PAIRED=paired)


def _split_buffers(split_k: int, rows: int, n: int, tiles: int, out: torch.Tensor):
    """A split-K launch's partial sums (split_k, rows, n) fp32 and its tiles' counters; without a
    split, `out` stands in for both (never read)."""
    if split_k == 1:
        return out, out
    assert tiles <= _MAX_TILES
    return torch.empty((split_k, rows, n), dtype=torch.float32, device=out.device), _tile_counters(out.device)


def _step_k(k: int, group: int, most: int) -> int:
    for block_k in (128, 64, 32):
        if block_k <= most and k % block_k == 0 and (block_k % group == 0 or group % block_k == 0):
            return block_k
    raise ValueError(f"no K step fits K = {k} with groups of {group}")


def dequantize_packed(weight: GroupedWeight, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """(N, K) in dtype: the weight decoded by the GPU, each value dequantize_grouped's float32
    value rounded once to dtype (what a long step multiplies by)."""
    n, k = weight.shape
    if out is None:
        out = torch.empty((n, k), dtype=dtype, device=weight.q.device)
    assert out.shape == (n, k) and out.stride(1) == 1 and out.dtype == dtype
    block_n, block_k = 32, _step_k(k, weight.group, 128)
    _kernel()[1][(-(-n // block_n), k // block_k)](
        out_ptr=out, ids_ptr=out, N=n, stride_out=out.stride(0), **_weight_args(weight), BLOCK_N=block_n,
        BLOCK_K=block_k, num_warps=4, num_stages=1)
    return out


def packed_embed_rows(ids: torch.Tensor, weight: GroupedWeight, dtype: torch.dtype, pdl: bool = False) -> torch.Tensor:
    """The weight's rows `ids` (T,) (any order, repeats allowed) -> (T, K) in dtype, in one launch:
    an embedding lookup from a table kept packed (PackedEmbedding), each value dequantize_grouped's
    rounded once to dtype, as its reference (where torch's gathers and unpacking take a dozen
    launches a step). pdl: launched with programmatic dependent launch (KernelOptions.pdl)."""
    assert ids.dim() == 1 and not ids.dtype.is_floating_point
    t, (n, k) = ids.shape[0], weight.shape
    out = torch.empty((t, k), dtype=dtype, device=weight.q.device)
    if t == 0:
        return out
    block_t, block_k = min(MAX_ROWS, next_pow2(t)), _step_k(k, weight.group, 128)
    _kernel()[1][(-(-t // block_t), k // block_k)](
        out_ptr=out, ids_ptr=ids, N=t, stride_out=out.stride(0), **_weight_args(weight), BLOCK_N=block_t,
        BLOCK_K=block_k, BY_IDS=True, num_warps=max(1, min(4, block_t * block_k // 512)), num_stages=1,
        **pdl_args(out.device, pdl))
    return out


def packed_matmul(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                  tile: MatmulTile | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M, K) with any M -> (M, N): packed_kernel over blocks of BLOCK_M rows, each weight tile
    decoded once a block of rows (a prefill that never holds the weight dequantized)."""
    m, k = x.shape
    n = weight.shape[0]
    assert k == weight.shape[1] and x.stride(1) == 1
    tile = tile or MatmulTile(block_k=_step_k(k, weight.group, 64))
    assert k % tile.block_k == 0 and (tile.block_k % weight.group == 0 or weight.group % tile.block_k == 0)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    interpreting = triton_interpreting()
    _kernel()[0][(-(-n // tile.block_n), 1, -(-m // tile.block_m))](
        x, b_ptr=bias if bias is not None else out, out_ptr=out, part_ptr=out, count_ptr=out, num_rows=m, N=n,
        stride_x=x.stride(0), stride_out=out.stride(0), K=k, **_weight_args(weight), HAS_BIAS=bias is not None,
        DOT_F32=x.dtype == torch.float32 or interpreting,
        MAGIC=True, SPLIT_K=1, K_PER_SPLIT=k, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k,
        num_warps=tile.num_warps, num_stages=1 if interpreting else tile.num_stages)
    return out


def packed_gemv_ref(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                    tile: PackedTile | None = None) -> torch.Tensor:
    """The weight dequantized in float32, rounded to x's dtype (as a load that dequantizes does),
    then F.linear."""
    return F.linear(x, dequantize_grouped(weight).to(x.dtype), bias)


__all__ = ["INT8", "SIGNED_NIBBLES", "MatmulTile", "PackedTile", "RowTile", "dequantize_packed", "packed_matmul", "default_row_tile", "default_tile", "packed_embed_rows", "packed_gemv",
           "packed_gemv_ref", "packed_row_gemv", "packed_row_gemv_blocks", "blocks_fit_one_launch", "row_kernel_fits",
           "row_kernel_k", "row_kernel_wide", "row_tile_for", "tile_group"]
