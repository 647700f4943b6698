"""What a greedy verify step does when it accepted an alternative draft token, in one launch.

    take_alternative(k_all, v_all, move, states, rows, out)
        k_all, v_all (L, S, Hkv, D): every layer's cache; move (2,): [from, to] cache rows: the
        accepted alternative's K/V are copied from its own row to its position in every layer
        (from == to: nothing to move); out (R, W) = states[rows] (the draft-extend's target
        states, the alternative's in its place).

Without it the step took five torch launches (an index_select and an index_copy per cache, a
gather), none of which overlaps its neighbours the way our PDL kernels do. The row indices are
read on the device: no host sync, safe to capture in a CUDA graph.
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = None  # bound by _kernels(): Triton is imported on first use only


@functools.cache
def _kernels():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def take_alternative_kernel(k_ptr, v_ptr, move_ptr, states_ptr, rows_ptr, out_ptr,
                                num_layers, layer_stride, row_stride, row_size, width, stride_states, stride_out,
                                OUT_ROWS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_W: tl.constexpr,
                                USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        pid = tl.program_id(0)
        if pid < num_layers:  # one layer's K and V row
            src = tl.load(move_ptr).to(tl.int64)
            dst = tl.load(move_ptr + 1).to(tl.int64)
            offs_kv = tl.arange(0, BLOCK)
            kv_ok = offs_kv < row_size
            base = pid.to(tl.int64) * layer_stride
            k = tl.load(k_ptr + base + src * row_stride + offs_kv, mask=kv_ok)
            v = tl.load(v_ptr + base + src * row_stride + offs_kv, mask=kv_ok)
            tl.store(k_ptr + base + dst * row_stride + offs_kv, k, mask=kv_ok)
            tl.store(v_ptr + base + dst * row_stride + offs_kv, v, mask=kv_ok)
        else:  # the extend window's states
            offs_w = tl.arange(0, BLOCK_W)
            w_ok = offs_w < width
            for r in tl.static_range(OUT_ROWS):
                src_row = tl.load(rows_ptr + r).to(tl.int64)
                x = tl.load(states_ptr + src_row * stride_states + offs_w, mask=w_ok)
                tl.store(out_ptr + r * stride_out + offs_w, x, mask=w_ok)

    return take_alternative_kernel


def _check(k_all, v_all, move, states, rows, out) -> None:
    assert k_all.shape == v_all.shape and k_all.dim() == 4 and k_all.stride() == v_all.stride()
    assert k_all.stride(3) == 1 and k_all.stride(2) == k_all.shape[3] and k_all.stride(1) == k_all.shape[2] * k_all.shape[3]
    assert move.shape == (2,) and rows.dim() == 1 and out.shape == (rows.shape[0], states.shape[1])
    assert states.stride(1) == 1 and out.stride(1) == 1 and states.dtype == out.dtype


def take_alternative(k_all: torch.Tensor, v_all: torch.Tensor, move: torch.Tensor, states: torch.Tensor,
                     rows: torch.Tensor, out: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """See the module docstring. CUDA (or the Triton interpreter); returns out. pdl: programmatic
    dependent launch (KernelOptions.pdl)."""
    _check(k_all, v_all, move, states, rows, out)
    num_layers = k_all.shape[0]
    row_size = k_all.shape[2] * k_all.shape[3]
    width = states.shape[1]
    _kernels()[(num_layers + 1,)](
        k_all, v_all, move, states, rows, out,
        num_layers, k_all.stride(0), k_all.stride(1), row_size, width, states.stride(0), out.stride(0),
        OUT_ROWS=rows.shape[0], BLOCK=next_pow2(row_size), BLOCK_W=next_pow2(width), num_warps=4,
        **pdl_args(states.device, pdl),
    )
    return out


def take_alternative_ref(k_all: torch.Tensor, v_all: torch.Tensor, move: torch.Tensor, states: torch.Tensor,
                         rows: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Reference and CPU path: the same in torch ops."""
    _check(k_all, v_all, move, states, rows, out)
    src, dst = move[0:1], move[1:2]
    for cache in (k_all, v_all):
        cache.index_copy_(1, dst, cache.index_select(1, src))
    return torch.index_select(states, 0, rows, out=out)
