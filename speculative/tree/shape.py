"""TreeShape: how wide and deep a draft tree grows and how many of its nodes are verified."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import UserError

MAX_TOKENS = 63  # verified nodes; with the root, 64 rows in one verify step


@dataclass(frozen=True)
class TreeShape:
    topk: int  # children each expanded node gets, and nodes expanded at each depth
    depth: int  # levels below the root
    tokens: int  # nodes kept for the verify step, the best by the draft's cumulative probability

    def __post_init__(self) -> None:
        if not (1 <= self.topk <= 16 and 1 <= self.depth <= 16 and 1 <= self.tokens <= MAX_TOKENS):
            raise UserError(f"--tree {self}: TOPK 1-16, DEPTH 1-16 and TOKENS 1-{MAX_TOKENS}")
        if self.tokens > self.topk + (self.depth - 1) * self.topk * self.topk:
            raise UserError(f"--tree {self}: {self.depth} levels of {self.topk} x {self.topk} candidates hold fewer "
                            f"than {self.tokens} nodes; lower TOKENS or raise TOPK or DEPTH")

    def __str__(self) -> str:
        return f"{self.topk},{self.depth},{self.tokens}"

    @property
    def is_chain(self) -> bool:
        return self.topk == 1


def parse_tree(spec: str) -> TreeShape | str | None:
    """--tree: "off" (None: chain drafting), "auto" (the speculator picks), or TOPK,DEPTH,TOKENS."""
    spec = spec.strip().lower()
    if spec == "off":
        return None
    if spec == "auto":
        return "auto"
    parts = [p.strip() for p in spec.split(",")]
    if len(parts) != 3 or not all(p.isdigit() for p in parts):
        raise UserError(f"--tree {spec!r}: use off, auto, or TOPK,DEPTH,TOKENS such as 8,6,48")
    return TreeShape(*(int(p) for p in parts))
