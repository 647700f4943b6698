"""Where a greedy decoding step's time goes, plain and speculative, on one loaded engine.

For each greedy graph loop (plain decode; the fused EAGLE-3 iteration) it reports:
  gpu_ms    one replay, back to back with no host reads (CUDA events): the GPU's own time
  wall_ms   one step of `Engine.generate`, host included (decode seconds / steps)
with results read one replay late (read_ahead.DEPTH 2, the default) and at once (DEPTH 1), so the
host's share of a step shows as wall_ms - gpu_ms.

    python benchmarks/profile_spec.py --model demo --prompts 4 --out profile_spec.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def gpu_ms(replay, n: int = 50) -> float:
    import torch

    replay()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(n):
        replay()
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--draft-steps", type=int, default=5)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    import torch

    from benchmarks.harness.prompts import chat_prompts
    from engine import read_ahead
    from engine.engine import Engine
    from engine.types import SamplingParams

    engine = Engine.load(args.model, draft=args.draft, device="cuda", draft_steps=args.draft_steps)
    params = SamplingParams(max_tokens=args.max_tokens)
    prompts = chat_prompts(args.prompts)
    report = {"model": engine.model_name, "draft": engine.draft_name, "k": args.draft_steps,
              "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "prompts": len(prompts),
              "max_tokens": args.max_tokens, "startup_phases_s": getattr(engine, "load_phases", None), "rows": []}
    for msgs in prompts[:1]:  # warm-up
        engine.reset()
        engine.generate(msgs, params, speculative=False)
        engine.reset()
        engine.generate(msgs, params, speculative=True)
    for depth in (2, 1):
        read_ahead.DEPTH = depth
        for spec in (False, True):
            tokens = steps = 0
            secs = 0.0
            for msgs in prompts:
                engine.reset()
                r = engine.generate(msgs, params, speculative=spec)
                tokens += r.stats.generated_tokens - 1
                steps += r.stats.verify_steps if spec else r.stats.generated_tokens - 1
                secs += r.stats.decode_s
            report["rows"].append({"read_ahead_depth": depth, "speculative": spec, "tok_s": tokens / secs,
                                   "wall_ms": 1e3 * secs / max(steps, 1), "tokens_per_step": tokens / max(steps, 1)})
    read_ahead.DEPTH = 2
    step = engine.runner.graphs[1]
    report["plain_gpu_ms"] = gpu_ms(step.graph.replay)
    spec = engine.speculator
    it = getattr(spec, "fused", None)
    if it is not None and it.graph is not None:
        engine.reset()
        msgs = prompts[0]
        engine.generate(msgs, SamplingParams(max_tokens=8), speculative=True)  # leaves a valid state
        report["spec_iteration_gpu_ms"] = gpu_ms(it.graph.replay, 20)
    engine.reset()
    print(f"{'depth':>5} {'spec':>5} {'tok/s':>8} {'wall ms':>8} {'tok/step':>8}")
    for r in report["rows"]:
        print(f"{r['read_ahead_depth']:>5} {str(r['speculative']):>5} {r['tok_s']:>8.0f} {r['wall_ms']:>8.3f} "
              f"{r['tokens_per_step']:>8.2f}")
    print(f"gpu ms: plain step {report['plain_gpu_ms']:.3f}, spec iteration {report.get('spec_iteration_gpu_ms', 0):.3f}")
    print("start-up phases:", report["startup_phases_s"])
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
