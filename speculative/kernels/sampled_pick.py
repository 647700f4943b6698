"""Speculative sampling's device work in a few launches with no host sync (safe to capture in a
CUDA graph), for sampling with temperature alone (the cuts' sorting pass stays in torch ops):

    draft_sample(logits, temperature, e, offsets, q_out, tok_out)
        q = softmax(logits / T) over the draft's vocabulary, into q_out; the draw
        j = argmax(q / e) (e: Exp(1) variates, an exponential race: a draw from q), mapped to
        the target's ids (j + offsets[j]) into tok_out. One launch per draft token, in place of
        a softmax, a scatter into the target's vocabulary, a division, an argmax and a copy.
    sampled_accept(logits, temperature, drafts, q, to_draft, u, e, out)
        the acceptance of k drafted tokens against the target's (k + 1, V) logits: d_i kept
        while u_i * q_i(d_i) < p_i(d_i), p = softmax(logits / T); at the first rejection (row a)
        the next token drawn from max(0, p_a - q_a) (the target's row a where that is all zero
        or all k were kept) by the race argmax(r / e). out = [a, next token]. Two launches
        (the rows' softmax statistics in parts; the acceptance, each part scanning a slice of
        row a, the last one to finish combining them) in place of some twenty.

With runners-up (SampledIteration's option), draft_sample also writes the race's second place (a
draw from q without the first) and sampled_accept gives a refused draft's runner-up a second round
against the residual (sampled_accept_ref says the rule): one more launch, for the residual's total.

q holds each draft distribution over the draft's vocabulary (k, Dv); to_draft (V,) maps a
target id to its draft id (-1: none). The rule is verify.rejection_accept's with its random
numbers given: lossless. The *_ref functions compute the same in torch ops (the CPU's path, the
cuts' path with their probabilities, and the tests' reference).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = _row_norm = _span_softmax = _accepted = _p_and_q = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # values per loop step
_PARTS = 8  # programs over each target row


@functools.cache
def _kernels():
    global triton, tl, _row_norm, _span_softmax, _accepted, _p_and_q  # module globals: the kernels below call these by name
    import triton
    import triton.language as tl

    @triton.jit
    def _span_softmax(base, start, end, inv_t, BLOCK: tl.constexpr):
        """(max, sum of exp(x - max)) of x = base[start:end] * inv_t: a running maximum and sum
        lane by lane, then across the lanes."""
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for v0 in range(start, end, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < end, other=float("-inf")).to(tl.float32) * inv_t
            m_new = tl.maximum(m, x)
            s = s * tl.exp(tl.where(m_new == float("-inf"), 0.0, m - m_new)) \
                + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
            m = m_new
        top = tl.max(m, axis=0)
        return top, tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - top)), axis=0)

    @triton.jit
    def draft_sample_kernel(logits_ptr, temp_ptr, e_ptr, offsets_ptr, q_ptr, tok_ptr, alt_ptr, vocab,
                            BLOCK: tl.constexpr, ALT: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        inv_t = 1.0 / tl.load(temp_ptr)
        top, total = _span_softmax(logits_ptr, 0, vocab, inv_t, BLOCK)  # pass 1
        # pass 2: the probabilities, and the race's winner (ties: the lowest index)
        best = tl.full([BLOCK], -1.0, tl.float32)
        best_i = tl.zeros([BLOCK], tl.int32)
        second = tl.full([BLOCK], -1.0, tl.float32)  # ALT: each lane's runner-up (ties: the earlier)
        second_i = tl.zeros([BLOCK], tl.int32)
        for v0 in range(0, vocab, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            ok = offs < vocab
            x = tl.load(logits_ptr + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t
            q = tl.exp(x - top) / total
            tl.store(q_ptr + offs, q, mask=ok)
            score = tl.where(ok, q / tl.load(e_ptr + offs, mask=ok, other=1.0), -1.0)
            better = score > best
            if ALT:
                runner = ~better & (score > second)
                second = tl.where(better, best, tl.where(runner, score, second))
                second_i = tl.where(better, best_i, tl.where(runner, offs, second_i))
            best = tl.where(better, score, best)
            best_i = tl.where(better, offs, best_i)
        win = tl.max(best, axis=0)
        j = tl.min(tl.where(best == win, best_i, vocab), axis=0)
        tok = j + tl.load(offsets_ptr + j)
        tl.store(tok_ptr, tok.to(tok_ptr.dtype.element_ty))
        if ALT:  # the race's second place: a draw from q without the winner
            alt_score = tl.where(best_i == j, second, best)
            alt_i = tl.where(best_i == j, second_i, best_i)
            top2 = tl.max(alt_score, axis=0)
            j2 = tl.min(tl.where(alt_score == top2, alt_i, vocab), axis=0)
            tl.store(alt_ptr, (j2 + tl.load(offsets_ptr + j2)).to(alt_ptr.dtype.element_ty))

    @triton.jit
    def row_stats_kernel(logits_ptr, temp_ptr, stats_ptr, vocab, stride, CHUNK: tl.constexpr,
                         BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        """(max, sum of exp(x - max)) of logits / T over one part of one row, into stats."""
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row, part = tl.program_id(0), tl.program_id(1)
        inv_t = 1.0 / tl.load(temp_ptr)
        top, total = _span_softmax(logits_ptr + row * stride, part * CHUNK, tl.minimum(part * CHUNK + CHUNK, vocab),
                                   inv_t, BLOCK)
        out = stats_ptr + (row * tl.num_programs(1) + part) * 2
        tl.store(out, top)
        tl.store(out + 1, total)

    @triton.jit
    def _row_norm(stats_ptr, row, PARTS: tl.constexpr):
        """The row's (max, sum of exp(x - max)) from its parts', in part order."""
        lane = tl.arange(0, PARTS)
        tops = tl.load(stats_ptr + (row * PARTS + lane) * 2)
        sums = tl.load(stats_ptr + (row * PARTS + lane) * 2 + 1)
        top = tl.max(tops, axis=0)
        return top, tl.sum(sums * tl.exp(tops - top), axis=0)

    @triton.jit
    def _accepted(logits_ptr, stats_ptr, drafts_ptr, q_ptr, to_draft_ptr, u_ptr, inv_t, draft_vocab, stride,
                  K: tl.constexpr, PARTS: tl.constexpr):
        """(a, q_a(d_(a+1))): the drafts kept before the first rejection, and the rejected
        draft's own draft probability (0 when all K were kept). Every program finds them itself
        (K gathers): no wait on another program."""
        a = 0
        alive = 1
        q_rej = 0.0
        for i in tl.static_range(K):
            d = tl.load(drafts_ptr + i)
            top, total = _row_norm(stats_ptr, i, PARTS)
            p = tl.exp(tl.load(logits_ptr + i * stride + d).to(tl.float32) * inv_t - top) / total
            j = tl.load(to_draft_ptr + d)
            q = tl.where(j >= 0, tl.load(q_ptr + i * draft_vocab + tl.maximum(j, 0)), 0.0)
            keep = (tl.load(u_ptr + i) * q < p).to(tl.int32)
            q_rej = tl.where((alive == 1) & (keep == 0), q, q_rej)
            alive = alive * keep
            a += alive
        return a, q_rej

    @triton.jit
    def _p_and_q(base, q_row, to_draft_ptr, offs, ok, inv_t, top, total, use_q):
        """p over one block of a target row (top, total: the row's softmax statistics) and the
        draft's q at the same target ids (0 outside the draft's vocabulary, or without use_q)."""
        pv = tl.exp(tl.load(base + offs, mask=ok, other=float("-inf")).to(tl.float32) * inv_t - top) / total
        jv = tl.load(to_draft_ptr + offs, mask=ok, other=-1)
        qv = tl.load(q_row + tl.maximum(jv, 0), mask=ok & (jv >= 0) & use_q, other=0.0)
        return pv, qv

    @triton.jit
    def residual_mass_kernel(logits_ptr, temp_ptr, stats_ptr, drafts_ptr, q_ptr, to_draft_ptr, u_ptr, mass_ptr,
                             vocab, draft_vocab, stride, K: tl.constexpr, PARTS: tl.constexpr, CHUNK: tl.constexpr,
                             BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        """With runners-up: one part of sum(max(0, p_a - q_a)) over row a, the rejected row (the
        runner-up's test needs the residual's total before any part can draw)."""
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        part = tl.program_id(0)
        inv_t = 1.0 / tl.load(temp_ptr)
        a, q_rej = _accepted(logits_ptr, stats_ptr, drafts_ptr, q_ptr, to_draft_ptr, u_ptr, inv_t, draft_vocab,
                             stride, K, PARTS)
        top, total = _row_norm(stats_ptr, a, PARTS)
        has_q = a < K
        base = logits_ptr + a * stride
        mass = tl.zeros([BLOCK], tl.float32)
        end = tl.minimum(part * CHUNK + CHUNK, vocab)
        for v0 in range(part * CHUNK, end, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            ok = offs < end
            pv, qv = _p_and_q(base, q_ptr + a * draft_vocab, to_draft_ptr, offs, ok, inv_t, top, total, has_q)
            mass += tl.where(ok, tl.maximum(pv - qv, 0.0), 0.0)
        tl.store(mass_ptr + part, tl.sum(mass, axis=0))

    @triton.jit
    def accept_kernel(logits_ptr, temp_ptr, stats_ptr, drafts_ptr, q_ptr, to_draft_ptr, u_ptr, e_ptr,
                      part_ptr, count_ptr, out_ptr, alt_ptr, u_alt_ptr, mass_ptr, vocab, draft_vocab, stride,
                      ids_ptr, n_ptr, result_ptr, window_ptr, draft_pos_ptr, last_pos,
                      K: tl.constexpr, PARTS: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                      ALT: tl.constexpr, CHAIN: tl.constexpr, KP: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        part = tl.program_id(0)
        inv_t = 1.0 / tl.load(temp_ptr)
        a, q_rej = _accepted(logits_ptr, stats_ptr, drafts_ptr, q_ptr, to_draft_ptr, u_ptr, inv_t, draft_vocab,
                             stride, K, PARTS)
        has_q = a < K
        row = a
        took = a < 0  # False, as a tensor
        tried = a < 0
        scale = 1.0 - q_rej  # q without the rejected draft is q / scale
        s0 = 0.0
        if ALT:
            # The rejected draft's runner-up c (drawn from q without the draft) is kept with
            # probability min(1, r(c) / q'(c)): r = max(0, p_a - q_a) / s0, q' = q_a / scale.
            top, total = _row_norm(stats_ptr, a, PARTS)
            s0 = tl.sum(tl.load(mass_ptr + tl.arange(0, PARTS)), axis=0)  # in part order
            a_c = tl.minimum(a, K - 1)
            c = tl.load(alt_ptr + a_c)
            pc = tl.exp(tl.load(logits_ptr + a * stride + c).to(tl.float32) * inv_t - top) / total
            jc = tl.load(to_draft_ptr + c)
            qc = tl.where((jc >= 0) & has_q, tl.load(q_ptr + a_c * draft_vocab + tl.maximum(jc, 0)), 0.0)
            rc = tl.maximum(pc - qc, 0.0)
            tried = has_q & (qc > 0.0) & (scale > 0.0) & (s0 > 0.0)
            took = tried & (tl.load(u_alt_ptr + a_c) * qc * s0 < rc * scale)
            row = tl.where(took, K + 1 + a_c, a)  # kept: the next token comes from the runner-up's row
        top, total = _row_norm(stats_ptr, row, PARTS)
        use_q = has_q & ~took
        base = logits_ptr + row * stride
        best_r = tl.full([BLOCK], -1.0, tl.float32)
        best_p = tl.full([BLOCK], -1.0, tl.float32)
        idx_r = tl.zeros([BLOCK], tl.int32)
        idx_p = tl.zeros([BLOCK], tl.int32)
        mass = tl.zeros([BLOCK], tl.float32)
        end = tl.minimum(part * CHUNK + CHUNK, vocab)
        for v0 in range(part * CHUNK, end, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            ok = offs < end
            pv, qv = _p_and_q(base, q_ptr + a * draft_vocab, to_draft_ptr, offs, ok, inv_t, top, total, use_q)
            r = tl.maximum(pv - qv, 0.0)
            if ALT:  # the runner-up refused too: what remains of r after q', scaled by s0 * scale
                r = tl.where(tried & ~took, tl.maximum(r * scale - qv * s0, 0.0), r)
            mass += tl.where(ok, r, 0.0)
            ev = tl.load(e_ptr + offs, mask=ok, other=1.0)
            sr = tl.where(ok, r / ev, -1.0)
            sp = tl.where(ok, pv / ev, -1.0)
            better = sr > best_r
            best_r, idx_r = tl.where(better, sr, best_r), tl.where(better, offs, idx_r)
            better = sp > best_p
            best_p, idx_p = tl.where(better, sp, best_p), tl.where(better, offs, idx_p)
        win_r = tl.max(best_r, axis=0)
        win_p = tl.max(best_p, axis=0)
        slot = part_ptr + part * 5
        tl.store(slot, tl.sum(mass, axis=0))
        tl.store(slot + 1, win_r)
        tl.store(slot + 2, tl.min(tl.where(best_r == win_r, idx_r, vocab), axis=0).to(tl.float32))
        tl.store(slot + 3, win_p)
        tl.store(slot + 4, tl.min(tl.where(best_p == win_p, idx_p, vocab), axis=0).to(tl.float32))
        tl.debug_barrier()  # the part is written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == PARTS - 1:  # the last part to finish: the parts' winners, in part order
            tl.debug_barrier()
            lane = tl.arange(0, PARTS)
            parts = part_ptr + lane * 5
            total_mass = tl.sum(tl.load(parts, cache_modifier=".cg"), axis=0)
            vr = tl.load(parts + 1, cache_modifier=".cg")
            ir = tl.load(parts + 2, cache_modifier=".cg").to(tl.int32)
            vp = tl.load(parts + 3, cache_modifier=".cg")
            ip = tl.load(parts + 4, cache_modifier=".cg").to(tl.int32)
            next_r = tl.min(tl.where(vr == tl.max(vr, axis=0), ir, vocab), axis=0)
            next_p = tl.min(tl.where(vp == tl.max(vp, axis=0), ip, vocab), axis=0)
            ty = out_ptr.dtype.element_ty
            accepted = a + took.to(a.dtype)
            nxt = tl.where(total_mass > 0, next_r, next_p)
            tl.store(out_ptr, accepted.to(ty))
            tl.store(out_ptr + 1, nxt.to(ty))
            if ALT:
                tl.store(out_ptr + 2, took.to(ty))
            if CHAIN:
                # ChainState.advance's writes (its torch ops are a dozen launches in the graph):
                # result [a, next, d_1..d_k], the extend window (the accepted drafts, then the next
                # token), n += a + 1, the bonus, and where the next chain's draft steps write
                k1 = tl.arange(0, KP)
                is_draft = k1 < K
                d = tl.load(ids_ptr + 1 + k1, mask=is_draft, other=0)
                rt = result_ptr.dtype.element_ty
                tl.store(result_ptr + k1, tl.where(k1 == 0, accepted, nxt).to(rt), mask=k1 < 2)
                tl.store(result_ptr + 2 + k1, d, mask=is_draft)
                tl.store(window_ptr + k1, tl.where(k1 < accepted, d, nxt).to(rt), mask=k1 < K + 1)
                n = tl.load(n_ptr) + accepted + 1
                tl.store(n_ptr, n)
                tl.store(ids_ptr, nxt.to(rt))
                tl.store(draft_pos_ptr + k1, tl.minimum(n + k1, last_pos), mask=k1 < K + 1)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return draft_sample_kernel, row_stats_kernel, accept_kernel, residual_mass_kernel


@functools.cache
def _scratch(device: torch.device, rows: int) -> tuple[torch.Tensor, ...]:
    # (rows' statistics by part, the parts' winners, the counter, the residual's mass by part):
    # zeroed once; each launch leaves the counter at zero again. One set per device and row
    # count: the launches that share it run one after another on one stream.
    return (torch.zeros(rows, _PARTS, 2, dtype=torch.float32, device=device),
            torch.zeros(_PARTS, 5, dtype=torch.float32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device),
            torch.zeros(_PARTS, dtype=torch.float32, device=device))


def draft_sample(logits: torch.Tensor, temperature: torch.Tensor, e: torch.Tensor, offsets: torch.Tensor,
                 q_out: torch.Tensor, tok_out: torch.Tensor, alt_out: torch.Tensor | None = None,
                 pdl: bool = True) -> torch.Tensor:
    """logits (Dv,) or (1, Dv), fp32 or the lean draft's bf16 (read as float32: the same values
    as an fp32 copy), temperature () fp32 > 0, e (Dv,) Exp(1) variates, offsets
    (Dv,) draft id -> target id - draft id; q_out (Dv,) fp32 gets softmax(logits / T), tok_out (a
    1-element view) the drawn token's target id, alt_out (a 1-element view, optional) the race's
    second place: a draw from q without tok_out's token. Returns tok_out. CUDA (or the Triton
    interpreter); no host sync."""
    logits = logits.reshape(-1)
    vocab = logits.shape[0]
    assert logits.stride(0) == 1 and e.shape == (vocab,) and offsets.shape == (vocab,) and q_out.shape == (vocab,)
    assert q_out.is_contiguous() and q_out.dtype == torch.float32 and tok_out.numel() == 1
    assert alt_out is None or alt_out.numel() == 1
    _kernels()[0][(1,)](logits, temperature, e, offsets, q_out, tok_out, tok_out if alt_out is None else alt_out,
                        vocab, BLOCK=_BLOCK, ALT=alt_out is not None, num_warps=8, **pdl_args(logits.device, pdl))
    return tok_out


def draft_sample_ref(logits, temperature, e, offsets, q_out, tok_out, alt_out=None) -> torch.Tensor:
    """Reference and CPU path (and, with the cuts' probabilities as q, the cuts' draw: see
    draw_from)."""
    q_out.copy_(torch.softmax(logits.reshape(-1).float() / temperature, dim=-1))
    return draw_from(q_out, e, offsets, tok_out, alt_out)


def draw_from(q: torch.Tensor, e: torch.Tensor, offsets: torch.Tensor, tok_out: torch.Tensor,
              alt_out: torch.Tensor | None = None) -> torch.Tensor:
    """The race argmax(q / e) over the draft's vocabulary, as a target id, into tok_out; with
    alt_out, the race's second place too (ties: the lowest index, as the kernel)."""
    score = q / e
    j = score.argmax().view(1)
    tok_out.view(1).copy_(j + offsets.index_select(0, j))
    if alt_out is not None:
        j2 = score.index_fill(0, j, -1.0).argmax().view(1)
        alt_out.view(1).copy_(j2 + offsets.index_select(0, j2))
    return tok_out


