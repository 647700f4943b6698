"""The prompt-lookup launch alone (speculative/kernels/tree_lookup.py), by warps per program: random
kept trees of each --nodes count (siblings distinct, at most 8 deep) and a --history-token
conversation of a small vocabulary (many repeats, so the proposal is long), the launch captured
--per-graph times in one CUDA graph and the graph replayed, so the figure is the launch's time
on the GPU with no host launch cost in it.

    python benchmarks/tree_lookup_launch.py --out FILE
    python benchmarks/tree_lookup_launch.py --nodes 15 24 --warps 1 2 4 8 --out FILE

Writes JSON (the machine, microseconds a launch for each node count and warps) and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def fail(message: str) -> None:
    raise SystemExit(f"tree_lookup_launch.py: {message}")


def random_tree(rng: random.Random, nodes: int, vocab: int, depth: int):
    """A kept tree in verify order: each node under the root or an earlier node of depth < `depth`
    with a token its siblings lack, scores falling along each path."""
    import torch

    from speculative.tree.grow import DraftTree

    parents, depths, scores, tokens = [], [], [], []
    for _ in range(nodes):
        room = [p for p in range(-1, len(parents)) if (p < 0 or depths[p] < depth)
                and len({tokens[j] for j, q in enumerate(parents) if q == p}) < vocab]
        p = rng.choice(room)
        taken = {tokens[j] for j, q in enumerate(parents) if q == p}
        parents.append(p)
        depths.append(1 if p < 0 else depths[p] + 1)
        scores.append((0.0 if p < 0 else scores[p]) - rng.random())
        tokens.append(rng.choice([t for t in range(vocab) if t not in taken]))
    order = sorted(range(nodes), key=lambda i: (depths[i], i))
    where = {old: new for new, old in enumerate(order)}
    return DraftTree(torch.tensor([tokens[i] for i in order]),
                     torch.tensor([where[parents[i]] if parents[i] >= 0 else -1 for i in order]),
                     torch.tensor([depths[i] for i in order]), torch.tensor([scores[i] for i in order]))


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[15, 24])
    ap.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--length", type=int, default=8, help="the chain's most tokens")
    ap.add_argument("--history", type=int, default=700, help="the conversation's tokens before the root")
    ap.add_argument("--per-graph", type=int, default=50)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    if any(not 2 <= n <= 63 for n in a.nodes):
        fail("--nodes: give counts from 2 to 63")
    if any(w not in (1, 2, 4, 8, 16) for w in a.warps):
        fail("--warps: give 1, 2, 4, 8 or 16")
    if not 1 <= a.length <= min(8, *a.nodes):
        fail("--length: give 1 to 8, and no more than the fewest nodes")
    if a.history < 1 or a.per_graph < 1:
        fail("--history and --per-graph must be 1 or more")
    if not Path(a.out).resolve().parent.is_dir():
        fail(f"--out {a.out}: its folder does not exist")
    import torch
    if not torch.cuda.is_available():
        fail("needs a CUDA GPU")
    from speculative.kernels.tree_lookup import tree_lookup
    from speculative.tree.grow import verify_rows

    dev, depth, vocab = torch.device("cuda"), 8, 6
    rows = []
    for nodes in a.nodes:
        rng = random.Random(nodes)
        tree = random_tree(rng, nodes, vocab, depth)
        history = torch.tensor([rng.randrange(vocab) for _ in range(a.history + depth + 2)], device=dev)
        n = torch.tensor(a.history, device=dev)
        cpu = verify_rows(tree, torch.zeros(vocab, dtype=torch.long), torch.tensor(a.history), torch.tensor([1]),
                          depth)
        verify = type(cpu)(**{f.name: None if getattr(cpu, f.name) is None else getattr(cpu, f.name).to(dev)
                              for f in dataclasses.fields(cpu)})
        last = torch.tensor([2] + [rng.randrange(vocab) for _ in range(depth + 1)], device=dev)
        for warps in a.warps:
            def launch():
                tree_lookup(history, verify, n, a.length, last, pdl=False, num_warps=warps)
            launch()
            torch.cuda.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                for _ in range(a.per_graph):
                    launch()
            graph.replay()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                graph.replay()
            end.record()
            torch.cuda.synchronize()
            us = start.elapsed_time(end) * 1000 / (10 * a.per_graph)
            rows.append({"nodes": nodes, "warps": warps, "us": round(us, 2)})
            print(f"{nodes:5d} nodes {warps:2d} warps {us:8.1f} us")
    report = {"machine": {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                          "python": platform.python_version()},
              "settings": {"length": a.length, "history": a.history, "per_graph": a.per_graph}, "launches": rows}
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
