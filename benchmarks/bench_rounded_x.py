"""The one-row packed kernel with x rounded to int8 inside every program (int8_x, the default)
against x rounded once before the launch (RoundedX: a byte an input read, not two), per
projection of the Llama-3.1-8B shape and for a layer's four in order, on the GPU.

Each projection runs inside CUDA graphs over weight copies larger than L2, with PDL as an engine
with no draft launches it; "a layer" is qkv, o_proj, gate_up and down one after another, x
rounded for each (the rounding's own launch timed apart: an engine would fold it into the
kernel before). Outputs are checked against the weights' exact values times the rounded x.

    python benchmarks/bench_rounded_x.py --out rounded_x.json [--layouts AWQ,Q4_K_M]
        [--down-tiles 4x4096v16,4x2048v8s2 [--only-down-tiles]]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import SHAPES, weight_copies  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels.packed_gemv import RowTile, packed_row_gemv, row_tile_for, rounds_x  # noqa: E402
from engine.kernels.rounded_x import round_x  # noqa: E402
from engine.kernels.packed_rows import rounded_x  # noqa: E402
from engine.weights.grouped import dequantize_grouped  # noqa: E402


def run(x, rx, blocks, out, pdl, tile=None):
    """The projection's blocks as an engine with no draft runs them: x itself (int8_x), or rx
    (on `tile`, or each block's default)."""
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        packed_row_gemv(x if rx is None else rx, b, None, tile=tile, out=out[:, start:stop], int8_x=True, pdl=pdl)
        start = stop


def parse_tile(spec: str) -> RowTile:
    """ROWSxSTEPvBYTES[sSPLIT][wWARPS], e.g. 4x4096v16 or 4x2048v8s2: rows a program, inputs a K
    step, bytes a load, programs along K (default 1), warps a program (default 4)."""
    m = re.fullmatch(r"(\d+)x(\d+)v(\d+)(?:s(\d+))?(?:w(\d+))?", spec)
    if m is None:
        raise SystemExit(f"bench_rounded_x.py: a tile is ROWSxSTEPvBYTES[sSPLIT][wWARPS], not {spec!r}")
    return RowTile(int(m[1]), int(m[2]), split_k=int(m[4] or 1), num_warps=int(m[5] or 4), vec=int(m[3]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default="AWQ,Q4_K_M,Q4_0,Q8_0")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--pdl", type=int, default=2)
    ap.add_argument("--down-tiles", default="",
                    help="also time down on these tiles (ROWSxSTEPvBYTES[sSPLIT][wWARPS], e.g. 4x4096v16,4x2048v8s2), x rounded each way")
    ap.add_argument("--only-down-tiles", action="store_true", help="time down's tiles alone")
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "pdl": args.pdl, "layouts": {}}
    print(f"{report['device']}, copy {bw / 1e9:.0f} GB/s", flush=True)
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {}
        sets_by_role = {}
        for role, (n, k) in SHAPES.items():
            if args.only_down_tiles and role != "down":
                continue
            sets, nbytes = weight_copies(layout, role, dev, gen)
            blocks, copies = sets[0], len(sets)
            sets_by_role[role] = sets
            x = torch.randn(1, k, device=dev, dtype=torch.bfloat16, generator=gen)
            order = rounds_x(blocks[0])
            rx = round_x(x, order)
            out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            w = torch.cat([dequantize_grouped(b).float() for b in blocks])
            want = F.linear(rounded_x(x), w)
            run(x, rx, blocks, out, args.pdl)
            err = float((out.float() - want).abs().max() / want.abs().max())
            us_in = time_graph(lambda i: run(x, None, sets[i % copies], out, args.pdl), args.iters, args.calls)
            us_rx = time_graph(lambda i: run(x, rx, sets[i % copies], out, args.pdl), args.iters, args.calls)
            us_round = time_graph(lambda i: round_x(x, order), args.iters, args.calls)
            if role == "down" and args.down_tiles:
                entry["down_tiles"] = {}
                for spec in args.down_tiles.split(","):
                    tile = parse_tile(spec)
                    run(x, rx, blocks, out, args.pdl, tile)
                    tile_err = float((out.float() - want).abs().max() / want.abs().max())
                    us_t_in = time_graph(lambda i: run(x, None, sets[i % copies], out, args.pdl, tile), args.iters,
                                         args.calls)
                    us_t_rx = time_graph(lambda i: run(x, rx, sets[i % copies], out, args.pdl, tile), args.iters,
                                         args.calls)
                    entry["down_tiles"][spec] = {"us_int8_x": us_t_in, "us_rounded_x": us_t_rx,
                                                 "rel_err_vs_rounded_ref": tile_err}
                    print(f"{layout:7s} down on {spec} (default {row_tile_for(blocks[0])}): int8_x {us_t_in:7.2f} us  "
                          f"rounded before {us_t_rx:7.2f} us  rel err {tile_err:.2g}", flush=True)
            entry[role] = {"bytes": nbytes, "us_int8_x": us_in, "us_rounded_x": us_rx, "us_round_x_launch": us_round,
                           "speedup": us_in / us_rx, "rel_err_vs_rounded_ref": err,
                           "of_copy_int8_x": nbytes / us_in / 1e3 / (bw / 1e9),
                           "of_copy_rounded_x": nbytes / us_rx / 1e3 / (bw / 1e9)}
            print(f"{layout:7s} {role:8s} int8_x {us_in:7.2f} us ({100 * entry[role]['of_copy_int8_x']:4.1f}%)  "
                  f"rounded before {us_rx:7.2f} us ({100 * entry[role]['of_copy_rounded_x']:4.1f}%)  "
                  f"x{us_in / us_rx:.3f}  rounding launch {us_round:5.2f} us  rel err {err:.2g}", flush=True)
        if args.only_down_tiles:
            del sets_by_role
            continue
        xs = {role: torch.randn(1, k, device=dev, dtype=torch.bfloat16, generator=gen)
              for role, (n, k) in SHAPES.items()}
        outs = {role: torch.empty(1, n, device=dev, dtype=torch.bfloat16) for role, (n, k) in SHAPES.items()}
        rxs = {role: round_x(xs[role], rounds_x(sets_by_role[role][0][0])) for role in SHAPES}
        copies = min(len(s) for s in sets_by_role.values())

        def layer(i, rounded):
            for role in SHAPES:
                run(xs[role], rxs[role] if rounded else None, sets_by_role[role][i % copies], outs[role], args.pdl)

        us_layer_in = time_graph(lambda i: layer(i, False), args.iters, args.calls)
        us_layer_rx = time_graph(lambda i: layer(i, True), args.iters, args.calls)
        nbytes = sum(entry[r]["bytes"] for r in SHAPES)
        entry["layer"] = {"bytes": nbytes, "us_int8_x": us_layer_in, "us_rounded_x": us_layer_rx,
                          "speedup": us_layer_in / us_layer_rx,
                          "of_copy_int8_x": nbytes / us_layer_in / 1e3 / (bw / 1e9),
                          "of_copy_rounded_x": nbytes / us_layer_rx / 1e3 / (bw / 1e9)}
        print(f"{layout:7s} layer    int8_x {us_layer_in:7.2f} us ({100 * entry['layer']['of_copy_int8_x']:4.1f}%)  "
              f"rounded before {us_layer_rx:7.2f} us ({100 * entry['layer']['of_copy_rounded_x']:4.1f}%)  "
              f"x{us_layer_in / us_layer_rx:.3f}", flush=True)
        del sets_by_role
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
