"""Times the gemv kernels against cuBLAS (F.linear) for Llama-3.1-8B and SmolLM2-135M shapes.

Every case runs inside a CUDA graph of `--calls` back-to-back calls, each reading a
different copy of the weight (together larger than L2, as a decode step reads them), timed
with CUDA events over `--iters` replays. Fused prologues are timed against the unfused
sequences they replace, in the decode step's mode (M = 1: add_rms_norm + cuBLAS, silu_and_mul
+ the row GEMV) and in batch-invariant mode (a draft loaded: "inv" rows, any M). A few
alternative tile configs are swept for the M=1 shapes that matter most, for the plain GEMV
(the built-in table in engine/kernels/gemv.py) and for the fused kernels (the decode step's
tiles: FUSED_TILES in engine/routing.py, printed ready to paste at the end; the invariant tile
is swept at the first M > 1 in --rows).
A case that fails is reported and skipped; the sweep stops at --max-seconds.

    python benchmarks/bench_gemv.py --out bench_gemv.json
    python benchmarks/bench_gemv.py --rows 1 --only qkv,gate_up,down --out fused_m1.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.activation import silu_and_mul  # noqa: E402
from engine.kernels.gemv import (  # noqa: E402
    GemvConfig, default_config, gemv, gemv_ref, rms_norm_gemv, rms_norm_gemv_ref, silu_mul_gemv, silu_mul_gemv_ref,
)
from engine.kernels.norm import add_rms_norm  # noqa: E402
from engine.options import KernelOptions  # noqa: E402
from engine.routing import UNFUSED, fused_tile, row_tile  # noqa: E402

DTYPE = torch.bfloat16
PEAK_GB_S = 4300.0
# name -> (N, K)
SHAPES = {
    "8b qkv": (6144, 4096), "8b o_proj": (4096, 4096), "8b gate_up": (28672, 4096),
    "8b down": (4096, 14336), "8b lm_head": (128256, 4096),
    "smol qkv": (960, 576), "smol o_proj": (576, 576), "smol gate_up": (3072, 576),
    "smol down": (576, 1536), "smol lm_head": (49152, 576),
}
RMS_SHAPES = ("8b qkv", "8b gate_up", "smol qkv", "smol gate_up")  # projections that follow a norm
SILU_SHAPES = ("8b down", "smol down")
SWEEP_SHAPES = ("8b qkv", "8b o_proj", "8b down", "smol o_proj", "smol down")
SWEEP = [GemvConfig(*c) for c in [  # (block_n, block_k, split_k, num_warps, num_stages)
    (8, 512, 1, 4, 3), (16, 512, 1, 4, 3), (4, 512, 1, 4, 3), (8, 256, 1, 4, 3), (8, 512, 2, 4, 3),
    (32, 256, 1, 8, 3), (8, 256, 4, 4, 3),
]]
# --wide-sweep adds these M = 1 tiles (narrower and deeper tiles, other warp and stage counts).
WIDE_SWEEP = [GemvConfig(*c) for c in [
    (2, 512, 1, 4, 3), (2, 1024, 1, 4, 3), (4, 1024, 1, 4, 3), (4, 1024, 1, 8, 3), (4, 512, 1, 4, 4),
    (4, 512, 1, 4, 5), (4, 512, 1, 2, 3), (4, 2048, 1, 8, 2), (8, 1024, 1, 8, 3), (8, 512, 1, 8, 3),
    (2, 512, 1, 2, 4), (4, 256, 1, 2, 4), (4, 512, 2, 4, 3), (2, 2048, 1, 8, 2),
]]
# Fused kernels at M = 1 (every RMS_SHAPES / SILU_SHAPES entry): the plain sweep plus short
# splits for K = 576 / 1536 (SmolLM2), where the rms pre-pass and latency dominate.
FUSED_SWEEP = SWEEP + [GemvConfig(*c) for c in [
    (8, 256, 2, 4, 3), (8, 256, 3, 4, 3), (4, 256, 3, 4, 3), (16, 256, 2, 4, 3), (4, 512, 2, 4, 3),
    (16, 128, 4, 4, 3), (32, 512, 1, 8, 3), (8, 1024, 1, 8, 3),
]]
# The invariant (tensor-core, 16-row) tile: block_n >= 16; swept at one M > 1.
INVARIANT_SWEEP = [GemvConfig(*c) for c in [
    (16, 256, 1, 4, 2), (16, 256, 2, 4, 2), (16, 128, 4, 4, 2), (32, 256, 1, 4, 2), (16, 512, 1, 8, 2),
    (32, 128, 2, 4, 2), (16, 64, 8, 4, 2),
]]
FUSED_KERNEL = {"rms_norm+linear": "rms_norm_gemv", "silu_mul+linear": "silu_mul_gemv"}


def current_tile(mode: str, kernel: str, n: int, k: int) -> GemvConfig | None:
    """The tile the engine runs for this fused kernel (None: the built-in one, also where
    FUSED_TILES says UNFUSED, so the fused kernel is still timed)."""
    tile = fused_tile(KernelOptions(), mode, kernel, n, k)
    return None if tile == UNFUSED else tile


def label(impl: str, cfg: GemvConfig) -> str:
    return f"{impl} bn{cfg.block_n} bk{cfg.block_k} sk{cfg.split_k} w{cfg.num_warps} s{cfg.num_stages}"


def time_graph(fn, iters: int, calls: int) -> float:
    """Microseconds per call, from a graph holding `calls` calls (fn(i) for i in range(calls))."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for i in range(min(calls, 3)):
            fn(i)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i)
    graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / (iters * calls)


