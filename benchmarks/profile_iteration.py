"""Kernel breakdown of one speculative iteration of the demo model with its head (CUDA): greedy, or
with `--temperature T` the sampled iteration (each replay after the host's draws for it, as the
engine runs it).

Answers one held-out prompt (64 tokens) to reach a valid state, times 40 replays of the
whole-iteration graph, then profiles 20 eager runs of the same body (the kernels the graph
replays; with n known on the host, attention reads only the filled cache), and 20 replays of
the graph itself: its timeline, each kernel's time and the gap before it (launch latency and
breaks in the programmatic-dependent-launch chain show there). Also times the first chain's
graph (GreedyIteration.begin). JSON to OUT:

    python benchmarks/profile_iteration.py OUT.json
    python benchmarks/profile_iteration.py OUT.json --temperature 0.7
    LOCALCHAT_LEAN_DRAFT=0 python benchmarks/profile_iteration.py OUT.json   # the loop before the lean draft step
    LOCALCHAT_SPEC_ALTS=0 python benchmarks/profile_iteration.py OUT.json    # no runners-up verified
    python benchmarks/profile_iteration.py OUT.json --tree 4,5,8             # a greedy tree step's graph
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--tree", default=None, help="TOPK,DEPTH,TOKENS: profile the greedy tree step of this shape")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.harness.prompts import chat_prompts_from
    from engine.engine import Engine
    from engine.errors import UserError
    from engine.types import SamplingParams
    from speculative.tree.shape import TreeShape, parse_tree

    sampled = args.temperature > 0
    shape = None
    try:  # bad input (or no GPU): one line
        if args.tree:
            if sampled:
                raise UserError("--tree profiles the greedy tree step: leave out --temperature")
            shape = parse_tree(args.tree)
            if not isinstance(shape, TreeShape):
                raise UserError(f"--tree {args.tree}: give a tree, TOPK,DEPTH,TOKENS")
        engine = Engine.load("demo", device="cuda")
    except UserError as e:
        raise SystemExit(str(e)) from None
    if shape is not None:
        engine.set_tree(shape)
    msgs, _ = chat_prompts_from(1)
    params = SamplingParams(max_tokens=64, temperature=args.temperature, seed=1) if sampled else \
        SamplingParams(max_tokens=64)
    for _ in engine.stream_ids(engine.tokenizer.apply_chat_template(msgs[0]), params, speculative=True):
        pass
    if shape is not None:  # the tree step: its greedy graph, and its body eagerly
        it = engine.speculator.tree_step(shape)
        graph = it.graphs.get((None, it.lookup))  # the greedy step, with the options' lookup chain
        alts = []

        def body():
            it._body(None, None)
    else:
        it = engine.speculator.sampled if sampled else engine.speculator.greedy
        graph, alts = it.graph, list(it.alts)
        # A sampled replay needs the host's draws first (SampledIteration._prepare), as in the engine.
        prepare = it._prepare if sampled else (lambda: None)

        def body():
            prepare()
            it._body(int(it.n))
    if graph is None:
        raise SystemExit("the iteration has no captured graph (the answer ran step by step)")

    def replay():
        if shape is None:
            prepare()
        graph.replay()

    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(40):
        replay()
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - start) / 40 * 1e3
    n_it = 20
    with torch.inference_mode():
        for _ in range(3):
            body()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n_it):
                body()
            torch.cuda.synchronize()
    with torch.inference_mode():
        with profile(activities=[ProfilerActivity.CUDA]) as timeline:
            for _ in range(n_it):
                replay()
            torch.cuda.synchronize()
        first_ms = None
        if getattr(it, "first_graph", None) is not None:
            start = time.perf_counter()
            for _ in range(40):
                it.first_graph.replay()
            torch.cuda.synchronize()
            first_ms = (time.perf_counter() - start) / 40 * 1e3
    slots = graph_timeline(timeline, n_it)
    agg = defaultdict(lambda: [0.0, 0])
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            a = agg[ev.name[:70]]
            a[0] += ev.device_time_total
            a[1] += 1
    rows = sorted(({"name": k, "us_per_iter": v[0] / n_it, "launches_per_iter": v[1] / n_it} for k, v in agg.items()),
                  key=lambda r: -r["us_per_iter"])
    total = sum(r["us_per_iter"] for r in rows)
    launches = sum(r["launches_per_iter"] for r in rows)
    summary = None
    if slots:
        summary = {"kernels": len(slots), "span_us": sum(r["us"] + r["gap_before_us"] for r in slots),
                   "busy_us": sum(r["us"] for r in slots),
                   "gaps_us": sum(max(r["gap_before_us"], 0.0) for r in slots)}
    Path(args.out).write_text(json.dumps({"temperature": args.temperature, "tree": args.tree,
                                          "alternatives": alts,
                                          "graph_iter_ms": graph_ms,
                                             "first_chain_graph_ms": first_ms, "kernel_sum_us": total,
                                             "launches": launches, "rows": rows, "graph_timeline": summary,
                                             "graph_slots": slots}, indent=1))
    print(f"graph iteration {graph_ms:.3f} ms, kernel sum {total:.1f} us, {launches:.0f} launches; "
          f"first chain graph {first_ms} ms")
    for r in rows[:25]:
        print(f"{r['us_per_iter']:8.1f} us {r['launches_per_iter']:5.1f}  {r['name']}")
    if summary:
        print(f"graph timeline: {summary}")
        print("largest gaps before a kernel in the replayed graph (us, after -> kernel):")
        for r in sorted(slots, key=lambda r: -r["gap_before_us"])[:20]:
            print(f"{r['gap_before_us']:7.2f} {r['us']:7.2f}  {r['after'][:40]} -> {r['name'][:50]}")


def graph_timeline(prof, replays: int) -> list[dict]:
    """The kernels of `replays` back-to-back replays of one graph, in order: for each kernel of
    one replay, its mean time and the mean gap from the previous kernel's end to its start
    (negative: it started before that one ended). Empty when the profiler saw no graph kernels
    or a count that does not divide into the replays."""
    import torch

    evs = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA
                  and not ev.name.startswith("Memcpy") and not ev.name.startswith("Memset")),
                 key=lambda ev: ev.time_range.start)
    if not evs or len(evs) % replays:
        print(f"graph timeline: {len(evs)} kernels for {replays} replays; not reported")
        return []
    per = len(evs) // replays
    slots = [{"name": evs[i].name[:70], "after": evs[i - 1].name[:70] if i else "", "us": 0.0, "gap_before_us": 0.0}
             for i in range(per)]
    for r in range(1, replays):  # the first replay's first gap is the host's launch
        for i in range(per):
            ev, prev = evs[r * per + i], evs[r * per + i - 1]
            slots[i]["us"] += (ev.time_range.end - ev.time_range.start) / (replays - 1)
            slots[i]["gap_before_us"] += (ev.time_range.start - prev.time_range.end) / (replays - 1)
    return slots


if __name__ == "__main__":
    main()
