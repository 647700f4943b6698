"""Kernel-time breakdown of one eager decode step (CUDA), grouped by kernel name; JSON to --out.

Eager mode launches the same kernels the captured graph replays, so the sum of kernel
times, against the graph's step time, shows how much is launch gap versus kernel work.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--random-weights", default="llama-8b")
    ap.add_argument("--context", type=int, default=768)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    from app.bench_setup import build_bench_engine

    ns = argparse.Namespace(random_weights=args.random_weights, device="cuda", max_seq_len=4096,
                            force_accept=None, draft_steps=5, no_graphs=False)
    engine = build_bench_engine(ns)
    r = engine.runner
    _mode = torch.inference_mode()
    _mode.__enter__()
    tok = torch.zeros(1, dtype=torch.long, device="cuda")
    for _ in range(3):
        r.model(__import__("engine.batch", fromlist=["ForwardBatch"]).ForwardBatch.eager(tok, args.context), r.kv)
    torch.cuda.synchronize()
    step = r.graphs[1]
    n = 100
    t = time.perf_counter()
    for _ in range(n):
        step.replay(tok, args.context)
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - t) / n * 1000
    from engine.batch import ForwardBatch

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            out = r.model(ForwardBatch.eager(tok, args.context), r.kv)
            r.model.logits(out.hidden[-1:])
        torch.cuda.synchronize()
    groups: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    total = 0.0
    for ev in prof.events():
        if ev.device_type.name == "CUDA":
            us = ev.device_time / 5 if hasattr(ev, "device_time") else ev.cuda_time / 5
            groups[ev.name[:60]][0] += us
            groups[ev.name[:60]][1] += 1 / 5
            total += us
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    weight_bytes = sum(p.numel() * p.element_size() for p in r.model.parameters())
    report = {"graph_step_ms": graph_ms, "kernel_sum_ms": total / 1000, "weight_GB": weight_bytes / 1e9,
              "kernels": [{"name": k, "us_per_step": v[0], "launches_per_step": v[1]} for k, v in rows[:25]]}
    print(f"graph step {graph_ms:.3f} ms, kernel sum {total / 1000:.3f} ms, weights {weight_bytes / 1e9:.2f} GB")
    for k, v in rows[:15]:
        print(f"{v[0]:9.1f} us  x{v[1]:5.0f}  {k}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
