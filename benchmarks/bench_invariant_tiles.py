"""The batch-invariant GEMV tile against the fastest one-row kernel, shape by shape.

A draft's verify steps need a projection whose rows carry the bits of the one-row decode step
(the tensor-core tile over 16 padded rows, `invariant=True`); plain decoding is fastest on the
one-row kernels (cuBLAS, or our FMA GEMV on its M = 1 tiles). If one invariant tile per shape
runs one row about as fast as the best one-row kernel, plain decoding can run it too, and then
a verify row equals the plain step it stands for. For each shape this times the one-row
kernels and a sweep of invariant tiles (plain and swap_ab) at 1, 6 and 16 rows, inside CUDA
graphs over weight copies larger than L2 (bench_gemv.time_graph), and checks that each tile's
rows are the same bits at every row count.

    python benchmarks/bench_invariant_tiles.py --out invariant_tiles.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import SHAPES, make_inputs, time_graph  # noqa: E402
from engine.kernels.gemv import MAX_ROWS, GemvConfig, default_config, gemv  # noqa: E402
from engine.routing import invariant_tile, row_tile  # noqa: E402

# (block_n, block_k, split_k, num_warps, num_stages, swap_ab)
TILES = [GemvConfig(*c) for c in [
    (16, 256, 1, 4, 2, False), (16, 512, 1, 4, 3, False), (32, 256, 1, 4, 3, False), (16, 128, 1, 4, 4, False),
    (32, 512, 1, 8, 3, False), (64, 256, 1, 8, 3, False),
    (64, 128, 1, 4, 3, True), (64, 256, 1, 4, 3, True), (128, 128, 1, 4, 3, True), (64, 256, 1, 4, 4, True),
    (128, 256, 1, 8, 3, True), (64, 512, 1, 4, 2, True), (32, 256, 1, 4, 3, True), (16, 512, 1, 4, 3, True),
]]

# --wide: swapped tiles over block_n, block_k, warps and stages (a stage's weight tile within
# 160 KB of shared memory), for shapes where the tiles above trail the one-row kernels.
WIDE_TILES = [GemvConfig(bn, bk, 1, w, st, True) for bn in (32, 64, 128) for bk in (128, 256, 512)
              for w in (4, 8) for st in (3, 4, 5, 6) if bn * bk * 2 * st <= 160 * 1024 and bn * bk >= 8192]

# --small-warps: one and two warps (tensor-core instructions of one warp, no warpgroup), for the
# small weights where a tile's latency at one row, not bandwidth, is what it costs.
SMALL_WARP_TILES = [GemvConfig(bn, bk, 1, w, st, True) for bn in (16, 32, 64) for bk in (64, 128, 256)
                    for w in (1, 2) for st in (2, 3)]


def label(cfg: GemvConfig) -> str:
    return (f"bn{cfg.block_n} bk{cfg.block_k} sk{cfg.split_k} w{cfg.num_warps} s{cfg.num_stages}"
            + (" swap" if cfg.swap_ab else ""))


def with_split(cfg: GemvConfig, n: int, k: int) -> GemvConfig:
    """cfg with the split-K that default_config would give its column count (short N only)."""
    tiles = -(-n // max(16, cfg.block_n))
    k_blocks = -(-k // cfg.block_k)
    split = 1
    while tiles * split < 2 * 132 and split * 2 <= min(8, k_blocks):
        split *= 2
    return GemvConfig(cfg.block_n, cfg.block_k, split, cfg.num_warps, cfg.num_stages, cfg.swap_ab)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--only", default="", help="comma list of shape-name substrings")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=16)
    ap.add_argument("--max-seconds", type=float, default=400)
    ap.add_argument("--no-sweep", action="store_true", help="the engine's invariant tile only, no sweep")
    ap.add_argument("--wide", action="store_true", help="sweep WIDE_TILES (and their K splits) instead")
    ap.add_argument("--small-warps", action="store_true", help="sweep SMALL_WARP_TILES (and their K splits) instead")
    ap.add_argument("--no-each-row", action="store_true", help="skip timing the one-row kernel row by row")
    args = ap.parse_args()
    t0 = time.time()
    results = []
    names = [s for s in SHAPES if not args.only or any(o in s for o in args.only.split(","))]
    for name in names:
        n, k = SHAPES[name]
        inp = make_inputs(16, n, k)
        ws, x16 = inp["weights"], inp["x"]
        x1 = x16[:1]
        best_row = {}
        for impl, fn in [("cublas", lambda i: F.linear(x1, ws[i % len(ws)])),
                         ("gemv m1", lambda i: gemv(x1, ws[i % len(ws)])),
                         ("gemv row_tile", lambda i: gemv(x1, ws[i % len(ws)], config=row_tile(k)))]:
            best_row[impl] = time_graph(fn, args.iters, args.calls)
        row_us = min(best_row.values())
        entry = {"shape": name, "n": n, "k": k, "one_row": best_row, "one_row_best_us": row_us, "tiles": []}
        # the one-row kernel row by row (each_row), on the M = 1 tiles
        entry["each_row"] = {}
        for impl, cfg in [] if args.no_each_row else [("default", None), ("row_tile", row_tile(k))]:
            entry["each_row"][impl] = {
                m: time_graph(lambda i, m=m, c=cfg: gemv(x16[:m], ws[i % len(ws)], config=c, each_row=True),
                              args.iters, args.calls) for m in (1, 6, 16)}
        tiles = WIDE_TILES if args.wide else SMALL_WARP_TILES if args.small_warps else TILES
        cfgs = [invariant_tile((n, k))] + ([] if args.no_sweep else
                                           [default_config(MAX_ROWS, n, k)] + tiles + [with_split(c, n, k) for c in tiles])
        seen = set()
        for cfg in cfgs:
            if cfg in seen or time.time() - t0 > args.max_seconds:
                continue
            seen.add(cfg)
            try:
                out16 = gemv(x16, ws[0], config=cfg, invariant=True)
                out6 = gemv(x16[:6], ws[0], config=cfg, invariant=True)
                out1 = gemv(x1, ws[0], config=cfg, invariant=True)
                same = bool(torch.equal(out16[:6], out6) and torch.equal(out16[:1], out1))
                err = float((out16.float() - F.linear(x16, ws[0]).float()).abs().max())
                us = {m: time_graph(lambda i, m=m: gemv(x16[:m], ws[i % len(ws)], config=cfg, invariant=True),
                                    args.iters, args.calls) for m in (1, 6, 16)}
            except Exception as e:  # a tile this Triton cannot build: reported, skipped
                entry["tiles"].append({"tile": label(cfg), "error": repr(e)[:200]})
                continue
            entry["tiles"].append({"tile": label(cfg), "us_1": us[1], "us_6": us[6], "us_16": us[16],
                                   "vs_one_row": row_us / us[1], "rows_invariant": same, "max_err": err})
        ok = [t for t in entry["tiles"] if "us_1" in t]
        entry["best_m1"] = min(ok, key=lambda t: t["us_1"]) if ok else None
        results.append(entry)
        b = entry["best_m1"]
        if entry["each_row"]:
            er = entry["each_row"]["row_tile"]
            print(f"{name:14s} each_row row_tile: 1 row {er[1]:.2f} us, 6 rows {er[6]:.2f}, 16 rows {er[16]:.2f}",
                  flush=True)
        print(f"{name:14s} one-row {row_us:7.2f} us ({min(best_row, key=best_row.get)}); invariant best at 1 row: "
              f"{b['tile'] if b else '-'} {b['us_1'] if b else 0:7.2f} us (x{b['vs_one_row'] if b else 0:.3f}), "
              f"6 rows {b['us_6'] if b else 0:.2f}, 16 rows {b['us_16'] if b else 0:.2f}", flush=True)
        del inp, ws
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "results": results}, indent=1))


if __name__ == "__main__":
    main()
