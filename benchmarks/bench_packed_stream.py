"""The one-row packed kernel launched persistent, against a program a tile, on the GPU.

For each layout and each of the Llama-3.1-8B shape's four layer projections (random packed
weights, benchmarks/bench_packed.py's blocks, weight copies larger than L2, inside CUDA graphs),
times packed_row_gemv with x rounded to int8 (an engine with no draft) at its default tile, then
the same tile launched persistent: `programs` a multiprocessor, each looping over the tiles and
requesting its next tile's weights into L2 first (RowTile.programs, .prefetch), and with PDL.
Last, a layer's four projections one after another in one graph, as a decode step runs them
(where PDL can overlap one launch with the next). Every variant's outputs are checked bit for
bit against the default launch's.

    python benchmarks/bench_packed_stream.py --out stream.json [--layouts AWQ,Q4_K_M] [--programs 1,2,4,8]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import SHAPES, blocks_for  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels.packed_gemv import (  # noqa: E402
    blocks_fit_one_launch, packed_row_gemv, packed_row_gemv_blocks, row_tile_for,
)


def run_projection(x, blocks, out, programs: int, prefetch: int = 1, pdl: bool = False, regs: int = 0):
    """One projection's one-row step as the engine runs it (two blocks in one launch where they
    fit), int8 x."""
    if blocks_fit_one_launch(blocks):
        cut = blocks[0].shape[0]
        packed_row_gemv_blocks(x, blocks, [None, None], [out[:, :cut], out[:, cut:]], int8_x=True,
                               programs=programs, pdl=pdl, prefetch=prefetch)
        return out
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        tile = dataclasses.replace(row_tile_for(b), programs=programs, prefetch=prefetch, pdl=pdl,
                                   max_registers=regs if b.shape[1] <= 4096 else 0)
        packed_row_gemv(x, b, None, tile, out=out[:, start:stop], int8_x=True)
        start = stop
    return out


PREFETCH_NAMES = {0: "no prefetch", 1: "lines", 2: "bulk"}


def variants(programs: list[int]) -> list[dict]:
    """A program a tile, then persistent launches: prefetching each next tile a line at a time,
    in bulk or not at all, with PDL, and capped at 96 registers a thread where K is one step (the
    loop keeps more live than a program a tile)."""
    def v(p, prefetch, pdl=False, regs=0):
        name = f"{p}/SM {PREFETCH_NAMES[prefetch]}" + (" pdl" if pdl else "") + (f" r{regs}" if regs else "")
        return dict(name=name, programs=p, prefetch=prefetch, pdl=pdl, regs=regs)

    mid = programs[len(programs) // 2]
    out = [dict(name="a program a tile", programs=0, prefetch=1, pdl=False, regs=0)]
    out += [v(p, 1) for p in programs] + [v(p, 2) for p in programs[1:]] + [v(mid, 0)]
    out += [v(p, 2, pdl=True) for p in programs[1:3]] + [v(p, 2, regs=96) for p in programs[2:]]
    out += [v(mid, 2, pdl=True, regs=96)]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default="AWQ,Q4_K_M")
    ap.add_argument("--programs", default="1,2,4,8")
    ap.add_argument("--few", action="store_true", help="only the default launch, 2, 4 and 8 a multiprocessor "
                    "with bulk prefetch, and 4 by lines, with PDL or capped at 96 registers")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    x16 = torch.randn(16, 14336, device=dev, dtype=torch.bfloat16)
    vs = variants([int(p) for p in args.programs.split(",")])
    if args.few:
        keep = {"a program a tile", "4/SM lines", "2/SM bulk", "4/SM bulk", "8/SM bulk", "4/SM bulk pdl",
                "4/SM bulk r96"}
        vs = [v for v in vs if v["name"] in keep]
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "variants": vs, "layouts": {}}
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {"roles": {}}
        sets_of = {}
        for role, (n, k) in SHAPES.items():
            blocks = blocks_for(layout, role, dev, gen)
            nbytes = sum(b.nbytes for b in blocks)
            copies = max(1, (512 << 20) // nbytes + 1)
            sets = [blocks] + [blocks_for(layout, role, dev, gen) for _ in range(copies - 1)]
            sets_of[role] = (sets, nbytes)
            x1 = x16[:1, :k]
            out1 = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            want = run_projection(x1, blocks, out1.clone(), 0)
            rows = []
            for v in vs:
                got = run_projection(x1, blocks, out1.clone(), v["programs"], v["prefetch"], v["pdl"], v["regs"])
                us = time_graph(lambda i: run_projection(x1, sets[i % copies], out1, v["programs"], v["prefetch"],
                                                         v["pdl"], v["regs"]), args.iters, args.calls)
                rows.append({"variant": v["name"], "us": us, "of_copy_bandwidth": nbytes / us / 1e3 / (bw / 1e9),
                             "equal": bool(torch.equal(got, want))})
            entry["roles"][role] = {"bytes": nbytes, "variants": rows}
            base = rows[0]["us"]
            for r in rows:
                print(f"{layout:6s} {role:8s} {r['variant']:24s} {r['us']:8.2f} us {100 * r['of_copy_bandwidth']:5.1f}%"
                      f" of copy  x{base / r['us']:.3f}  equal {r['equal']}", flush=True)
        # a layer's four projections in order, in one graph
        copies = min(len(s) for s, _ in sets_of.values())
        layer_bytes = sum(b for _, b in sets_of.values())
        outs = {role: torch.empty(1, n, device=dev, dtype=torch.bfloat16) for role, (n, k) in SHAPES.items()}
        layer = []
        for v in vs:
            def step(i, v=v):
                for role, (n, k) in SHAPES.items():
                    run_projection(x16[:1, :k], sets_of[role][0][i % copies], outs[role], v["programs"],
                                   v["prefetch"], v["pdl"], v["regs"])
            us = time_graph(step, args.iters, args.calls)
            layer.append({"variant": v["name"], "us": us, "of_copy_bandwidth": layer_bytes / us / 1e3 / (bw / 1e9)})
        entry["layer"] = {"bytes": layer_bytes, "variants": layer}
        for r in layer:
            print(f"{layout:6s} layer    {r['variant']:24s} {r['us']:8.2f} us {100 * r['of_copy_bandwidth']:5.1f}% of copy"
                  f"  x{layer[0]['us'] / r['us']:.3f}", flush=True)
        del sets_of
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