def max_diff(a, b) -> float:
    if isinstance(a, tuple):
        return max(max_diff(x, y) for x, y in zip(a, b))
    return (a.float() - b.float()).abs().max().item()


def make_inputs(m: int, n: int, k: int):
    """Weight copies totalling >= ~256 MB (at most 8, at least 1) so L2 holds none of them."""
    copies = max(1, min(8, (256 << 20) // (n * k * 2) + 1))
    weights = [torch.randn(n, k, device="cuda", dtype=DTYPE) / k**0.5 for _ in range(copies)]
    return dict(
        x=torch.randn(m, k, device="cuda", dtype=DTYPE), residual=torch.randn(m, k, device="cuda", dtype=DTYPE),
        norm_weight=1 + 0.1 * torch.randn(k, device="cuda", dtype=DTYPE),
        gate_up=torch.randn(m, 2 * k, device="cuda", dtype=DTYPE), weights=weights,
    )


def cases(m: int, name: str, n: int, k: int, inp: dict, sweep: bool, no_sweep: bool = False,
          invariant_sweep: bool = False):
    """Yields (variant, impl, fn(i), check() -> max diff vs reference)."""
    ws, x, res, nw, gu = inp["weights"], inp["x"], inp["residual"], inp["norm_weight"], inp["gate_up"]
    w0 = ws[0]
    want = gemv_ref(x, w0)
    yield "linear", "cublas", lambda i: F.linear(x, ws[i % len(ws)]), lambda: 0.0
    yield "linear", "gemv", lambda i: gemv(x, ws[i % len(ws)]), lambda: max_diff(gemv(x, w0), want)
    if sweep:
        for cfg in SWEEP:
            yield "linear", label("gemv", cfg), (lambda i, c=cfg: gemv(x, ws[i % len(ws)], config=c)), \
                (lambda c=cfg: max_diff(gemv(x, w0, config=c), want))
    fused_sweep = FUSED_SWEEP if m == 1 and not no_sweep else []
    inv_sweep = INVARIANT_SWEEP if invariant_sweep and not no_sweep else []
    if name in RMS_SHAPES:
        # The unfused pair a decode step runs (M = 1: cuBLAS), the fused kernel with the
        # engine's M = 1 tile (FUSED_TILES or default_config), and the same pair in
        # batch-invariant mode.
        want_rms = rms_norm_gemv_ref(x, res, nw, 1e-5, w0)
        row_cfg = current_tile("row", "rms_norm_gemv", n, k) if m == 1 else None
        inv_cfg = current_tile("invariant", "rms_norm_gemv", n, k)
        yield "rms_norm+linear", "add_rms_norm+cublas", \
            lambda i: F.linear(add_rms_norm(x, res, nw, 1e-5)[0], ws[i % len(ws)]), lambda: 0.0
        yield "rms_norm+linear", "add_rms_norm+gemv", \
            lambda i: gemv(add_rms_norm(x, res, nw, 1e-5)[0], ws[i % len(ws)]), lambda: 0.0
        yield "rms_norm+linear", "rms_norm_gemv", \
            lambda i: rms_norm_gemv(x, res, nw, 1e-5, ws[i % len(ws)], config=row_cfg), \
            lambda: max_diff(rms_norm_gemv(x, res, nw, 1e-5, w0, config=row_cfg), want_rms)
        yield "rms_norm+linear", "inv add_rms_norm+gemv", \
            lambda i: gemv(add_rms_norm(x, res, nw, 1e-5)[0], ws[i % len(ws)], invariant=True), lambda: 0.0
        yield "rms_norm+linear", "inv rms_norm_gemv", \
            lambda i: rms_norm_gemv(x, res, nw, 1e-5, ws[i % len(ws)], config=inv_cfg, invariant=True), \
            lambda: max_diff(rms_norm_gemv(x, res, nw, 1e-5, w0, config=inv_cfg, invariant=True), want_rms)
        for cfg in fused_sweep:
            yield "rms_norm+linear", label("rms_norm_gemv", cfg), \
                (lambda i, c=cfg: rms_norm_gemv(x, res, nw, 1e-5, ws[i % len(ws)], config=c)), \
                (lambda c=cfg: max_diff(rms_norm_gemv(x, res, nw, 1e-5, w0, config=c), want_rms))
        for cfg in inv_sweep:
            yield "rms_norm+linear", label("inv rms_norm_gemv", cfg), \
                (lambda i, c=cfg: rms_norm_gemv(x, res, nw, 1e-5, ws[i % len(ws)], config=c, invariant=True)), \
                (lambda c=cfg: max_diff(rms_norm_gemv(x, res, nw, 1e-5, w0, config=c, invariant=True), want_rms))
    if name in SILU_SHAPES:
        want_silu = silu_mul_gemv_ref(gu, w0)
        row_cfg = current_tile("row", "silu_mul_gemv", n, k) or row_tile(k) if m == 1 else None
        inv_cfg = current_tile("invariant", "silu_mul_gemv", n, k)
        yield "silu_mul+linear", "silu_and_mul+cublas", lambda i: F.linear(silu_and_mul(gu), ws[i % len(ws)]), \
            lambda: 0.0
        yield "silu_mul+linear", "silu_and_mul+gemv", \
            lambda i: gemv(silu_and_mul(gu), ws[i % len(ws)], config=row_tile(k) if m == 1 else None), lambda: 0.0
        yield "silu_mul+linear", "silu_mul_gemv", lambda i: silu_mul_gemv(gu, ws[i % len(ws)], config=row_cfg), \
            lambda: max_diff(silu_mul_gemv(gu, w0, config=row_cfg), want_silu)
        yield "silu_mul+linear", "inv silu_and_mul+gemv", \
            lambda i: gemv(silu_and_mul(gu), ws[i % len(ws)], invariant=True), lambda: 0.0
        yield "silu_mul+linear", "inv silu_mul_gemv", \
            lambda i: silu_mul_gemv(gu, ws[i % len(ws)], config=inv_cfg, invariant=True), \
            lambda: max_diff(silu_mul_gemv(gu, w0, config=inv_cfg, invariant=True), want_silu)
        for cfg in fused_sweep:
            yield "silu_mul+linear", label("silu_mul_gemv", cfg), \
                (lambda i, c=cfg: silu_mul_gemv(gu, ws[i % len(ws)], config=c)), \
                (lambda c=cfg: max_diff(silu_mul_gemv(gu, w0, config=c), want_silu))
        for cfg in inv_sweep:
            yield "silu_mul+linear", label("inv silu_mul_gemv", cfg), \
                (lambda i, c=cfg: silu_mul_gemv(gu, ws[i % len(ws)], config=c, invariant=True)), \
                (lambda c=cfg: max_diff(silu_mul_gemv(gu, w0, config=c, invariant=True), want_silu))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--iters", type=int, default=20, help="graph replays timed")
    parser.add_argument("--calls", type=int, default=16, help="calls captured in one graph")
    parser.add_argument("--rows", default="1,6", help="comma list of M values")
    parser.add_argument("--only", default="", help="comma list of shape-name substrings (default: all)")
    parser.add_argument("--no-sweep", action="store_true", help="skip the tile-config sweep")
    parser.add_argument("--max-seconds", type=float, default=150.0, help="sweep cases stop after this")
    parser.add_argument("--wide-sweep", action="store_true", help="sweep WIDE_SWEEP's M = 1 tiles too")
    args = parser.parse_args()
    if args.wide_sweep:
        SWEEP.extend(WIDE_SWEEP)
        FUSED_SWEEP.extend(WIDE_SWEEP)
    if not torch.cuda.is_available():
        sys.exit("bench_gemv needs a CUDA GPU")
    torch.manual_seed(0)
    began = time.time()
    results = []
    print(f"{'M':>2s} {'shape':13s} {'variant':16s} {'impl':32s} {'us':>8s} {'GB/s':>7s} {'%peak':>6s} {'diff':>8s}")
    row_counts = [int(r) for r in args.rows.split(",")]
    inv_sweep_m = next((m for m in row_counts if m > 1), None)
    for m in row_counts:
        for name, (n, k) in SHAPES.items():
            if args.only and not any(s in name for s in args.only.split(",")):
                continue
            try:
                inp = make_inputs(m, n, k)
            except Exception as exc:  # noqa: BLE001 - report and go on
                print(f"{m:2d} {name:13s} inputs failed: {exc}", flush=True)
                continue
            sweep = m == 1 and name in SWEEP_SHAPES and not args.no_sweep
            weight_bytes = n * k * 2
            default = default_config(m, n, k, torch.cuda.get_device_properties(0).multi_processor_count)
            for variant, impl, fn, check in cases(m, name, n, k, inp, sweep, args.no_sweep, m == inv_sweep_m):
                if " bn" in impl and time.time() - began > args.max_seconds:
                    continue
                row = dict(m=m, shape=name, n=n, k=k, variant=variant, impl=impl, default_config=default.__dict__)
                try:
                    row["max_abs_diff"] = check()
                    row["us"] = time_graph(fn, args.iters, args.calls)
                    row["gb_s"] = weight_bytes / row["us"] / 1e3
                    row["pct_peak"] = 100 * row["gb_s"] / PEAK_GB_S
                    print(f"{m:2d} {name:13s} {variant:16s} {impl:32s} {row['us']:8.2f} {row['gb_s']:7.0f} "
                          f"{row['pct_peak']:5.1f}% {row['max_abs_diff']:8.1e}", flush=True)
                except Exception as exc:  # noqa: BLE001 - one bad config must not end the run
                    row["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                    row["traceback"] = traceback.format_exc()[-4000:]
                    print(f"{m:2d} {name:13s} {variant:16s} {impl:32s} FAILED {row['error'][:200]}", flush=True)
                results.append(row)
            del inp
            torch.cuda.empty_cache()
    import triton

    report = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, dtype=str(DTYPE),
        iters=args.iters, calls_per_graph=args.calls, peak_gb_s=PEAK_GB_S, seconds=time.time() - began,
        results=results,
    )
    args.out.write_text(json.dumps(report, indent=2))
    best = {}
    for row in results:
        if row["variant"] == "linear" and "us" in row and row["impl"] != "cublas":
            key = (row["m"], row["shape"])
            if key not in best or row["us"] < best[key]["us"]:
                best[key] = row
    print("\nfastest gemv config per shape (M, shape: impl us vs cublas us)")
    for (m, name), row in best.items():
        cublas = next((r for r in results if r["m"] == m and r["shape"] == name and r["impl"] == "cublas"
                       and "us" in r), None)
        print(f"{m:2d} {name:13s} {row['impl']:32s} {row['us']:8.2f} vs {cublas['us'] if cublas else float('nan'):8.2f}")
    print_fused_choice(results)
    print(f"wrote {args.out} in {time.time() - began:.0f} s")


def print_fused_choice(results: list[dict]) -> None:
    """Per mode and shape, the fastest fused tile against the unfused pair the engine would run
    instead, as FUSED_TILES entries (engine/routing.py): row mode from the M = 1 rows, invariant
    mode from the M > 1 rows that were swept."""
    unfused = {("row", "rms_norm+linear"): "add_rms_norm+cublas", ("row", "silu_mul+linear"): "silu_and_mul+gemv",
               ("invariant", "rms_norm+linear"): "inv add_rms_norm+gemv",
               ("invariant", "silu_mul+linear"): "inv silu_and_mul+gemv"}
    lines = []
    for mode in ("row", "invariant"):
        prefix = "inv " if mode == "invariant" else ""
        timed = [r for r in results if "us" in r and r["variant"] in FUSED_KERNEL]
        if mode == "row":
            timed = [r for r in timed if r["m"] == 1]
        else:  # the M whose invariant tiles were swept
            swept = {r["m"] for r in timed if r["impl"].startswith("inv ") and " bn" in r["impl"]}
            timed = [r for r in timed if r["m"] in swept]
        for name in dict.fromkeys(r["shape"] for r in timed):
            rows = [r for r in timed if r["shape"] == name]
            variant = rows[0]["variant"]
            kernel = FUSED_KERNEL[variant]
            fused = [r for r in rows if r["impl"] == prefix + kernel or r["impl"].startswith(prefix + kernel + " bn")]
            old = next((r["us"] for r in rows if r["impl"] == unfused[mode, variant]), float("nan"))
            if not fused:
                continue
            best = min(fused, key=lambda r: r["us"])
            if not best["us"] < old:
                entry = "UNFUSED"
            elif " bn" not in best["impl"]:
                entry = "the built-in or current tile"
            else:
                fields = best["impl"].split()[-5:]
                entry = "GemvConfig({}, {}, {}, {}, {})".format(
                    *(int(f.lstrip("bnkswt")) for f in fields))
            lines.append(f'    ("{mode}", "{kernel}", {best["n"]}, {best["k"]}): {entry},  # {name} M={best["m"]}: '
                         f'fused {best["us"]:.2f} us ({best["impl"]}), unfused {old:.2f}')
    if lines:
        print("\nfastest fused tile per mode and shape against the unfused pair (FUSED_TILES, engine/routing.py):")
        print("\n".join(lines))

if __name__ == "__main__":
    main()
