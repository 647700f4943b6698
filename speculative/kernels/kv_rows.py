"""A tree step's accepted nodes' keys and values moved to their positions, every layer's K and V
in one launch with no host sync (safe to capture in a CUDA graph):

    move_kv_rows(k_all, v_all, src, dst)

k_all, v_all (L, S, Hkv, D): the target's cache (engine/kv_cache.py); src, dst (R,) int64: row
src[r] of every layer goes to row dst[r], as `x.index_copy_(1, dst, x.index_select(1, src))` moves
them for K and then for V (four launches). A program takes one layer of K or of V and a block of
its columns for all R rows: it reads every source row before it writes any (the two sets of rows
may overlap: a tree's accepted nodes move down onto rows of other nodes), and no other program
touches its columns. move_kv_rows_ref is the torch form (the tests' reference).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = None  # bound by _kernel(): Triton is imported on first use only

_BLOCK = 1024  # columns of a row (kv heads x head dim) a program moves


@functools.cache
def _kernel():
    global triton, tl  # module globals: the kernel reads them by name
    import triton
    import triton.language as tl

    @triton.jit
    def move_kv_rows_kernel(k_ptr, v_ptr, src_ptr, dst_ptr, stride_layer, stride_row, width, R: tl.constexpr,
                            RP: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:  # src and dst come from the kernel before
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        layer = tl.program_id(0)
        r = tl.arange(0, RP)
        on = r < R
        src = tl.load(src_ptr + r, mask=on, other=0)
        dst = tl.load(dst_ptr + r, mask=on, other=0)
        cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        inside = on[:, None] & (cols < width)[None, :]
        offset = layer.to(tl.int64) * stride_layer
        if tl.program_id(1) == 0:
            base = k_ptr + offset
        else:
            base = v_ptr + offset
        rows = tl.load(base + src[:, None] * stride_row + cols[None, :], mask=inside)
        tl.debug_barrier()  # every source row is read before any row is written
        tl.store(base + dst[:, None] * stride_row + cols[None, :], rows, mask=inside)

    return move_kv_rows_kernel


def move_kv_rows(k_all: torch.Tensor, v_all: torch.Tensor, src: torch.Tensor, dst: torch.Tensor,
                 pdl: bool = True) -> None:
    """The module's docstring. CUDA (or the Triton interpreter)."""
    assert k_all.shape == v_all.shape and k_all.dim() == 4 and k_all.stride() == v_all.stride()
    assert k_all[0, 0].is_contiguous() and src.shape == dst.shape and src.dim() == 1
    layers, _, heads, dim = k_all.shape
    width, rows = heads * dim, src.shape[0]
    if rows == 0:
        return
    block = min(_BLOCK, next_pow2(width))
    _kernel()[(layers, 2, -(-width // block))](k_all, v_all, src, dst, k_all.stride(0), k_all.stride(1), width,
                                              R=rows, RP=next_pow2(rows), BLOCK=block, num_warps=4,
                                              **pdl_args(k_all.device, pdl))


def move_kv_rows_ref(k_all: torch.Tensor, v_all: torch.Tensor, src: torch.Tensor, dst: torch.Tensor) -> None:
    """move_kv_rows in torch ops."""
    for x in (k_all, v_all):
        x.index_copy_(1, dst, x.index_select(1, src))
