"""The batch-invariant packed GEMV of a quantized target with a draft loaded, per projection of the
Llama-3.1-8B shape: packed_mma_gemv (x rounded to int8, int8 tensor-core dots) beside packed_gemv
(the weights decoded to bf16, bf16 dots) at 1, 6 and 16 rows, and the one-row kernel of an engine
with no draft (packed_row_gemv with int8 x), inside CUDA graphs over weight copies larger than L2.
Each timed kernel's values are checked: packed_mma_gemv against packed_mma_ref, and the rows of its
16-row call against its 1-row calls, bit for bit. --sweep tries other tiles at 6 rows.

    python benchmarks/bench_packed_mma.py --out mma.json [--layouts Q4_K_M,AWQ] [--sweep]
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
from engine.kernels.packed_mma import MmaTile, default_mma_tile, packed_mma_gemv, packed_mma_ref  # noqa: E402

ROWS = (1, 6, 16)
# (block_n, block_k, split_k, num_warps, num_stages); split_k 0: the default's
SWEEP = [MmaTile(*c) for c in [
    (64, 128, 0, 4, 3), (64, 128, 0, 4, 4), (64, 256, 0, 4, 3), (128, 128, 0, 4, 3), (128, 128, 0, 8, 3),
    (64, 64, 0, 4, 4), (128, 256, 0, 8, 3), (64, 128, 1, 4, 3), (64, 128, 2, 4, 3), (64, 128, 4, 4, 3),
    (64, 128, 8, 4, 3), (128, 128, 2, 4, 3), (128, 128, 4, 4, 3),
]]


def run_mma(x, blocks, out, tile=None):
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        packed_mma_gemv(x, b, None, tile, out=out[:, start:stop])
        start = stop
    return out


def resolve(tile: MmaTile, n: int, k: int) -> MmaTile:
    if tile.split_k:
        return tile
    steps, tiles = k // tile.block_k, -(-n // tile.block_n)
    splits = [s for s in (1, 2, 4, 8, 16) if steps % s == 0]
    split = next((s for s in splits if tiles * s >= 512), splits[-1])
    return MmaTile(tile.block_n, tile.block_k, split, tile.num_warps, tile.num_stages)


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
            ref = torch.cat([packed_mma_ref(xk, b) for b in blocks], dim=1)
            got = run_mma(xk, blocks, out.clone())
            ones = torch.cat([run_mma(xk[i:i + 1], blocks, out[:1].clone()) for i in range(16)])
            row = {"bytes": nbytes, "mma_max_err_vs_ref": float((got.float() - ref.float()).abs().max()),
                   "ref_max": float(ref.float().abs().max()), "mma_rows_equal_1_row_calls": bool(torch.equal(got, ones)),
                   "default_tile": str(default_mma_tile(n, k)), "mma_us": {}, "gemv_us": {}, "tiles": []}
            for m in ROWS:
                xm, om = xk[:m], out[:m]
                row["mma_us"][m] = time_graph(lambda i: run_mma(xm, sets[i % copies], om), args.iters, args.calls)
                row["gemv_us"][m] = time_graph(lambda i: run_blocks(xm, sets[i % copies], om), args.iters, args.calls)
            row["row_int8_x_us"] = time_graph(lambda i: run_row(xk[:1], sets[i % copies], out[:1], None, True),
                                              args.iters, args.calls)
            row["mma_of_copy_bandwidth_1"] = nbytes / row["mma_us"][1] / 1e3 / (bw / 1e9)
            if args.sweep:
                for t in SWEEP:
                    tile = resolve(t, n, k)
                    if time.time() - t0 > args.max_seconds or k % (tile.block_k * tile.split_k):
                        continue
                    try:
                        us = time_graph(lambda i: run_mma(xk[:6], sets[i % copies], out[:6], tile), args.iters,
                                        args.calls)
                        us1 = time_graph(lambda i: run_mma(xk[:1], sets[i % copies], out[:1], tile), args.iters,
                                         args.calls)
                        g16 = run_mma(xk, blocks, out.clone(), tile)
                    except Exception as e:  # a tile this Triton cannot build: reported, skipped
                        row["tiles"].append({"tile": str(tile), "error": repr(e)[:200]})
                        continue
                    row["tiles"].append({"tile": [tile.block_n, tile.block_k, tile.split_k, tile.num_warps,
                                                  tile.num_stages], "us_6": us, "us_1": us1,
                                         "equal_default": bool(torch.equal(g16, got))})
                for tt in sorted((t for t in row["tiles"] if "us_6" in t), key=lambda t: t["us_6"])[:3]:
                    print(f"  tile {tt['tile']}: 6 rows {tt['us_6']:.2f} us, 1 row {tt['us_1']:.2f}", flush=True)
            entry[role] = row
            print(f"{layout:6s} {role:8s} mma " + " ".join(f"{m}:{row['mma_us'][m]:7.2f}" for m in ROWS)
                  + " | gemv " + " ".join(f"{m}:{row['gemv_us'][m]:7.2f}" for m in ROWS)
                  + f" | row int8 x {row['row_int8_x_us']:7.2f} us; mma err {row['mma_max_err_vs_ref']:.3g}"
                  f" of {row['ref_max']:.3g}, rows equal {row['mma_rows_equal_1_row_calls']}", flush=True)
            del sets, blocks
            torch.cuda.empty_cache()
        if len(entry) == len(SHAPES):
            layer = {"mma_us": {m: sum(entry[r]["mma_us"][m] for r in SHAPES) for m in ROWS},
                     "gemv_us": {m: sum(entry[r]["gemv_us"][m] for r in SHAPES) for m in ROWS},
                     "row_int8_x_us": sum(entry[r]["row_int8_x_us"] for r in SHAPES),
                     "bytes": sum(entry[r]["bytes"] for r in SHAPES)}
            entry["layer"] = layer
            print(f"{layout:6s} layer    mma " + " ".join(f"{m}:{layer['mma_us'][m]:7.2f}" for m in ROWS)
                  + " | gemv " + " ".join(f"{m}:{layer['gemv_us'][m]:7.2f}" for m in ROWS)
                  + f" | row int8 x {layer['row_int8_x_us']:7.2f} us", flush=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
