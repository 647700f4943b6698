"""Two source trees of localchat (e.g. before and after a restructuring) on the same GPU, in
alternating runs: plain decoding of the 8B shape (random weights), and the demo model with no
draft loaded, with its draft loaded but speculation off, and with greedy speculation. Each run
is a fresh process whose imports come from its tree; the tokens of each prompt are compared
between the trees.

    python benchmarks/compare_trees.py --tree old=/path/to/old --tree new=. --rounds 2 --out r.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

PROMPTS = [
    "List five things to check before buying a used bicycle.",
    "Explain what a hash table is to someone who knows arrays.",
    "Write a polite email asking a neighbour to trim their hedge.",
    "How do I make a basic vinaigrette? Give the steps.",
    "What are three ways to stay focused when working from home?",
    "Describe how rain forms, in a short paragraph.",
    "Give me a packing list for a two-day city trip.",
    "Write a Python function that reverses the words in a sentence.",
]

DEMO_WORKER = r"""
import json, sys, time
from engine.engine import Engine
from engine.types import SamplingParams
prompts, draft, max_tokens, device = json.loads(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4]
e = Engine.load("demo", draft=None if draft == "default" else draft, device=device)
system = {"role": "system", "content": "You are a helpful assistant."}
modes = [("plain", False)] + ([("speculative", True)] if e.speculator is not None else [])
params = SamplingParams(max_tokens=max_tokens)
for name, spec in modes:  # warm-up
    e.generate([system, {"role": "user", "content": "Hello!"}], SamplingParams(max_tokens=16), speculative=spec)
out = {name: {"ids": [], "tokens": 0, "decode_s": 0.0, "accept": []} for name, _ in modes}
for p in prompts:
    for name, spec in modes:
        e.reset()
        r = e.generate([system, {"role": "user", "content": p}], params, speculative=spec)
        o = out[name]
        o["ids"].append(r.token_ids)
        o["tokens"] += r.stats.generated_tokens - 1  # decode_s starts after the first token
        o["decode_s"] += r.stats.decode_s
        o["accept"].append(r.stats.accept_len_mean)
print("RESULT " + json.dumps(out))
"""


def run_demo(tree: str, draft: str, max_tokens: int, device: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-c", DEMO_WORKER, json.dumps(PROMPTS), draft, str(max_tokens), device],
                       cwd=tree, env=env, capture_output=True, text=True)
    line = next((l for l in p.stdout.splitlines() if l.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"demo worker in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(line[7:])


def run_8b(tree: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tree, os.environ.get("PYTHONPATH", "")]))
    p = subprocess.run([sys.executable, "-m", "app.cli", "bench", "--random-weights", "llama-8b", "--no-peer",
                        "--json", "--prompts", "1", "--prompt-tokens", "512", "--new-tokens", "256",
                        "--device", "cuda"], cwd=tree, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"8B bench in {tree} failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout)["plain"]["decode_tok_s"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tree", action="append", required=True, metavar="NAME=PATH")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--skip-8b", action="store_true")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    trees = dict(t.split("=", 1) for t in a.tree)
    runs = {name: {"8b_plain": [], "demo_no_draft": [], "demo_draft_off": [], "demo_spec": [], "accept": []}
            for name in trees}
    ids = {}
    for r in range(a.rounds):
        for name, path in trees.items():
            t = time.perf_counter()
            if not a.skip_8b:
                runs[name]["8b_plain"].append(run_8b(path))
            nd = run_demo(path, "none", a.max_tokens, a.device)["plain"]
            d = run_demo(path, "default", a.max_tokens, a.device)
            runs[name]["demo_no_draft"].append(nd["tokens"] / nd["decode_s"])
            runs[name]["demo_draft_off"].append(d["plain"]["tokens"] / d["plain"]["decode_s"])
            runs[name]["demo_spec"].append(d["speculative"]["tokens"] / d["speculative"]["decode_s"])
            runs[name]["accept"].append(sum(d["speculative"]["accept"]) / len(PROMPTS))
            ids.setdefault(name, {"no_draft": nd["ids"], "draft_off": d["plain"]["ids"],
                                  "spec": d["speculative"]["ids"]})
            print(f"round {r} {name}: " + ", ".join(f"{k} {v[-1]:.1f}" for k, v in runs[name].items() if v)
                  + f" ({time.perf_counter() - t:.0f} s)", flush=True)
    names = list(trees)
    base = names[0]
    same = {other: {mode: [a_ == b_ for a_, b_ in zip(ids[base][mode], ids[other][mode])] for mode in ids[base]}
            for other in names[1:]}
    mean = {n: {k: (sum(v) / len(v) if v else None) for k, v in runs[n].items()} for n in names}
    report = {"trees": trees, "rounds": a.rounds, "max_tokens": a.max_tokens, "prompts": PROMPTS,
              "system_prompt": "You are a helpful assistant.", "runs": runs, "mean": mean, "same_tokens": same}
    try:
        import torch

        report["machine"] = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__}
    except Exception:
        pass
    if a.out:
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{'setting':<16}" + "".join(f"{n:>12}" for n in names) + "   ratio")
    for k in ("8b_plain", "demo_no_draft", "demo_draft_off", "demo_spec", "accept"):
        vals = [mean[n][k] for n in names]
        if None in vals:
            continue
        print(f"{k:<16}" + "".join(f"{v:>12.1f}" for v in vals) + f"   {vals[-1] / vals[0]:.3f}")
    for other, modes in same.items():
        print(f"same tokens as {base} ({other}): " + ", ".join(f"{m} {sum(v)}/{len(v)}" for m, v in modes.items()))


if __name__ == "__main__":
    main()
