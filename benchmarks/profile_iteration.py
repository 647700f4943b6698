"""Kernel breakdown of one greedy speculative iteration of the demo model with its head (CUDA).

Answers one held-out prompt (64 tokens) to reach a valid state, times 40 replays of the
whole-iteration graph, then profiles 20 eager runs of the same body (the kernels the graph
replays; with n known on the host, attention reads only the filled cache). JSON to OUT:

    python benchmarks/profile_iteration.py OUT.json
    LOCALCHAT_LEAN_DRAFT=0 python benchmarks/profile_iteration.py OUT.json   # session 8's loop
    LOCALCHAT_SPEC_ALTS=0 python benchmarks/profile_iteration.py OUT.json    # no runners-up verified
"""

from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("usage: python benchmarks/profile_iteration.py OUT.json")
    import torch
    from torch.profiler import ProfilerActivity, profile

    from app.bench_setup import chat_prompts_from
    from engine.engine import Engine
    from engine.types import SamplingParams

    engine = Engine.load("demo", device="cuda")
    msgs, _ = chat_prompts_from(1)
    for _ in engine.stream_ids(engine.tokenizer.apply_chat_template(msgs[0]), SamplingParams(max_tokens=64),
                               speculative=True):
        pass
    it = engine.speculator.fused
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(40):
        it.graph.replay()
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - start) / 40 * 1e3
    n_it = 20
    with torch.inference_mode():
        for _ in range(3):
            it._body(int(it.n))
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(n_it):
                it._body(int(it.n))
            torch.cuda.synchronize()
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
    Path(sys.argv[1]).write_text(json.dumps({"alternatives": list(it.alts), "graph_iter_ms": graph_ms,
                                             "kernel_sum_us": total, "launches": launches, "rows": rows}, indent=1))
    print(f"graph iteration {graph_ms:.3f} ms, kernel sum {total:.1f} us, {launches:.0f} launches")
    for r in rows[:25]:
        print(f"{r['us_per_iter']:8.1f} us {r['launches_per_iter']:5.1f}  {r['name']}")


if __name__ == "__main__":
    main()
