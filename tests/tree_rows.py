"""A draft tree's verify rows as the attention kernel reads them, for the kernel and model tests."""

from __future__ import annotations

import torch


def tree_layout(parents: list[int], node_slot: list[int]) -> tuple[list[int], torch.Tensor]:
    """(each node's depth, slot_map (rows, max depth + 1) int32): entry d of a node's row is the cache
    row of its ancestor at depth d (node_slot[ancestor]), zero from its own depth on. parents: each
    node's parent's index (-1: the root, depth 0), parents before children."""
    depth: list[int] = []
    for p in parents:
        depth.append(0 if p < 0 else depth[p] + 1)
    slot_map = torch.zeros(len(parents), max(depth) + 1, dtype=torch.int32)
    for i, a in enumerate(parents):
        while a >= 0:
            slot_map[i, depth[a]] = node_slot[a]
            a = parents[a]
    return depth, slot_map
