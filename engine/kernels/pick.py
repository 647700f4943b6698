"""Greedy picks over logits, each one launch with no host sync (safe to capture in a CUDA graph).

    argmax_pick(logits, offsets, out, row)    i = argmax(logits[row]); out[0] = i + offsets[i]
    greedy_verify(logits, chain, ...)         a verify step's greedy acceptance, and the chain
                                              state moved on (see greedy_verify)

A draft with a reduced vocabulary maps its ids to the target's this way (EAGLE-3's d2t:
target = draft + d2t[draft]). One launch replaces an argmax, a gather, an add and a copy
per draft token; the row index is read on the device (the last accepted row of a
draft-extend), so it needs no host sync and is safe to capture in a CUDA graph.
Ties go to the lowest index, as torch.argmax (which, unlike these, would pick a NaN).
"""

from __future__ import annotations

import functools

import torch

from . import pdl_args

triton = tl = row_argmax = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step of the single program


@functools.cache
def _kernels():
    global triton, tl, row_argmax  # module globals: the kernels below call row_argmax by name
    import triton
    import triton.language as tl

    @triton.jit
    def row_argmax(base, vocab, BLOCK: tl.constexpr):
        """The index of the largest of vocab values at base (ties and all -inf: the lowest;
        NaN never wins, unlike torch.argmax)."""
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = tl.zeros([BLOCK], tl.int32)
        for v0 in range(0, vocab, BLOCK):  # per lane: the first maximum of its strided slice
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            better = x > best
            best = tl.where(better, x, best)
            best_i = tl.where(better, offs, best_i)
        top = tl.max(best, axis=0)
        return tl.min(tl.where(best == top, best_i, vocab), axis=0)  # the lowest lane index holding it

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
        idx = row_argmax(base, vocab, BLOCK)
        if HAS_OFFSETS:
            idx = idx + tl.load(offsets_ptr + idx)
        tl.store(out_ptr, idx.to(out_ptr.dtype.element_ty))

    @triton.jit
    def greedy_verify_kernel(logits_ptr, ids_ptr, n_ptr, result_ptr, window_ptr, accepted_ptr, draft_pos_ptr,
                             choice_ptr, count_ptr, vocab, stride_row, rows, last_pos,
                             BLOCK: tl.constexpr, BLOCK_R: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        choice = row_argmax(logits_ptr + r * stride_row, vocab, BLOCK)
        tl.store(choice_ptr + r, choice.to(tl.int64))
        tl.debug_barrier()  # the choice is written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == rows - 1:  # the last row's program: accept, and move the chain on
            lane = tl.arange(0, BLOCK_R)
            c = tl.load(choice_ptr + lane, mask=lane < rows, other=-1, cache_modifier=".cg")
            is_draft = lane < rows - 1
            d = tl.load(ids_ptr + 1 + lane, mask=is_draft, other=-1)  # draft i + 1 at lane i
            a = tl.min(tl.where(is_draft & (d != c), lane, rows - 1), axis=0)  # leading matches
            nxt = tl.sum(tl.where(lane == a, c, 0), axis=0)
            tl.store(result_ptr + lane, tl.where(lane == 0, a, nxt).to(tl.int64), mask=lane < 2)
            tl.store(result_ptr + 2 + lane, d, mask=is_draft)
            # extend row i pairs target state n + i with the token at n + i + 1
            tl.store(window_ptr + lane, tl.where(lane < a, d, nxt), mask=lane < rows)
            tl.store(accepted_ptr, a.to(tl.int64))
            n = tl.load(n_ptr) + a + 1
            tl.store(n_ptr, n)
            tl.store(ids_ptr, nxt)
            tl.store(draft_pos_ptr + lane, tl.minimum(n + lane, last_pos), mask=lane < rows)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return argmax_pick_kernel, greedy_verify_kernel


def argmax_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor,
                row: torch.Tensor | None = None) -> torch.Tensor:
    """logits (T, V), last dim contiguous; offsets (V,) or None; out: a 1-element tensor (a view
    into a buffer); row: a 0-dim integer tensor on the device, or None for row 0. Returns out.
    CUDA (or the Triton interpreter); no host sync."""
    assert logits.dim() == 2 and logits.stride(1) == 1 and out.numel() == 1
    assert offsets is None or offsets.shape == (logits.shape[1],)
    _kernels()[0][(1,)](
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


class ChainState:
    """The device state of a greedy draft chain that greedy_verify reads and moves on.

    ids (k+1,): [bonus, d_1..d_k], the token at position n and the k drafts after it; n (): the
    cache length before the verify. greedy_verify writes result (k+2,) [accepted a, next token,
    d_1..d_k], window (k+1,) (the draft-extend's tokens: d_1..d_a, then the next token),
    accepted (), n += a + 1, ids[0] = the next token, and draft_pos (k+1,): min(n + i, last_pos),
    where the next chain's draft steps write."""

    def __init__(self, k: int, last_pos: int, device):
        long = dict(dtype=torch.long, device=device)
        self.k, self.last_pos = k, last_pos
        self.ids = torch.zeros(k + 1, **long)
        self.n = torch.zeros((), **long)
        self.result = torch.zeros(k + 2, **long)
        self.window = torch.zeros(k + 1, **long)
        self.accepted = torch.zeros((), **long)
        self.draft_pos = torch.zeros(k + 1, **long)
        self.offsets = torch.arange(k + 1, **long)
        self._choice = torch.zeros(k + 1, **long)
        self._counter = torch.zeros(1, dtype=torch.int32, device=device)

    def advance(self, a: torch.Tensor, nxt: torch.Tensor) -> None:
        """greedy_verify's writes in torch ops, for an accepted count a () and next token nxt ()
        decided elsewhere (the reference, and the sampled loop's rejection sampling); all but
        `accepted`, which only greedy_verify's callers read."""
        drafts = self.ids[1:]
        self.result[0].copy_(a)
        self.result[1].copy_(nxt)
        self.result[2:].copy_(drafts)
        self.window.copy_(torch.where(self.offsets < a, torch.cat([drafts, drafts[-1:]]), nxt))
        self.n.add_(a + 1)
        self.ids[0].copy_(nxt)
        torch.add(self.offsets, self.n, out=self.draft_pos)
        self.draft_pos.clamp_(max=self.last_pos)


def greedy_verify(logits: torch.Tensor, chain: ChainState) -> None:
    """logits (k+1, V): the target's after [bonus, d_1..d_k] (any float dtype). The target's
    choice at each row is its argmax (ties: lowest index); d_1..d_a are accepted where they
    equal the choices before them, and the next token is the choice after them, so the output
    is what plain greedy decoding gives. Writes chain's fields (ChainState). One launch: each
    row's program takes its argmax, and the last to finish does the rest. CUDA (or the Triton
    interpreter)."""
    rows = chain.k + 1
    assert logits.dim() == 2 and logits.shape[0] == rows and logits.stride(1) == 1
    _kernels()[1][(rows,)](
        logits, chain.ids, chain.n, chain.result, chain.window, chain.accepted, chain.draft_pos,
        chain._choice, chain._counter, logits.shape[1], logits.stride(0), rows, chain.last_pos,
        BLOCK=_BLOCK, BLOCK_R=max(16, 1 << (rows - 1).bit_length()), num_warps=8, **pdl_args(logits.device),
    )


def greedy_verify_ref(logits: torch.Tensor, chain: ChainState) -> None:
    """Reference and CPU path: the same writes in torch ops."""
    choice = logits.argmax(-1)
    matches = (chain.ids[1:] == choice[:-1]).to(torch.int64)
    a = matches.cumprod(0).sum()
    chain.accepted.copy_(a)
    chain.advance(a, choice.index_select(0, a.view(1))[0])  # index_select: no host sync
