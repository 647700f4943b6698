"""The draft's greedy picks, each one launch with no host sync (safe to capture in a CUDA graph).

    argmax_pick(logits, offsets, out)         i = argmax(logits[0]); out[0] = i + offsets[i]
    draft_pick(logits, offsets, out, alts)    the same, and the next len(alts) best ids
                                              (mapped the same way) into alts

A draft with a reduced vocabulary maps its ids to the target's this way (EAGLE-3's d2t:
target = draft + d2t[draft]). One launch replaces an argmax, a gather, an add and a copy
per draft token.
Ties go to the lowest index, as torch.argmax (which, unlike these, would pick a NaN).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import pdl_args

triton = tl = row_argmax = _pop_best = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step of the single program


@functools.cache
def _kernels():
    global triton, tl, row_argmax, _pop_best  # module globals: the kernels below call them by name
    import triton
    import triton.language as tl

    from engine.kernels.pick import argmax_helpers

    row_argmax = argmax_helpers()[1]

    @triton.jit
    def _pop_best(b0, b1, b2, b3, i0, i1, i2, i3, vocab):
        """The best of the lanes' best (ties: the lowest index), and the lanes with it taken out."""
        top = tl.max(b0, axis=0)
        idx = tl.min(tl.where(b0 == top, i0, vocab), axis=0)
        won = i0 == idx
        b0, i0 = tl.where(won, b1, b0), tl.where(won, i1, i0)
        b1, i1 = tl.where(won, b2, b1), tl.where(won, i2, i1)
        b2, i2 = tl.where(won, b3, b2), tl.where(won, i3, i2)
        b3 = tl.where(won, float("-inf"), b3)
        return idx, b0, b1, b2, b3, i0, i1, i2, i3

    @triton.jit
    def draft_pick_kernel(logits_ptr, offsets_ptr, out_ptr, alts_ptr, vocab,
                          ALTS: tl.constexpr, HAS_OFFSETS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        base = logits_ptr
        # One pass: each lane keeps the four best of its strided slice, in order (a later index
        # enters only above a strictly smaller value: ties keep the lower index first).
        ninf = tl.full([BLOCK], float("-inf"), tl.float32)
        zero = tl.zeros([BLOCK], tl.int32)
        b0, b1, b2, b3 = ninf, ninf, ninf, ninf
        i0, i1, i2, i3 = zero, zero, zero, zero
        for v0 in range(0, vocab, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            g0, g1, g2, g3 = x > b0, x > b1, x > b2, x > b3
            b3, i3 = tl.where(g2, b2, tl.where(g3, x, b3)), tl.where(g2, i2, tl.where(g3, offs, i3))
            b2, i2 = tl.where(g1, b1, tl.where(g2, x, b2)), tl.where(g1, i1, tl.where(g2, offs, i2))
            b1, i1 = tl.where(g0, b0, tl.where(g1, x, b1)), tl.where(g0, i0, tl.where(g1, offs, i1))
            b0, i0 = tl.where(g0, x, b0), tl.where(g0, offs, i0)
        # a lane never filled holds index 0 at -inf: it can only win where all are -inf
        i0 = tl.where(b0 == float("-inf"), vocab, i0)
        i1 = tl.where(b1 == float("-inf"), vocab, i1)
        i2 = tl.where(b2 == float("-inf"), vocab, i2)
        i3 = tl.where(b3 == float("-inf"), vocab, i3)
        j0, b0, b1, b2, b3, i0, i1, i2, i3 = _pop_best(b0, b1, b2, b3, i0, i1, i2, i3, vocab)
        j1, b0, b1, b2, b3, i0, i1, i2, i3 = _pop_best(b0, b1, b2, b3, i0, i1, i2, i3, vocab)
        j2 = j1
        j3 = j1
        if ALTS > 1:
            j2, b0, b1, b2, b3, i0, i1, i2, i3 = _pop_best(b0, b1, b2, b3, i0, i1, i2, i3, vocab)
        if ALTS > 2:
            j3, b0, b1, b2, b3, i0, i1, i2, i3 = _pop_best(b0, b1, b2, b3, i0, i1, i2, i3, vocab)
        if HAS_OFFSETS:
            j0 = j0 + tl.load(offsets_ptr + j0)
            j1 = j1 + tl.load(offsets_ptr + j1)
            j2 = j2 + tl.load(offsets_ptr + j2)
            j3 = j3 + tl.load(offsets_ptr + j3)
        ty = out_ptr.dtype.element_ty
        tl.store(out_ptr, j0.to(ty))
        tl.store(alts_ptr, j1.to(ty))
        if ALTS > 1:
            tl.store(alts_ptr + 1, j2.to(ty))
        if ALTS > 2:
            tl.store(alts_ptr + 2, j3.to(ty))

    @triton.jit
    def argmax_pick_kernel(logits_ptr, offsets_ptr, out_ptr, vocab,
                           HAS_OFFSETS: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        idx = row_argmax(logits_ptr, vocab, BLOCK)
        if HAS_OFFSETS:
            idx = idx + tl.load(offsets_ptr + idx)
        tl.store(out_ptr, idx.to(out_ptr.dtype.element_ty))

    return argmax_pick_kernel, draft_pick_kernel


def argmax_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """The argmax of logits (1, V) (last dim contiguous; ties: the lowest index), mapped by
    offsets (V,) (id + offsets[id]; None: none), into out: a 1-element tensor (a view into a
    buffer). Returns out. CUDA (or the Triton interpreter); no host sync."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.stride(1) == 1 and out.numel() == 1
    assert offsets is None or offsets.shape == (logits.shape[1],)
    _kernels()[0][(1,)](
        logits, offsets if offsets is not None else out, out, logits.shape[1],
        HAS_OFFSETS=offsets is not None, BLOCK=_BLOCK, num_warps=8, **pdl_args(logits.device, pdl),
    )
    return out


def argmax_pick_ref(logits, offsets, out) -> torch.Tensor:
    """Reference and CPU path: the same in torch ops."""
    i = logits[0].argmax().view(1)
    out.view(1).copy_(i if offsets is None else i + offsets[i])
    return out


MAX_ALTS = 3  # draft_pick's limit


def draft_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor,
               alts: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """argmax_pick, and the next alts.numel() (1..MAX_ALTS) best ids, best first, into alts (a
    contiguous view into a buffer; ties: the lowest index first). One launch, no host sync."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.stride(1) == 1 and out.numel() == 1
    assert 1 <= alts.numel() <= MAX_ALTS and alts.is_contiguous() and alts.numel() < logits.shape[1]
    _kernels()[1][(1,)](
        logits, offsets if offsets is not None else out, out, alts, logits.shape[1],
        ALTS=alts.numel(), HAS_OFFSETS=offsets is not None, BLOCK=_BLOCK, num_warps=8, **pdl_args(logits.device, pdl),
    )
    return out


def draft_pick_ref(logits, offsets, out, alts) -> torch.Tensor:
    """Reference and CPU path: the same in torch ops (a stable sort: ties go to the lowest
    index, as in the kernel)."""
    ids = logits[0].float().sort(descending=True, stable=True).indices[:alts.numel() + 1]
    if offsets is not None:
        ids = ids + offsets[ids]
    out.view(1).copy_(ids[:1])
    alts.view(-1).copy_(ids[1:])
    return out
