"""Kernel-time breakdown of one eager decode step (CUDA), grouped by kernel name; JSON to --out.

Eager mode launches the same kernels the captured graph replays, so the sum of kernel
times, against the graph's step time, shows how much is launch gap versus kernel work.
--rows N profiles an N-row (verify) step instead, --invariant the batch-invariant kernels a
loaded draft gets, --no-fuse the unfused norm/activation launches (KernelOptions.fuse off):

    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json
    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json --no-fuse
    python benchmarks/profile_decode.py --random-weights benchmarks/configs/smollm2-135m.json --invariant --rows 6

--random-quant LAYOUT packs the layers' projections (Q4_K_M, AWQ, ...) as a quantized model's.
--timeline also profiles 20 replays of the captured graph and reports what each kernel adds to
the step: its end minus the latest end of the kernels before it (kernels launched with PDL
overlap, so their own times sum to more than the step). --variant SPEC builds the engine with a
variants.py variant's options (e.g. row_cublas+tail_off).
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
    ap.add_argument("--timeline", action="store_true", help="also each kernel's share of the replayed graph step")
    ap.add_argument("--variant", default="base", help="a variants.py variant to build the engine with")
    ap.add_argument("--random-quant", default=None, help="the layers' projections random packed weights of this "
                    "layout (Q4_K_M, AWQ, ...: benchmarks/harness/random_packed.py)")
    args = ap.parse_args()
    import dataclasses

    import torch
    from torch.profiler import ProfilerActivity, profile

    from benchmarks.harness.shapes import random_engine
    from engine.options import KernelOptions
    from variants import variant_options

    options = variant_options(args.variant, KernelOptions.from_env())
    # --invariant: the target's kernels with a draft loaded, without the draft
    options = dataclasses.replace(options, fuse=options.fuse and not args.no_fuse, batch_invariant=args.invariant)
    engine = random_engine(args.random_weights, "cuda", 4096, options, quant=args.random_quant)
    r = engine.runner
    r.capture([args.rows])
    from engine.forward_batch import ForwardBatch

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
    timeline = None
    if args.timeline:
        with profile(activities=[ProfilerActivity.CUDA]) as replays:
            for _ in range(20):
                step.replay(tok, args.context)
            torch.cuda.synchronize()
        timeline = step_shares(replays, 20, r.config.num_layers)
    rows = sorted(groups.items(), key=lambda kv: -kv[1][0])
    weight_bytes = sum(p.numel() * p.element_size() for p in r.model.parameters())
    launches = sum(v[1] for _, v in rows)
    layers = r.config.num_layers
    report = {"rows": args.rows, "invariant": args.invariant, "fused": r.model.ops.options.fuse,
              "graph_step_ms": graph_ms, "kernel_sum_ms": total / 1000, "weight_GB": weight_bytes / 1e9,
              "launches_per_step": launches, "launches_per_layer": launches / layers,
              "variant": args.variant, "quant": args.random_quant, "timeline": timeline,
              "kernels": [{"name": k, "us_per_step": v[0], "launches_per_step": v[1]} for k, v in rows[:25]]}
    print(f"{args.rows}-row step ({'fused' if r.model.ops.options.fuse else 'unfused'}"
          f"{', batch-invariant' if args.invariant else ''}): graph step {graph_ms:.3f} ms, "
          f"kernel sum {total / 1000:.3f} ms, weights {weight_bytes / 1e9:.2f} GB")
    print(f"{launches:.0f} kernel launches per step, {launches / layers:.1f} per layer ({layers} layers)")
    for k, v in rows[:15]:
        print(f"{v[0]:9.1f} us  x{v[1]:5.0f}  {k}")
    if timeline and "layer_slots" not in timeline:  # layers of different kernels (a Q4_K_M file's)
        print(f"replayed step {timeline['step_us']:.1f} us; no repeating layer: every kernel in the JSON")
    elif timeline:
        print(f"replayed step {timeline['step_us']:.1f} us; per layer slot (kernel, own us, us added to the step):")
        for slot in timeline["layer_slots"]:
            print(f"  {slot['name'][:50]:50s} {slot['us']:7.2f} {slot['added_us']:7.2f}")
        print(f"  outside the layers: {timeline['outside_added_us']:.1f} us added")
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


def step_shares(prof, replays: int, num_layers: int) -> dict | None:
    """From a profile of `replays` graph replays: each kernel's own time and the time it adds to
    the step (its end minus the latest end before it), averaged over replays 2.., and the same
    averaged over the layers for each kernel slot of a layer."""
    import torch

    evs = sorted((ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA
                  and not ev.name.startswith(("Memcpy", "Memset"))), key=lambda ev: ev.time_range.start)
    if not evs or len(evs) % replays:
        print(f"timeline: {len(evs)} kernels for {replays} replays; not reported")
        return None
    per = len(evs) // replays
    own, added = [0.0] * per, [0.0] * per
    for rep in range(1, replays):
        latest = evs[rep * per - 1].time_range.end
        for i in range(per):
            ev = evs[rep * per + i]
            own[i] += (ev.time_range.end - ev.time_range.start) / (replays - 1)
            added[i] += max(ev.time_range.end - latest, 0) / (replays - 1)
            latest = max(latest, ev.time_range.end)
    names = [evs[i].name for i in range(per)]
    period = (per - 2) // num_layers  # kernels per layer: the longest run that repeats num_layers times
    while period > 0:
        first = next((i for i in range(per - period * num_layers + 1)
                      if all(names[i + j] == names[i + j + period * m] for m in range(num_layers) for j in range(period))),
                     None)
        if first is not None:
            break
        period -= 1
    if period <= 0:
        return {"step_us": sum(added), "slots": [{"name": n, "us": o, "added_us": a} for n, o, a in zip(names, own, added)]}
    layer = range(first, first + period * num_layers)
    slots = [{"name": names[first + j],
              "us": sum(own[first + j + period * m] for m in range(num_layers)) / num_layers,
              "added_us": sum(added[first + j + period * m] for m in range(num_layers)) / num_layers}
             for j in range(period)]
    return {"step_us": sum(added), "layer_slots": slots,
            "outside_added_us": sum(a for i, a in enumerate(added) if i not in layer),
            "outside": [{"name": names[i], "us": own[i], "added_us": added[i]} for i in range(per) if i not in layer]}


if __name__ == "__main__":
    main()
