"""A draft tree grown the EAGLE-2 way, and its attention mask.

From the root (the last token the target gave), the draft's top-k tokens form depth 1. At each
further depth the k nodes with the highest cumulative draft log-probability are expanded, each into
its own top-k children; every candidate seen is kept. At the end the `tokens` best candidates by
cumulative log-probability are verified. A child's cumulative log-probability is at most its
parent's, so the best candidates always include their ancestors (ties go to the shallower node).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

from speculative.kernels.tree_level import VerifyRows, tree_level
from speculative.tree.shape import TreeShape


@dataclass(frozen=True)
class DraftTree:
    """Nodes in verify order: by depth, then by score; a parent always comes before its children."""

    tokens: torch.Tensor  # (N,) int64 draft token of each node
    parents: torch.Tensor  # (N,) int64 index of the node's parent, -1 for the root's children
    depths: torch.Tensor  # (N,) int64, 1 for the root's children
    scores: torch.Tensor  # (N,) float32 cumulative draft log-probability

    def __len__(self) -> int:
        return self.tokens.shape[0]

    def children(self, node: int) -> list[int]:
        """The nodes whose parent is `node` (-1: the root), best score first."""
        return [i for i in range(len(self)) if int(self.parents[i]) == node]

    def path(self, node: int) -> list[int]:
        """The nodes from depth 1 down to `node`."""
        out = []
        while node >= 0:
            out.append(node)
            node = int(self.parents[node])
        return out[::-1]


Expand = Callable[[torch.Tensor, "DraftTree"], torch.Tensor]


def grow_tree(root_logprobs: torch.Tensor, expand: Expand, shape: TreeShape, fused: bool = False,
              inputs=None, select: bool = True, keys: bool = False, split: bool = False) -> DraftTree:
    """root_logprobs: (V,) the draft's log-probabilities for the token after the root.
    expand(frontier, grown): (F, V) the draft's log-probabilities for the token after each of the
    frontier nodes (indices into `grown`, the candidates so far, whose paths they extend; all of
    one depth, the deepest so far).

    Few tensor operations (in a captured tree step each is a kernel): the candidates go into
    buffers of every node the shape can make, level after level, so that their index order is
    their depth order. fused: each level is one launch (speculative/kernels/tree_level.py; CUDA
    or Triton's interpreter), and the root's and expand's rows may be logits as well (a row's
    log-softmax is taken inside); with `inputs` (its LevelInputs) each level also writes the
    next expansion's inputs there, before expand is called (keys, split: tree_level's). select=False:
    every candidate, in their layout (for kernels/tree_level.py's tree_select), instead of the
    best shape.tokens."""
    k = min(shape.topk, root_logprobs.shape[-1])
    dev = root_logprobs.device
    count = k + max(shape.depth - 1, 0) * k * k
    tokens = torch.empty(count, dtype=torch.int64, device=dev)
    scores = torch.empty(count, dtype=torch.float32, device=dev)
    depths = _depths(k, shape.depth, dev)
    if fused:  # each level one launch; the kernels write every candidate's parent
        parents = torch.empty(count, dtype=torch.int64, device=dev)

        def next_inputs(depth: int):  # for the expansion of a frontier of this depth, if one follows
            return (inputs, depth) if inputs is not None and depth < shape.depth else (None, 0)

        frontier = torch.empty(k, dtype=torch.int64, device=dev)
        tree_level(root_logprobs.reshape(1, -1), None, tokens, parents, scores, 0, k, frontier, *next_inputs(1),
                   keys=keys, split=split)
        grown = k
        for depth in range(2, shape.depth + 1):
            rows = expand(frontier, DraftTree(tokens[:grown], parents[:grown], depths[:grown], scores[:grown]))
            nxt = torch.empty(k, dtype=torch.int64, device=dev)  # expand has read frontier; the kernel reads it too
            tree_level(rows, frontier, tokens, parents, scores, grown, k, nxt, *next_inputs(depth), keys=keys,
                       split=split)
            frontier, grown = nxt, grown + k * k
    else:  # the torch ops leave the root's children at -1
        parents = torch.full((count,), -1, dtype=torch.int64, device=dev)
        top = _top(root_logprobs.float(), k)
        tokens[:k], scores[:k] = top.indices, top.values
        frontier = torch.arange(k, device=dev)
        grown = k
        for _ in range(2, shape.depth + 1):
            lp = expand(frontier, DraftTree(tokens[:grown], parents[:grown], depths[:grown], scores[:grown])).float()
            child = _top(lp, k)  # (F, k)
            width = frontier.shape[0] * k
            cand = scores[grown:grown + width]
            torch.add(scores.index_select(0, frontier)[:, None], child.values, out=cand.view(-1, k))
            tokens[grown:grown + width] = child.indices.flatten()
            parents[grown:grown + width] = frontier[:, None].expand(-1, k).flatten()
            frontier = grown + _top(cand, min(k, width)).indices
            grown += width
    if not select:
        return DraftTree(tokens, parents, depths, scores)
    return _kept(tokens, parents, depths, scores, shape.tokens)


def _kept(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, scores: torch.Tensor,
          most: int) -> DraftTree:
    """The tree of the `most` best candidates, in verify order."""
    count, dev = tokens.shape[0], tokens.device
    # the best `tokens` by score, ties to the shallower, then earlier node: the index order is
    # the depth order, so a stable sort by score alone gives that
    keep = torch.sort(-scores, stable=True).indices[:min(most, count)]
    # verify order: by depth, then score (a stable sort of the kept ones by depth)
    keep = keep.index_select(0, torch.sort(depths.index_select(0, keep), stable=True).indices)
    new_index = torch.full((count,), -1, dtype=torch.int64, device=dev)
    new_index[keep] = torch.arange(keep.shape[0], device=dev)
    old_parents = parents.index_select(0, keep)
    parents_out = torch.where(old_parents >= 0, new_index.index_select(0, old_parents.clamp_min(0)), -1)
    if not parents_out.is_cuda:  # checked where it costs no wait on a GPU (every CPU test checks it)
        assert bool((parents_out[old_parents >= 0] >= 0).all()), "a kept node lost its parent"
    return DraftTree(tokens.index_select(0, keep), parents_out, depths.index_select(0, keep),
                     scores.index_select(0, keep))


@functools.lru_cache(maxsize=32)
def _depths(k: int, depth: int, device: torch.device) -> torch.Tensor:
    """Each candidate's depth, as grow_tree lays them out (k of depth 1, then k * k a level)."""
    return torch.tensor([1] * k + [d for d in range(2, depth + 1) for _ in range(k * k)], device=device)


# Past this many entries a CUDA sort is a radix sort of some eight launches, where topk is one or two
SORT_LIMIT = 4096


def _top(x: torch.Tensor, k: int):
    """topk along the last dim with ties to the lower index (as argmax breaks them, so that a
    depth-1 tree of one node is the chain's first draft); torch.topk leaves ties unordered. A long
    last dim (a draft's vocabulary) takes torch.topk, its k results then ordered by value and
    index: the same, except where the k-th and the next value tie (which of them is kept)."""
    if x.shape[-1] <= SORT_LIMIT or k > 64:
        values, indices = torch.sort(x, dim=-1, descending=True, stable=True)
        return torch.return_types.topk((values[..., :k], indices[..., :k]))
    top = torch.topk(x, k, dim=-1)
    by_index = torch.sort(top.indices, dim=-1, stable=True)
    values = top.values.gather(-1, by_index.indices)
    order = torch.sort(values, dim=-1, descending=True, stable=True).indices
    return torch.return_types.topk((values.gather(-1, order), by_index.values.gather(-1, order)))


def tree_mask(parents: torch.Tensor) -> torch.Tensor:
    """(N + 1, N + 1) bool: row i sees column j where node j is node i itself or one of its
    ancestors; index 0 is the root, node n is index n + 1. The verify step's attention over the
    tree's own rows (every row also sees the context before the root)."""
    n = parents.shape[0]
    up = torch.cat([torch.zeros(1, dtype=torch.int64, device=parents.device), parents + 1])  # root: itself
    mask = torch.eye(n + 1, dtype=torch.bool, device=parents.device)
    rows = torch.arange(n + 1, device=parents.device)
    cur = up
    for _ in range(n + 1):
        mask[rows, cur] = True
        cur = up[cur]
    return mask


def tree_slot_map(parents: torch.Tensor, depths: torch.Tensor, root_slot: "int | torch.Tensor",
                  width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The verify rows' ancestors for the decode kernel (ForwardBatch.slot_map): (N + 1, width)
    int32 and (N + 1,) int32; width at least D + 1, D the deepest node's depth (None: D + 1, read
    from the device; a tree shape's depth + 1 keeps one compiled kernel for every step of that
    shape). Tensor operations of fixed shapes: no host read with a width given. Row 0 is the root (position and cache
    row root_slot), row i + 1 node i (cache row root_slot + 1 + i, position root_slot + its
    depth); entry d of a row is the cache row of its ancestor at depth d (0: the root), and
    map_base is the root's position for every row. Entries at and below a row's own depth are
    never read (its own K/V comes from its own slot)."""
    n, device = parents.shape[0], parents.device
    if width is None:
        width = 1 + (int(depths.max()) if n else 0)
    # few launches (in a captured tree step each op is a kernel): row r's ancestor l levels up
    # is chain[l][r] (rows: 0 the root, i + 1 node i; the root is its own parent), and its
    # ancestor at depth j is depth(r) - j levels up
    zero = torch.zeros(1, dtype=torch.long, device=device)
    up, row_depth = torch.cat([zero, parents + 1]), torch.cat([zero, depths])
    chain = [torch.arange(n + 1, device=device)]
    for _ in range(width - 1):
        chain.append(up.index_select(0, chain[-1]))
    levels = row_depth[:, None] - torch.arange(width, device=device)[None, :]  # (N + 1, width)
    rows = torch.stack(chain, dim=1).gather(1, levels.clamp(0, width - 1))
    slot_map = torch.where(levels > 0, root_slot + rows, 0)
    slot_map[0, 0] = root_slot
    slot_map = slot_map.to(torch.int32)
    base = root_slot if isinstance(root_slot, torch.Tensor) else torch.tensor(root_slot, device=device)
    return slot_map, base.to(torch.int32).expand(n + 1).contiguous()


def verify_rows(tree: DraftTree, d2t: torch.Tensor, n: torch.Tensor, root: torch.Tensor, depth: int,
                slot_map: bool = True):
    """The verify step's inputs for a kept tree (draft ids), in torch ops: VerifyRows, as
    kernels/tree_level.py's tree_select writes them (ids, positions and cache rows of the root and
    each node, and the slot map tree_slot_map gives, depth + 1 wide; slot_map=False: none, for
    explicit masks)."""
    N, dev = len(tree), tree.tokens.device
    rows_map, base = tree_slot_map(tree.parents, tree.depths, n, depth + 1) if slot_map else (None, None)
    return VerifyRows(tokens=tree.tokens, parents=tree.parents, depths=tree.depths, scores=tree.scores,
                      ids=torch.cat([root, tree.tokens + d2t[tree.tokens]]),
                      positions=n + torch.cat([torch.zeros(1, dtype=torch.long, device=dev), tree.depths]),
                      slots=n + torch.arange(N + 1, device=dev), slot_map=rows_map, map_base=base)


def verify_rows_ref(tokens, parents, depths, scores, most, d2t, n, root, depth):
    """tree_select's reference: grow_tree's selection, then verify_rows."""
    return verify_rows(_kept(tokens, parents, depths, scores, most), d2t, n, root, depth)
