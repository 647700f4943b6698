"""Programmatic dependent launch off vs on, in one process: each setting gets its own engine,
built with KernelOptions(pdl=...) (its eager launches and its graphs use it), measured in
alternating rounds (off, on, off, on) so that clock drift falls on both. Demo model with its
shipped head (plain decode and greedy speculation on held-out prompts), and with --llama-8b the
8B shape with random weights (plain decode, 512-token prompt); a config JSON (as `bench
--random-weights`) likewise. Tokens must match between the settings.

    python benchmarks/pdl.py --out pdl.json [--models demo,llama-8b,benchmarks/configs/smollm2-135m.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="demo", help="comma-separated: demo, llama-8b, or a config JSON "
                    "(random bf16 weights)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script (PDL is CUDA-only)")
    a = ap.parse_args()

    import torch

    from benchmarks.harness.compare import comparison_model
    from benchmarks.harness.timing import alternating_rounds
    from engine.options import KernelOptions

    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else a.device
    report = {"machine": {"device": gpu, "torch": torch.__version__,
                          "python": platform.python_version()}, "rounds": a.rounds, "results": {}}
    for model in [m for m in a.models.split(",") if m]:
        name = Path(model).stem if model.endswith(".json") else model
        make, workload = comparison_model(model, a.device, a.prompts)
        base = KernelOptions.from_env()
        engines = {on: make(dataclasses.replace(base, pdl=on)) for on in (False, True)}
        prompts, which, modes = workload(engines[False])
        res = {"prompt_set": which}
        for mode, spec in modes:
            speeds, tokens = alternating_rounds(engines, prompts, a.new_tokens, spec, a.rounds)
            off, on_ = statistics.mean(speeds[False]), statistics.mean(speeds[True])
            res[mode] = {"pdl_off_tok_s": round(off, 1), "pdl_on_tok_s": round(on_, 1), "ratio": round(on_ / off, 4),
                         "rounds_off": [round(x, 1) for x in speeds[False]],
                         "rounds_on": [round(x, 1) for x in speeds[True]],
                         "same_tokens": tokens[False] == tokens[True]}
            print(f"{name:9s} {mode:12s} off {off:8.1f} tok/s  on {on_:8.1f} tok/s  x{on_ / off:.3f}  "
                  f"same tokens: {tokens[False] == tokens[True]}", flush=True)
        report["results"][name] = res
        del engines
        if a.device == "cuda":
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
