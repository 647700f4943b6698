"""Skinny matmul out = x @ weight.T for M = 1..16 rows (decode/verify; invariant launches up to 64),
with fused prologues.

Three ops, each beside its plain-torch reference:
  gemv(x, weight, bias)                              out = x @ W.T (+ bias)
  rms_norm_gemv(x, residual, norm_weight, eps, W)    h = x + residual; out = rms_norm(h) @ W.T
  silu_mul_gemv(gate_up, W)                          out = (silu(gate) * up) @ W.T
two epilogues of the one-row kernel: gated_gemv (silu(gate) * up of [gate; up] rows) and
gemv_add_norm (x @ W.T + residual, then RMSNorm in the last program: see there); and two of the
invariant tensor-core tile that split an RMSNorm between the projections around it:
gemv_add_stats (x @ W.T + residual, times the norm's weight, with partial sums of squares) and
gemv_rstd (the next projection, scaled by 1 / rms from those sums after its dot).

Two kernels: row_kernel (CUDA-core FMAs on one-row tiles; several rows run as that many one-row
programs along the grid's third axis, so every row has the bits of a one-row call: `each_row`)
and dot_kernel (tensor cores over 16 padded rows; `invariant`: one tile for every row count, so
again a row's bits do not depend on the rows beside it). The first is the faster for one row,
and for several rows of weights small enough that their re-reads come from L2; the second for
several rows of large weights.

Each program owns BLOCK_N output columns of every row and one K range (split). With one
split it stores the result; with several, it stores an fp32 partial and bumps a per-tile
counter, and the program that arrives last sums the partials, stores the output and
resets the counter for the next launch. One launch, no host sync, no memset, grid fixed
by the shape: safe to capture in a CUDA graph. Launches that share counters must not run
concurrently on different streams.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from engine.kernels import next_pow2, num_sms, pdl_args, triton_interpreting

triton = tl = prefetch_rows = sum_splits = tile_rstd = tile_operand = tile_dot = tile_store = None  # bound by _kernels()

NONE, RMS_NORM, SILU_MUL = 0, 1, 2  # prologue kinds
ADD_STATS, RSTD = 1, 2  # the invariant tile's epilogues (gemv_add_stats, gemv_rstd)
MAX_ROWS = 16  # rows of one launch, and of the invariant tile (its rows padded to 16)
# Rows of one invariant launch: tiles of MAX_ROWS rows along the grid's third axis, each running
# the instructions a launch of up to MAX_ROWS rows runs, so that every row keeps its bits (a draft
# tree's verify step of up to 63 nodes and its root in one forward; the attention's limit too).
MAX_TREE_ROWS = 64
PREFETCH_LINES = 16  # with PDL: 128-byte lines of each weight row requested before the wait (2 KB)
_MAX_TILES = 1 << 16  # split-K counters per device
# How the RMS_NORM prologue gets the row's mean square (norm_mode):
# LOOP: a pass over K before the projection (L2-resident), K / BLOCK_K dependent loads.
# ONE_PASS: one load of the whole row (one-row launches up to ONE_PASS_MAX elements): one round
#   trip to L2 before the first weight step (docs/performance.md: 1.09x over the loop).
LOOP, ONE_PASS = 0, 1
ONE_PASS_MAX = 8192


@dataclass(frozen=True)
class GemvConfig:
    block_n: int  # output columns per program
    block_k: int  # reduction elements per loop step
    split_k: int  # programs along K per column tile; 1: no reduction pass
    num_warps: int
    num_stages: int
    # Tensor-core tiles (several rows, or invariant): the weight tile as the left operand of the
    # dot, out.T = W @ x.T, so that BLOCK_N, not the 16 padded rows, is the dot's long side.
    swap_ab: bool = False


def default_config(num_rows: int, n: int, k: int, num_sms: int = 132) -> GemvConfig:
    """A fixed table by shape class (no autotuning: start-up stays fast, graphs stay valid).

    M = 1: 8 x 512 tiles (~80 registers a thread, about 6 programs per SM, 8 KB of 16-byte
    loads in flight each). The grid is kept within one wave of those slots; split-K is
    used only when column tiles leave slots idle (short N), with the fewest K steps per
    program that still fit, since such shapes are latency-bound (SmolLM2: one or two steps).
    M > 1: tensor-core dot on 16 x 256 tiles.
    """
    if num_rows == 1:
        block_n, block_k, slots = 8, (512 if k >= 2048 else 256), 6 * num_sms
    else:
        block_n, block_k, slots = 16, 256, 4 * num_sms
    block_k = min(block_k, max(64, next_pow2(k)))
    tiles = -(-n // block_n)
    k_blocks = -(-k // block_k)
    split = 1
    for steps in range(1, k_blocks + 1):  # fewest K steps per program whose grid fits the slots
        split = -(-k_blocks // steps)
        if tiles * split <= slots or split == 1:
            break
    split = min(split, 8)
    return GemvConfig(block_n, block_k, split, num_warps=4, num_stages=3 if num_rows == 1 else 2)


def gated_config(n: int, k: int) -> GemvConfig:
    """A one-row gated launch's tile: 4 gate and 4 up rows a program, no split-K, the whole row in
    one K step up to 4,096 elements (every weight load of a program in flight at once). On an H200
    (benchmarks/variants.py; docs/performance.md) the 8B's gate_up with 4 x 4096 made the step
    1.034x and 1.035x faster than with 4 x 1024 (4 x 2048: 1.026x, 1.029x; 8 rows or 8 warps
    lost); SmolLM2's 4 x 1024 (one step over K = 576) 1.018x faster than 4 x 256."""
    return GemvConfig(4, min(next_pow2(k), 4096), 1, num_warps=4, num_stages=3)


