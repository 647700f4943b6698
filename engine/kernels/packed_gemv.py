"""packed_gemv: out = x @ W.T for 1 to 16 rows with W kept quantized (a GroupedWeight), decoded
tile by tile inside the kernel; packed_gemv_ref beside it (the weight dequantized by the torch
reference and rounded to x's dtype, then a plain matmul: what the dequantize-at-load path runs).

One program owns BLOCK_N output columns of every row and one K range (split). Each K step loads
the step's quantized bytes and, for each, its group's scale and offset, decodes w = q * scale
(+ offset) in float32, rounds it to bf16 (the very weight the dequantize-at-load path multiplies)
and takes a tensor-core dot with the rows, padded to 16: a row's result does not depend on how
many rows came with it, so a verify row has the bits of the decode step it stands for (batch
invariance, as the bf16 tiles). With a split, the last program of a column tile sums the fp32
partials in split order (a counter per tile, left at zero). No host sync: safe inside CUDA
graphs; launches that share the counters must not run concurrently on different streams. Steps of more than 16 rows (prefill)
dequantize the weight and run a plain matmul instead (packed_linear in engine/packed_linear.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import triton_interpreting
from engine.kernels.gemv import _tile_counters
from engine.weights.grouped import FP8, INT8, SIGNED_NIBBLES, GroupedWeight, dequantize_grouped

MAX_ROWS = 16


@dataclass(frozen=True)
class PackedTile:
    block_n: int  # output columns a program (the dot's long side)
    block_k: int  # inputs a K step
    split_k: int = 1  # programs along K per column tile (partials summed in a fixed order)
    num_warps: int = 4
    num_stages: int = 3


def default_tile(n: int, k: int, group: int) -> PackedTile:
    """64 columns a program over 128-input steps where the columns fill the GPU (the 8B's qkv and
    gate_up), else 32 over 256-input steps with K split so that there are at least 256 programs
    (its o_proj and down); shorter steps where K needs them."""
    for block_k in (256, 128, 64, 32):
        if k % block_k == 0:
            break
    else:
        raise ValueError(f"no K step fits K = {k}")
    block_n = 64 if n >= 6144 else 32
    if block_n == 64 and block_k > 128 and k % 128 == 0:
        block_k = 128
    split = 1
    while -(-n // block_n) * split < 256 and k % (2 * split * block_k) == 0 and k // (2 * split) >= 4 * block_k:
        split *= 2
    return PackedTile(block_n, block_k, split)


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def packed_kernel(x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr, part_ptr, count_ptr, num_rows, N,
                      stride_x, stride_q, stride_s, stride_out,
                      KIND: tl.constexpr, G: tl.constexpr, HAS_OFFSET: tl.constexpr,
                      HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr, SPLIT_K: tl.constexpr,
                      K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
        pid_n = tl.program_id(0)
        pid_k = tl.program_id(1)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_rows = tl.where(n_ok, offs_n, 0)  # clamped, not masked: the loads stay vectorized
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < num_rows
        x_rows = x_ptr + rows[:, None] * stride_x
        acc_t = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for kk in range(0, K_PER_SPLIT, BLOCK_K):
            k0 = pid_k * K_PER_SPLIT + kk
            if KIND <= 1:
                # Byte j holds inputs 2j (low nibble) and 2j + 1 (high): the even inputs' weights
                # and the odd ones' take a dot each with the matching inputs of x, with no shuffle.
                j = tl.arange(0, BLOCK_K // 2)
                b = tl.load(q_ptr + w_rows[:, None] * stride_q + (k0 // 2 + j)[None, :]).to(tl.int32)
                lo = b & 0x0F
                hi = b >> 4
                if KIND == 1:
                    lo = lo - 8
                    hi = hi - 8
                grp = ((k0 + 2 * j) // G)[None, :]  # both nibbles of a byte share a group (G even)
                s = tl.load(s_ptr + w_rows[:, None] * stride_s + grp).to(tl.float32)
                w_lo = lo.to(tl.float32) * s
                w_hi = hi.to(tl.float32) * s
                if HAS_OFFSET:
                    o = tl.load(o_ptr + w_rows[:, None] * stride_s + grp).to(tl.float32)
                    w_lo = w_lo + o
                    w_hi = w_hi + o
                a_lo = tl.load(x_rows + (k0 + 2 * j)[None, :], mask=row_ok[:, None], other=0.0)
                a_hi = tl.load(x_rows + (k0 + 2 * j + 1)[None, :], mask=row_ok[:, None], other=0.0)
                if DOT_F32:
                    acc_t += tl.dot(w_lo.to(a_lo.dtype).to(tl.float32), tl.trans(a_lo.to(tl.float32)),
                                    input_precision="ieee")
                    acc_t += tl.dot(w_hi.to(a_hi.dtype).to(tl.float32), tl.trans(a_hi.to(tl.float32)),
                                    input_precision="ieee")
                else:
                    acc_t += tl.dot(w_lo.to(a_lo.dtype), tl.trans(a_lo))
                    acc_t += tl.dot(w_hi.to(a_hi.dtype), tl.trans(a_hi))
            else:  # int8 or fp8, one a byte
                offs_k = k0 + tl.arange(0, BLOCK_K)
                qf = tl.load(q_ptr + w_rows[:, None] * stride_q + offs_k[None, :]).to(tl.float32)
                grp = (offs_k // G)[None, :]
                w = qf * tl.load(s_ptr + w_rows[:, None] * stride_s + grp).to(tl.float32)
                if HAS_OFFSET:
                    w = w + tl.load(o_ptr + w_rows[:, None] * stride_s + grp).to(tl.float32)
                a = tl.load(x_rows + offs_k[None, :], mask=row_ok[:, None], other=0.0)
                if DOT_F32:
                    acc_t += tl.dot(w.to(a.dtype).to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
                else:
                    acc_t += tl.dot(w.to(a.dtype), tl.trans(a))
        acc = tl.trans(acc_t)
        out_mask = row_ok[:, None] & n_ok[None, :]
        out_ptrs = out_ptr + rows[:, None] * stride_out + offs_n[None, :]
        if SPLIT_K > 1:
            # part: (SPLIT_K, BLOCK_M, N) fp32; the program that arrives last sums them in order
            part = part_ptr + rows[:, None] * N + offs_n[None, :]
            tl.store(part + pid_k * BLOCK_M * N, acc, mask=out_mask)
            tl.debug_barrier()
            arrived = tl.atomic_add(count_ptr + pid_n, 1, sem="acq_rel", scope="gpu")
            if arrived == SPLIT_K - 1:
                tl.debug_barrier()
                acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
                for sk in range(SPLIT_K):
                    acc += tl.load(part + sk * BLOCK_M * N, mask=out_mask, other=0.0, cache_modifier=".cg")
                if HAS_BIAS:
                    acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
                tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
                tl.atomic_xchg(count_ptr + pid_n, 0)  # ready for the next launch
        else:
            if HAS_BIAS:
                acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)

    return packed_kernel


def packed_gemv(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                tile: PackedTile | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M <= 16, K) bf16 (or fp16; fp32 under the interpreter), weight a GroupedWeight on x's
    device -> (M, N) in x's dtype, fp32 accumulation. out: an (M, N) view to write into (a row
    block of a wider projection's output), unit stride along N."""
    m, k = x.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_ROWS and k == weight.shape[1] and x.stride(1) == 1
    assert weight.q.is_contiguous() and weight.scale.is_contiguous() and weight.group % 2 == 0
    assert weight.kind != FP8 or x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) >= (8, 9)
    tile = tile or default_tile(n, k, weight.group)
    assert k % (tile.block_k * tile.split_k) == 0, (k, tile)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    tiles = -(-n // tile.block_n)
    if tile.split_k > 1:
        part = torch.empty((tile.split_k, MAX_ROWS, n), dtype=torch.float32, device=x.device)
        counters = _tile_counters(x.device)
        assert tiles <= counters.numel()
    else:
        part = counters = out  # unused
    interpreting = triton_interpreting()
    _kernel()[(tiles, tile.split_k)](
        x, weight.q, weight.scale, weight.offset if weight.offset is not None else weight.scale,
        bias if bias is not None else out, out, part, counters, m, n, x.stride(0), weight.q.stride(0),
        weight.scale.stride(0), out.stride(0), KIND=weight.kind, G=weight.group,
        HAS_OFFSET=weight.offset is not None, HAS_BIAS=bias is not None,
        DOT_F32=x.dtype == torch.float32 or interpreting, SPLIT_K=tile.split_k, K_PER_SPLIT=k // tile.split_k,
        BLOCK_M=MAX_ROWS, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps,
        num_stages=1 if interpreting else tile.num_stages)
    return out


def packed_gemv_ref(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                    tile: PackedTile | None = None) -> torch.Tensor:
    """The weight dequantized in float32, rounded to x's dtype (as a load that dequantizes does),
    then F.linear."""
    return F.linear(x, dequantize_grouped(weight).to(x.dtype), bias)


__all__ = ["INT8", "SIGNED_NIBBLES", "PackedTile", "default_tile", "packed_gemv", "packed_gemv_ref"]
