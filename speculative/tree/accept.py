"""Which path of a draft tree the target accepts, greedy and sampled, keeping the target's output.

Row 0 of the target's verify output stands for the root, row i + 1 for node i.

Greedy: from the root, step to the child whose token is the target's choice at the current row,
while there is one; the next token is the target's choice where the walk stops. The output is what
plain greedy decoding gives.

Sampled (the siblings are the draft's top-k, not samples, so only the target's probabilities
enter): at the current row, with the target's distribution p, try the children one after the
other, best first: child c is accepted with probability r(c) / sum(r), where r is p with the tried
children's mass removed; the first one accepted is stepped into. If none is, the next token is
drawn from r, normalized. Then the token emitted at every step has exactly the distribution p: a
child c is emitted with probability p(c) (the chance that the ones before were refused times c's
share of what remained), and any other token x with the probability that all were refused times
x's share of what remained, p(x). At a leaf, the next token is drawn from its row's p.
"""

from __future__ import annotations

import torch

from speculative.kernels.tree_level import StepEnd
from speculative.tree.grow import DraftTree


def greedy_tree_path(tree: DraftTree, target_choice: torch.Tensor, max_depth: int | None = None):
    """The greedy walk as tensor operations of fixed shapes (no host read): a node is on the path
    when its token is the target's choice at its parent's row and so is every ancestor's; siblings
    are distinct tokens (a distribution's top-k), so at most one node of each depth is. Returns
    (path (D,) the nodes from depth 1 down, the first `count` of them valid; count () the accepted
    drafts; next_token () the target's choice at the last accepted row), D = max_depth (default:
    the tree's deepest node's depth)."""
    parents, depths, tokens = tree.parents, tree.depths, tree.tokens
    dev = tokens.device
    D = max_depth if max_depth is not None else int(depths.max()) if len(tree) else 0
    N = tokens.shape[0]
    if not N:
        empty = torch.full((D,), -1, dtype=torch.long, device=dev)
        return empty, torch.zeros((), dtype=torch.long, device=dev), target_choice[0]
    # few launches: in a captured tree step every op here is a kernel of its own
    up, under_root = parents.clamp_min(0), parents < 0
    matched = tokens == target_choice.index_select(0, parents + 1)
    on_path = matched
    for _ in range(max(D - 1, 0)):  # a node stays on it while its parent is (D levels at most)
        on_path = matched & (under_root | on_path.index_select(0, up))
    # the path holds one node of each depth from 1 to count: row d of `at` marks depth d + 1's
    at = on_path[None, :] & (depths[None, :] == torch.arange(1, D + 1, device=dev)[:, None])  # (D, N)
    count = on_path.sum()
    path = torch.where(at.any(1), (at * torch.arange(N, device=dev)).sum(1), -1)
    last = torch.where(count > 0, path.index_select(0, (count - 1).clamp_min(0).view(1))[0], -1)
    next_token = target_choice.index_select(0, (last + 1).view(1))[0]
    return path, count, next_token


def sampled_tree_path(tree: DraftTree, target_probs: torch.Tensor, u: torch.Tensor, e: torch.Tensor,
                      max_depth: int):
    """The sampled rule (the module's docstring) as tensor operations of fixed shapes, its random
    numbers given: u (D, K) a uniform for each try (level, child slot; K at least the most
    children a node has), e (V,) Exp(1) variates for the last draw (an exponential race:
    argmax of r / e is a draw from r normalized). target_probs (N + 1, V): row 0 the root's, row
    i + 1 node i's. Returns (path (D,) the accepted nodes from depth 1, the first `count` of them
    valid; count (); next_token ()), D = max_depth; no host read."""
    parents, tokens = tree.parents, tree.tokens
    dev, N = tokens.device, tokens.shape[0]
    D, K = max_depth, u.shape[1]
    # children[r * K + s]: row r's child s in verify order (best score first), -1: none; a node's
    # rank among its siblings is how many of them come before it
    index = torch.arange(N, device=dev)
    rank = ((parents[None, :] == parents[:, None]) & (index[None, :] < index[:, None])).sum(1)
    children = torch.full(((N + 1) * K + 1,), -1, dtype=torch.long, device=dev)
    children.index_copy_(0, torch.where(rank < K, (parents + 1) * K + rank, (N + 1) * K), index)
    row = torch.zeros((), dtype=torch.long, device=dev)  # where the walk is: 0 the root, i + 1 node i
    residual = target_probs[0].clone()
    walking = torch.ones((), dtype=torch.bool, device=dev)
    path = torch.full((D,), -1, dtype=torch.long, device=dev)
    for d in range(D):
        stepped = torch.full((), -1, dtype=torch.long, device=dev)
        for s in range(K):
            child = children.index_select(0, (row * K + s).view(1))[0]
            token = tokens.index_select(0, child.clamp_min(0).view(1))
            mass = residual.index_select(0, token)
            tried = walking & (child >= 0) & (stepped < 0)
            take = tried & (u[d, s] * residual.sum() < mass[0])
            stepped = torch.where(take, child, stepped)
            residual.index_copy_(0, token, torch.where(tried & ~take, 0.0, mass))  # refused: its mass out
        moved = stepped >= 0
        path[d] = stepped
        row = torch.where(moved, stepped + 1, row)
        residual = torch.where(moved, target_probs.index_select(0, row.view(1))[0], residual)
        walking = moved
    count = (path >= 0).sum()
    # refused children with all the mass (cannot happen with exact arithmetic): the row's p
    start = target_probs.index_select(0, row.view(1))[0]
    residual = torch.where(residual.sum() > 0, residual, start)
    return path, count, (residual / e).argmax()


def step_end(path: torch.Tensor, count: torch.Tensor, next_token: torch.Tensor, tokens: torch.Tensor,
             n: torch.Tensor, depth: int, result: torch.Tensor, root: torch.Tensor):
    """What a tree step does after its walk, in torch ops (kernels/tree_level.py's tree_accept
    does a greedy step's in its launch): from the walk's path (D,), count and next token, and the
    nodes' target ids, the StepEnd (the accepted rows' K/V sources and destinations, the
    draft-extend's tokens, rows and positions); result gets [count, next token, the accepted
    tokens], root the next token, and n moves on by count + 1. Rows past the path copy onto
    themselves and pad the draft-extend (their K/V, past the accepted length, is rewritten before
    anything reads it)."""
    dev = tokens.device
    index = torch.arange(depth, device=dev)
    taken = index < count
    accepted = tokens.index_select(0, path.clamp_min(0))
    # row i of the draft-extend pairs the target state of the path's row i (0: the root) with the
    # token after it; its outputs are those of row `count`
    end = StepEnd(count=count, src=n + 1 + torch.where(taken, path, index), dst=n + 1 + index,
                  window=torch.cat([torch.where(taken, accepted, next_token), next_token.view(1)]),
                  rows=torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.where(taken, 1 + path, 0)]),
                  ext_pos=n + torch.arange(depth + 1, device=dev))
    result.copy_(torch.cat([count.view(1), next_token.view(1), accepted]))
    root.copy_(next_token.view(1))
    n.add_(count + 1)
    return end


def step_end_ref(choice, tokens, parents, depths, n, depth, result, root):
    """tree_accept's reference: greedy_tree_path, then step_end."""
    path, count, next_token = greedy_tree_path(DraftTree(tokens, parents, depths, depths.float()), choice, depth)
    return step_end(path, count, next_token, tokens, n, depth, result, root)
