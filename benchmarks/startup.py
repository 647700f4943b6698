"""Start-up to first token as a user meets it: `localchat run` in a fresh process, timed from
before the process starts until the first token arrives (the wall time of a one-token answer,
so exit is included; the first token's own time is reported too).

The first run may fill caches (the demo's prepared folder, the verified tokenizer, Triton's
kernel cache); the issue's figure is a later run with the weights in the page cache.

    python benchmarks/startup.py --model demo [--device cuda] [--runs 3] --out startup.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None)
    ap.add_argument("--device", default=None)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cmd = [sys.executable, "-m", "app.cli", "run", "--json", "--model", args.model, "--max-tokens", "1"]
    cmd += ["--draft", args.draft] if args.draft else []
    cmd += ["--device", args.device] if args.device else []
    runs = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        res = subprocess.run(cmd + ["Hi"], capture_output=True, text=True, cwd=ROOT)
        wall = time.perf_counter() - t0
        if res.returncode != 0:
            raise SystemExit(f"run {i + 1} failed: {res.stderr.strip().splitlines()[-1:]}")
        stats = json.loads(res.stdout)["stats"]
        runs.append({"wall_s": wall, "ttft_s": stats["ttft_s"], "draft": json.loads(res.stdout)["draft"]})
        print(f"run {i + 1}: {wall:.2f} s to the first token and exit (prefill + first token {stats['ttft_s'] * 1000:.0f} ms)")
    report = {"model": args.model, "device": args.device, "python": platform.python_version(), "runs": runs,
              "best_later_run_s": min(r["wall_s"] for r in runs[1:]) if len(runs) > 1 else None}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
