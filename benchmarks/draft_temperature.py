"""How much a sampled verify step could accept with the draft drawn at another temperature.

Speculative sampling stays lossless whatever distribution q the drafts are drawn from; each draft
is kept with probability sum_v min(p(v), q(v)) (p: the target's distribution, here at the
request's temperature T). localchat draws an EAGLE-3 head's drafts at T as well. This runs
`localchat bench` at temperature T and, at every verify step, re-tempers each draft
distribution to T' (q' proportional to q^(T / T'), the head's logits over T') and records that
overlap with the step's p, per draft position, for several T' / T. Position 1 is exact (its
draft came from the head's own state after the verify); later positions are measured along the
drafts actually drawn at T.

    python benchmarks/draft_temperature.py --device cpu --prompts 4 --new-tokens 96 --out dt.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.harness.sampled_steps import bench_observing_acceptance  # noqa: E402

RATIOS = (0.6, 0.7, 0.8, 0.9, 1.0, 1.1, 1.25, 1.5)  # T' / T


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=96)
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    args = ap.parse_args()

    overlaps = {r: [] for r in RATIOS}

    def record(p, drafts, q, to_draft, targets):
        # p: (k + 1, V) the target's rows; q: (k, Dv) the drafts' distributions over the draft
        # vocabulary, whose ids map to the target's by `targets`
        k = q.shape[0]
        for ratio in RATIOS:
            q_t = torch.softmax(q.clamp_min(1e-30).log() / ratio, dim=-1)
            full = torch.zeros(k, p.shape[1], dtype=p.dtype, device=p.device)
            full[:, targets] = q_t
            overlaps[ratio].append(torch.minimum(p[:k], full).sum(-1).tolist())

    bench_observing_acceptance(record, args.temperature, args.prompts_file, args.prompts, args.new_tokens,
                               args.device)
    if not overlaps[1.0]:
        raise SystemExit("no verify step went through the reference acceptance (on a GPU, temperature alone "
                         "takes the fused kernels): run with --device cpu")
    report = {"temperature": args.temperature, "device": args.device, "prompts": args.prompts,
              "new_tokens": args.new_tokens, "verify_steps": len(overlaps[1.0]), "by_ratio": {}}
    for ratio, rows in overlaps.items():
        t = torch.tensor(rows)
        report["by_ratio"][str(ratio)] = {"position_1": float(t[:, 0].mean()),
                                          "by_position": [float(x) for x in t.mean(0)]}
        print(f"T'/T {ratio:4.2f}: position 1 {t[:, 0].mean():.4f}, by position "
              f"{[round(float(x), 4) for x in t.mean(0)]}", file=sys.stderr)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