def sampled_accept(logits: torch.Tensor, temperature: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor,
                   to_draft: torch.Tensor, u: torch.Tensor, e: torch.Tensor, out: torch.Tensor,
                   alts: torch.Tensor | None = None, u_alt: torch.Tensor | None = None,
                   pdl: bool = True, chain=None) -> torch.Tensor:
    """logits (k + 1, V) fp32 (last dim contiguous), temperature () fp32, drafts (k,) target ids,
    q (k, Dv) fp32 the draft distributions, to_draft (V,) int32, u (k,) uniforms, e (V,) Exp(1)
    variates; out (2,) int64 gets [accepted, next token]. Returns out. CUDA (or the Triton
    interpreter); no host sync.

    chain (a ChainState whose ids[1:k + 1] are the drafts; no runners-up): the same launch also
    moves it on as ChainState.advance(out[0], out[1]) does, bit for bit.

    With runners-up: alts (k,) the runner-up of each draft (drawn from its q without the draft),
    logits (2k + 1, V) with row k + 1 + i the target's after runner-up i in place of draft i + 1,
    u_alt (k,) uniforms; out (3,) gets [accepted, next token, whether the last accepted token is
    the runner-up of draft `accepted`] (sampled_accept_ref's rule)."""
    rows, vocab = logits.shape
    k = drafts.shape[0]
    alt = alts is not None
    assert rows == (2 * k + 1 if alt else k + 1), (rows, k)
    assert logits.stride(1) == 1 and q.shape[0] == k and q.is_contiguous()
    assert to_draft.shape == (vocab,) and u.shape == (k,) and e.shape == (vocab,) and out.numel() == (3 if alt else 2)
    assert not alt or (alts.shape == (k,) and u_alt.shape == (k,))
    stats, parts, counter, mass = _scratch(logits.device, rows)
    chunk = -(-vocab // _PARTS)
    pdl_kw = pdl_args(logits.device, pdl)
    kernels = _kernels()
    block = min(_BLOCK, next_pow2(chunk))
    kernels[1][(rows, _PARTS)](logits, temperature, stats, vocab, logits.stride(0), CHUNK=chunk,
                               BLOCK=block, num_warps=4, **pdl_kw)
    if alt:
        kernels[3][(_PARTS,)](logits, temperature, stats, drafts, q, to_draft, u, mass, vocab, q.shape[1],
                              logits.stride(0), K=k, PARTS=_PARTS, CHUNK=chunk, BLOCK=block, num_warps=4, **pdl_kw)
    if chain is not None:
        assert not alt and chain.k == k and not chain.num_alts
        assert drafts.data_ptr() == chain.ids[1:].data_ptr(), "the drafts must be the chain's own"
        moves = (chain.ids, chain.n, chain.result, chain.window, chain.draft_pos, chain.last_pos)
    else:
        moves = (out, out, out, out, out, 0)
    kernels[2][(_PARTS,)](logits, temperature, stats, drafts, q, to_draft, u, e, parts, counter, out,
                          alts if alt else drafts, u_alt if alt else u, mass, vocab, q.shape[1], logits.stride(0),
                          *moves, K=k, PARTS=_PARTS, CHUNK=chunk, BLOCK=block, ALT=alt, CHAIN=chain is not None,
                          KP=next_pow2(k + 1), num_warps=4, **pdl_kw)
    return out


def sampled_accept_ref(p: torch.Tensor, drafts: torch.Tensor, q: torch.Tensor, to_draft: torch.Tensor,
                       targets: torch.Tensor, u: torch.Tensor, e: torch.Tensor, out: torch.Tensor,
                       alts: torch.Tensor | None = None, u_alt: torch.Tensor | None = None) -> torch.Tensor:
    """The same rule in torch ops, on the target's probabilities p (k + 1, V) (after any cuts;
    (2k + 1, V) with runners-up): targets (Dv,) the draft ids' target ids (to_draft's inverse).
    Graph-safe (no host sync).

    Runners-up (alts, u_alt; sampling without replacement, then recursive rejection): where draft
    a + 1 was refused at row a, its runner-up c, drawn from q' = q_a without that draft
    (q_a / scale, scale = 1 - q_a(d)), is kept with probability min(1, r(c) / q'(c)), r the
    residual max(0, p_a - q_a) normalized. Kept, the next token is drawn from p at c's own row;
    refused, from max(0, r - q'). Each step's token still has p_a's distribution: the residual
    after a refused draft is the distribution the rest must have, and a second rejection-sampling
    round against it, from any proposal, keeps it."""
    k = drafts.shape[0]
    rows = torch.arange(k, device=drafts.device)
    j = to_draft.index_select(0, drafts).long()
    q_at = torch.where(j >= 0, q[rows, j.clamp_min(0)], torch.zeros((), dtype=q.dtype, device=q.device))
    keep = (u * q_at < p[rows, drafts]).to(torch.int64)
    accepted = keep.cumprod(0).sum().view(1)
    target = p.index_select(0, accepted)[0]
    padded = torch.cat([q, torch.zeros_like(q[:1])], dim=0).index_select(0, accepted)[0]
    q_full = torch.zeros_like(target).index_copy(0, targets, padded)
    residual = (target - q_full).clamp_min(0)
    if alts is None:
        draw = torch.where(residual.sum() > 0, residual, target)
        out[0:1].copy_(accepted)
        out[1:2].copy_((draw / e).argmax().view(1))
        return out
    a_c = accepted.clamp(max=k - 1)
    has_q = accepted < k
    scale = 1.0 - q_at.index_select(0, a_c)  # the refused draft's mass out of q
    s0 = residual.sum()
    c = alts.index_select(0, a_c)
    qc = q_full.index_select(0, c)
    rc = (target.index_select(0, c) - qc).clamp_min(0)
    tried = has_q & (qc > 0) & (scale > 0) & (s0 > 0)
    took = tried & (u_alt.index_select(0, a_c) * qc * s0 < rc * scale)
    row = torch.where(took, k + 1 + a_c, accepted)
    final = p.index_select(0, row)[0]
    r = torch.where(tried & ~took, (residual * scale - q_full * s0).clamp_min(0), residual)
    r = torch.where(took, final, r)
    draw = torch.where(r.sum() > 0, r, final)
    out[0:1].copy_(accepted + took.long())
    out[1:2].copy_((draw / e).argmax().view(1))
    out[2:3].copy_(took.long())
    return out
