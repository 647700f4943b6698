"""Runs the first-load measurement behind Engine.speculation_pays (engine/spec_pays.py) for a
model and each of its drafts, from a clean cache entry, and writes the cache's entries (speculation
and plain decoding without the draft, tokens/s, and their ratio) as JSON:

    python benchmarks/spec_pays.py --model demo --drafts demo-eagle3,demo-mtp --out spec_pays.json
    python benchmarks/spec_pays.py --drafts demo-eagle3 --repeat 5 --out cpu.json   # on a CPU: the verdict's spread

With --repeat N each draft is measured N times, each from an empty cache (the CPU's measurement
is noisy near its 1.1x bar); the report keeps every run under "runs", and in how many it said on.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine import spec_pays  # noqa: E402
from engine.engine import Engine  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--drafts", default="demo-eagle3,demo-mtp")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--repeat", type=int, default=1, help="measurements per draft, each from an empty cache")
    args = ap.parse_args()
    if args.repeat < 1:
        sys.exit(f"--repeat must be at least 1, got {args.repeat}")
    report = {}
    for draft in args.drafts.split(","):
        engine = Engine.load(args.model, draft=draft)
        runs = []
        settings = spec_pays.draft_settings(engine)
        for _ in range(args.repeat):
            cache = Path(tempfile.mkdtemp()) / "speculation-calibration.json"  # never the user's cache
            began = time.perf_counter()
            pays, reason = spec_pays.verdict(engine, settings, cache)
            seconds = time.perf_counter() - began
            entry = json.loads(cache.read_text())[spec_pays.cache_key(engine, settings)]
            runs.append(dict(entry, pays=pays, reason=reason, seconds=seconds))
            print(f"{draft} on {engine.device}: {'on' if pays else 'off: ' + reason} (spec {entry['spec']:.1f} "
                  f"tok/s, plain {entry['plain']:.1f} tok/s without the draft; {seconds:.1f} s)", flush=True)
        report[draft] = runs[0] if args.repeat == 1 else {"on_in": sum(r["pays"] for r in runs), "runs": runs}
        del engine
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
