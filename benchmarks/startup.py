"""Start-up to first token as a user meets it: `localchat run` in a fresh process, timed from
before the process starts until the first byte of the answer arrives on its stdout (first_token_s),
and until the process has exited after a two-token answer (exit_s).

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
    cmd = [sys.executable, "-m", "app.cli", "run", "--model", args.model, "--max-tokens", "2"]
    cmd += ["--draft", args.draft] if args.draft else []
    cmd += ["--device", args.device] if args.device else []
    runs = []
    for i in range(args.runs):
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd + ["Say hello."], stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)
        first = proc.stdout.read(1)
        t_first = time.perf_counter() - t0
        out, err = proc.stdout.read(), proc.stderr.read()  # the rest (stderr is a few short lines)
        proc.wait()
        t_exit = time.perf_counter() - t0
        if proc.returncode != 0 or not first:
            raise SystemExit(f"run {i + 1} failed: {err.decode(errors='replace').strip().splitlines()[-1:]}")
        runs.append({"first_token_s": t_first, "exit_s": t_exit, "text": (first + out).decode(errors="replace").strip()})
        print(f"run {i + 1}: first token after {t_first:.2f} s, exit after {t_exit:.2f} s")
    report = {"model": args.model, "device": args.device, "python": platform.python_version(), "runs": runs,
              "best_later_run_s": min(r["first_token_s"] for r in runs[1:]) if len(runs) > 1 else None}
    if args.out:
        Path(args.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
