"""greedy_verify: a verify step's greedy acceptance, and the draft chain (ChainState) moved on,
in one launch with no host sync (safe to capture in a CUDA graph); greedy_verify_ref beside it."""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

from speculative.chain_state import ChainState

triton = tl = row_argmax = None  # bound by _kernel(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step of each row's program


@functools.cache
def _kernel():
    global triton, tl, row_argmax  # module globals: the kernel below calls row_argmax by name
    import triton
    import triton.language as tl

    from engine.kernels.pick import argmax_helpers

    row_argmax = argmax_helpers()[1]

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

    return greedy_verify_kernel


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
    _kernel()[(rows,)](
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
    has = j < m
    row = k + 1 + j.clamp(max=m - 1)  # the hit's verify row (any row when none)
    nxt = torch.where(has, choice.index_select(0, row.view(1))[0], nxt)
    chain.advance_alternative(a, nxt, has, row)
