"""The batch-invariant packed GEMV of a quantized target with a draft loaded, per projection of the
Llama-3.1-8B shape: packed_rows_gemv (x rounded to int8, dp4a; its rounding launch included, once a
projection as PackedLinear runs it) beside packed_gemv (the weights decoded to bf16, tensor-core
dots) at 1, 6 and 16 rows, and the one-row kernel of an engine with no draft (packed_row_gemv with
int8 x), inside CUDA graphs over weight copies larger than L2. Each timed kernel's values are
checked: packed_rows_gemv against packed_rows_ref, and the rows of its 16-row call against its
1-row calls, bit for bit. --sweep tries other tiles at 6 rows.

    python benchmarks/bench_packed_rows.py --out rows.json [--layouts Q4_K_M,AWQ] [--sweep]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import SHAPES, blocks_for, run_blocks, run_row  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels.packed_rows import (  # noqa: E402
    RowsTile, default_rows_tile, nibble_order, packed_rows_gemv, packed_rows_ref, quantize_rows,
)

ROW_COUNTS = (1, 6, 16)
# (block_n, lanes, split_k, unroll, num_warps, num_stages)
SWEEP = [RowsTile(*c) for c in [
    (64, 8, 1, 1, 4, 3), (32, 8, 1, 1, 4, 3), (128, 4, 1, 1, 4, 3), (4, 32, 1, 1, 4, 3),
]]


def run_rows(x, blocks, out, tile=None):
    """As PackedLinear runs a batch-invariant step: x rounded once for the blocks of one word order."""
    rounded = {}
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        order = nibble_order(b)
        if order not in rounded:
            rounded[order] = quantize_rows(x, order)
        packed_rows_gemv(x, b, None, tile, out=out[:, start:stop], xq=rounded[order])
        start = stop
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default="Q4_K_M,AWQ,Q4_0,Q8_0,Q6_K")
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=300)
    args = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    x16 = torch.randn(16, 14336, device=dev, dtype=torch.bfloat16)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "layouts": {}}
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {}
        for role, (n, k) in SHAPES.items():
            if time.time() - t0 > args.max_seconds:
                break
            blocks = blocks_for(layout, role, dev, gen)
            nbytes = sum(b.nbytes for b in blocks)
            copies = max(1, (512 << 20) // nbytes + 1)
            sets = [blocks] + [blocks_for(layout, role, dev, gen) for _ in range(copies - 1)]
            xk = x16[:, :k]
            out = torch.empty(16, n, device=dev, dtype=torch.bfloat16)
            ref = torch.cat([packed_rows_ref(xk, b) for b in blocks], dim=1)
            got = run_rows(xk, blocks, out.clone())
            ones = torch.cat([run_rows(xk[i:i + 1], blocks, out[:1].clone()) for i in range(16)])
            row = {"bytes": nbytes, "rows_max_err_vs_ref": float((got.float() - ref.float()).abs().max()),
                   "ref_max": float(ref.float().abs().max()), "rows_equal_1_row_calls": bool(torch.equal(got, ones)),
                   "default_tile": str(default_rows_tile(n, k)), "rows_us": {}, "gemv_us": {}, "tiles": []}
            for m in ROW_COUNTS:
                xm, om = xk[:m], out[:m]
                row["rows_us"][m] = time_graph(lambda i: run_rows(xm, sets[i % copies], om), args.iters, args.calls)
                row["gemv_us"][m] = time_graph(lambda i: run_blocks(xm, sets[i % copies], om), args.iters, args.calls)
            row["row_int8_x_us"] = time_graph(lambda i: run_row(xk[:1], sets[i % copies], out[:1], None, True),
                                              args.iters, args.calls)
            row["rows_of_copy_bandwidth_1"] = nbytes / row["rows_us"][1] / 1e3 / (bw / 1e9)
            if args.sweep:
                for tile in SWEEP:
                    if time.time() - t0 > args.max_seconds or (k // 32) % tile.split_k:
                        continue
                    try:
                        us = time_graph(lambda i: run_rows(xk[:6], sets[i % copies], out[:6], tile), args.iters,
                                        args.calls)
                        us1 = time_graph(lambda i: run_rows(xk[:1], sets[i % copies], out[:1], tile), args.iters,
                                         args.calls)
                        g16 = run_rows(xk, blocks, out.clone(), tile)
                    except Exception as e:  # a tile this Triton cannot build: reported, skipped
                        row["tiles"].append({"tile": str(tile), "error": repr(e)[:200]})
                        continue
                    row["tiles"].append({"tile": [tile.block_n, tile.lanes, tile.split_k, tile.unroll,
                                                  tile.num_warps, tile.num_stages], "us_6": us, "us_1": us1,
                                         "equal_default": bool(torch.equal(g16, got))})
                for tt in sorted((t for t in row["tiles"] if "us_6" in t), key=lambda t: t["us_6"])[:3]:
                    print(f"  tile {tt['tile']}: 6 rows {tt['us_6']:.2f} us, 1 row {tt['us_1']:.2f}", flush=True)
            entry[role] = row
            print(f"{layout:6s} {role:8s} rows " + " ".join(f"{m}:{row['rows_us'][m]:7.2f}" for m in ROW_COUNTS)
                  + " | gemv " + " ".join(f"{m}:{row['gemv_us'][m]:7.2f}" for m in ROW_COUNTS)
                  + f" | row int8 x {row['row_int8_x_us']:7.2f} us; rows err {row['rows_max_err_vs_ref']:.3g}"
                  f" of {row['ref_max']:.3g}, rows equal {row['rows_equal_1_row_calls']}", flush=True)
            del sets, blocks
            torch.cuda.empty_cache()
        if len(entry) == len(SHAPES):
            layer = {"rows_us": {m: sum(entry[r]["rows_us"][m] for r in SHAPES) for m in ROW_COUNTS},
                     "gemv_us": {m: sum(entry[r]["gemv_us"][m] for r in SHAPES) for m in ROW_COUNTS},
                     "row_int8_x_us": sum(entry[r]["row_int8_x_us"] for r in SHAPES),
                     "bytes": sum(entry[r]["bytes"] for r in SHAPES)}
            entry["layer"] = layer
            print(f"{layout:6s} layer    rows " + " ".join(f"{m}:{layer['rows_us'][m]:7.2f}" for m in ROW_COUNTS)
                  + " | gemv " + " ".join(f"{m}:{layer['gemv_us'][m]:7.2f}" for m in ROW_COUNTS)
                  + f" | row int8 x {layer['row_int8_x_us']:7.2f} us", flush=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
