"""A quantized model's answers with its weights decoded in place (packed) against the same weights
dequantized to bf16 at load: greedy tokens compared answer by answer, and plain decode speed.

Two engines in one process, no draft, alternating per prompt; each prompt is a user turn under
the app's default system prompt, answers end at EOS (at most --new-tokens).

    python benchmarks/packed_quality.py --model demo --prompts-file benchmarks/prompts/unseen_requests.txt \
        --out packed_quality.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.settings import Settings  # noqa: E402
from engine import Engine  # noqa: E402
from engine.options import KernelOptions  # noqa: E402
from engine.types import SamplingParams  # noqa: E402


def answer(engine: Engine, prompt: str, new_tokens: int) -> tuple[list[int], float]:
    messages = [{"role": "system", "content": Settings().system_prompt}, {"role": "user", "content": prompt}]
    ids: list[int] = []
    t_first = None
    torch.cuda.synchronize()
    for ev in engine.stream(messages, SamplingParams(max_tokens=new_tokens)):
        ids.extend(ev.token_ids)
        if t_first is None and ids:
            torch.cuda.synchronize()
            t_first = time.perf_counter()
    torch.cuda.synchronize()
    return ids, (len(ids) - 1) / (time.perf_counter() - t_first) if len(ids) > 1 else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--prompts-file", type=Path, required=True)
    ap.add_argument("--prompts", type=int, default=None)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    prompts = [p.strip() for p in args.prompts_file.read_text().splitlines() if p.strip()][:args.prompts]
    base = KernelOptions.from_env()
    packed = Engine.load(args.model, options=dataclasses.replace(base, packed_weights=True))
    bf16 = Engine.load(args.model, options=dataclasses.replace(base, packed_weights=False))
    assert packed.runs_as != "bf16" and bf16.runs_as == "bf16", (packed.runs_as, bf16.runs_as)
    for engine in (packed, bf16):
        answer(engine, prompts[0], 16)  # warm-up
    rows, speed = [], {"packed": [], "bf16": []}
    for i, prompt in enumerate(prompts):
        order = [("packed", packed), ("bf16", bf16)][:: 1 if i % 2 == 0 else -1]
        got = {}
        for name, engine in order:
            got[name], tok_s = answer(engine, prompt, args.new_tokens)
            speed[name].append((len(got[name]) - 1, (len(got[name]) - 1) / tok_s if tok_s else 0.0))
        a, b = got["packed"], got["bf16"]
        first = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))
        rows.append({"prompt": prompt, "same": a == b, "first_difference": first, "tokens": [len(a), len(b)]})
        print(f"{i:2d} {'same' if a == b else f'differ at {first}':>14s}  {len(a):4d} / {len(b):4d} tokens", flush=True)
    tok_s = {k: sum(n for n, _ in v) / max(1e-9, sum(t for _, t in v)) for k, v in speed.items()}
    report = {"model": args.model, "weights": packed.weights, "runs_as": {"packed": packed.runs_as, "bf16": bf16.runs_as},
              "device": torch.cuda.get_device_name(), "torch": torch.__version__, "new_tokens": args.new_tokens,
              "prompts_file": str(args.prompts_file), "same": sum(r["same"] for r in rows), "prompts": len(rows),
              "tok_s": tok_s, "packed_vs_bf16": tok_s["packed"] / tok_s["bf16"], "answers": rows}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"same answers {report['same']} of {len(rows)}; plain decode packed {tok_s['packed']:.1f} tok/s, "
          f"bf16 {tok_s['bf16']:.1f} (x{report['packed_vs_bf16']:.3f})")


if __name__ == "__main__":
    main()
