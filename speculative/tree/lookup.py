"""Prompt-lookup tokens in a greedy draft tree's last places.

Answers repeat their own phrases and the prompt's. Before a verify step, `record_step` adds the
step before's accepted tokens to the conversation's, `lookup_proposal` takes the tokens that
followed the latest earlier occurrence of the context's last 4 tokens (else 3, else 2) in the
conversation so far, and `merge_lookup` puts them into the kept tree as a chain:
the chain's first tokens that a path of kept nodes already spells cost nothing, and the rest take
the places of the tree's lowest-scored nodes, so that the step verifies as many rows as before.
The greedy walk then accepts the longer of the tree's paths and the chain. Lookup tokens are the
target's ids, so they may lie outside the draft's vocabulary.

All are tensor operations of fixed shapes over device tensors (no host read), so a captured tree
step runs them. `benchmarks/tree_acceptance.py --lookup` measures the same rule over recorded
trees (docs/performance.md, "Prompt-lookup tokens beside the tree").
"""

from __future__ import annotations

import torch

from speculative.kernels.tree_level import VerifyRows
from speculative.tree.grow import tree_slot_map

# The longest of the context's last tokens found earlier in it wins. A single token's match
# proposes what rarely follows (its first token accepted 22% of the time, a 3-token match's 83%)
# and takes places from the tree's nodes: without it, and with 4 tokens first, 4,8,15 trees
# accepted 3.996 tokens a step against 3.931 on the CPU's walk (docs/performance.md).
GRAMS = (4, 3, 2)


def record_step(history: torch.Tensor, last: torch.Tensor, n: torch.Tensor) -> None:
    """Writes the step before's tokens into the history: last is its result [a, next token,
    path...] (a of the path's tokens accepted, then the next token, the root at n), so they go to
    n - a .. n; the rest of the path's places past n get the root too (never read: the context
    ends at n). A first step's `last` is [0, root, ...]."""
    R = last.shape[0] - 1
    w = torch.arange(R, device=history.device)
    a = last[0]
    tokens = torch.where(w < a, last[2:].index_select(0, w.clamp_max(R - 2)), last[1])
    history.index_copy_(0, n - a + w, tokens)


