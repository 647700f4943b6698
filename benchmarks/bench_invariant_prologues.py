"""Times the batch-invariant fused prologues (rms_norm_gemv, silu_mul_gemv with invariant=True)
against the unfused pairs they replace (add_rms_norm or silu_and_mul, then the invariant GEMV),
for the 8B's and SmolLM2's shapes, over a few tensor-core tiles. Microseconds per call inside a
CUDA graph of back-to-back calls on weights larger than L2 (bench_gemv.time_graph); JSON to --out.
The engine keeps these pairs apart on the invariant tiles (docs/performance.md: the prologue's work
on 16 padded rows at every K step costs more than the launch it saves); commit e3f3034 timed the
same cases with the norm moved after the dot (h200_invariant_prologues_norm_after.json).

    python benchmarks/bench_invariant_prologues.py --rows 1,6 --out inv_prologues.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_gemv import make_inputs, time_graph  # noqa: E402
from engine.kernels.activation import silu_and_mul  # noqa: E402
from engine.kernels.gemv import GemvConfig, gemv, rms_norm_gemv, silu_mul_gemv  # noqa: E402
from engine.kernels.norm import add_rms_norm  # noqa: E402
from engine.routing import invariant_tile  # noqa: E402

SHAPES = {"8b qkv": (6144, 4096, "rms"), "8b gate_up": (28672, 4096, "rms"), "8b down": (4096, 14336, "silu"),
          "smol qkv": (960, 576, "rms"), "smol gate_up": (3072, 576, "rms"), "smol down": (576, 1536, "silu")}
TILES = [GemvConfig(*c) for c in [  # (block_n, block_k, split_k, num_warps, num_stages, swap_ab)
    (64, 128, 1, 4, 3, True), (64, 64, 1, 4, 3, True), (32, 128, 1, 4, 3, True), (64, 128, 1, 8, 3, True),
    (128, 64, 1, 8, 3, True), (64, 256, 1, 4, 4, True), (16, 128, 1, 4, 4, False), (32, 64, 1, 4, 4, True),
]]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--rows", default="1,6")
    ap.add_argument("--only", default="")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=16)
    args = ap.parse_args()
    results = []
    for m in (int(r) for r in args.rows.split(",")):
        for name, (n, k, kind) in SHAPES.items():
            if args.only and not any(s in name for s in args.only.split(",")):
                continue
            inp = make_inputs(m, n, k)
            ws, x, res, nw, gu = inp["weights"], inp["x"], inp["residual"], inp["norm_weight"], inp["gate_up"]
            own = invariant_tile((n, k))
            cases = {}
            if kind == "rms":
                cases["unfused"] = lambda i: gemv(add_rms_norm(x, res, nw, 1e-5)[0], ws[i % len(ws)], config=own,
                                                  invariant=True)
                cases["gemv alone"] = lambda i: gemv(x, ws[i % len(ws)], config=own, invariant=True)
                for t in TILES:
                    cases[f"fused {t}"] = (lambda i, t=t: rms_norm_gemv(x, res, nw, 1e-5, ws[i % len(ws)], None, t,
                                                                        invariant=True))
            else:
                cases["unfused"] = lambda i: gemv(silu_and_mul(gu), ws[i % len(ws)], config=own, invariant=True)
                cases["gemv alone"] = lambda i: gemv(gu[:, :k], ws[i % len(ws)], config=own, invariant=True)
                for t in TILES:
                    cases[f"fused {t}"] = (lambda i, t=t: silu_mul_gemv(gu, ws[i % len(ws)], None, t, invariant=True))
            for label, fn in cases.items():
                try:
                    us = time_graph(fn, args.iters, args.calls)
                except Exception as exc:  # noqa: BLE001 - a tile that does not compile is reported
                    print(f"{m:2d} {name:13s} {label:60s} FAILED {type(exc).__name__}", flush=True)
                    continue
                results.append(dict(m=m, shape=name, n=n, k=k, case=label, us=us))
                print(f"{m:2d} {name:13s} {label[:80]:80s} {us:8.2f}", flush=True)
            del inp
            torch.cuda.empty_cache()
    args.out.write_text(json.dumps(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                                        results=results), indent=2))


if __name__ == "__main__":
    main()
