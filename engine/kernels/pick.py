"""Greedy picks over logits, each one launch with no host sync (safe to capture in a CUDA graph).

    argmax_pick(logits, offsets, out)         i = argmax(logits[0]); out[0] = i + offsets[i]
    draft_pick(logits, offsets, out, alts)    the same, and the next len(alts) best ids
                                              (mapped the same way) into alts
    greedy_verify(logits, chain, ...)         a verify step's greedy acceptance, and the chain
                                              state moved on (see greedy_verify)
    greedy_next(logits, next_token, ids, pos) the decode graph's greedy chaining: i = argmax;
                                              next_token[0] = ids[0] = i; pos[0] += 1

A draft with a reduced vocabulary maps its ids to the target's this way (EAGLE-3's d2t:
target = draft + d2t[draft]). One launch replaces an argmax, a gather, an add and a copy
per draft token.
Ties go to the lowest index, as torch.argmax (which, unlike these, would pick a NaN).
"""

from __future__ import annotations

import functools

import torch

from . import next_pow2, pdl_args

triton = tl = span_best = row_argmax = _pop_best = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step of the single program


@functools.cache
def _kernels():
    global triton, tl, span_best, row_argmax, _pop_best  # module globals: the kernels below call them by name
    import triton
    import triton.language as tl

    @triton.jit
    def span_best(base, start, end, BLOCK: tl.constexpr):
        """(the largest of the values at base[start:end], its index): ties and all -inf go to
        the lowest index; NaN never wins, unlike torch.argmax."""
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = start + tl.arange(0, BLOCK)  # all -inf: the span's first index
        for v0 in range(start, end, BLOCK):  # per lane: the first maximum of its strided slice
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
            better = x > best
            best = tl.where(better, x, best)
            best_i = tl.where(better, offs, best_i)
        top = tl.max(best, axis=0)
        return top, tl.min(tl.where(best == top, best_i, end), axis=0)  # the lowest lane index holding it

    @triton.jit
    def row_argmax(base, vocab, BLOCK: tl.constexpr):
        """The index of the largest of vocab values at base (as span_best)."""
        return span_best(base, 0, vocab, BLOCK)[1]

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

    @triton.jit
    def greedy_verify_kernel(logits_ptr, ids_ptr, n_ptr, result_ptr, window_ptr, accepted_ptr, draft_pos_ptr,
                             choice_ptr, count_ptr, state_rows_ptr, kv_move_ptr, alt_draft_ptr, vocab, stride_row, rows,
                             k, last_pos, HAS_ALTS: tl.constexpr, BLOCK: tl.constexpr, BLOCK_R: tl.constexpr,
                             USE_PDL: tl.constexpr):
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
            is_draft = lane < k
            d = tl.load(ids_ptr + 1 + lane, mask=is_draft, other=-1)  # draft i + 1 at lane i
            a = tl.min(tl.where(is_draft & (d != c), lane, k), axis=0)  # leading matches
            nxt = tl.sum(tl.where(lane == a, c, 0), axis=0)
            n_old = tl.load(n_ptr)
            if HAS_ALTS:
                # Alternative j stands for draft alt_draft[j] + 1 (verify row k + 1 + j): where the
                # chain's draft a + 1 was rejected, the first alternative for it that equals the
                # target's choice is accepted too, and the next token is the choice after it.
                alt_ok = lane < rows - k - 1
                alt = tl.load(ids_ptr + k + 1 + lane, mask=alt_ok, other=-1)
                alt_draft = tl.load(alt_draft_ptr + lane, mask=alt_ok, other=-1)
                hit = alt_ok & (alt_draft == a) & (alt == nxt)
                j = tl.min(tl.where(hit, lane, BLOCK_R), axis=0)
                has = j < BLOCK_R
                alt_tok = tl.sum(tl.where(lane == j, alt, 0), axis=0)
                d = tl.where(has & (lane == a), alt_tok, d)
                nxt = tl.where(has, tl.sum(tl.where(lane == k + 1 + j, c, 0), axis=0), nxt)
                tl.store(state_rows_ptr + lane, tl.where(has & (lane == a + 1), k + 1 + j, lane).to(tl.int64),
                         mask=lane < k + 1)
                # the accepted alternative's K/V moves from its own slot to its position
                src = tl.where(has, k + 1 + j, a + 1)
                tl.store(kv_move_ptr + lane, (n_old + tl.where(lane == 0, src, a + 1)).to(tl.int64), mask=lane < 2)
                a = a + has.to(a.dtype)
            tl.store(result_ptr + lane, tl.where(lane == 0, a, nxt).to(tl.int64), mask=lane < 2)
            tl.store(result_ptr + 2 + lane, d, mask=is_draft)
            # extend row i pairs target state n + i with the token at n + i + 1
            tl.store(window_ptr + lane, tl.where(lane < a, d, nxt), mask=lane < k + 1)
            tl.store(accepted_ptr, a.to(tl.int64))
            n = n_old + a + 1
            tl.store(n_ptr, n)
            tl.store(ids_ptr, nxt)
            tl.store(draft_pos_ptr + lane, tl.minimum(n + lane, last_pos), mask=lane < k + 1)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    @triton.jit
    def greedy_next_kernel(logits_ptr, part_val_ptr, part_idx_ptr, count_ptr, next_ptr, ids_ptr, pos_ptr, vocab,
                           num_parts, CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                           USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        p = tl.program_id(0)
        top, where = span_best(logits_ptr, p * CHUNK, tl.minimum(p * CHUNK + CHUNK, vocab), BLOCK)
        tl.store(part_val_ptr + p, top)
        tl.store(part_idx_ptr + p, where)
        tl.debug_barrier()  # the part is written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == num_parts - 1:  # the last chunk's program: the best of the chunks' best
            tl.debug_barrier()
            lane = tl.arange(0, BLOCK_P)
            ok = lane < num_parts
            val = tl.load(part_val_ptr + lane, mask=ok, other=float("-inf"), cache_modifier=".cg")
            idx = tl.load(part_idx_ptr + lane, mask=ok, other=vocab, cache_modifier=".cg")
            win = tl.min(tl.where(val == tl.max(val, axis=0), idx, vocab), axis=0).to(tl.int64)
            tl.store(next_ptr, win)
            tl.store(ids_ptr, win)
            tl.store(pos_ptr, tl.load(pos_ptr) + 1)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return argmax_pick_kernel, greedy_verify_kernel, draft_pick_kernel, greedy_next_kernel


def argmax_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """The argmax of logits (1, V) (last dim contiguous; ties: the lowest index), mapped by
    offsets (V,) (id + offsets[id]; None: none), into out: a 1-element tensor (a view into a
    buffer). Returns out. CUDA (or the Triton interpreter); no host sync. pdl: programmatic dependent
    launch (KernelOptions.pdl), as for every kernel here."""
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


_NEXT_BLOCK = 2048  # greedy_next: logits per program and loop step
_NEXT_MAX_PARTS = 512


@functools.cache
def _next_buffers(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # (each chunk's best value, its index, the arrival counter): the counter is zeroed once and
    # each launch leaves it at zero again. Launches must not run concurrently on two streams.
    return (torch.empty(_NEXT_MAX_PARTS, dtype=torch.float32, device=device),
            torch.empty(_NEXT_MAX_PARTS, dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device))


def greedy_next(logits: torch.Tensor, next_token: torch.Tensor, input_ids: torch.Tensor,
                positions: torch.Tensor, pdl: bool = True) -> None:
    """The greedy chaining of a one-token decode graph, in one launch: i = argmax(logits[0])
    (ties: the lowest index; NaN never wins); next_token[0] = input_ids[0] = i; positions[0] += 1.
    Programs take chunks of the vocabulary and the last to finish picks among their best (torch's
    argmax over a 128K vocabulary took 28 us on the H200, as one block). CUDA (or the Triton
    interpreter); no host sync."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.stride(1) == 1
    assert next_token.numel() == input_ids.numel() == positions.numel() == 1
    assert next_token.dtype == input_ids.dtype == positions.dtype == torch.int64
    vocab = logits.shape[1]
    chunk = _NEXT_BLOCK * -(-vocab // (_NEXT_BLOCK * _NEXT_MAX_PARTS))
    parts = -(-vocab // chunk)
    part_val, part_idx, count = _next_buffers(logits.device)
    _kernels()[3][(parts,)](
        logits, part_val, part_idx, count, next_token, input_ids, positions, vocab, parts,
        CHUNK=chunk, BLOCK=_NEXT_BLOCK, BLOCK_P=max(16, next_pow2(parts)), num_warps=8,
        **pdl_args(logits.device, pdl),
    )


def greedy_next_ref(logits, next_token, input_ids, positions) -> None:
    """Reference and CPU path: the same in torch ops."""
    i = logits[0].argmax().view(1)
    next_token.view(1).copy_(i)
    input_ids.view(1).copy_(i)
    positions.add_(1)


MAX_ALTS = 3  # draft_pick's limit


def draft_pick(logits: torch.Tensor, offsets: torch.Tensor | None, out: torch.Tensor,
               alts: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """argmax_pick, and the next alts.numel() (1..MAX_ALTS) best ids, best first, into alts (a
    contiguous view into a buffer; ties: the lowest index first). One launch, no host sync."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.stride(1) == 1 and out.numel() == 1
    assert 1 <= alts.numel() <= MAX_ALTS and alts.is_contiguous() and alts.numel() < logits.shape[1]
    _kernels()[2][(1,)](
        logits, offsets if offsets is not None else out, out, alts, logits.shape[1],
        ALTS=alts.numel(), HAS_OFFSETS=offsets is not None, BLOCK=_BLOCK, num_warps=8,
        **pdl_args(logits.device, pdl),
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


class ChainState:
    """The device state of a greedy draft chain that greedy_verify reads and moves on.

    ids (k+1+sum(alts),): [bonus, d_1..d_k, then alts[i] alternatives for d_(i+1), for each i]: the
    token at position n, the k drafts after it, and the draft's next-best tokens in place of drafts
    (verify rows of their own, at the draft's position, with their K/V in the rows after the
    chain's: cache row n + row index). n (): the cache length before the verify. greedy_verify
    writes result (k+2,) [accepted a, next token, the a accepted drafts, then the rest of
    d_1..d_k], window (k+1,) (the draft-extend's tokens: the accepted ones, then the next token),
    accepted (), n += a + 1, ids[0] = the next token, and draft_pos (k+1,): min(n + i, last_pos),
    where the next chain's draft steps write. With alternatives also state_rows (k+1,), the
    verify row whose target state each extend row takes, and kv_move (2,): [from, to], the cache
    row the accepted alternative's K/V must move to its position from (from == to: none)."""

    def __init__(self, k: int, last_pos: int, device, alts: int | tuple[int, ...] = 0):
        long = dict(dtype=torch.long, device=device)
        alts = (alts,) * k if isinstance(alts, int) else tuple(alts)
        assert len(alts) == k and all(0 <= m <= MAX_ALTS for m in alts), alts
        self.k, self.last_pos, self.alts = k, last_pos, alts
        self.num_alts = sum(alts)
        self.rows = k + 1 + self.num_alts  # verify rows
        self.ids = torch.zeros(self.rows, **long)
        self.n = torch.zeros((), **long)
        self.result = torch.zeros(k + 2, **long)
        self.window = torch.zeros(k + 1, **long)
        self.accepted = torch.zeros((), **long)
        self.draft_pos = torch.zeros(k + 1, **long)
        self.offsets = torch.arange(k + 1, **long)
        # verify row i sits at position n + row_pos[i] and writes cache row n + i
        self.alt_draft = torch.tensor([i for i, m in enumerate(alts) for _ in range(m)], **long)  # draft index - 1
        self.row_pos = torch.cat([self.offsets, self.alt_draft + 1])
        self.row_slots = torch.arange(self.rows, **long)
        self.state_rows = torch.arange(k + 1, **long)
        self.kv_move = torch.zeros(2, **long)
        self._choice = torch.zeros(self.rows, **long)
        self._counter = torch.zeros(1, dtype=torch.int32, device=device)

    def alt_slots(self, s: int) -> torch.Tensor:
        """The ids where draft s + 1's alternatives go (empty: it has none)."""
        start = self.k + 1 + sum(self.alts[:s])
        return self.ids[start:start + self.alts[s]]

    def advance(self, a: torch.Tensor, nxt: torch.Tensor, drafts: torch.Tensor | None = None) -> None:
        """greedy_verify's writes in torch ops, for an accepted count a () and next token nxt ()
        decided elsewhere (the reference, and the sampled loop's rejection sampling); all but
        `accepted`, which only greedy_verify's callers read. drafts: the k proposed tokens as
        accepted (d_1..d_k, with an accepted alternative in its draft's place)."""
        drafts = self.ids[1:self.k + 1] if drafts is None else drafts
        self.result[0].copy_(a)
        self.result[1].copy_(nxt)
        self.result[2:].copy_(drafts)
        self.window.copy_(torch.where(self.offsets < a, torch.cat([drafts, drafts[-1:]]), nxt))
        self.n.add_(a + 1)
        self.ids[0].copy_(nxt)
        self.place_drafts()

    def place_drafts(self) -> None:
        """draft_pos = min(n + i, last_pos): where the draft steps of the chain after the bonus
        token at n write."""
        torch.add(self.offsets, self.n, out=self.draft_pos)
        self.draft_pos.clamp_(max=self.last_pos)


def greedy_verify(logits: torch.Tensor, chain: ChainState, pdl: bool = True) -> None:
    """logits (rows, V): the target's after each verify row (ChainState.ids; any float dtype).
    The target's choice at each row is its argmax (ties: lowest index); d_1..d_a are accepted
    where they equal the choices before them. Where d_(a+1) was rejected, an alternative for it
    that equals the target's choice there is accepted as well, and the next token is the choice
    after the last accepted token, so the output is what plain greedy decoding gives. Writes
    chain's fields (ChainState). One launch: each row's program takes its argmax, and the last
    to finish does the rest. CUDA (or the Triton interpreter)."""
    rows = chain.rows
    assert logits.dim() == 2 and logits.shape[0] == rows and logits.stride(1) == 1
    _kernels()[1][(rows,)](
        logits, chain.ids, chain.n, chain.result, chain.window, chain.accepted, chain.draft_pos,
        chain._choice, chain._counter, chain.state_rows, chain.kv_move,
        chain.alt_draft if chain.num_alts else chain.kv_move, logits.shape[1], logits.stride(0), rows, chain.k,
        chain.last_pos, HAS_ALTS=chain.num_alts > 0, BLOCK=_BLOCK, BLOCK_R=max(16, next_pow2(rows)),
        num_warps=8, **pdl_args(logits.device, pdl),
    )


def greedy_verify_ref(logits: torch.Tensor, chain: ChainState) -> None:
    """Reference and CPU path: the same writes in torch ops."""
    k, m = chain.k, chain.num_alts
    choice = logits.argmax(-1)
    matches = (chain.ids[1:k + 1] == choice[:k]).to(torch.int64)
    a = matches.cumprod(0).sum()
    nxt = choice.index_select(0, a.view(1))[0]  # index_select: no host sync
    if not m:
        chain.accepted.copy_(a)
        chain.advance(a, nxt)
        return
    alt = chain.ids[k + 1:]
    lane = torch.arange(m, device=alt.device)
    hit = (chain.alt_draft == a) & (alt == nxt)
    j = torch.where(hit, lane, m).min()
    has = (j < m).to(torch.int64)
    row = k + 1 + j.clamp(max=m - 1)  # the hit's verify row (any row when none)
    alt_tok = alt.index_select(0, j.clamp(max=m - 1).view(1))[0]
    nxt = torch.where(has.bool(), choice.index_select(0, row.view(1))[0], nxt)
    chain.state_rows.copy_(torch.where(has.bool() & (chain.offsets == a + 1), row, chain.offsets))
    src = torch.where(has.bool(), row, a + 1)
    chain.kv_move.copy_(chain.n + torch.stack([src, a + 1]))
    drafts = torch.where(has.bool() & (chain.offsets[:k] == a), alt_tok, chain.ids[1:k + 1])
    a = a + has
    chain.accepted.copy_(a)
    chain.advance(a, nxt, drafts)