def lookup_proposal(history: torch.Tensor, n: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """history (H,) int64: the conversation's tokens, valid at 0 .. n (n () int64, the root's
    position: the context ends with the root). Returns (proposal (length,) int64, count () int64):
    the first `count` entries are the tokens that followed the latest earlier occurrence of the
    context's last 4 tokens, else 3, else 2 (GRAMS), at most up to the root; count 0 when none
    occurs."""
    H, dev = history.shape[0], history.device
    p = torch.arange(H, device=dev)
    best_j = torch.full((), -1, dtype=torch.long, device=dev)
    best_g = torch.zeros((), dtype=torch.long, device=dev)
    for g in sorted(GRAMS):  # a longer match found overrides a shorter one
        # an occurrence starting at j ends before the context's last g tokens begin to be read
        # again: j + g - 1 <= n - 1; the context needs more than g tokens
        match = (p <= n - g) & (n >= g)
        for i in range(g):
            tail = history.index_select(0, (n - g + 1 + i).clamp_min(0).view(1))
            match &= history.index_select(0, (p + i).clamp_max(H - 1)) == tail
        j = torch.where(match, p, -1).max()
        found = j >= 0
        best_j, best_g = torch.where(found, j, best_j), torch.where(found, g, best_g)
    start = best_j + best_g
    count = torch.where(best_j >= 0, (n - start + 1).clamp(0, length), 0)
    proposal = history.index_select(0, (start + torch.arange(length, device=dev)).clamp(0, H - 1))
    return proposal, count


def _shared(ids, parents, kept, proposal, count):
    """How many of the proposal's first tokens a path of kept nodes spells, and that path's last
    node (-1: the root)."""
    N, dev = ids.shape[0], ids.device
    index = torch.arange(N, device=dev)
    at = torch.full((), -1, dtype=torch.long, device=dev)
    shared = torch.zeros((), dtype=torch.long, device=dev)
    walking = torch.ones((), dtype=torch.bool, device=dev)
    for t in range(proposal.shape[0]):
        child = kept & (parents == at) & (ids == proposal[t])  # siblings are distinct tokens: one at most
        hit = walking & child.any() & (t < count)
        at = torch.where(hit, torch.where(child, index, N).min(), at)
        shared, walking = shared + hit.long(), hit
    return shared, at


def merge_lookup(verify: VerifyRows, proposal: torch.Tensor, count: torch.Tensor, n: torch.Tensor,
                 width: int | None = None) -> VerifyRows:
    """The kept tree of `verify` with the proposal's first `count` tokens as a chain from the root:
    its tokens that kept nodes already spell (a path from the root) stay those nodes, and the rest
    hang below them, in the rows of the tree's lowest-scored nodes (by score, ties to the later
    row: leaves, so that what is kept stays a tree). The rows come back in depth order (parents
    first), with their ids, positions and slot map (where `verify` has one: `width` entries a row,
    the walk's depth + 1, by default verify's); cache rows are n + 1 + row as before. The proposal
    is at most as long as the tree has nodes and as deep as the walk goes, which may be deeper than
    the tree. A chain node's draft token is -1 and its score the node's it replaced: the greedy
    walk reads neither."""
    ids, parents, depths, scores = verify.ids[1:], verify.parents, verify.depths, verify.scores
    N, L, dev = ids.shape[0], proposal.shape[0], ids.device
    assert L <= N, "a proposal longer than the tree has nodes"
    index = torch.arange(N, device=dev)
    # rank: nodes before it by score, ties to the earlier row (a parent comes before its children)
    rank = ((scores[None, :] > scores[:, None])
            | ((scores[None, :] == scores[:, None]) & (index[None, :] < index[:, None]))).sum(1)
    # keep the best m so that m + the chain's new nodes = N: fewer kept nodes may spell less of
    # the chain (more new nodes), so again until it holds (the new nodes grow at most L times)
    m = torch.full((), N, dtype=torch.long, device=dev)
    for _ in range(L + 1):
        shared, last = _shared(ids, parents, rank < m, proposal, count)
        m = torch.where(m + count - shared > N, N - (count - shared), m)
    shared, last = _shared(ids, parents, rank < m, proposal, count)
    dropped = rank >= m  # as many as the chain's new nodes: count - shared
    k = dropped.long().cumsum(0) - 1  # a dropped row's place in the chain's tail
    row_of = torch.full((L + N,), -1, dtype=torch.long, device=dev)  # chain place -> row (kept rows past L)
    row_of.index_copy_(0, torch.where(dropped, k, L + index), index)
    t = (shared + k).clamp(0, L - 1)  # the proposal's token each dropped row takes
    up = torch.where(k == 0, last, row_of.index_select(0, (k - 1).clamp_min(0)))
    new_ids = torch.where(dropped, proposal.index_select(0, t), ids)
    new_parents = torch.where(dropped, up, parents)
    new_depths = torch.where(dropped, t + 1, depths)
    new_tokens = torch.where(dropped, -1, verify.tokens)
    # depth order, rows of one depth as they were: a parent before its children
    order = torch.argsort(new_depths * (N + 1) + index)
    where = torch.empty_like(order).index_copy_(0, order, index)  # old row -> new row
    p = new_parents.index_select(0, order)
    parents_out = torch.where(p >= 0, where.index_select(0, p.clamp_min(0)), -1)
    depths_out = new_depths.index_select(0, order)
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    slot_map = map_base = None
    if verify.slot_map is not None:
        slot_map, map_base = tree_slot_map(parents_out, depths_out, n, width or verify.slot_map.shape[1])
    return VerifyRows(tokens=new_tokens.index_select(0, order), parents=parents_out, depths=depths_out,
                      scores=scores.index_select(0, order),
                      ids=torch.cat([verify.ids[:1], new_ids.index_select(0, order)]),
                      positions=n + torch.cat([zero, depths_out]), slots=verify.slots,
                      slot_map=slot_map, map_base=map_base)
