"""4-bit GEMV beside other libraries' kernels, per projection of the Llama-3.1-8B shape, one row.

The same shapes, 4-bit weights with a scale and a zero per group of 128 (AWQ's layout), timed
inside CUDA graphs over weight copies larger than L2:
- localchat's packed_gemv on an AWQ checkpoint's weights (engine/kernels/packed_gemv.py), the
  batch-invariant kernel a loaded draft needs, and packed_row_gemv, the one-row kernel of an
  engine with no draft;
- torch's int4 weight-only kernel (`torch._weight_int4pack_mm`, the tinygemm kernel torchao's
  int4 weight-only layout runs);
- gemlite's GemLiteLinear (A16W4, group 128), where the `gemlite` package is installed.
Contents are random: this times the kernels, it does not compare their values.

    python benchmarks/bench_int4_libraries.py --out libraries.json
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.harness.random_packed import random_awq  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402
from engine.kernels.packed_gemv import packed_gemv, packed_row_gemv  # noqa: E402
from engine.weights.grouped import from_packed  # noqa: E402

SHAPES = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}
GROUP = 128


def int4_bytes(n: int, k: int) -> int:
    """4 bits a weight, a 2-byte scale and a 2-byte zero a group."""
    return n * k // 2 + n * (k // GROUP) * 4


def localchat(n, k, copies, dev, gen, kernel=packed_gemv):
    ws = [from_packed([random_awq(n, k, dev, gen)]) for _ in range(copies)]
    out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
    return lambda x, i: kernel(x, ws[i % copies], out=out), ws[0].nbytes


def torch_int4(n, k, copies, dev, gen):
    ws = []
    for _ in range(copies):
        packed = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=dev, generator=gen)
        w = torch._convert_weight_to_int4pack(packed, 8)
        sz = (torch.rand(k // GROUP, n, 2, device=dev, generator=gen) * 0.01).to(torch.bfloat16)
        ws.append((w, sz))
    return lambda x, i: torch._weight_int4pack_mm(x, ws[i % copies][0], GROUP, ws[i % copies][1]), int4_bytes(n, k)


def gemlite(n, k, copies, dev, gen):
    from gemlite import DType, GemLiteLinear

    layers = []
    for _ in range(copies):
        layer = GemLiteLinear(4, group_size=GROUP, in_features=k, out_features=n, input_dtype=DType.BF16,
                              output_dtype=DType.BF16)
        w_q = torch.randint(0, 16, (n, k), dtype=torch.uint8, device=dev, generator=gen)
        scales = (torch.rand(n, k // GROUP, device=dev, generator=gen) * 0.01).to(torch.bfloat16)
        zeros = torch.full((n, k // GROUP), 8.0, device=dev, dtype=torch.bfloat16)
        layer.pack(w_q, scales, zeros, None)
        layers.append(layer)
    return lambda x, i: layers[i % copies](x), int4_bytes(n, k)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(0)
    bw = copy_bandwidth(dev)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "copy_bandwidth_GBps": bw / 1e9,
              "group": GROUP, "shapes": {}}
    try:
        import gemlite as gl
        report["gemlite"] = getattr(gl, "__version__", "installed")
    except ImportError:
        report["gemlite"] = None
    kernels = {"localchat": localchat, "localchat_row": functools.partial(localchat, kernel=packed_row_gemv),
               "torch_int4pack": torch_int4, "gemlite": gemlite}
    for role, (n, k) in SHAPES.items():
        row = report["shapes"][role] = {}
        copies = max(1, (512 << 20) // int4_bytes(n, k) + 1)
        x = torch.randn(1, k, device=dev, dtype=torch.bfloat16)
        for name, build in kernels.items():
            if name == "gemlite" and report["gemlite"] is None:
                continue
            t0 = time.time()
            try:
                fn, nbytes = build(n, k, copies, dev, gen)
                fn(x, 0)
                torch.cuda.synchronize()
                us = time_graph(lambda i: fn(x, i), args.iters, args.calls)
            except Exception as e:  # a library that cannot run here: reported, not fatal
                row[name] = {"error": repr(e)[:300]}
                print(f"{role:8s} {name:15s} failed: {repr(e)[:200]}", flush=True)
                continue
            row[name] = {"us_1": us, "bytes": nbytes, "GBps": nbytes / us / 1e3,
                         "of_copy_bandwidth": nbytes / us / 1e3 / (bw / 1e9), "build_s": time.time() - t0}
            print(f"{role:8s} {name:15s} {us:8.2f} us  {nbytes / us / 1e3:7.0f} GB/s "
                  f"({100 * row[name]['of_copy_bandwidth']:.1f}% of copy)", flush=True)
            torch.cuda.empty_cache()
    for name in kernels:
        if all(name in r and "us_1" in r[name] for r in report["shapes"].values()):
            report.setdefault("layer_us", {})[name] = sum(r[name]["us_1"] for r in report["shapes"].values())
    print("layer (four projections, us):", report.get("layer_us"), flush=True)
    args.out.write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
