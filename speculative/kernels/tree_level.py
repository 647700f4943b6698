"""One level of a draft tree's growth in one launch with no host sync (safe to capture in a CUDA
graph):

    tree_level(logits, frontier, tokens, parents, scores, grown, k, next_frontier)

logits (F, Dv): the draft's logits after each of the F frontier nodes (indices `frontier` into the
candidate buffers; None: the root, F = 1). Each row's top k, ordered by value with ties to the
lower index, becomes that node's children: candidates grown + f * k + j get the draft id, the
parent, and the parent's score plus the child's log-probability (its logit less the row's
logsumexp). The k best of the F * k new candidates by score (ties: the lower index) go to
next_frontier, as candidate indices: the nodes the next level expands.

This is speculative/tree/grow.py's level (a log-softmax, a top-k with its ordering sorts, the
candidates' scores and buffers, the selection's sort: some fifteen launches) as one: F programs,
one a frontier row (a pass for the logsumexp, then k passes each taking the best value after the
one before), the last to finish choosing the next frontier from the scores the others wrote.
Where grow.py takes torch.topk (a vocabulary over its SORT_LIMIT), the order differs only where
the k-th and the next value tie; scores may differ from the torch ops' by a rounding.
tree_level_ref is the same in torch ops (the tests' reference).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step


@functools.cache
def _kernels():
    global triton, tl  # module globals: the kernel reads them by name
    import triton
    import triton.language as tl

    @triton.jit
    def tree_level_kernel(logits_ptr, stride, frontier_ptr, tokens_ptr, parents_ptr, scores_ptr, next_ptr,
                          count_ptr, vocab, grown, K: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr,
                          ROOT: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        f = tl.program_id(0)
        rows = tl.num_programs(0)
        base = logits_ptr + f * stride
        # the row's logsumexp: a running maximum and sum lane by lane, then across the lanes
        m = tl.full([BLOCK], float("-inf"), tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        for v0 in range(0, vocab, BLOCK):
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
            m_new = tl.maximum(m, x)
            s = s * tl.exp(tl.where(m_new == float("-inf"), 0.0, m - m_new)) \
                + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
            m = m_new
        top = tl.max(m, axis=0)
        lse = top + tl.log(tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - top)), axis=0))
        if ROOT:
            parent = -1
            p_score = 0.0
        else:
            parent = tl.load(frontier_ptr + f)
            p_score = tl.load(scores_ptr + parent)
        # the top k in order: pass j takes the best value after pass j - 1's (value, index) in the
        # order "higher value first, then the lower index"
        last_v = tl.full([], float("inf"), tl.float32)
        last_i = tl.full([], -1, tl.int32)
        lane = tl.arange(0, KP)
        vals = tl.full([KP], float("-inf"), tl.float32)
        idxs = tl.zeros([KP], tl.int32)
        for j in tl.static_range(K):
            best = tl.full([BLOCK], float("-inf"), tl.float32)
            best_i = tl.full([BLOCK], vocab, tl.int32)
            for v0 in range(0, vocab, BLOCK):
                offs = v0 + tl.arange(0, BLOCK)
                ok = offs < vocab
                x = tl.load(base + offs, mask=ok, other=float("-inf")).to(tl.float32)
                after = ok & ((x < last_v) | ((x == last_v) & (offs > last_i)))
                # a lane's first eligible value enters even at -inf; later ones only above
                better = after & ((x > best) | (best_i == vocab))
                best = tl.where(better, x, best)
                best_i = tl.where(better, offs, best_i)
            v = tl.max(best, axis=0)
            i = tl.min(tl.where((best == v) & (best_i < vocab), best_i, vocab), axis=0)
            vals = tl.where(lane == j, v, vals)
            idxs = tl.where(lane == j, i, idxs)
            last_v = v
            last_i = i
        out = grown + f * K + lane
        kept = lane < K
        tl.store(tokens_ptr + out, idxs.to(tokens_ptr.dtype.element_ty), mask=kept)
        tl.store(parents_ptr + out, tl.full([KP], 0, tl.int64) + parent, mask=kept)
        tl.store(scores_ptr + out, p_score + (vals - lse), mask=kept)
        tl.debug_barrier()  # the row's candidates are written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == rows - 1:  # the last row to finish: the next frontier from every row's
            tl.debug_barrier()
            c = tl.arange(0, CP)
            width = rows * K
            cand = tl.load(scores_ptr + grown + c, mask=c < width, other=float("-inf"), cache_modifier=".cg")
            # (names of their own: a variable bound before this branch keeps its type in it)
            sel_v = tl.full([], float("inf"), tl.float32)
            sel_i = tl.full([], -1, tl.int32)
            for j in tl.static_range(K):
                after = (c < width) & ((cand < sel_v) | ((cand == sel_v) & (c > sel_i)))
                v_sel = tl.max(tl.where(after, cand, float("-inf")), axis=0)
                i_sel = tl.min(tl.where(after & (cand == v_sel), c, CP), axis=0)
                tl.store(next_ptr + j, (grown + i_sel).to(next_ptr.dtype.element_ty), mask=j < width)
                sel_v = v_sel
                sel_i = i_sel
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return tree_level_kernel


@functools.cache
def _counter(device: torch.device) -> torch.Tensor:
    # zeroed once; each launch leaves it at zero again. The launches that share it run one after
    # another on one stream.
    return torch.zeros(1, dtype=torch.int32, device=device)


def tree_level(logits: torch.Tensor, frontier: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor,
               scores: torch.Tensor, grown: int, k: int, next_frontier: torch.Tensor, pdl: bool = True) -> None:
    """The module's docstring. logits (F, Dv) fp32 or bf16, last dim contiguous; frontier (F,)
    int64 or None (the root: F = 1, parent -1, score 0); tokens, parents (int64) and scores (fp32)
    the candidate buffers, written at grown .. grown + F * k; next_frontier (min(k, F * k),) int64.
    k at most Dv. CUDA (or the Triton interpreter); no host sync."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and 1 <= k <= vocab
    assert (rows == 1) if frontier is None else frontier.shape == (rows,)
    assert scores.dtype == torch.float32 and tokens.dtype == parents.dtype == torch.int64
    assert next_frontier.numel() >= min(k, rows * k)
    _kernels()[(rows,)](logits, logits.stride(0), tokens if frontier is None else frontier, tokens, parents,
                        scores, next_frontier, _counter(logits.device), vocab, grown, K=k, KP=next_pow2(k),
                        CP=next_pow2(rows * k), ROOT=frontier is None, BLOCK=min(_BLOCK, next_pow2(vocab)),
                        num_warps=4, **pdl_args(logits.device, pdl))


def tree_level_ref(logits: torch.Tensor, frontier: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor,
                   scores: torch.Tensor, grown: int, k: int, next_frontier: torch.Tensor) -> None:
    """tree_level in torch ops: a stable sort gives the order (ties to the lower index)."""
    rows = logits.shape[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    order = torch.sort(lp, dim=-1, descending=True, stable=True)
    values, indices = order.values[:, :k], order.indices[:, :k]
    width = rows * k
    p_score = torch.zeros(rows, device=logits.device) if frontier is None else scores.index_select(0, frontier)
    scores[grown:grown + width] = (p_score[:, None] + values).flatten()
    tokens[grown:grown + width] = indices.flatten()
    parents[grown:grown + width] = (torch.full((rows,), -1, dtype=torch.int64, device=logits.device)
                                    if frontier is None else frontier)[:, None].expand(-1, k).flatten()
    best = torch.sort(scores[grown:grown + width], descending=True, stable=True).indices[:min(k, width)]
    next_frontier[:best.shape[0]] = grown + best
