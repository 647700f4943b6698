"""The one-row packed kernel against an earlier version of itself and bf16, 8B shapes, on the GPU.

Loads the earlier engine/kernels/packed_gemv.py from a file (for example
`git show 97bfe19:engine/kernels/packed_gemv.py > before.py`) beside the current one, and times
both one-row paths (each with its own default tiles, and the current one with --tiles too) on the
Llama-3.1-8B shape's four projections, inside CUDA graphs over weight copies larger than L2, beside
the fastest bf16 one-row kernel (cuBLAS or our GEMV), all in one process. Kinds a version's
one-row kernel does not serve (its row_kernel_fits) run packed_gemv in its column.

    python benchmarks/bench_packed_row_before.py --before before.py --out row_before.json \
        [--layouts AWQ,Q4_K_M,Q4_0] [--tiles 4x4096x4x16,4x2048x4x8]   # rows x K step x warps x bytes
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import SHAPES, blocks_for, row_tile_fits  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels import packed_gemv as current  # noqa: E402
from engine.kernels.gemv import gemv  # noqa: E402
from engine.kernels.packed_gemv import RowTile, packed_gemv, packed_gemv_ref  # noqa: E402


def load_before(path: Path):
    spec = importlib.util.spec_from_file_location("packed_gemv_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def run(module, x, blocks, out, tile=None):
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        if module.row_kernel_fits(b):
            module.packed_row_gemv(x, b, None, tile, out=out[:, start:stop])
        else:
            packed_gemv(x, b, None, out=out[:, start:stop])
        start = stop
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default="AWQ,Q4_K_M,Q4_0")
    ap.add_argument("--tiles", default="")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    before = load_before(args.before)
    tiles = {"default": None}
    for t in filter(None, args.tiles.split(",")):
        bn, bk, warps, vec = (int(v) for v in t.split("x"))
        tiles[t] = RowTile(bn, bk, num_warps=warps, vec=vec)
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    x16 = torch.randn(16, 14336, device=dev, dtype=torch.bfloat16)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "before": str(args.before),
              "copy_bandwidth_GBps": bw / 1e9, "bf16_us": {}, "layouts": {}}
    for role, (n, k) in SHAPES.items():
        copies = max(1, (512 << 20) // (n * k * 2) + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x1 = x16[:1, :k]
        report["bf16_us"][role] = min(time_graph(lambda i: F.linear(x1, ws[i % copies]), args.iters, args.calls),
                                      time_graph(lambda i: gemv(x1, ws[i % copies]), args.iters, args.calls))
        del ws
        torch.cuda.empty_cache()
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {}
        for role, (n, k) in SHAPES.items():
            blocks = blocks_for(layout, role, dev, gen)
            nbytes = sum(b.nbytes for b in blocks)
            copies = max(1, (512 << 20) // nbytes + 1)
            sets = [blocks] + [blocks_for(layout, role, dev, gen) for _ in range(copies - 1)]
            x1 = x16[:1, :k]
            out1 = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            ref = torch.cat([packed_gemv_ref(x1, b) for b in blocks], dim=1).float()
            row = {"bytes": nbytes, "before_us": time_graph(lambda i: run(before, x1, sets[i % copies], out1),
                                                            args.iters, args.calls),
                   "before_max_err": float((run(before, x1, blocks, out1.clone()).float() - ref).abs().max()),
                   "tiles": {}}
            for name, tile in tiles.items():
                if tile is not None and not row_tile_fits(tile, k, blocks):
                    continue
                us = time_graph(lambda i: run(current, x1, sets[i % copies], out1, tile), args.iters, args.calls)
                err = float((run(current, x1, blocks, out1.clone(), tile).float() - ref).abs().max())
                row["tiles"][name] = {"us": us, "max_err": err, "of_copy_bandwidth": nbytes / us / 1e3 / (bw / 1e9)}
            entry[role] = row
            now = row["tiles"]["default"]
            print(f"{layout:7s} {role:8s} bf16 {report['bf16_us'][role]:7.2f} us  before {row['before_us']:7.2f}  "
                  f"now {now['us']:7.2f} ({100 * now['of_copy_bandwidth']:4.1f}% of copy)  " +
                  " ".join(f"{t}:{v['us']:.1f}" for t, v in row["tiles"].items() if t != "default"), flush=True)
            del sets
            torch.cuda.empty_cache()
        layer = {"bf16": sum(report["bf16_us"].values()), "before": sum(entry[r]["before_us"] for r in SHAPES),
                 "now": sum(entry[r]["tiles"]["default"]["us"] for r in SHAPES)}
        entry["layer_us"] = layer
        print(f"{layout:7s} layer    bf16 {layer['bf16']:7.2f} us  before {layer['before']:7.2f}  now {layer['now']:7.2f}  "
              f"({layer['before'] / layer['now']:.2f}x before, {layer['bf16'] / layer['now']:.2f}x bf16)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
