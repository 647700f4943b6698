"""A greedy tree step's prompt-lookup chain in one launch (no host sync: safe to capture in a CUDA
graph):

    tree_lookup(history, verify, n, length, last) -> VerifyRows

speculative/tree/lookup.py's record_step, lookup_proposal and merge_lookup (some hundreds of small
torch ops for a chain of 8) as one program: it writes the step before's accepted tokens into the
conversation's, scans those for the latest earlier occurrence of the context's last 4 (else 3,
else 2: GRAMS) tokens, ranks the kept nodes by score, walks the proposal down the tree once, keeps the
most best-ranked nodes that leave room for the chain's new tokens, gives those the rows of the
lowest-scored nodes, and writes the rows in depth order with their ids, positions and slot map, as
tree_select writes them (a slot map's entries from a row's own depth on are 0). The same rows as
the torch ops, which are its reference in the tests. Four warps: its node-by-node matrices (ranks,
depth order, the slot map's ancestors) are a few hundred to a thousand entries, and one warp alone
runs their dependent reductions back to back without hiding their latency (2-4x as long).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args
from speculative.kernels.tree_level import VerifyRows
from speculative.tree.lookup import GRAMS

# the kernel scans matches of GMIN .. GMAX tokens, the longest found first
_GMIN, _GMAX = min(GRAMS), max(GRAMS)
assert sorted(GRAMS) == list(range(_GMIN, _GMAX + 1)) and 1 <= _GMIN and _GMAX <= 4, "grams of 1 to 4, no gaps"

triton = tl = _pick = None  # bound by _kernel(): the kernel reads them by name
_BLOCK = 1024  # history positions scanned a loop step


@functools.cache
def _kernel():
    global triton, tl, _pick  # module globals: the kernel calls the helper by name
    import triton
    import triton.language as tl

    @triton.jit
    def pick(vec, lanes, at):
        """Element `at` (a scalar or a vector of lanes) of the register vector `vec`."""
        return tl.sum(tl.where(lanes[None, :] == at[:, None], vec[None, :], 0), axis=1)

    _pick = pick

    @triton.jit
    def tree_lookup_kernel(hist_ptr, H, n_ptr, last_ptr, tokens_ptr, parents_ptr, depths_ptr, scores_ptr, ids_ptr,
                           out_tokens_ptr, out_parents_ptr, out_depths_ptr, out_scores_ptr, out_ids_ptr, pos_ptr,
                           slots_ptr, map_ptr, base_ptr, N: tl.constexpr, NP: tl.constexpr, L: tl.constexpr,
                           LP: tl.constexpr, GMIN: tl.constexpr, GMAX: tl.constexpr, MP: tl.constexpr,
                           R: tl.constexpr, RP: tl.constexpr, D: tl.constexpr, W: tl.constexpr, WP: tl.constexpr,
                           BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        n = tl.load(n_ptr)
        # the step before's accepted tokens and the root (its next token) at n - a .. n
        a = tl.load(last_ptr)
        w = tl.arange(0, RP)
        recent = tl.load(last_ptr + 2 + w, mask=w < tl.minimum(a, R - 1), other=0)
        recent = tl.where(w < a, recent, tl.load(last_ptr + 1))
        tl.store(hist_ptr + n - a + w, recent, mask=w < R)
        tl.debug_barrier()  # the scan below reads them from other lanes
        # the proposal: the latest start p of the context's last g tokens before their own place
        # (the grams GMIN .. GMAX, at most 4: speculative/tree/lookup.py's GRAMS)
        last1 = tl.load(hist_ptr + n)
        last2 = tl.load(hist_ptr + tl.maximum(n - 1, 0))
        last3 = tl.load(hist_ptr + tl.maximum(n - 2, 0))
        last4 = tl.load(hist_ptr + tl.maximum(n - 3, 0))
        best1 = tl.full([], -1, tl.int64)
        best2 = tl.full([], -1, tl.int64)
        best3 = tl.full([], -1, tl.int64)
        best4 = tl.full([], -1, tl.int64)
        for p0 in range(0, n, BLOCK):
            p = p0 + tl.arange(0, BLOCK).to(tl.int64)
            h0 = tl.load(hist_ptr + p, mask=p < n, other=-1)
            h1 = tl.load(hist_ptr + p + 1, mask=p + 1 < n, other=-1)
            m1 = (p <= n - 1) & (h0 == last1)
            m2 = (p <= n - 2) & (n >= 2) & (h0 == last2) & (h1 == last1)
            best1 = tl.maximum(best1, tl.max(tl.where(m1, p, -1), axis=0))
            best2 = tl.maximum(best2, tl.max(tl.where(m2, p, -1), axis=0))
            if GMAX >= 3:
                h2 = tl.load(hist_ptr + p + 2, mask=p + 2 < n, other=-1)
                m3 = (p <= n - 3) & (n >= 3) & (h0 == last3) & (h1 == last2) & (h2 == last1)
                best3 = tl.maximum(best3, tl.max(tl.where(m3, p, -1), axis=0))
                if GMAX >= 4:
                    h3 = tl.load(hist_ptr + p + 3, mask=p + 3 < n, other=-1)
                    m4 = (p <= n - 4) & (n >= 4) & (h0 == last4) & (h1 == last3) & (h2 == last2) & (h3 == last1)
                    best4 = tl.maximum(best4, tl.max(tl.where(m4, p, -1), axis=0))
        # the longest gram found wins
        j = tl.full([], -1, tl.int64)
        g = tl.full([], 0, tl.int64)
        if GMIN <= 1:
            j, g = tl.where(best1 >= 0, best1, j), tl.where(best1 >= 0, 1, g)
        if GMIN <= 2:
            j, g = tl.where(best2 >= 0, best2, j), tl.where(best2 >= 0, 2, g)
        if GMIN <= 3 and GMAX >= 3:
            j, g = tl.where(best3 >= 0, best3, j), tl.where(best3 >= 0, 3, g)
        if GMAX >= 4:
            j, g = tl.where(best4 >= 0, best4, j), tl.where(best4 >= 0, 4, g)
        start = j + g
        count = tl.where(j >= 0, tl.minimum(tl.maximum(n - start + 1, 0), L), 0).to(tl.int32)
        lt = tl.arange(0, LP)
        prop = tl.load(hist_ptr + tl.minimum(tl.maximum(start + lt, 0), H - 1), mask=lt < count, other=-1)

        # the kept nodes, ranked by score (ties: the earlier row)
        i = tl.arange(0, NP)
        live = i < N
        s = tl.load(scores_ptr + i, mask=live, other=float("-inf"))
        tok = tl.load(tokens_ptr + i, mask=live, other=-1)
        par = tl.load(parents_ptr + i, mask=live, other=-2)
        dep = tl.load(depths_ptr + i, mask=live, other=0)
        ids = tl.load(ids_ptr + 1 + i, mask=live, other=-1)
        first = (s[None, :] > s[:, None]) | ((s[None, :] == s[:, None]) & (i[None, :] < i[:, None]))
        rank = tl.sum((live[None, :] & first).to(tl.int32), axis=1)

        # The chain's path through the whole tree (siblings are distinct tokens: one child at
        # most), each of its nodes with the worst rank on the path down to it: keeping the best m
        # nodes keeps the path's first t nodes while that rank is under m.
        path = tl.full([LP], -1, tl.int64)
        worst = tl.full([LP], 2 * NP, tl.int32)  # past the path: never kept
        at = tl.full([], -1, tl.int64)
        worst_so_far = tl.full([], -1, tl.int32)
        walking = tl.full([], 1, tl.int1)
        for t in tl.static_range(L):
            child = live & (par == at) & (ids == tl.sum(tl.where(lt == t, prop, 0), axis=0))
            hit = walking & (tl.max(child.to(tl.int32), axis=0) > 0) & (t < count)
            node = tl.min(tl.where(child, i, NP), axis=0).to(tl.int64)
            worst_so_far = tl.maximum(worst_so_far, tl.max(tl.where(i == node, rank, -1), axis=0))
            path = tl.where(hit & (lt == t), node, path)
            worst = tl.where(hit & (lt == t), worst_so_far, worst)
            at = tl.where(hit, node, at)
            walking = hit
        # keep the most nodes m that leave room for the chain's new ones: m + count - shared(m) <= N
        # (speculative/tree/lookup.py's loop reaches the same m: the largest that holds)
        mm = tl.arange(0, MP)
        shared_of = tl.sum((worst[None, :] < mm[:, None]).to(tl.int32), axis=1)
        m = tl.max(tl.where((mm <= N) & (mm + count - shared_of <= N), mm, -1), axis=0)
        shared = tl.sum((worst < m).to(tl.int32), axis=0)
        at = tl.where(shared > 0, tl.sum(tl.where(lt == shared - 1, path, 0), axis=0), -1)
        dropped = live & (rank >= m)
        k = tl.cumsum(dropped.to(tl.int32), axis=0) - 1  # a dropped row's place in the chain's tail
        t_of = tl.minimum(tl.maximum(shared + k, 0), L - 1)
        new_ids = tl.where(dropped, _pick(prop, lt, t_of), ids)
        pred = tl.sum(tl.where(dropped[None, :] & (k[None, :] == k[:, None] - 1), i[None, :], 0), axis=1)
        new_par = tl.where(dropped, tl.where(k == 0, at, pred.to(tl.int64)), par)
        new_dep = tl.where(dropped, (t_of + 1).to(tl.int64), dep)
        new_tok = tl.where(dropped, -1, tok)

        # depth order, rows of one depth as they were
        before = live[None, :] & ((new_dep[None, :] < new_dep[:, None])
                                  | ((new_dep[None, :] == new_dep[:, None]) & (i[None, :] < i[:, None])))
        pos = tl.sum(before.to(tl.int32), axis=1)
        up_pos = _pick(pos, i, tl.maximum(new_par, 0))
        tl.store(out_tokens_ptr + pos, new_tok, mask=live)
        tl.store(out_parents_ptr + pos, tl.where(new_par >= 0, up_pos.to(tl.int64), -1), mask=live)
        tl.store(out_depths_ptr + pos, new_dep, mask=live)
        tl.store(out_scores_ptr + pos, s, mask=live)
        tl.store(out_ids_ptr + 1 + pos, new_ids, mask=live)
        tl.store(pos_ptr + 1 + pos, n + new_dep, mask=live)
        # the slot map: entry e of a row the cache row of its ancestor at depth e (0: the root, row
        # n; node at row r, n + 1 + r), entries from its own depth on 0
        col = tl.arange(0, WP)
        rows_map = tl.where((col[None, :] == 0) & live[:, None], (n + tl.zeros([NP, WP], tl.int64)).to(tl.int32), 0)
        cur = new_par
        for step in tl.static_range(D - 1):
            at_depth = new_dep - 1 - step  # the depth of `cur`, where it is a node
            real = live & (at_depth >= 1) & (cur >= 0)
            row = n + 1 + _pick(pos, i, tl.maximum(cur, 0))
            rows_map = tl.where((col[None, :] == at_depth[:, None]) & real[:, None], row.to(tl.int32)[:, None],
                                rows_map)
            cur = tl.where(real, _pick(new_par, i, tl.maximum(cur, 0)), -1)
        tl.store(map_ptr + (1 + pos)[:, None] * W + col[None, :], rows_map, mask=live[:, None] & (col[None, :] < W))
        # row 0, the root
        tl.store(map_ptr + col, tl.where(col == 0, n, 0).to(tl.int32), mask=col < W)
        tl.store(out_ids_ptr, tl.load(ids_ptr))
        tl.store(pos_ptr, n)
        r = tl.arange(0, 2 * NP)
        tl.store(slots_ptr + r, n + r, mask=r < N + 1)
        tl.store(base_ptr + r, (n + tl.zeros([2 * NP], tl.int64)).to(tl.int32), mask=r < N + 1)

    return tree_lookup_kernel


def tree_lookup(history: torch.Tensor, verify: VerifyRows, n: torch.Tensor, length: int, last: torch.Tensor,
                width: int | None = None, pdl: bool = True, num_warps: int = 4) -> VerifyRows:
    """speculative/tree/lookup.py's record_step(history, last, n) and then
    merge_lookup(verify, *lookup_proposal(history, n, length), n) in one launch: history (H,) int64
    the conversation's tokens (valid to n, the root's position, once the step before's are
    written), verify tree_select's rows (with a slot map), last the step before's result
    [a, next token, path...]; width the slot map's entries a row (the walk's depth + 1, by
    default verify's: a chain may go deeper than the tree). CUDA (or the Triton interpreter); no
    host sync. num_warps: the program's (benchmarks/tree_lookup_launch.py times the others)."""
    N, W = verify.parents.shape[0], width or verify.slot_map.shape[1]
    assert W >= verify.slot_map.shape[1], "a slot map no narrower than the tree's"
    assert 1 <= length <= N and length <= W - 1, "a chain no longer than the tree's nodes and depth"
    dev = verify.parents.device
    long = dict(dtype=torch.int64, device=dev)
    out = VerifyRows(tokens=torch.empty(N, **long), parents=torch.empty(N, **long), depths=torch.empty(N, **long),
                     scores=torch.empty(N, dtype=verify.scores.dtype, device=dev), ids=torch.empty(N + 1, **long),
                     positions=torch.empty(N + 1, **long), slots=torch.empty(N + 1, **long),
                     slot_map=torch.empty(N + 1, W, dtype=torch.int32, device=dev),
                     map_base=torch.empty(N + 1, dtype=torch.int32, device=dev))
    R = last.shape[0] - 1  # the positions a step's record writes: its path's and the next token's
    _kernel()[(1,)](history, history.shape[0], n, last, verify.tokens, verify.parents, verify.depths, verify.scores,
                    verify.ids, out.tokens, out.parents, out.depths, out.scores, out.ids, out.positions, out.slots,
                    out.slot_map, out.map_base, N=N, NP=next_pow2(N), L=length, LP=next_pow2(length), GMIN=_GMIN,
                    GMAX=_GMAX, MP=next_pow2(N + 1), R=R, RP=next_pow2(R), D=W - 1, W=W, WP=next_pow2(W), BLOCK=_BLOCK,
                    num_warps=num_warps, **pdl_args(dev, pdl))
    return out
