"""The one-row packed kernel's K steps unrolled (the default tiles, loads into registers) against
the same steps as a loop that Triton pipelines (RowTile.stream: each step's weights copied into
shared memory some steps ahead), per projection of the Llama-3.1-8B shape and for a layer's four
in order, on the GPU.

x is rounded to int8 before each launch (RoundedX), as an engine with no draft runs it; each
projection runs inside CUDA graphs over weight copies larger than L2, with PDL. A tile that does
not fit a block (its K, its groups) leaves that block on its default. Outputs are checked against
the weights' exact values times the rounded x (with --check-bits, a streamed tile's against the
unrolled tile of the same rows and step too, bit for bit).

    python benchmarks/bench_row_stream.py --out row_stream.json [--layouts AWQ,Q4_K_M]
        [--tiles 4x1024v16w1p4,4x2048v8p3]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import SHAPES, weight_copies  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels.packed_gemv import packed_row_gemv, row_tile_for, row_tile_given, rounds_x  # noqa: E402
from engine.kernels.packed_rows import rounded_x  # noqa: E402
from engine.kernels.rounded_x import round_x  # noqa: E402
from engine.options import parse_row_tile  # noqa: E402
from engine.weights.grouped import dequantize_grouped  # noqa: E402

TILES = "4x1024v16w1p4,8x1024v16w1p3,4x1024v8w2p4,4x2048v16w2p3,4x2048v8p3,4x1024v16w1p6"


def run(rx, blocks, out, pdl, tiles):
    start = 0
    for b, tile in zip(blocks, tiles):
        stop = start + b.shape[0]
        packed_row_gemv(rx, b, None, tile=tile, out=out[:, start:stop], pdl=pdl)
        start = stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default="AWQ,Q4_K_M")
    ap.add_argument("--tiles", default=TILES, help="ROWSxSTEPvBYTES[sSPLIT][wWARPS]pSTAGES, comma-separated")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--pdl", type=int, default=2)
    ap.add_argument("--check-bits", action="store_true",
                    help="also run each streamed tile's unrolled twin and compare their outputs")
    args = ap.parse_args()
    specs = [s.strip() for s in args.tiles.split(",") if s.strip()]
    for spec in specs:
        if parse_row_tile(spec) is None:
            raise SystemExit(f"bench_row_stream.py: a tile is ROWSxSTEPvBYTES[sSPLIT][wWARPS][pSTAGES], not {spec!r}")
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "pdl": args.pdl, "layouts": {}}
    print(f"{report['device']}, copy {bw / 1e9:.0f} GB/s", flush=True)
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {}
        state = {}
        for role, (n, k) in SHAPES.items():
            sets, nbytes = weight_copies(layout, role, dev, gen)
            blocks, copies = sets[0], len(sets)
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16, generator=gen)
            rx = round_x(x, rounds_x(blocks[0]))
            out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            want = F.linear(rounded_x(x), torch.cat([dequantize_grouped(b).float() for b in blocks]))
            state[role] = (sets, rx, out, copies)
            row = entry[role] = {"bytes": nbytes, "default": [str(row_tile_for(b)) for b in blocks], "tiles": {}}
            defaults = [None] * len(blocks)
            row["us_default"] = time_graph(lambda i: run(rx, sets[i % copies], out, args.pdl, defaults),
                                           args.iters, args.calls)
            line = [f"{layout:7s} {role:8s} default {row['us_default']:7.2f} us "
                    f"({100 * nbytes / row['us_default'] / 1e3 / (bw / 1e9):4.1f}%)"]
            for spec in specs:
                tiles = [row_tile_given(b, parse_row_tile(spec)) for b in blocks]
                if all(t is None for t in tiles):
                    continue
                run(rx, blocks, out, args.pdl, tiles)
                err = float((out.float() - want).abs().max() / want.abs().max())
                same = None
                if args.check_bits:
                    got = out.clone()
                    run(rx, blocks, out, args.pdl, [t and replace(t, stream=0) for t in tiles])
                    same = bool(torch.equal(got, out))
                us = time_graph(lambda i: run(rx, sets[i % copies], out, args.pdl, tiles), args.iters, args.calls)
                row["tiles"][spec] = {"us": us, "of_copy": nbytes / us / 1e3 / (bw / 1e9),
                                      "speedup": row["us_default"] / us, "rel_err_vs_rounded_ref": err,
                                      "bits_of_unrolled": same, "blocks_on_it": sum(t is not None for t in tiles)}
                line.append(f"{spec} {us:6.2f} ({row['us_default'] / us:.2f}x{' BITS DIFFER' if same is False else ''})")
            print("  ".join(line), flush=True)

        def layer(i, spec):
            for role in SHAPES:
                sets, rx, out, copies = state[role]
                blocks = sets[i % copies]
                tiles = [None if spec is None else row_tile_given(b, parse_row_tile(spec)) for b in blocks]
                run(rx, blocks, out, args.pdl, tiles)

        nbytes = sum(entry[r]["bytes"] for r in SHAPES)
        lay = entry["layer"] = {"bytes": nbytes, "us_default": time_graph(lambda i: layer(i, None), args.iters,
                                                                           args.calls), "tiles": {}}
        line = [f"{layout:7s} layer    default {lay['us_default']:7.2f} us "
                f"({100 * nbytes / lay['us_default'] / 1e3 / (bw / 1e9):4.1f}%)"]
        for spec in specs:
            us = time_graph(lambda i: layer(i, spec), args.iters, args.calls)
            lay["tiles"][spec] = {"us": us, "speedup": lay["us_default"] / us,
                                  "of_copy": nbytes / us / 1e3 / (bw / 1e9)}
            line.append(f"{spec} {us:6.2f} ({lay['us_default'] / us:.2f}x)")
        print("  ".join(line), flush=True)
        del state
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
