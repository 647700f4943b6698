"""Greedy pick: the argmax of one row of logits, mapped through an offset table, written to a slot.

    argmax_pick(logits, offsets, out, row)    i = argmax(logits[row]); out[0] = i + offsets[i]

A draft with a reduced vocabulary maps its ids to the target's this way (EAGLE-3's d2t:
target = draft + d2t[draft]). One launch replaces an argmax, a gather, an add and a copy
per draft token; the row index is read on the device (the last accepted row of a
draft-extend), so it needs no host sync and is safe to capture in a CUDA graph.
Ties go to the lowest index, as torch.argmax.
"""

from __future__ import annotations

import functools

import torch

from . import pdl_args

triton = tl = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step of the single program


@functools.cache
def _kernels():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def argmax_pick_kernel(logits_ptr, row_ptr, offsets_ptr, out_ptr, vocab, stride_row,
                           HAS_ROW: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK: tl.constexpr,
                           USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        base = logits_ptr
        if HAS_ROW:
            base += tl.load(row_ptr) * stride_row
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.zeros([BLOCK], tl.int32)
        for v0 in range(0, vocab, BLOCK):  # per lane: the first maximum of its strided slice
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            better = x > best
            best = tl.where(better, x, best)
            best_i = tl.where(better, offs, best_i)
        top = tl.max(best, axis=0)
        # the lowest index among the lanes that hold the maximum
        idx = tl.min(tl.where(best == top, best_i, vocab), axis=0)
        idx = tl.minimum(idx, vocab - 1)  # every logit NaN or -inf: index vocab - 1, not out of range
        if HAS_OFFSETS:
            idx = idx + tl.load(offsets_ptr + idx)
        tl.store(out_ptr, idx.to(out_ptr.dtype.element_ty))

    return argmax_pick_kernel


def argmax_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor,
                row: torch.Tensor | None = None) -> torch.Tensor:
    """logits (T, V), last dim contiguous; offsets (V,) or None; out: a 1-element tensor (a view
    into a buffer); row: a 0-dim integer tensor on the device, or None for row 0. Returns out.
    CUDA (or the Triton interpreter); no host sync."""
    assert logits.dim() == 2 and logits.stride(1) == 1 and out.numel() == 1
    assert offsets is None or offsets.shape == (logits.shape[1],)
    _kernels()[(1,)](
        logits, row if row is not None else out, offsets if offsets is not None else out, out,
        logits.shape[1], logits.stride(0),
        HAS_ROW=row is not None, HAS_OFFSETS=offsets is not None, BLOCK=_BLOCK, num_warps=8,
        **pdl_args(logits.device),
    )
    return out


def argmax_pick_ref(logits, offsets, out, row=None) -> torch.Tensor:
    """Reference and CPU path: the same in torch ops."""
    x = logits[0] if row is None else logits.index_select(0, row.view(1))[0]
    i = x.argmax().view(1)
    out.view(1).copy_(i if offsets is None else i + offsets[i])
    return out
