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


def sampled_tree_accept(tree: DraftTree, target_probs: torch.Tensor,
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """target_probs: (N + 1, V) the target's distribution (after temperature and the cuts) at the
    root and at each node. Returns (the accepted nodes, root to leaf; the next token), the emitted
    tokens having the target's distribution (see the module's docstring)."""
    dev = target_probs.device
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path, node = [], -1
    while True:
        residual = target_probs[node + 1].double().clone()
        kids = [i for i in range(len(tokens)) if parents[i] == node]  # best score first (verify order)
        stepped = None
        for c in kids:
            total = residual.sum()
            if total <= 0:
                break
            u = torch.rand((), dtype=torch.float64, device=dev, generator=generator)
            if u * total < residual[tokens[c]]:
                stepped = c
                break
            residual[tokens[c]] = 0.0
        if stepped is None:
            if residual.sum() <= 0:  # every token the target allows was a refused child: cannot happen
                residual = target_probs[node + 1].double()
            nxt = torch.multinomial(residual / residual.sum(), 1, generator=generator)
            return path, int(nxt)
        path.append(stepped)
        node = stepped
