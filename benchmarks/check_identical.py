"""Greedy speculation against plain decoding on held-out chat prompts, same engine, token for
token: how many of the answers are identical and where the first difference is.

    python benchmarks/check_identical.py --draft demo-eagle3 --prompts 16 --out identical.json
    python benchmarks/check_identical.py --prompt-set instruct --prompts 8 --out identical_instruct.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--prompt-set", choices=["chitchat", "instruct"], default="chitchat")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()

    from benchmarks.harness.prompts import chat_prompts_from
    from engine.engine import Engine
    from engine.types import SamplingParams

    engine = Engine.load(args.model, draft=args.draft, device=args.device)
    params = SamplingParams(max_tokens=args.max_tokens)
    rows = []
    prompts, which = chat_prompts_from(args.prompts, args.prompt_set)
    for msgs in prompts:
        engine.reset()
        plain = engine.generate(msgs, params, speculative=False).token_ids
        engine.reset()
        spec = engine.generate(msgs, params, speculative=True).token_ids
        rows.append({"plain_tokens": len(plain), "spec_tokens": len(spec), "identical": plain == spec,
                     "first_difference": next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)})
    out = {"model": engine.model_name, "draft": engine.draft_name, "device": str(engine.device), "prompt_set": which,
           "max_tokens": args.max_tokens, "prompts": len(rows),
           "identical": sum(r["identical"] for r in rows), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"identical {out['identical']} of {len(rows)}")


if __name__ == "__main__":
    main()
