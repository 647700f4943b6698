"""How much more a sampled verify step could accept with a second candidate at each draft position.

At every verify step of `localchat bench` at temperature T (CPU: the acceptance runs through
the torch reference), this records for each draft position, from the target's distribution p and
the draft's q there:

    one        sum_v min(p(v), q(v)): the chance the drawn draft is kept (what the chain gets)
    two        the chance that the draft, or else its runner-up (drawn from q without it, kept by
               a second rejection-sampling round against the residual), is kept; exact, summed
               over the draft's likeliest refused tokens
    top1..top3 p's mass on q's 1, 2, 3 likeliest tokens: what siblings taken as the draft's top-k
               (not drawn) give, the rule of the sampled trees

Position 1 is exact (its draft came from the head's own state after the verify); later ones are
measured along the drafts actually drawn.

    python benchmarks/runner_up_overlap.py --prompts 4 --new-tokens 96 --out overlap.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.sampled_steps import bench_observing_acceptance  # noqa: E402

REFUSED = 256  # refused first draws summed exactly for the second round (the rest carry ~no mass)


def overlaps(p: torch.Tensor, q: torch.Tensor) -> list[float]:
    """[one, two, top1, top2, top3] for one position: p (V,) and q (V,) in float64."""
    one = torch.minimum(p, q).sum()
    residual = (p - q).clamp_min(0)
    mass = residual.sum()
    refused = (q - p).clamp_min(0)  # the chance each token is drawn and then refused
    two = one
    if mass > 1e-12:
        top = torch.topk(refused, min(REFUSED, refused.shape[0])).indices
        scale = 1.0 / (1.0 - q[top]).clamp_min(1e-12)  # q without the refused token, renormalized
        second = torch.minimum(scale[:, None] * q[None, :], (residual / mass)[None, :]).sum(1)
        two = one + (refused[top] * second).sum()
    best = torch.cumsum(p[torch.topk(q, 3).indices], 0)
    return [float(one), float(two), *[float(x) for x in best]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    args = ap.parse_args()

    rows: list[list[float]] = []

    def record(p, drafts, q, to_draft, targets):
        k = q.shape[0]
        full = torch.zeros(k, p.shape[1], dtype=torch.float64)
        full[:, targets] = q.double()
        for i in range(k):
            rows.append([i + 1, *overlaps(p[i].double(), full[i])])

    bench_observing_acceptance(record, args.temperature, args.prompts_file, args.prompts, args.new_tokens)
    if not rows:
        raise SystemExit("no verify step went through the reference acceptance")
    t = torch.tensor(rows)
    names = ("one", "two", "top1", "top2", "top3")
    report = {"temperature": args.temperature, "prompts": args.prompts, "new_tokens": args.new_tokens,
              "verify_steps": int((t[:, 0] == 1).sum()), "by_position": {}}
    for pos in sorted({int(x) for x in t[:, 0]}):
        sel = t[t[:, 0] == pos][:, 1:].mean(0)
        report["by_position"][str(pos)] = {n: round(float(v), 4) for n, v in zip(names, sel)}
        print(f"position {pos}: " + "  ".join(f"{n} {float(v):.4f}" for n, v in zip(names, sel)), file=sys.stderr)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
