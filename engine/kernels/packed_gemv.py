"""packed_gemv: out = x @ W.T for 1 to 16 rows with W kept quantized (a GroupedWeight), decoded
tile by tile inside the kernel; packed_gemv_ref beside it (the weight dequantized by the torch
reference and rounded to x's dtype, then a plain matmul: what the dequantize-at-load path runs).

One program owns BLOCK_N output columns of every row. Each K step loads the step's quantized
bytes, its groups' scales and offsets, decodes w = q * scale (+ offset) in float32, rounds it to
bf16 (the very weight the dequantize-at-load path multiplies) and takes a tensor-core dot with
the rows, padded to 16: a row's result does not depend on how many rows came with it, so a
verify row has the bits of the decode step it stands for (batch invariance, as the bf16 tiles).
No split-K, no host sync: safe inside CUDA graphs. Steps of more than 16 rows (prefill)
dequantize the weight and run a plain matmul instead (packed_linear in engine/packed_linear.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.kernels import triton_interpreting
from engine.weights.grouped import FP8, INT8, SIGNED_NIBBLES, GroupedWeight, dequantize_grouped

MAX_ROWS = 16


@dataclass(frozen=True)
class PackedTile:
    block_n: int  # output columns a program (the dot's long side)
    block_k: int  # inputs a K step
    num_warps: int = 4
    num_stages: int = 3


def default_tile(n: int, k: int, group: int) -> PackedTile:
    """64 columns a program over 128-input steps for wide projections, 32 over 256-input steps
    for the others (shorter steps where K or the groups need them). The fastest of a sweep on an
    H200 (benchmarks/bench_packed.py --sweep; docs/performance.md): the 8B's Q4_K qkv 43.2 us
    and gate_up 50.2 against 46.6 and 76.6 with 32 x 128, its o_proj 14.1 and down 43.0 against
    18.3 and 58.3."""
    wide = n >= 6144
    for block_k in ((128, 64, 32) if wide else (256, 128, 64, 32)):
        if k % block_k == 0 and (block_k % group == 0 or group % block_k == 0):
            return PackedTile(64 if wide else 32, block_k)
    raise ValueError(f"no K step fits K = {k} with groups of {group}")


@functools.cache
def _kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def packed_kernel(x_ptr, q_ptr, s_ptr, o_ptr, b_ptr, out_ptr, num_rows, N,
                      stride_x, stride_q, stride_s, stride_out,
                      K: tl.constexpr, KIND: tl.constexpr, G: tl.constexpr, HAS_OFFSET: tl.constexpr,
                      HAS_BIAS: tl.constexpr, DOT_F32: tl.constexpr,
                      BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        GROUPS: tl.constexpr = BLOCK_K // G if G < BLOCK_K else 1  # groups a K step spans
        SUB: tl.constexpr = BLOCK_K // GROUPS
        pid_n = tl.program_id(0)
        offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        n_ok = offs_n < N
        w_rows = tl.where(n_ok, offs_n, 0)  # clamped, not masked: the loads stay vectorized
        rows = tl.arange(0, BLOCK_M)
        row_ok = rows < num_rows
        acc_t = tl.zeros([BLOCK_N, BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            if KIND <= 1:  # two nibbles a byte: element 2j low, 2j + 1 high
                offs_b = k0 // 2 + tl.arange(0, BLOCK_K // 2)
                b = tl.load(q_ptr + w_rows[:, None] * stride_q + offs_b[None, :]).to(tl.int32)
                q = tl.reshape(tl.join(b & 0x0F, b >> 4), (BLOCK_N, BLOCK_K))
                if KIND == 1:
                    q = q - 8
                qf = q.to(tl.float32)
            else:  # int8 or fp8, one a byte
                offs_q = k0 + tl.arange(0, BLOCK_K)
                qf = tl.load(q_ptr + w_rows[:, None] * stride_q + offs_q[None, :]).to(tl.float32)
            offs_g = k0 // G + tl.arange(0, GROUPS)
            s = tl.load(s_ptr + w_rows[:, None] * stride_s + offs_g[None, :]).to(tl.float32)
            w = tl.reshape(qf, (BLOCK_N, GROUPS, SUB)) * s[:, :, None]
            if HAS_OFFSET:
                o = tl.load(o_ptr + w_rows[:, None] * stride_s + offs_g[None, :]).to(tl.float32)
                w = w + o[:, :, None]
            w = tl.reshape(w, (BLOCK_N, BLOCK_K))
            offs_k = k0 + tl.arange(0, BLOCK_K)
            a = tl.load(x_ptr + rows[:, None] * stride_x + offs_k[None, :], mask=row_ok[:, None], other=0.0)
            if DOT_F32:
                acc_t += tl.dot(w.to(a.dtype).to(tl.float32), tl.trans(a.to(tl.float32)), input_precision="ieee")
            else:
                acc_t += tl.dot(w.to(a.dtype), tl.trans(a))
        acc = tl.trans(acc_t)
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows[:, None] * stride_out + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None] & n_ok[None, :])

    return packed_kernel


def packed_gemv(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                tile: PackedTile | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """x (M <= 16, K) bf16 (or fp16; fp32 under the interpreter), weight a GroupedWeight on x's
    device -> (M, N) in x's dtype, fp32 accumulation. out: an (M, N) view to write into (a row
    block of a wider projection's output), unit stride along N."""
    m, k = x.shape
    n = weight.shape[0]
    assert 1 <= m <= MAX_ROWS and k == weight.shape[1] and x.stride(1) == 1
    assert weight.q.is_contiguous() and weight.scale.is_contiguous()
    assert weight.kind != FP8 or x.device.type != "cuda" or torch.cuda.get_device_capability(x.device) >= (8, 9)
    tile = tile or default_tile(n, k, weight.group)
    assert k % tile.block_k == 0 and (tile.block_k % weight.group == 0 or weight.group % tile.block_k == 0)
    if out is None:
        out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    assert out.shape == (m, n) and out.stride(1) == 1 and out.dtype == x.dtype
    interpreting = triton_interpreting()
    _kernel()[(-(-n // tile.block_n),)](
        x, weight.q, weight.scale, weight.offset if weight.offset is not None else weight.scale,
        bias if bias is not None else out, out, m, n, x.stride(0), weight.q.stride(0), weight.scale.stride(0),
        out.stride(0), K=k, KIND=weight.kind, G=weight.group, HAS_OFFSET=weight.offset is not None,
        HAS_BIAS=bias is not None, DOT_F32=x.dtype == torch.float32 or interpreting,
        BLOCK_M=MAX_ROWS, BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, num_warps=tile.num_warps,
        num_stages=1 if interpreting else tile.num_stages)
    return out


def packed_gemv_ref(x: torch.Tensor, weight: GroupedWeight, bias: torch.Tensor | None = None,
                    tile: PackedTile | None = None) -> torch.Tensor:
    """The weight dequantized in float32, rounded to x's dtype (as a load that dequantizes does),
    then F.linear."""
    return F.linear(x, dequantize_grouped(weight).to(x.dtype), bias)


__all__ = ["INT8", "SIGNED_NIBBLES", "PackedTile", "default_tile", "packed_gemv", "packed_gemv_ref"]
