"""Kernel breakdown of one greedy speculative iteration of the demo model with its head: the
captured graph's replay time, and each kernel's time and launches from the torch profiler over
the eager body (the same kernels the graph holds). LOCALCHAT_SPEC_ALTS picks the alternatives.

    LOCALCHAT_SPEC_ALTS=0 python benchmarks/iteration_profile.py OUT.json
"""

import json
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from app.bench_setup import chat_prompts_from  # noqa: E402
from engine.engine import Engine  # noqa: E402
from engine.types import SamplingParams  # noqa: E402


def main() -> None:
    if len(sys.argv) != 2 or not torch.cuda.is_available():
        raise SystemExit("usage: python benchmarks/iteration_profile.py OUT.json (needs CUDA)")
    e = Engine.load("demo", device="cuda")
    msgs, _ = chat_prompts_from(2)
    for _ in e.stream_ids(e.tokenizer.apply_chat_template(msgs[0]), SamplingParams(max_tokens=64), speculative=True):
        pass  # captures the graphs and leaves the loop's state mid-conversation
    it = e.speculator.fused
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(40):
        it.graph.replay()
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - t) / 40 * 1e3
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
    report = {"alternatives": list(it.alts), "graph_iter_ms": graph_ms,
              "kernel_sum_us": sum(r["us_per_iter"] for r in rows),
              "launches": sum(r["launches_per_iter"] for r in rows), "rows": rows}
    Path(sys.argv[1]).write_text(json.dumps(report, indent=1))
    print(f"alternatives {list(it.alts)}: graph iteration {graph_ms:.3f} ms, kernel sum {report['kernel_sum_us']:.1f} us, "
          f"{report['launches']:.0f} launches")
    for r in rows[:20]:
        print(f"{r['us_per_iter']:8.1f} us {r['launches_per_iter']:5.1f}  {r['name']}")


if __name__ == "__main__":
    main()
