"""Times each Triton kernel against its torch reference on one CUDA GPU.

Every implementation is timed eagerly (CUDA events around `iters` calls) and replayed
from a CUDA graph (one graph of `calls` back-to-back calls, replayed `iters` times), so
launch overhead and GPU time can be told apart. Attention reads a different layer's
cache on each call (`--layers` caches, together larger than L2), as a decode step does.

    python benchmarks/bench_kernels.py --out bench_kernels.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.kernels.activation import silu_and_mul, silu_and_mul_ref  # noqa: E402
from engine.kernels.attention import decode_attention, decode_attention_ref, decode_attention_sdpa  # noqa: E402
from engine.kernels.norm import add_rms_norm, add_rms_norm_ref  # noqa: E402
from engine.kernels.rope import rope_and_cache, rope_and_cache_ref  # noqa: E402

DTYPE = torch.bfloat16
DEVICE = "cuda"


def time_eager(fn, iters: int) -> float:
    """Microseconds per call, launches included."""
    for _ in range(3):
        fn()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / iters


def time_graph(fn, iters: int, calls: int) -> float:
    """Microseconds per call, from a graph holding `calls` calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
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


def attention_cases(args):
    # (name, T, Hq, Hkv, D, S_max, last position)
    shapes = [
        ("llama8b decode", 1, 32, 8, 128, 4096, 768),
        ("llama8b verify k=5", 6, 32, 8, 128, 4096, 768),
        ("llama8b decode long", 1, 32, 8, 128, 4096, 4000),
        ("llama8b verify long", 6, 32, 8, 128, 4096, 4000),
        ("llama8b decode S=32k", 1, 32, 8, 128, 32768, 768),
        ("smollm2 decode", 1, 9, 3, 64, 4096, 768),
        ("smollm2 verify k=5", 6, 9, 3, 64, 4096, 768),
    ]
    for name, num_rows, num_heads, num_kv_heads, head_dim, max_seq_len, last in shapes:
        layers = max(1, min(args.layers, (1 << 30) // (max_seq_len * num_kv_heads * head_dim * 4)))
        q = torch.randn(num_rows, num_heads, head_dim, device=DEVICE, dtype=DTYPE)
        caches = [
            (torch.randn(max_seq_len, num_kv_heads, head_dim, device=DEVICE, dtype=DTYPE),
             torch.randn(max_seq_len, num_kv_heads, head_dim, device=DEVICE, dtype=DTYPE))
            for _ in range(layers)
        ]
        positions = torch.arange(last - num_rows + 1, last + 1, device=DEVICE, dtype=torch.int32)
        scale = head_dim**-0.5
        kv_bytes = 2 * (last + 1) * num_kv_heads * head_dim * q.element_size()

        def over_layers(op):
            def run():
                for k_cache, v_cache in caches:
                    op(q, k_cache, v_cache, positions, scale)
            return run

        want = decode_attention_ref(q, *caches[0], positions, scale)
        impls = {"triton": decode_attention, "ref": decode_attention_ref,
                 "sdpa": decode_attention_sdpa}
        for impl, op in impls.items():
            diff = max_diff(op(q, *caches[0], positions, scale), want)
            yield dict(
                kernel="decode_attention", case=name, impl=impl, max_abs_diff=diff, kv_bytes=kv_bytes,
                fn=over_layers(op), calls_per_fn=layers,
            )


def norm_cases(args):
    for name, num_rows, hidden in [("llama8b T=1", 1, 4096), ("llama8b T=6", 6, 4096), ("smollm2 T=1", 1, 576)]:
        x, residual = (torch.randn(num_rows, hidden, device=DEVICE, dtype=DTYPE) for _ in range(2))
        weight = torch.randn(hidden, device=DEVICE, dtype=DTYPE)
        want = add_rms_norm_ref(x, residual, weight, 1e-5)
        for impl, op in {"triton": add_rms_norm, "ref": add_rms_norm_ref}.items():
            yield dict(
                kernel="add_rms_norm", case=name, impl=impl, max_abs_diff=max_diff(op(x, residual, weight, 1e-5), want),
                fn=lambda op=op: op(x, residual, weight, 1e-5), calls_per_fn=1,
            )


def activation_cases(args):
    for name, num_rows, inter in [("llama8b T=1", 1, 14336), ("llama8b T=6", 6, 14336), ("smollm2 T=1", 1, 1536)]:
        gate_up = torch.randn(num_rows, 2 * inter, device=DEVICE, dtype=DTYPE)
        want = silu_and_mul_ref(gate_up)
        for impl, op in {"triton": silu_and_mul, "ref": silu_and_mul_ref}.items():
            yield dict(
                kernel="silu_and_mul", case=name, impl=impl, max_abs_diff=max_diff(op(gate_up), want),
                fn=lambda op=op: op(gate_up), calls_per_fn=1,
            )


def rope_cases(args):
    for name, num_rows, num_heads, num_kv_heads, head_dim in [
        ("llama8b T=1", 1, 32, 8, 128), ("llama8b T=6", 6, 32, 8, 128), ("smollm2 T=1", 1, 9, 3, 64),
    ]:
        max_seq_len = 4096
        inv_freq = 1.0 / 500000 ** (torch.arange(0, head_dim, 2, device=DEVICE).float() / head_dim)
        freqs = torch.outer(torch.arange(max_seq_len, device=DEVICE).float(), inv_freq)
        cos_sin_cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
        qkv = torch.randn(num_rows, (num_heads + 2 * num_kv_heads) * head_dim, device=DEVICE, dtype=DTYPE)
        q, k, v = (x.view(num_rows, -1, head_dim) for x in qkv.split(
            [num_heads * head_dim, num_kv_heads * head_dim, num_kv_heads * head_dim], dim=-1))
        positions = torch.arange(700, 700 + num_rows, device=DEVICE, dtype=torch.int32)
        k_cache = torch.zeros(max_seq_len, num_kv_heads, head_dim, device=DEVICE, dtype=DTYPE)
        v_cache = torch.zeros_like(k_cache)
        want = rope_and_cache_ref(q, k, v, cos_sin_cache, positions, k_cache.clone(), v_cache.clone())
        for impl, op in {"triton": rope_and_cache, "ref": rope_and_cache_ref}.items():
            got = op(q, k, v, cos_sin_cache, positions, k_cache, v_cache)
            yield dict(
                kernel="rope_and_cache", case=name, impl=impl, max_abs_diff=max_diff(got, want),
                fn=lambda op=op: op(q, k, v, cos_sin_cache, positions, k_cache, v_cache), calls_per_fn=1,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--iters", type=int, default=200, help="timed eager calls / graph replays")
    parser.add_argument("--calls", type=int, default=20, help="calls captured in one graph")
    parser.add_argument("--layers", type=int, default=16, help="attention caches cycled per call (beats L2)")
    parser.add_argument("--only", default="", help="comma list of kernels to run (default: all)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("bench_kernels needs a CUDA GPU")
    torch.manual_seed(0)
    only = {name for name in args.only.split(",") if name}
    results = []
    print(f"{'kernel':18s} {'case':22s} {'impl':7s} {'eager us':>9s} {'graph us':>9s} {'GB/s':>7s} {'max diff':>9s}")
    for cases in (attention_cases, norm_cases, activation_cases, rope_cases):
        for case in cases(args):
            if only and case["kernel"] not in only:
                continue
            fn, calls_per_fn = case.pop("fn"), case.pop("calls_per_fn")
            case["eager_us"] = time_eager(fn, args.iters) / calls_per_fn
            case["graph_us"] = time_graph(fn, args.iters, max(1, args.calls // calls_per_fn)) / calls_per_fn
            gbps = case["kv_bytes"] / case["graph_us"] / 1e3 if "kv_bytes" in case else None
            case["graph_kv_gb_s"] = gbps
            results.append(case)
            print(
                f"{case['kernel']:18s} {case['case']:22s} {case['impl']:7s} {case['eager_us']:9.2f} "
                f"{case['graph_us']:9.2f} {'' if gbps is None else f'{gbps:7.0f}':>7s} {case['max_abs_diff']:9.2e}",
                flush=True,
            )
            torch.cuda.empty_cache()
    import triton

    report = dict(
        device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
        dtype=str(DTYPE), iters=args.iters, calls_per_graph=args.calls, results=results,
    )
    args.out.write_text(json.dumps(report, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
