"""Packed (quantized) GEMV against bf16, per projection of the Llama-3.1-8B shape (or a config.json's), on the GPU.

For each layout (harness/random_packed.py: random blocks laid out as a file lays them, through
the GroupedWeight conversion a load runs) and each of the 8B's four layer projections, times
packed_gemv at 1 and 16 rows inside CUDA graphs over weight copies larger than L2, beside the
fastest one-row bf16 kernel (cuBLAS or our GEMV), and reports the bandwidth each reaches from
its own bytes (weights + scales + offsets) against the measured copy bandwidth, and the one-row
kernel of an engine with no draft (packed_row_gemv), for the 4-bit kinds also with x rounded to
int8 (int8_x). --sweep also tries other tiles at one row, for all three; --int8-x-sweep for the
last alone. Last, a layer's four projections summed: what a decode step's GEMVs cost per layer
in each format. bf16's batch-invariant tile is timed too, at 1 and 16 rows, beside packed_gemv
(both what a step with a draft loaded runs).

--config takes the projections of a config.json's layer instead (a small model's: the demo's
benchmarks/configs/smollm2-135m.json), and --sweep then also tries packed_gemv's tiles for a
short K (small_sweep: steps that divide K, any split of them up to 16, narrower column tiles).

    python benchmarks/bench_packed.py --out packed.json [--sweep | --int8-x-sweep] [--layouts Q4_K_M,AWQ]
    python benchmarks/bench_packed.py --config benchmarks/configs/smollm2-135m.json --layouts Q4_1 --sweep --out ...

--lm-head adds the lm_head's shape (the vocabulary by the hidden size) to the projections timed;
--roles lm_head (or qkv,down, ...) times only those.
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

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.harness.random_packed import random_awq, random_fp8, random_gguf  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.config import ModelConfig  # noqa: E402
from engine.kernels.gemv import gemv  # noqa: E402
from engine.kernels.packed_gemv import (  # noqa: E402
    PackedTile, RowTile, default_tile, packed_gemv, packed_gemv_ref, packed_row_gemv, row_kernel_fits,
    INT8_X_KINDS, row_tile_for, row_tile_fits_weight,
)
from engine.weights.grouped import KIND_NAMES, grouped_blocks  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
# The 8B's qkv parts (q, k, v) and gate_up parts (gate, up): a Q4_K_M file stores v apart.
PARTS = {"qkv": [4096, 1024, 1024], "o_proj": [4096], "gate_up": [14336, 14336], "down": [4096]}
LAYOUT_KINDS = {"Q4_K_M": {"v": "Q6_K"}, "Q5_K_M": {"v": "Q6_K"}, "Q4_K": {}, "Q5_K": {}, "Q4_0": {}, "Q4_1": {},
                "Q8_0": {}, "Q6_K": {}, "AWQ": {}, "FP8": {}}
# (block_n, block_k, split_k, num_warps, num_stages, magic)
SWEEP = [PackedTile(*c) for c in [
    (64, 128, 4, 4, 3, True), (64, 128, 4, 4, 3, False), (64, 128, 2, 4, 3, True), (64, 128, 8, 4, 3, True),
    (64, 128, 4, 8, 3, True), (64, 128, 4, 4, 4, True), (128, 128, 4, 8, 3, True), (128, 64, 4, 4, 3, True),
    (64, 64, 8, 4, 3, True), (64, 256, 4, 8, 3, True), (32, 128, 4, 4, 3, True),
]]

# (block_n, block_k, split_k, num_warps, num_stages, vec)
ROW_SWEEP = [RowTile(*c) for c in [
    (4, 4096, 1, 4, 3, 16), (8, 4096, 1, 4, 3, 16), (4, 2048, 1, 4, 3, 8), (8, 2048, 1, 4, 3, 8),
    (16, 4096, 1, 8, 3, 16), (4, 2048, 1, 4, 3, 16), (8, 1024, 1, 4, 3, 8), (4, 2048, 2, 4, 3, 8),
]]
# int8 x: more rows a program share each vector's rounding of x
XQ_SWEEP = [RowTile(*c) for c in [
    (4, 4096, 1, 4, 3, 16), (8, 4096, 1, 4, 3, 16), (16, 4096, 1, 4, 3, 16), (16, 4096, 1, 8, 3, 16),
    (8, 2048, 1, 4, 3, 16), (16, 2048, 1, 4, 3, 16), (32, 2048, 1, 8, 3, 16), (8, 2048, 1, 4, 3, 8),
]]


def model_shapes(config: dict | None, lm_head: bool = False) -> tuple[dict, dict]:
    """(shapes, parts) of a layer's four projections as SHAPES and PARTS hold the 8B's: a
    config.json's (q, k and v of its heads; gate and up of its intermediate size), None the 8B's.
    lm_head: its lm_head too (vocabulary by hidden size: a GGUF whose tied head stays packed)."""
    if config is None:
        shapes, parts = dict(SHAPES), dict(PARTS)
        hidden, vocab = SHAPES["o_proj"][0], 128256
    else:
        cfg = ModelConfig.from_hf(config, "config")
        hidden, inter, q, kv, vocab = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size, cfg.vocab_size
        shapes = {"qkv": (q + 2 * kv, hidden), "o_proj": (hidden, q), "gate_up": (2 * inter, hidden),
                  "down": (hidden, inter)}
        parts = {"qkv": [q, kv, kv], "o_proj": [hidden], "gate_up": [inter, inter], "down": [hidden]}
    if lm_head:
        shapes["lm_head"], parts["lm_head"] = (vocab, hidden), [vocab]
    return shapes, parts


def small_sweep(k: int, group: int) -> list[PackedTile]:
    """packed_gemv tiles for a short K (a small model's): steps of 32 to 128 inputs that divide K
    and fit the groups, K split in any count of shares up to 16 that divides the steps, 16 to 64
    columns a program, 2 or 4 warps."""
    tiles = []
    for block_k in (32, 64, 128):
        if k % block_k or (block_k % group and group % block_k):
            continue
        steps = k // block_k
        for split in (s for s in range(1, 17) if steps % s == 0):
            for block_n in (16, 32, 64):
                for warps in (2, 4):
                    tiles.append(PackedTile(block_n, block_k, split, warps))
    return tiles


def blocks_for(layout: str, role: str, device, gen, shapes: dict | None = None, parts_of: dict | None = None):
    n, k = (shapes or SHAPES)[role]
    parts = []
    for index, rows in enumerate((parts_of or PARTS)[role]):
        if layout == "AWQ":
            parts.append(random_awq(rows, k, device, gen))
        elif layout == "FP8":
            parts.append(random_fp8(rows, k, device, gen))
        else:
            kind = LAYOUT_KINDS[layout].get("v" if role == "qkv" and index == 2 else role, layout.removesuffix("_M"))
            parts.append(random_gguf(kind, rows, k, device, gen))
    return grouped_blocks(parts)


def run_blocks(x, blocks, out, tile=None):
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        packed_gemv(x, b, None, tile, out=out[:, start:stop])
        start = stop
    return out


def run_row(x, blocks, out, tile=None, int8_x=False):
    """As an engine with no draft runs one row: the one-row kernel where it serves (row_kernel_fits;
    int8_x: x rounded to int8 for the 4-bit kinds), packed_gemv's default tile elsewhere (a K with no one-row tile)."""
    start = 0
    for b in blocks:
        stop = start + b.shape[0]
        if row_kernel_fits(b):
            packed_row_gemv(x, b, None, tile, out=out[:, start:stop], int8_x=int8_x)
        else:
            packed_gemv(x, b, None, out=out[:, start:stop])
        start = stop
    return out


def row_tile_fits(tile, k, blocks) -> bool:
    """Whether packed_row_gemv takes this tile for every block (row_tile_fits_weight)."""
    assert all(b.shape[1] == k for b in blocks)
    return all(row_tile_fits_weight(b, tile) for b in blocks)


def weight_copies(layout: str, role: str, device, gen, shapes: dict | None = None,
                  parts_of: dict | None = None) -> tuple[list, int]:
    """Copies of a projection's blocks whose bytes together pass 512 MB (larger than L2, so a
    timed loop over them reads from memory), and the bytes of one."""
    blocks = blocks_for(layout, role, device, gen, shapes, parts_of)
    nbytes = sum(b.nbytes for b in blocks)
    copies = max(1, (512 << 20) // nbytes + 1)
    return [blocks] + [blocks_for(layout, role, device, gen, shapes, parts_of) for _ in range(copies - 1)], nbytes


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--layouts", default=",".join(LAYOUT_KINDS))
    ap.add_argument("--sweep", action="store_true")
    ap.add_argument("--int8-x-sweep", action="store_true", help="sweep only the int8-x row kernel's tiles")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    ap.add_argument("--max-seconds", type=float, default=240)
    ap.add_argument("--config", type=Path, default=None,
                    help="a config.json whose layer's projections to time (default: the Llama-3.1-8B shape)")
    ap.add_argument("--lm-head", action="store_true", help="the lm_head's shape too (a tied head kept packed)")
    ap.add_argument("--roles", default=None, help="only these of the shapes, comma-separated (e.g. lm_head)")
    args = ap.parse_args()
    t0 = time.time()
    shapes, parts_of = model_shapes(json.loads(args.config.read_text()) if args.config else None, args.lm_head)
    if args.roles:
        unknown = set(args.roles.split(",")) - set(shapes)
        if unknown:
            ap.error(f"--roles: no shape named {', '.join(sorted(unknown))} (there are {', '.join(shapes)})")
        shapes = {role: shape for role, shape in shapes.items() if role in args.roles.split(",")}
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    x16 = torch.randn(16, max(k for _, k in shapes.values()), device=dev, dtype=torch.bfloat16)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "config": str(args.config) if args.config else "llama-8b", "shapes": shapes, "bf16": {}, "layouts": {}}
    for role, (n, k) in shapes.items():  # the bf16 baseline: the fastest one-row kernel; the invariant tile
        copies = max(1, (512 << 20) // (n * k * 2) + 1)
        ws = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for _ in range(copies)]
        x1, xk = x16[:1, :k], x16[:, :k]
        us = {"cublas": time_graph(lambda i: F.linear(x1, ws[i % copies]), args.iters, args.calls),
              "gemv": time_graph(lambda i: gemv(x1, ws[i % copies]), args.iters, args.calls)}
        inv1 = time_graph(lambda i: gemv(x1, ws[i % copies], invariant=True), args.iters, args.calls)
        inv16 = time_graph(lambda i: gemv(xk, ws[i % copies], invariant=True), args.iters, args.calls)
        best = min(us.values())
        report["bf16"][role] = {"us": us, "best_us": best, "bytes": n * k * 2, "GBps": n * k * 2 / best / 1e3,
                                "invariant_us_1": inv1, "invariant_us_16": inv16}
        print(f"bf16   {role:8s} {best:8.2f} us  {n * k * 2 / best / 1e3:7.0f} GB/s; invariant tile {inv1:.2f} us, "
              f"16 rows {inv16:.2f}", flush=True)
        del ws
        torch.cuda.empty_cache()
    for layout in args.layouts.split(","):
        entry = report["layouts"][layout] = {}
        for role, (n, k) in shapes.items():
            if time.time() - t0 > args.max_seconds:
                break
            sets, nbytes = weight_copies(layout, role, dev, gen, shapes, parts_of)
            blocks, copies = sets[0], len(sets)
            x1, xk = x16[:1, :k], x16[:, :k]
            out1 = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
            out16 = torch.empty(16, n, device=dev, dtype=torch.bfloat16)
            ref = torch.cat([packed_gemv_ref(xk, b) for b in blocks], dim=1)
            got = run_blocks(xk, blocks, out16.clone())
            err = float((got.float() - ref.float()).abs().max())
            us1 = time_graph(lambda i: run_blocks(x1, sets[i % copies], out1), args.iters, args.calls)
            ref1 = torch.cat([packed_gemv_ref(x1, b) for b in blocks], dim=1)
            row_err = float((run_row(x1, blocks, out1.clone()).float() - ref1.float()).abs().max())
            us_row = time_graph(lambda i: run_row(x1, sets[i % copies], out1), args.iters, args.calls)
            us16 = time_graph(lambda i: run_blocks(xk, sets[i % copies], out16), args.iters, args.calls)
            xq = any(b.kind in INT8_X_KINDS for b in blocks)
            if xq:  # x rounded to int8 against the nibbles (int8_x), default tile
                xq_err = float((run_row(x1, blocks, out1.clone(), None, True).float() - ref1.float()).abs().max())
                us_xq = time_graph(lambda i: run_row(x1, sets[i % copies], out1, None, True), args.iters, args.calls)
            row = {"blocks": [f"{b.format} {KIND_NAMES[b.kind]} g{b.group} scale {str(b.scale.dtype)[6:]}"
                              + ("" if b.offset is None else f" offset {str(b.offset.dtype)[6:]}") for b in blocks],
                   "bytes": nbytes, "us_1": us1, "us_16": us16, "GBps_1": nbytes / us1 / 1e3,
                   "of_copy_bandwidth": nbytes / us1 / 1e3 / (bw / 1e9), "vs_bf16": report["bf16"][role]["best_us"] / us1,
                   "vs_bf16_invariant": report["bf16"][role]["invariant_us_1"] / us1,
                   "vs_bf16_invariant_16": report["bf16"][role]["invariant_us_16"] / us16,
                   "max_err_vs_ref": err, "tiles": [],
                   "row": {"us_1": us_row, "GBps_1": nbytes / us_row / 1e3,
                           "of_copy_bandwidth": nbytes / us_row / 1e3 / (bw / 1e9),
                           "vs_bf16": report["bf16"][role]["best_us"] / us_row, "max_err_vs_ref": row_err,
                           "default_tile": str(row_tile_for(blocks[0])),
                           "tiles": []}}
            if xq:
                row["row_int8_x"] = {"us_1": us_xq, "GBps_1": nbytes / us_xq / 1e3,
                                     "of_copy_bandwidth": nbytes / us_xq / 1e3 / (bw / 1e9),
                                     "vs_bf16": report["bf16"][role]["best_us"] / us_xq,
                                     "max_err_vs_ref": xq_err, "ref_max": float(ref1.float().abs().max()), "tiles": []}
            if args.sweep:
                small = small_sweep(k, max(b.group for b in blocks)) if args.config else []
                for tile in SWEEP + [t for t in small if t not in SWEEP]:
                    if time.time() - t0 > args.max_seconds:
                        break
                    if any(k % (tile.block_k * tile.split_k) or (tile.block_k % b.group and b.group % tile.block_k)
                           for b in blocks):
                        continue
                    try:
                        us = time_graph(lambda i: run_blocks(x1, sets[i % copies], out1, tile), args.iters, args.calls)
                        got16 = run_blocks(xk, blocks, out16.clone(), tile)
                        ones = torch.cat([run_blocks(xk[i:i + 1], blocks, out1.clone(), tile) for i in range(16)])
                    except Exception as e:  # a tile this Triton cannot build: reported, skipped
                        row["tiles"].append({"tile": str(tile), "error": repr(e)[:160]})
                        continue
                    # each tile's values too: a fast tile that computes something else is no answer
                    us16_tile = time_graph(lambda i: run_blocks(xk, sets[i % copies], out16, tile), args.iters,
                                           args.calls)
                    row["tiles"].append({"tile": [tile.block_n, tile.block_k, tile.split_k, tile.num_warps,
                                                  tile.num_stages, tile.magic],
                                         "us_1": us, "us_16": us16_tile,
                                         "max_err_vs_ref": float((got16.float() - ref.float()).abs().max()),
                                         "rows_equal_1_row_calls": bool(torch.equal(got16, ones))})
            if args.sweep:
                for tile in ROW_SWEEP:
                    if time.time() - t0 > args.max_seconds or not row_tile_fits(tile, k, blocks):
                        continue
                    try:
                        us = time_graph(lambda i: run_row(x1, sets[i % copies], out1, tile), args.iters, args.calls)
                        got1 = run_row(x1, blocks, out1.clone(), tile)
                    except Exception as e:
                        row["row"]["tiles"].append({"tile": str(tile), "error": repr(e)[:160]})
                        continue
                    row["row"]["tiles"].append({"tile": [tile.block_n, tile.block_k, tile.split_k, tile.num_warps,
                                                         tile.num_stages, tile.vec], "us_1": us,
                                                "max_err_vs_ref": float((got1.float() - ref1.float()).abs().max())})
                best = sorted((t for t in row["row"]["tiles"] if "us_1" in t), key=lambda t: t["us_1"])[:3]
                for t in best:
                    print(f"  row tile {t['tile']}: {t['us_1']:.2f} us, max error {t['max_err_vs_ref']:.3g}", flush=True)
            if xq and (args.sweep or args.int8_x_sweep):
                for tile in XQ_SWEEP:
                    if time.time() - t0 > args.max_seconds or not row_tile_fits(tile, k, blocks):
                        continue
                    try:
                        us = time_graph(lambda i: run_row(x1, sets[i % copies], out1, tile, True), args.iters,
                                        args.calls)
                        got1 = run_row(x1, blocks, out1.clone(), tile, True)
                    except Exception as e:
                        row["row_int8_x"]["tiles"].append({"tile": str(tile), "error": repr(e)[:160]})
                        continue
                    row["row_int8_x"]["tiles"].append({"tile": [tile.block_n, tile.block_k, tile.split_k,
                                                                tile.num_warps, tile.num_stages, tile.vec], "us_1": us,
                                                       "max_err_vs_ref": float((got1.float() - ref1.float()).abs().max())})
                best = sorted((t for t in row["row_int8_x"]["tiles"] if "us_1" in t), key=lambda t: t["us_1"])[:3]
                for t in best:
                    print(f"  int8 x tile {t['tile']}: {t['us_1']:.2f} us, max error {t['max_err_vs_ref']:.3g}",
                          flush=True)
            print(f"{layout:6s} {role:8s} row kernel {us_row:8.2f} us  {nbytes / us_row / 1e3:7.0f} GB/s = "
                  f"{100 * row['row']['of_copy_bandwidth']:5.1f}% of copy, x{row['row']['vs_bf16']:.2f} vs bf16, "
                  f"max error {row_err:.3g}", flush=True)
            if xq:
                print(f"{layout:6s} {role:8s} int8 x     {us_xq:8.2f} us  {nbytes / us_xq / 1e3:7.0f} GB/s = "
                      f"{100 * row['row_int8_x']['of_copy_bandwidth']:5.1f}% of copy, x{row['row_int8_x']['vs_bf16']:.2f} "
                      f"vs bf16, max error {xq_err:.3g} (of {row['row_int8_x']['ref_max']:.3g})", flush=True)
            entry[role] = row
            timed = [t for t in row["tiles"] if "us_1" in t]
            for t in sorted(timed, key=lambda t: t["us_1"])[:3]:
                print(f"  tile {t['tile']}: {t['us_1']:.2f} us (16 rows {t['us_16']:.2f}), max error "
                      f"{t['max_err_vs_ref']:.3g}, 16 rows equal "
                      f"their 1-row calls: {t['rows_equal_1_row_calls']}", flush=True)
            print(f"{layout:6s} {role:8s} {us1:8.2f} us (16 rows {us16:7.2f})  {row['GBps_1']:7.0f} GB/s "
                  f"= {100 * row['of_copy_bandwidth']:5.1f}% of copy, x{row['vs_bf16']:.2f} vs bf16, "
                  f"default tile {default_tile(blocks[0].shape[0], k, blocks[0].group)}", flush=True)
            del sets, blocks
            torch.cuda.empty_cache()
        if all(r in entry for r in PARTS):  # a layer's four projections (not the lm_head)
            layer = sum(entry[r]["us_1"] for r in PARTS)
            bf16 = sum(report["bf16"][r]["best_us"] for r in PARTS)
            row_layer = sum(entry[r]["row"]["us_1"] for r in PARTS)
            xq_layer = sum(entry[r].get("row_int8_x", entry[r]["row"])["us_1"] for r in PARTS)
            entry["layer"] = {"us_1": layer, "bf16_us_1": bf16, "speedup": bf16 / layer,
                              "row_us_1": row_layer, "row_speedup": bf16 / row_layer,
                              "row_int8_x_us_1": xq_layer, "row_int8_x_speedup": bf16 / xq_layer,
                              "bf16_invariant_us_1": sum(report["bf16"][r]["invariant_us_1"] for r in PARTS),
                              "bf16_invariant_us_16": sum(report["bf16"][r]["invariant_us_16"] for r in PARTS),
                              "us_16": sum(entry[r]["us_16"] for r in PARTS),
                              "bytes": sum(entry[r]["bytes"] for r in PARTS)}
            print(f"{layout:6s} layer    {layer:8.2f} us, row kernel {row_layer:8.2f} us, against bf16 {bf16:.2f}: "
                  f"x{bf16 / layer:.2f}, row x{bf16 / row_layer:.2f}; int8 x {xq_layer:.2f} us, x{bf16 / xq_layer:.2f}",
                  flush=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
