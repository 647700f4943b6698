"""Where a draft-tree step's time goes (speculative/eagle3/tree_loop.py): the whole step as the
app runs it (its CUDA graph where one is captured), then the same step eagerly by phase: the
growth (the draft's steps over the tree), the target's verify forwards, the acceptance, and the
rest (the K/V moves and the draft-extend), per verify step, on one loaded engine; with the kernels launched a
step and their summed GPU time from one profiled step on CUDA, so that launch- and host-bound
time shows beside the GPU's own. JSON to --out.

    python benchmarks/profile_tree.py --model demo --tree 4,5,24 --prompts 3 --new-tokens 96 --out tree.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PROMPTS = ("Give me three ideas for a rainy afternoon at home.",
           "How do I reverse a string in JavaScript?",
           "Summarize what a hash table is in a short paragraph.",
           "Write a haiku about autumn leaves.")


def main() -> None:
    import torch

    import speculative.eagle3.tree_loop as tree_loop
    from engine.engine import Engine
    from engine.types import SamplingParams
    from speculative.tree.shape import parse_tree

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--tree", default="4,5,24")
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    engine = Engine.load(args.model, draft=args.draft, device=args.device)
    if engine.speculator is None or not hasattr(engine.speculator, "set_tree"):
        sys.exit("profile_tree needs an EAGLE-3 draft head")
    engine.set_tree(parse_tree(args.tree))
    cuda = engine.device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    spent: dict[str, float] = defaultdict(float)
    steps = [0]

    @contextmanager
    def phase(name: str):
        sync()
        t = time.perf_counter()
        yield
        sync()
        spent[name] += time.perf_counter() - t

    def timed(fn, name):
        def wrapper(*a, **kw):
            with phase(name):
                return fn(*a, **kw)
        return wrapper

    grow, body = tree_loop.TreeDrafting._grow, tree_loop.TreeDrafting._body
    accept = tree_loop.greedy_tree_path
    capture = tree_loop.TreeDrafting.capture

    def counted_body(self, *a, **kw):
        model = self.runner.model
        forward = model.forward
        model.forward = timed(forward, "verify forwards")  # the only target forwards of a step
        try:
            steps[0] += 1
            with phase("step"):
                return body(self, *a, **kw)
        finally:
            del model.forward

    params = SamplingParams(max_tokens=args.new_tokens)
    system = {"role": "system", "content": "You are a helpful assistant."}

    def answers() -> tuple[int, int, float]:
        """The prompts' answers: (tokens, verify steps, seconds)."""
        tokens = verify = 0
        sync()
        t = time.perf_counter()
        for prompt in PROMPTS[:args.prompts]:
            engine.reset()
            stats = engine.generate([system, {"role": "user", "content": prompt}], params).stats
            tokens, verify = tokens + stats.generated_tokens, verify + stats.verify_steps
        sync()
        return tokens, verify, time.perf_counter() - t

    # the step's graph where the device has one (captured in the warm-up), timed whole
    engine.generate([system, {"role": "user", "content": "Hello!"}], SamplingParams(max_tokens=16))  # warm-up
    tokens, verify, seconds = answers()
    graphed = {"tokens": tokens, "verify_steps": verify, "seconds": seconds, "tok_s": tokens / seconds,
               "ms_per_step": 1e3 * seconds / max(1, verify),
               "captured": any(t.graphs for t in engine.speculator._tree_steps.values())}
    # the same step eagerly, by phase
    tree_loop.TreeDrafting._grow = timed(grow, "growth")
    tree_loop.TreeDrafting._body = counted_body
    tree_loop.TreeDrafting.capture = lambda self, kv_len, kind: False
    tree_loop.greedy_tree_path = timed(accept, "acceptance")
    spent.clear()
    steps[0] = 0
    tokens, _, seconds = answers()
    tree_loop.TreeDrafting._grow, tree_loop.TreeDrafting._body = grow, body
    tree_loop.TreeDrafting.capture, tree_loop.greedy_tree_path = capture, accept
    per_step = {name: 1e3 * s / max(1, steps[0]) for name, s in spent.items()}
    per_step["rest (K/V moves, draft-extend)"] = (per_step.get("step", 0.0) - per_step.get("growth", 0.0)
                                                  - per_step.get("verify forwards", 0.0)
                                                  - per_step.get("acceptance", 0.0))
    report = {"model": engine.model_name, "draft": engine.draft_name, "tree": args.tree, "device": engine.device,
              "graph": graphed, "eager": {"verify_steps": steps[0], "tokens": tokens, "tok_s": tokens / seconds,
                                          "ms_per_step": per_step}}
    if cuda:  # eager steps under the profiler: the kernels a step launches (its graph replays them)
        from torch.profiler import ProfilerActivity, profile

        tree_loop.TreeDrafting.capture = lambda self, kv_len, kind: False
        engine.reset()
        before = steps[0]
        tree_loop.TreeDrafting._body = counted_body
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            engine.generate([system, {"role": "user", "content": PROMPTS[0]}], SamplingParams(max_tokens=32))
        tree_loop.TreeDrafting.capture, tree_loop.TreeDrafting._body = capture, body
        profiled = max(1, steps[0] - before)
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        names: dict[str, int] = defaultdict(int)
        for e in kernels:
            names[e.name[:60]] += 1
        report["profiled"] = {"verify_steps": profiled, "kernels": len(kernels),
                              "kernel_ms": sum(e.device_time_total for e in kernels) / 1e3,
                              "by_name_per_step": {k: v / profiled for k, v in
                                                   sorted(names.items(), key=lambda kv: -kv[1])[:40]},
                              "note": "an answer's prefill and plain steps are counted too"}
        print(f"profiled: {len(kernels) / profiled:.0f} kernels a verify step (prefill included)")
        for k, v in list(report["profiled"]["by_name_per_step"].items())[:25]:
            print(f"  {v:7.1f}  {k}")
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{'whole step' + (' (graph)' if graphed['captured'] else '  (eager)'):34s} "
          f"{graphed['ms_per_step']:8.2f} ms a verify step, {graphed['tok_s']:.1f} tok/s")
    for name, ms in per_step.items():
        print(f"{'eager: ' + name:34s} {ms:8.2f} ms a verify step")
    print(f"{steps[0]} eager verify steps, {tokens} tokens")


if __name__ == "__main__":
    main()