@functools.cache
def _tile_counters(device: torch.device) -> torch.Tensor:
    # Zeroed once; each split-K launch leaves its counters at zero again.
    return torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)


@functools.cache
def _tail_counter(device: torch.device) -> torch.Tensor:
    # One per row, zeroed once; the last program of each row of a norm-tail launch sets it back to zero.
    return torch.zeros(MAX_ROWS, dtype=torch.int32, device=device)


@functools.cache
def _kernels():
    global triton, tl, prefetch_rows, sum_splits, tile_rstd, tile_operand, tile_dot, tile_store
    import triton
    import triton.language as tl

    @triton.jit
    def prefetch_rows(w_ptr, w_rows, stride_w, k_start, K, N, GATED: tl.constexpr, LINE: tl.constexpr,
                      PREFETCH_LINES: tl.constexpr):
        """With PDL: the weights are never written by a kernel, so the first PREFETCH_LINES 128-byte
        lines (LINE elements each) of this program's rows are requested into L2 while the previous
        kernel may still run (GATED: the up rows' too)."""
        lines = k_start + tl.arange(0, PREFETCH_LINES) * LINE
        line_ptrs = w_ptr + w_rows[:, None] * stride_w + tl.minimum(lines, K - 1)[None, :]
        tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [line_ptrs], dtype=tl.int32,
                                  is_pure=False, pack=1)
        if GATED:
            tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [line_ptrs + N * stride_w],
                                      dtype=tl.int32, is_pure=False, pack=1)

    @triton.jit
    def sum_splits(acc, part, pid_k, counter, num_rows, N, out_mask, SPLIT_K: tl.constexpr):
        """Split K: stores this program's partial sums at part (rows of N, SPLIT_K blocks of
        num_rows * N fp32) and returns (last, total): last for the last program of the column tile
        to arrive, which adds every split's partials in split order (so the sum does not depend on
        which finished first) and sets the tile's counter back to zero for the next launch."""
        tl.store(part + pid_k * num_rows * N, acc, mask=out_mask)
        tl.debug_barrier()  # every thread's partial is written before the counter moves
        arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        last = arrived == SPLIT_K - 1
        total = tl.zeros_like(acc)
        if last:
            tl.debug_barrier()
            for s in range(SPLIT_K):
                total += tl.load(part + s * num_rows * N, mask=out_mask, other=0.0, cache_modifier=".cg")
            tl.atomic_xchg(counter, 0)  # ready for the next launch
        return last, total

    @triton.jit
    def row_kernel(
        x_ptr, res_ptr, nw_ptr, new_res_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, count_ptr,
        num_rows, N, K, stride_x, stride_res, stride_new_res, stride_w, stride_out, eps,
        PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr,
        SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
        LINE: tl.constexpr, PREFETCH_LINES: tl.constexpr, NORM_MODE: tl.constexpr, K_POW2: tl.constexpr,
        GATED: tl.constexpr, NORM_TAIL: tl.constexpr, N_POW2: tl.constexpr,
        sq_ptr, stride_sq, EPILOGUE: tl.constexpr,
    ):
        """The one-row kernel (CUDA-core FMAs), one row per program along the grid's third axis:
        row m runs the same instructions whatever num_rows is, so its bits do not depend on the
        rows beside it. The programs of one column tile read the same weights, from L2 after the
        first (a small model's layer stays there). EPILOGUE ADD_STATS (no split-K): as dot_kernel's,
        the new stream, its columns times the norm's weight and their squares, one part a program."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_rows = tl.where(n_ok, offs_n, 0)  # clamped instead of masked: loads stay vectorized
        k_start = pid_k * K_PER_SPLIT
        dtype = out_ptr.dtype.element_ty
        if USE_PDL:
            prefetch_rows(w_ptr, w_rows, stride_w, k_start, K, N, GATED, LINE, PREFETCH_LINES)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        m = tl.program_id(2)
        x_row = x_ptr + m * stride_x
        res_row = res_ptr + m * stride_res
        if NORM_TAIL or EPILOGUE == 1:  # requested now, used after the K loop: its round trip overlaps the weights'
            res_tail = tl.load(res_row + offs_n[None, :], mask=n_ok[None, :], other=0.0)
        inv_rms = tl.zeros([1], tl.float32)
        if PROLOGUE == 1 and NORM_MODE == 1:
            # The row's K elements in one load, summed in fp32.
            offs_all = tl.arange(0, K_POW2)
            all_ok = offs_all < K
            row_all = tl.load(x_row + offs_all, mask=all_ok, other=0.0)
            if HAS_RESIDUAL:
                res_all = tl.load(res_row + offs_all, mask=all_ok, other=0.0)
                row_all = (row_all.to(tl.float32) + res_all.to(tl.float32)).to(row_all.dtype)
            row_f32 = row_all.to(tl.float32)
            inv_rms += tl.rsqrt(tl.sum(row_f32 * row_f32, axis=0) / K + eps)
        elif PROLOGUE == 1 and NORM_MODE == 0:
            # The norm needs the whole row's mean square first: a pass over K (L2-resident).
            sq = tl.zeros([1], tl.float32)
            for k0 in range(0, K, BLOCK_K):
                offs_k = k0 + tl.arange(0, BLOCK_K)
                mask = (offs_k < K)[None, :]
                h = tl.load(x_row + offs_k[None, :], mask=mask, other=0.0)
                if HAS_RESIDUAL:
                    res = tl.load(res_row + offs_k[None, :], mask=mask, other=0.0)
                    h = (h.to(tl.float32) + res.to(tl.float32)).to(h.dtype)
                sq += tl.sum(h.to(tl.float32) * h.to(tl.float32), axis=1)
            inv_rms = tl.rsqrt(sq / K + eps)
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)  # reduced once, after the loop
        acc2_up = tl.zeros([BLOCK_N if GATED else 1, BLOCK_K], tl.float32)  # GATED: the up rows'
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            offs_k = k_start + kk + tl.arange(0, BLOCK_K)
            if EVEN_K:
                k_ok = offs_k < K_PER_SPLIT * SPLIT_K
                w = tl.load(w_ptr + w_rows[:, None] * stride_w + offs_k[None, :])
                if GATED:
                    w_up = tl.load(w_ptr + (w_rows + N)[:, None] * stride_w + offs_k[None, :])
            else:
                k_ok = offs_k < K
                w = tl.load(w_ptr + w_rows[:, None] * stride_w + offs_k[None, :], mask=k_ok[None, :], other=0.0)
                if GATED:
                    w_up = tl.load(w_ptr + (w_rows + N)[:, None] * stride_w + offs_k[None, :],
                                   mask=k_ok[None, :], other=0.0)
            # a: the (1, BLOCK_K) fp32 left operand after the prologue
            mask = k_ok[None, :]
            x = tl.load(x_row + offs_k[None, :], mask=mask, other=0.0)
            if PROLOGUE == 1:  # RMS_NORM, rounded like rms_norm_gemv_ref at each step
                h = x
                if HAS_RESIDUAL:
                    res = tl.load(res_row + offs_k[None, :], mask=mask, other=0.0)
                    h = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
                    if pid_n == 0:  # column tile 0 writes the new residual stream
                        tl.store(new_res_ptr + m * stride_new_res + offs_k[None, :], h, mask=mask)
                nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
                normed = (h.to(tl.float32) * inv_rms[:, None]).to(x.dtype).to(tl.float32)
                a = (normed * nw[None, :]).to(x.dtype).to(tl.float32)
            elif PROLOGUE == 2:  # SILU_MUL: x is gate, up sits K columns further
                up = tl.load(x_row + K + offs_k[None, :], mask=mask, other=0.0)
                gate = x.to(tl.float32)
                act = (gate * tl.sigmoid(gate)).to(x.dtype).to(tl.float32)
                a = (act * up.to(tl.float32)).to(x.dtype).to(tl.float32)
            else:
                a = x.to(tl.float32)
            acc2 += w.to(tl.float32) * a
            if GATED:
                acc2_up += w_up.to(tl.float32) * a
        acc = tl.reshape(tl.sum(acc2, axis=1), (1, BLOCK_N))
        if GATED:
            # silu(gate) * up of this tile's columns, each rounded as the unfused ops round them
            gate = acc
            up = tl.reshape(tl.sum(acc2_up, axis=1), (1, BLOCK_N))
            if HAS_BIAS:
                gate += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                up += tl.load(bias_ptr + N + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            gate = gate.to(dtype).to(tl.float32)
            up = up.to(dtype).to(tl.float32)
            acc = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * up
        out_mask = n_ok[None, :]
        if SPLIT_K > 1:  # part: (SPLIT_K, num_rows, N) fp32
            tl.store(part_ptr + (pid_k * num_rows + m) * N + offs_n[None, :], acc, mask=out_mask)
        else:
            if HAS_BIAS and not GATED:
                acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if NORM_TAIL:
                # h = x @ W.T + residual on this tile's columns, rounded as gemv and then
                # add_rms_norm round, goes to the new stream; the norm comes below.
                h = (acc.to(dtype).to(tl.float32) + res_tail.to(tl.float32)).to(dtype)
                tl.store(new_res_ptr + m * stride_new_res + offs_n[None, :], h, mask=out_mask)
            elif EPILOGUE == 1:  # ADD_STATS, rounded as the dot kernel's
                h = (acc.to(dtype).to(tl.float32) + res_tail.to(tl.float32)).to(dtype)
                tl.store(new_res_ptr + m * stride_new_res + offs_n[None, :], h, mask=out_mask)
                hf = tl.where(out_mask, h.to(tl.float32), 0.0)
                g = tl.load(nw_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
                tl.store(out_ptr + m * stride_out + offs_n[None, :], (hf * g[None, :]).to(dtype), mask=out_mask)
                tl.store(sq_ptr + m * stride_sq + pid_n + tl.zeros([1], tl.int32), tl.sum(hf * hf, axis=1))
            else:
                tl.store(out_ptr + m * stride_out + offs_n[None, :], acc.to(dtype), mask=out_mask)
        if SPLIT_K > 1:
            counter = count_ptr + m * tl.num_programs(0) + pid_n  # one per (row, column tile)
            tl.debug_barrier()  # every thread's partials are written before the counter moves
            arrived = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:  # last program of this column tile: sum the splits
                tl.debug_barrier()
                acc = tl.zeros([1, BLOCK_N], tl.float32)
                for s in range(SPLIT_K):
                    acc += tl.load(part_ptr + (s * num_rows + m) * N + offs_n[None, :], mask=n_ok[None, :],
                                   other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + m * stride_out + offs_n[None, :], acc.to(dtype), mask=n_ok[None, :])
                tl.atomic_xchg(counter, 0)  # ready for the next launch
        if NORM_TAIL:
            # The program that finishes its row last reads the row's h back from L2 and writes
            # rms_norm(h) * norm_weight to out, in place of a separate norm launch.
            tl.debug_barrier()  # every thread's columns are written before the counter moves
            arrived = tl.atomic_add(count_ptr + m, 1, sem="acq_rel", scope="gpu")
            if arrived == tl.num_programs(0) - 1:
                tl.debug_barrier()
                offs_h = tl.arange(0, N_POW2)
                h_ok = offs_h < N
                nw_h = tl.load(nw_ptr + offs_h, mask=h_ok, other=0.0).to(tl.float32)
                hf = tl.load(new_res_ptr + m * stride_new_res + offs_h, mask=h_ok, other=0.0,
                             cache_modifier=".cg").to(tl.float32)
                inv_rms_h = tl.rsqrt(tl.sum(hf * hf, axis=0) / N + eps)
                normed_h = (hf * inv_rms_h).to(dtype).to(tl.float32)  # HF casts before the weight
                tl.store(out_ptr + m * stride_out + offs_h, (normed_h * nw_h).to(dtype), mask=h_ok)
                tl.atomic_xchg(count_ptr + m, 0)  # ready for the next launch

    @triton.jit
    def tile_rstd(x_ptr, res_ptr, rows, row_ok, stride_x, stride_res, K, eps,
                  HAS_RESIDUAL: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
        """1 / rms of a tile's rows (x + residual): the RMS_NORM prologue's pass over K (L2-resident)."""
        sq = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            offs_k = k0 + tl.arange(0, BLOCK_K)
            mask = row_ok[:, None] & (offs_k < K)[None, :]
            h = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
            if HAS_RESIDUAL:
                res = tl.load(res_ptr + rows[:, None] * stride_res + offs_k[None, :], mask=mask, other=0.0)
                h = (h.to(tl.float32) + res.to(tl.float32)).to(h.dtype)
            sq += tl.sum(h.to(tl.float32) * h.to(tl.float32), axis=1)
        return tl.rsqrt(sq / K + eps)

    @triton.jit
    def tile_operand(x_ptr, res_ptr, nw_ptr, new_res_ptr, rows, row_ok, offs_k, k_ok, inv_rms, pid_n,
                     stride_x, stride_res, stride_new_res, K,
                     PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr):
        """A tile's (BLOCK_M, BLOCK_K) fp32 left operand after the prologue, rounded at each step as
        the references round."""
        mask = row_ok[:, None] & k_ok[None, :]
        x = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=mask, other=0.0)
        if PROLOGUE == 1:  # RMS_NORM, rounded like rms_norm_gemv_ref at each step
            h = x
            if HAS_RESIDUAL:
                res = tl.load(res_ptr + rows[:, None] * stride_res + offs_k[None, :], mask=mask, other=0.0)
                h = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
                if pid_n == 0:  # column tile 0 writes the new residual stream
                    tl.store(new_res_ptr + rows[:, None] * stride_new_res + offs_k[None, :], h, mask=mask)
            nw = tl.load(nw_ptr + offs_k, mask=k_ok, other=0.0).to(tl.float32)
            normed = (h.to(tl.float32) * inv_rms[:, None]).to(x.dtype).to(tl.float32)
            a = (normed * nw[None, :]).to(x.dtype).to(tl.float32)
        elif PROLOGUE == 2:  # SILU_MUL: x is gate, up sits K columns further
            up = tl.load(x_ptr + rows[:, None] * stride_x + K + offs_k[None, :], mask=mask, other=0.0)
            gate = x.to(tl.float32)
            act = (gate * tl.sigmoid(gate)).to(x.dtype).to(tl.float32)
            a = (act * up.to(tl.float32)).to(x.dtype).to(tl.float32)
        else:
            a = x.to(tl.float32)
        return a

    @triton.jit
    def tile_dot(acc, a, w, SWAP_AB: tl.constexpr, DOT_F32: tl.constexpr):
        """One K step of a tile: acc (BLOCK_M, BLOCK_N), or (BLOCK_N, BLOCK_M) with SWAP_AB."""
        if SWAP_AB:
            if DOT_F32:
                acc += tl.dot(w.to(tl.float32), tl.trans(a), input_precision="ieee")
            else:
                acc += tl.dot(w, tl.trans(a.to(w.dtype)))
        else:
            if DOT_F32:
                acc += tl.dot(a, tl.trans(w.to(tl.float32)), input_precision="ieee")
            else:
                acc += tl.dot(a.to(w.dtype), tl.trans(w))
        return acc

    @triton.jit
    def tile_store(acc, rows, row_ok, offs_n, n_ok, w_rows, pid_n, pid_k, counter,
                   res_ptr, nw_ptr, new_res_ptr, bias_ptr, out_ptr, part_ptr, sq_ptr,
                   num_rows, N, K, eps, num_sq, stride_res, stride_new_res, stride_out, stride_sq,
                   HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, EPILOGUE: tl.constexpr,
                   SQ_POW2: tl.constexpr, GATE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
        """A tile's (BLOCK_M, BLOCK_N) fp32 sums to its outputs: split K's partials added in split
        order by the last program of the tile to arrive (its counter), the bias, the epilogue."""
        out_mask = row_ok[:, None] & n_ok[None, :]
        if SPLIT_K > 1:
            # part: (SPLIT_K, BLOCK_M rows of num_rows, N) fp32
            part = part_ptr + rows[:, None] * N + offs_n[None, :]
            last, acc = sum_splits(acc, part, pid_k, counter, num_rows, N, out_mask, SPLIT_K)
            if last:
                if HAS_BIAS:
                    acc += tl.load(bias_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :],
                         acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        else:
            dtype = out_ptr.dtype.element_ty
            if EPILOGUE == 2:  # RSTD: the norm's 1 / rms from the partial sums of squares
                offs_p = tl.arange(0, SQ_POW2)
                parts = tl.load(sq_ptr + rows[:, None] * stride_sq + offs_p[None, :],
                                mask=row_ok[:, None] & (offs_p < num_sq)[None, :], other=0.0)
                acc = acc * tl.rsqrt(tl.sum(parts, axis=1) / K + eps)[:, None]
            if HAS_BIAS:
                acc += tl.load(bias_ptr + w_rows, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            if GATE:  # rounded as gate_up's output, then as silu_and_mul rounds
                gate, up = tl.split(tl.reshape(acc.to(dtype).to(tl.float32), [BLOCK_M, BLOCK_N // 2, 2]))
                act = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32)
                offs_o = pid_n * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
                tl.store(out_ptr + rows[:, None] * stride_out + offs_o[None, :], (act * up).to(dtype),
                         mask=row_ok[:, None] & (offs_o < N)[None, :])
            elif EPILOGUE == 1:  # ADD_STATS: the new stream, its columns times the norm's weight, and their squares
                res = tl.load(res_ptr + rows[:, None] * stride_res + offs_n[None, :], mask=out_mask, other=0.0)
                h = (acc.to(dtype).to(tl.float32) + res.to(tl.float32)).to(dtype)  # rounded as gemv, then the add
                tl.store(new_res_ptr + rows[:, None] * stride_new_res + offs_n[None, :], h, mask=out_mask)
                hf = tl.where(out_mask, h.to(tl.float32), 0.0)
                g = tl.load(nw_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)
                tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], (hf * g[None, :]).to(dtype),
                         mask=out_mask)
                tl.store(sq_ptr + rows * stride_sq + pid_n, tl.sum(hf * hf, axis=1), mask=row_ok)
            else:
                tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], acc.to(dtype), mask=out_mask)

    @triton.jit
    def dot_kernel(
        x_ptr, res_ptr, nw_ptr, new_res_ptr, w_ptr, bias_ptr, out_ptr, part_ptr, count_ptr,
        num_rows, N, K, stride_x, stride_res, stride_new_res, stride_w, stride_out, eps,
        sq_ptr, num_sq, stride_sq,
        PROLOGUE: tl.constexpr, HAS_RESIDUAL: tl.constexpr, HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
        SPLIT_K: tl.constexpr, K_PER_SPLIT: tl.constexpr, EVEN_K: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, USE_PDL: tl.constexpr,
        LINE: tl.constexpr, PREFETCH_LINES: tl.constexpr, SWAP_AB: tl.constexpr,
        EPILOGUE: tl.constexpr, SQ_POW2: tl.constexpr, GATE: tl.constexpr,
    ):
        """Tensor-core tiles over BLOCK_M (>= 16) padded rows: each row's result comes from the
        same dot instructions whatever the other rows hold; a launch of more rows runs one tile a
        program along the grid's third axis (a program looping over several tiles on a weight tile
        loaded once was slower: docs/performance.md). EPILOGUE (no split-K): ADD_STATS or RSTD
        (gemv_add_stats, gemv_rstd). GATE (no split-K, no ADD_STATS): the weight is [gate; up]
        (2N rows) and the program's BLOCK_N tile columns alternate gate row j and up row j, for
        BLOCK_N / 2 outputs j, silu(gate) * up stored after the dot; each column is the dot the
        plain tile takes for that weight row, so the outputs are those of gate_up then
        silu_and_mul, bit for bit."""
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        pid_m = tl.program_id(2)  # the tile of BLOCK_M rows (invariant launches of more rows)
        rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < num_rows
        if GATE:
            cols = tl.arange(0, BLOCK_N)
            offs_n = pid_n * (BLOCK_N // 2) + cols // 2  # the output each column feeds
            n_ok = offs_n < N
            w_rows = tl.where(n_ok, offs_n + (cols % 2) * N, 0)  # even: gate row j, odd: up row j
        else:
            offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
            n_ok = offs_n < N
            w_rows = tl.where(n_ok, offs_n, 0)
        k_start = pid_k * K_PER_SPLIT
        if USE_PDL:
            prefetch_rows(w_ptr, w_rows, stride_w, k_start, K, N, False, LINE, PREFETCH_LINES)
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        inv_rms = tl.zeros([BLOCK_M], tl.float32)
        if PROLOGUE == 1:  # the norm needs the whole row's mean square first
            inv_rms = tile_rstd(x_ptr, res_ptr, rows, row_ok, stride_x, stride_res, K, eps, HAS_RESIDUAL,
                                BLOCK_M, BLOCK_K)
        if SWAP_AB:
            acc = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        else:
            acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            offs_k = k_start + kk + tl.arange(0, BLOCK_K)
            if EVEN_K:
                k_ok = offs_k < K_PER_SPLIT * SPLIT_K
                w = tl.load(w_ptr + w_rows[:, None] * stride_w + offs_k[None, :])
            else:
                k_ok = offs_k < K
                w = tl.load(w_ptr + w_rows[:, None] * stride_w + offs_k[None, :], mask=k_ok[None, :], other=0.0)
            a = tile_operand(x_ptr, res_ptr, nw_ptr, new_res_ptr, rows, row_ok, offs_k, k_ok, inv_rms, pid_n,
                             stride_x, stride_res, stride_new_res, K, PROLOGUE, HAS_RESIDUAL)
            acc = tile_dot(acc, a, w, SWAP_AB, DOT_F32)
        if SWAP_AB:
            acc = tl.trans(acc)
        tile_store(acc, rows, row_ok, offs_n, n_ok, w_rows, pid_n, pid_k,
                   count_ptr + pid_m * tl.num_programs(0) + pid_n,
                   res_ptr, nw_ptr, new_res_ptr, bias_ptr, out_ptr, part_ptr, sq_ptr, num_rows, N, K, eps, num_sq,
                   stride_res, stride_new_res, stride_out, stride_sq, HAS_BIAS, SPLIT_K, EPILOGUE, SQ_POW2, GATE,
                   BLOCK_M, BLOCK_N)

    return row_kernel, dot_kernel


def _launch(prologue, x, residual, norm_weight, eps, weight, bias, k, config, invariant: bool = False,
            gated: bool = False, tail: bool = False, pdl: bool = True,
            each_row: bool = False, epilogue: int = NONE, sq: torch.Tensor | None = None,
            gate: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Picks the kernel: row_kernel for one row, or for several with each_row (each row's bits as
    if it came alone, with the one-row tile); otherwise dot_kernel, with invariant one compiled
    kernel and tile for every row count (the tensor-core path over MAX_ROWS rows, the config of a
    MAX_ROWS-row call; up to MAX_TREE_ROWS rows as blocks of MAX_ROWS, each computed as a
    launch of its rows alone), so row i's result does not depend on how many rows came with it.
    gated and tail (gemv_add_norm: residual and norm_weight go to the epilogue; returns (normed, h))
    run on row_kernel only. pdl: programmatic dependent launch (KernelOptions.pdl). epilogue
    (no split-K; on row_kernel ADD_STATS only): ADD_STATS (residual, norm_weight: see gemv_add_stats; sq gets the
    squares) or RSTD (sq: the partial sums of squares to take the norm's scale from). gate
    (invariant, no split-K, not ADD_STATS): weight is [gate; up] and the launch returns
    silu(gate) * up of the projection, from the same tile's dots (dot_kernel's GATE)."""
    num_rows = x.shape[0]
    # invariant launches and the one-row kernel row by row (one program column a row) take up to 64
    # rows; the others, and the norm tail's per-row counters, 16
    most = MAX_TREE_ROWS if invariant or (each_row and not (gated or tail)) else MAX_ROWS
    assert 1 <= num_rows <= most and x.stride(1) == 1, f"x: (M <= {most}, K), last dim contiguous"
    assert weight.dim() == 2 and weight.shape[1] == k and weight.stride(1) == 1 and weight.dtype == x.dtype
    assert bias is None or bias.shape == (weight.shape[0],)
    assert not (invariant and (each_row or gated or tail)), "the tensor-core tile runs no each_row, gated or tail"
    assert not gate or (invariant and epilogue != ADD_STATS and weight.shape[0] % 2 == 0)
    rows_kernel = not invariant and (num_rows == 1 or each_row or gated or tail)
    n = weight.shape[0] // 2 if gated or gate else weight.shape[0]  # [gate; up] rows, n outputs
    if gated:
        assert prologue != SILU_MUL and weight.shape[0] % 2 == 0
        cfg = config or gated_config(n, k)
        assert cfg.split_k == 1, "gated launches do not split K"
    else:
        cfg = config or default_config(1 if rows_kernel else (MAX_ROWS if invariant else num_rows), n, k,
                                       num_sms(x.device))
        if tail and config is None:  # the built-in tile without its split: the tail needs whole columns
            cfg = replace(cfg, split_k=1)
    out = torch.empty((num_rows, n), dtype=x.dtype, device=x.device)
    new_res = None
    res = nw = new_res_arg = x  # unused by the kernel unless the prologue or the tail reads them
    if tail:
        assert prologue == NONE and not gated
        assert residual.shape == (num_rows, n) and residual.stride(1) == 1 and norm_weight.shape == (n,)
        assert cfg.split_k == 1, "a norm tail needs the whole column tile in one program"
        new_res = torch.empty_like(out)
        res, nw, new_res_arg = residual, norm_weight, new_res
    if epilogue != NONE:  # the one-row kernel has ADD_STATS only
        assert invariant or (epilogue == ADD_STATS and rows_kernel and not (gated or tail))
        assert prologue == NONE and cfg.split_k == 1 and sq is not None and sq.dtype == torch.float32
    if epilogue == ADD_STATS:
        assert residual.shape == (num_rows, n) and residual.stride(1) == 1 and norm_weight.shape == (n,)
        assert sq.shape[0] >= num_rows and sq.shape[1] >= -(-n // (cfg.block_n if rows_kernel else max(16, cfg.block_n)))
        new_res = torch.empty_like(out)
        res, nw, new_res_arg = residual, norm_weight, new_res
    if prologue == RMS_NORM:
        assert norm_weight.shape == (k,)
        nw, new_res = norm_weight, x  # no residual (first layer): the stream is x itself
        if residual is not None:
            assert residual.shape == x.shape and residual.stride(1) == 1
            new_res = torch.empty_like(x, memory_format=torch.contiguous_format)
            res, new_res_arg = residual, new_res
    block_n = cfg.block_n if rows_kernel else max(16, cfg.block_n)  # tl.dot needs 16 columns or more
    if gate:
        assert cfg.split_k == 1, "a gated tile needs whole columns in one program"
    tiles = -(-n // (block_n // 2 if gate else block_n))
    k_per_split = -(-(-(-k // cfg.split_k)) // cfg.block_k) * cfg.block_k
    row_tiles = -(-num_rows // MAX_ROWS) if invariant else 1
    if cfg.split_k > 1:
        assert tiles * row_tiles <= _MAX_TILES
        part = torch.empty((cfg.split_k, num_rows, n), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device)
    elif tail:
        part, counters = out, _tail_counter(x.device)
    else:
        part = counters = out  # unused
    interpreting = triton_interpreting()
    row_kernel, dot_kernel = _kernels()
    common = dict(PROLOGUE=prologue, HAS_RESIDUAL=residual is not None, HAS_BIAS=bias is not None,
                  SPLIT_K=cfg.split_k, K_PER_SPLIT=k_per_split, EVEN_K=k_per_split * cfg.split_k == k,
                  BLOCK_N=block_n, BLOCK_K=cfg.block_k, num_warps=cfg.num_warps,
                  num_stages=1 if interpreting else cfg.num_stages, **pdl_args(x.device, pdl),
                  LINE=128 // weight.element_size(), PREFETCH_LINES=PREFETCH_LINES)
    args = (x, res, nw, new_res_arg, weight, bias if bias is not None else weight, out, part, counters,
            num_rows, n, k, x.stride(0), res.stride(0), new_res_arg.stride(0), weight.stride(0), out.stride(0),
            float(eps))
    if rows_kernel:
        norm = norm_mode(1, k) if prologue == RMS_NORM else LOOP
        assert cfg.split_k == 1 or tiles * num_rows <= _MAX_TILES
        sq_arg = sq if sq is not None else out
        row_kernel[(tiles, cfg.split_k, num_rows)](*args, NORM_MODE=norm, K_POW2=next_pow2(k) if norm == ONE_PASS else 1,
                                         GATED=gated, NORM_TAIL=tail, N_POW2=next_pow2(n) if tail else 1,
                                         sq_ptr=sq_arg, stride_sq=sq_arg.stride(0), EPILOGUE=epilogue, **common)
    else:
        block_m = MAX_ROWS if invariant else max(16, next_pow2(num_rows))
        sq_arg = sq if sq is not None else out
        dot_kernel[(tiles, cfg.split_k, row_tiles)](
            *args, sq_arg, sq.shape[1] if sq is not None else 1, sq_arg.stride(0),
            DOT_F32=x.dtype == torch.float32 or interpreting, BLOCK_M=block_m, SWAP_AB=cfg.swap_ab, EPILOGUE=epilogue,
            SQ_POW2=next_pow2(sq.shape[1]) if epilogue == RSTD else 1, GATE=gate, **common)
    return out, new_res


def norm_mode(block_m: int, k: int) -> int:
    """How an RMS_NORM launch of block_m rows gets the mean square: ONE_PASS or LOOP."""
    return ONE_PASS if block_m == 1 and k <= ONE_PASS_MAX else LOOP


def gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
         config: GemvConfig | None = None, invariant: bool = False, pdl: bool = True,
         each_row: bool = False) -> torch.Tensor:
    """x (M, K), weight (N, K) as nn.Linear holds it -> (M, N) in x's dtype, fp32 accumulation.

    CUDA (or the Triton interpreter); no host sync; graph-capturable. `config` overrides
    the built-in table (benchmarks). invariant: each row's result is independent of M, on the
    tensor-core tile; each_row: the same, on the one-row kernel (every row as a one-row call).
    """
    return _launch(NONE, x, None, None, 0.0, weight, bias, x.shape[1], config, invariant, pdl=pdl,
                   each_row=each_row)[0]


def gemv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
             config: GemvConfig | None = None) -> torch.Tensor:
    """Reference: F.linear (what nn.Linear computes)."""
    return F.linear(x, weight, bias)


def rms_norm_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                  weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None, invariant: bool = False,
                  pdl: bool = True, each_row: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm followed by a projection, in one launch: returns (out, x + residual).

    x, residual (M, K) (residual None: the first layer; the stream returned is x itself);
    norm_weight (K,); weight (N, K). Every program recomputes the row's rms (one extra pass
    over 2 * M * K elements from L2; for one row, one load or none: norm_mode); column tile 0
    writes the new residual. invariant: as for gemv (the rms too is computed by
    the same tile for any M).
    """
    return _launch(RMS_NORM, x, residual, norm_weight, eps, weight, bias, x.shape[1], config, invariant, pdl=pdl,
                   each_row=each_row)


def rms_norm_gemv_ref(x, residual, norm_weight, eps, weight, bias=None, config=None):
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return F.linear((normed * norm_weight).to(x.dtype), weight, bias), h


def silu_mul_gemv(gate_up: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: GemvConfig | None = None, invariant: bool = False, pdl: bool = True,
                  each_row: bool = False) -> torch.Tensor:
    """gate_up (M, 2I) = [gate | up], weight (N, I) -> (silu(gate) * up) @ weight.T, (M, N).
    invariant, each_row: as for gemv."""
    assert gate_up.shape[1] % 2 == 0
    return _launch(SILU_MUL, gate_up, None, None, 0.0, weight, bias, gate_up.shape[1] // 2, config, invariant,
                   pdl=pdl, each_row=each_row)[0]


def silu_mul_gemv_ref(gate_up, weight, bias=None, config=None):
    gate, up = gate_up.chunk(2, dim=-1)
    return F.linear(F.silu(gate) * up, weight, bias)


def gated_gemv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
               config: GemvConfig | None = None, pdl: bool = True) -> torch.Tensor:
    """silu(x @ gate.T) * (x @ up.T), (M, I), where weight (2I, K) = [gate; up] as the MLP's
    gate_up projection holds them. One launch; the down projection then reads I values instead of
    2I and computes no activation (silu_mul_gemv's prologue recomputes it in every program). The
    one-row kernel, row by row (each row's bits as if it came alone)."""
    return _launch(NONE, x, None, None, 0.0, weight, bias, x.shape[1], config, gated=True, pdl=pdl)[0]


def gated_gemv_ref(x, weight, bias=None, config=None):
    gate, up = F.linear(x, weight, bias).chunk(2, dim=-1)
    return F.silu(gate) * up


def rms_norm_gated_gemv(x: torch.Tensor, residual: torch.Tensor | None, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None = None,
                        config: GemvConfig | None = None, pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """add_rms_norm then gated_gemv, in one launch: (silu(h @ gate.T) * (h @ up.T), x + residual)."""
    return _launch(RMS_NORM, x, residual, norm_weight, eps, weight, bias, x.shape[1], config, gated=True, pdl=pdl)


def rms_norm_gated_gemv_ref(x, residual, norm_weight, eps, weight, bias=None, config=None):
    gate_up, h = rms_norm_gemv_ref(x, residual, norm_weight, eps, weight, bias)
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up, h


def gemv_add_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                  norm_weight: torch.Tensor, eps: float,
                  config: GemvConfig | None = None, pdl: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """gemv, then add_rms_norm of its output and residual, in one launch: returns
    (rms_norm(h) * norm_weight, h) with h = x @ weight.T (+ bias) + residual, each rounded as the
    two ops round. x (M, K); weight (N, K); residual (M, N); norm_weight (N,). The one-row kernel,
    row by row. No split-K (config
    None: the built-in one-row tile without its split). Each
    program adds the residual to its columns and stores h; the last program to finish reads h back
    (N values, from L2) and writes the normed row, in place of a separate norm launch that would
    read it after a kernel boundary (one row after the other)."""
    return _launch(NONE, x, residual, norm_weight, eps, weight, bias, x.shape[1], config, tail=True, pdl=pdl)


def gemv_add_norm_ref(x, weight, bias, residual, norm_weight, eps, config=None):
    from engine.kernels.norm import add_rms_norm_ref

    return add_rms_norm_ref(F.linear(x, weight, bias), residual, norm_weight, eps)


def gemv_add_stats(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, residual: torch.Tensor,
                   norm_weight: torch.Tensor, config: GemvConfig | None = None,
                   pdl: bool = True, each_row: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A sublayer's last projection with what the next RMSNorm needs, on the invariant tile, in one
    launch: h = x @ W.T (+ bias) + residual (the new stream, rounded as gemv and the add round),
    hg = h * norm_weight, and sq (M, programs), each program's sum of its columns' h^2 (fp32).
    gemv_rstd then runs the projection after the norm on hg, scaling by the 1 / rms that sq gives:
    the norm needs no launch of its own and no program waits for another (the one-row kernel's
    norm tail leaves the norm to the last program). Each row's values come from per-row arithmetic
    in a fixed order, so they do not depend on the rows beside it. each_row: the one-row kernel
    and tile (config: a one-row tile), one program per row and column tile, instead of the
    tensor-core tile: a small weight's one row as fast as without a draft, each further row a
    re-read from L2. Returns (hg, h, sq)."""
    n, k = weight.shape
    cfg = config or (replace(default_config(1, n, k, num_sms(x.device)), split_k=1) if each_row
                     else default_config(MAX_ROWS, n, k, num_sms(x.device)))
    sq = torch.empty((x.shape[0], -(-n // (cfg.block_n if each_row else max(16, cfg.block_n)))),
                     dtype=torch.float32, device=x.device)
    hg, h = _launch(NONE, x, residual, norm_weight, 0.0, weight, bias, k, cfg, invariant=not each_row, pdl=pdl,
                    epilogue=ADD_STATS, sq=sq, each_row=each_row)
    return hg, h, sq


def gemv_add_stats_ref(x, weight, bias, residual, norm_weight, config=None):
    """(hg, h, the row sums of h^2 (M, 1)): gemv_add_stats's sq summed over its programs."""
    h = (F.linear(x, weight, bias).float() + residual.float()).to(x.dtype)
    hf = h.float()
    return (hf * norm_weight.float()).to(x.dtype), h, hf.pow(2).sum(dim=-1, keepdim=True)


def gemv_rstd(hg: torch.Tensor, sq: torch.Tensor, eps: float, weight: torch.Tensor,
              bias: torch.Tensor | None = None, config: GemvConfig | None = None, pdl: bool = True,
              gate: bool = False) -> torch.Tensor:
    """The projection after an RMSNorm whose weight hg already carries (gemv_add_stats): (hg @ W.T)
    times each row's 1 / rms, rsqrt(sum(sq[m]) / K + eps), (+ bias), on the invariant tile.
    gate: weight is an MLP's [gate; up] and the result silu(gate) * up (M, N / 2), the activation
    in the same launch (bit for bit this projection, then silu_and_mul)."""
    n, k = weight.shape
    assert sq.shape[0] >= hg.shape[0]
    cfg = config or default_config(MAX_ROWS, n, k, num_sms(hg.device))
    return _launch(NONE, hg, None, None, eps, weight, bias, k, cfg, invariant=True, pdl=pdl, epilogue=RSTD,
                   sq=sq, gate=gate)[0]


def gemv_rstd_ref(hg, sq, eps, weight, bias=None, config=None, gate: bool = False):
    rstd = torch.rsqrt(sq.float().sum(dim=-1, keepdim=True) / weight.shape[1] + eps)
    out = F.linear(hg.float(), weight.float()) * rstd
    out = (out + bias.float() if bias is not None else out).to(hg.dtype)
    if gate:
        g, u = out.float().chunk(2, dim=-1)
        return ((g * torch.sigmoid(g)).to(hg.dtype).float() * u).to(hg.dtype)
    return out
