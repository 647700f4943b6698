"""Kernel-time breakdown of one eager decode step (CUDA), grouped by kernel name; JSON to --out.

Eager mode launches the same kernels the captured graph replays, so the sum of kernel
times, against the graph's step time, shows how much is launch gap versus kernel work.
--rows N profiles an N-row (verify) step instead, --invariant the batch-invariant kernels a
loaded draft switches on, --no-fuse the unfused norm/activation launches (LOCALCHAT_FUSE=0):

    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json
    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json --no-fuse
    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json --invariant --rows 6
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
    ap.add_argument("--rows", type=int, default=1, help="tokens per step (1: decode, k + 1: verify)")
    ap.add_argument("--invariant", action="store_true", help="batch-invariant projections (as with a draft)")
    ap.add_argument("--no-fuse", action="store_true", help="unfused norm/activation + projection launches")
    args = ap.parse_args()
    import os

    if args.no_fuse:
        os.environ["LOCALCHAT_FUSE"] = "0"  # read by Ops.for_device
    import torch
    from torch.profiler import ProfilerActivity, profile

    from app.bench_setup import build_bench_engine

    ns = argparse.Namespace(random_weights=args.random_weights, device="cuda", max_seq_len=4096,
                            force_accept=None, draft_steps=5, no_graphs=False)
    engine = build_bench_engine(ns)
    r = engine.runner
    if args.invariant:
        r.model.ops.set_batch_invariant(True)
        r.graphs.clear()  # captured with the switch off: capture again
    r.capture([args.rows])
    from engine.batch import ForwardBatch

    _mode = torch.inference_mode()
    _mode.__enter__()
    tok = torch.zeros(args.rows, dtype=torch.long, device="cuda")
    for _ in range(3):
        r.model(ForwardBatch.eager(tok, args.context), r.kv)
    torch.cuda.synchronize()
    step = r.graphs[args.rows]
    n = 100
    t = time.perf_counter()
    for _ in range(n):
        step.replay(tok, args.context)
    torch.cuda.synchronize()
    graph_ms = (time.perf_counter() - t) / n * 1000

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            out = r.model(ForwardBatch.eager(tok, args.context), r.kv)
            r.model.logits(out.hidden)
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
    launches = sum(v[1] for _, v in rows)
    layers = r.config.num_layers
    report = {"rows": args.rows, "invariant": args.invariant, "fused": r.model.ops.fuse,
              "graph_step_ms": graph_ms, "kernel_sum_ms": total / 1000, "weight_GB": weight_bytes / 1e9,
              "launches_per_step": launches, "launches_per_layer": launches / layers,
              "kernels": [{"name": k, "us_per_step": v[0], "launches_per_step": v[1]} for k, v in rows[:25]]}
    print(f"{args.rows}-row step ({'fused' if r.model.ops.fuse else 'unfused'}"
          f"{', batch-invariant' if args.invariant else ''}): graph step {graph_ms:.3f} ms, "
          f"kernel sum {total / 1000:.3f} ms, weights {weight_bytes / 1e9:.2f} GB")
    print(f"{launches:.0f} kernel launches per step, {launches / layers:.1f} per layer ({layers} layers)")
    for k, v in rows[:15]:
        print(f"{v[0]:9.1f} us  x{v[1]:5.0f}  {k}")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
