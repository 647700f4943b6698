"""Greedy speculation against plain decoding on held-out chat prompts, token for token: with the
draft loaded and speculation off (the same engine), and with no draft loaded (Engine.without_draft,
the kernels a user gets without the draft): how many answers are identical, where the first
difference is.

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
    no_draft = engine.without_draft()
    for msgs in prompts:
        engine.reset()
        plain = engine.generate(msgs, params, speculative=False).token_ids
        engine.reset()
        spec = engine.generate(msgs, params, speculative=True).token_ids
        base = no_draft.generate(msgs, params, speculative=False).token_ids
        no_draft.reset()
        rows.append({"plain_tokens": len(plain), "spec_tokens": len(spec), "identical": plain == spec,
                     "first_difference": _first_difference(plain, spec),
                     "no_draft_tokens": len(base), "identical_to_no_draft": base == spec,
                     "first_difference_from_no_draft": _first_difference(base, spec)})
    out = {"model": engine.model_name, "draft": engine.draft_name, "device": str(engine.device), "prompt_set": which,
           "max_tokens": args.max_tokens, "prompts": len(rows),
           "identical": sum(r["identical"] for r in rows),
           "identical_to_no_draft": sum(r["identical_to_no_draft"] for r in rows), "rows": rows}
    if args.out:
        Path(args.out).write_text(json.dumps(out, indent=1))
    print(f"identical {out['identical']} of {len(rows)} (no draft: {out['identical_to_no_draft']})")


def _first_difference(a: list[int], b: list[int]) -> int | None:
    """Index of the first differing token; None where the two are equal (one a prefix of the
    other: the shorter one's length)."""
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


if __name__ == "__main__":
    main()
