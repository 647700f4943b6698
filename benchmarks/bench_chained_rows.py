"""Two dependent one-row projections in one launch against two launches, on the GPU.

A packed layer runs nine launches one after another, and the bare reads (bench_read_ceiling.py)
say that a launch a projection cannot reach 85% of the bandwidth limit. This times the smallest
real step toward fewer launches: the 8B's gate_up, then down over gate_up's output (its first
14,336 values standing in for the activation), both on the engine's one-row kernel with int8 x:
- two launches, as the engine runs them: without PDL, and with PDL and the first K step's
  weights loaded before the wait (the engine's default);
- one chained launch: programs take tickets in the order they start; the first tickets run
  gate_up's programs, which count themselves done; the rest run down's, each waiting until all of
  gate_up's are done (so a program only waits on programs already running, and no launch size can
  hang), its first K step's weights loaded before the wait ("early") or after it.
Every variant's outputs are checked bit for bit against two plain launches (the same programs, so
the same sums), and timed in CUDA graphs over weight copies larger than L2.

    python benchmarks/bench_chained_rows.py --out chained.json [--layouts AWQ,Q4_K_M]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch's CPU build comes without Triton: main() says so in one line
    triton = None

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import LAYOUT_KINDS, blocks_for  # noqa: E402
from benchmarks.harness.timing import copy_bandwidth, kernel_bench_args  # noqa: E402
from engine.kernels import packed_gemv  # noqa: E402
from engine.kernels.packed_gemv import (  # noqa: E402
    CHAIN_WAIT, ROW_PDL_EARLY_W, _row_args, _row_kernel, packed_row_gemv)

GATE_UP, DOWN = "gate_up", "down"
# row_body's arguments after (pid_n, pid_k), in its order: the chained kernel takes each twice
BODY = ("x_ptr", "sx_ptr", "q_ptr", "qh_ptr", "s_ptr", "o_ptr", "su_ptr", "ou_ptr", "b_ptr", "out_ptr", "part_ptr",
        "count_ptr", "N", "stride_q", "stride_h", "stride_s", "stride_u", "low_mask", "high_mask", "ZERO", "G",
        "UNIT", "HAS_OFFSET", "HIGH", "ONE_BYTE", "FP8", "XQ", "ASM", "HAS_BIAS", "X_KIND", "SPLIT_K",
        "K_PER_SPLIT", "BLOCK_N", "BLOCK_K", "CHUNK", "VEC", "SG", "UG", "PAIRED")

if triton is not None:
    _row_kernel()  # binds packed_gemv's row_body and chain_wait
    row_body, chain_wait = packed_gemv.row_body, packed_gemv.chain_wait

    @triton.jit
    def chained_rows_kernel(
            sync_ptr, progs_a, tiles_a, progs_b, tiles_b,
            x_ptr_a, sx_ptr_a, q_ptr_a, qh_ptr_a, s_ptr_a, o_ptr_a, su_ptr_a, ou_ptr_a, b_ptr_a, out_ptr_a, part_ptr_a,
            count_ptr_a, N_a, stride_q_a, stride_h_a, stride_s_a, stride_u_a, low_mask_a, high_mask_a,
            ZERO_a: tl.constexpr, G_a: tl.constexpr, UNIT_a: tl.constexpr, HAS_OFFSET_a: tl.constexpr,
            HIGH_a: tl.constexpr, ONE_BYTE_a: tl.constexpr, FP8_a: tl.constexpr, XQ_a: tl.constexpr,
            ASM_a: tl.constexpr, HAS_BIAS_a: tl.constexpr, X_KIND_a: tl.constexpr, SPLIT_K_a: tl.constexpr,
            K_PER_SPLIT_a: tl.constexpr, BLOCK_N_a: tl.constexpr, BLOCK_K_a: tl.constexpr, CHUNK_a: tl.constexpr,
            VEC_a: tl.constexpr, SG_a: tl.constexpr, UG_a: tl.constexpr, PAIRED_a: tl.constexpr,
            x_ptr_b, sx_ptr_b, q_ptr_b, qh_ptr_b, s_ptr_b, o_ptr_b, su_ptr_b, ou_ptr_b, b_ptr_b, out_ptr_b, part_ptr_b,
            count_ptr_b, N_b, stride_q_b, stride_h_b, stride_s_b, stride_u_b, low_mask_b, high_mask_b,
            ZERO_b: tl.constexpr, G_b: tl.constexpr, UNIT_b: tl.constexpr, HAS_OFFSET_b: tl.constexpr,
            HIGH_b: tl.constexpr, ONE_BYTE_b: tl.constexpr, FP8_b: tl.constexpr, XQ_b: tl.constexpr,
            ASM_b: tl.constexpr, HAS_BIAS_b: tl.constexpr, X_KIND_b: tl.constexpr, SPLIT_K_b: tl.constexpr,
            K_PER_SPLIT_b: tl.constexpr, BLOCK_N_b: tl.constexpr, BLOCK_K_b: tl.constexpr, CHUNK_b: tl.constexpr,
            VEC_b: tl.constexpr, SG_b: tl.constexpr, UG_b: tl.constexpr, PAIRED_b: tl.constexpr,
            EARLY: tl.constexpr, WAIT_B: tl.constexpr):
        """The first projection's progs_a programs, then the second's progs_b, in one launch (the
        module docstring); EARLY: the second's first K step's weights loaded before its wait
        (WAIT_B = CHAIN_WAIT), else the wait first. sync_ptr: three int32 (tickets, the first
        projection's programs done, exits), zero at launch and again at exit."""
        t = tl.atomic_add(sync_ptr, 1)  # tickets in the order programs start
        if t < progs_a:
            row_body(t % tiles_a, t // tiles_a, x_ptr_a, sx_ptr_a, q_ptr_a, qh_ptr_a, s_ptr_a, o_ptr_a, su_ptr_a,
                     ou_ptr_a, b_ptr_a, out_ptr_a, part_ptr_a, count_ptr_a, N_a, stride_q_a, stride_h_a, stride_s_a,
                     stride_u_a, low_mask_a, high_mask_a, ZERO_a, G_a, UNIT_a, HAS_OFFSET_a, HIGH_a, ONE_BYTE_a,
                     FP8_a, XQ_a, ASM_a, HAS_BIAS_a, X_KIND_a, SPLIT_K_a, K_PER_SPLIT_a, BLOCK_N_a, BLOCK_K_a,
                     CHUNK_a, VEC_a, SG_a, UG_a, PAIRED_a, 0)
            tl.debug_barrier()  # every thread's stores before the count
            tl.atomic_add(sync_ptr + 1, 1, sem="release")
        else:
            u = t - progs_a
            if not EARLY:
                chain_wait(sync_ptr + 1, progs_a)
            row_body(u % tiles_b, u // tiles_b, x_ptr_b, sx_ptr_b, q_ptr_b, qh_ptr_b, s_ptr_b, o_ptr_b, su_ptr_b,
                     ou_ptr_b, b_ptr_b, out_ptr_b, part_ptr_b, count_ptr_b, N_b, stride_q_b, stride_h_b, stride_s_b,
                     stride_u_b, low_mask_b, high_mask_b, ZERO_b, G_b, UNIT_b, HAS_OFFSET_b, HIGH_b, ONE_BYTE_b,
                     FP8_b, XQ_b, ASM_b, HAS_BIAS_b, X_KIND_b, SPLIT_K_b, K_PER_SPLIT_b, BLOCK_N_b, BLOCK_K_b,
                     CHUNK_b, VEC_b, SG_b, UG_b, PAIRED_b, WAIT_B, sync_ptr + 1, progs_a)
        if tl.atomic_add(sync_ptr + 2, 1, sem="acq_rel") == progs_a + progs_b - 1:  # the last one out
            tl.store(sync_ptr, 0)
            tl.store(sync_ptr + 1, 0)
            tl.store(sync_ptr + 2, 0)


def chained_rows(x: torch.Tensor, first, second, mid: torch.Tensor, out: torch.Tensor, sync: torch.Tensor,
                 early: bool) -> torch.Tensor:
    """mid = x @ first.T (int8 x), then out = mid[:, :K] @ second.T, in one launch (module docstring)."""
    k2 = second.shape[1]
    grid_a, args_a, launch_a = _row_args(x, first, None, None, mid, True)
    grid_b, args_b, launch_b = _row_args(mid[:, :k2], second, None, None, out, True)
    assert launch_a == launch_b, (launch_a, launch_b)
    if args_a["SPLIT_K"] > 1 and args_b["SPLIT_K"] > 1:  # one tile-counter buffer a device
        args_b["count_ptr"] = args_b["count_ptr"][grid_a[0]:]
    args_a["x_ptr"], args_b["x_ptr"] = x, mid[:, :k2]
    kwargs = {f"{p}_a": args_a[p] for p in BODY}
    kwargs.update({f"{p}_b": args_b[p] for p in BODY})
    progs_a, progs_b = grid_a[0] * grid_a[1], grid_b[0] * grid_b[1]
    chained_rows_kernel[(progs_a + progs_b,)](sync, progs_a, grid_a[0], progs_b, grid_b[0], **kwargs, EARLY=early,
                                                 WAIT_B=CHAIN_WAIT if early else 0, **launch_a)
    return out


def two_launches(x: torch.Tensor, first, second, mid: torch.Tensor, out: torch.Tensor, pdl: int) -> torch.Tensor:
    packed_row_gemv(x, first, out=mid, int8_x=True, pdl=pdl)
    packed_row_gemv(mid[:, :second.shape[1]], second, out=out, int8_x=True, pdl=pdl)
    return out


def main() -> None:
    args, layouts = kernel_bench_args(__doc__.splitlines()[0], "--layouts", list(LAYOUT_KINDS), "layout",
                                      ("AWQ", "Q4_K_M"))
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_GBps": bw / 1e9, "layouts": {}}
    print(f"{report['device']}: copy bandwidth {bw / 1e9:,.0f} GB/s", flush=True)
    gen = torch.Generator(device=dev).manual_seed(0)
    sync = torch.zeros(3, dtype=torch.int32, device=dev)
    for layout in layouts:
        pairs = []
        while not pairs or sum(w.nbytes for w in pairs[0]) * len(pairs) < (256 << 20):
            gu, down = blocks_for(layout, GATE_UP, dev, gen), blocks_for(layout, DOWN, dev, gen)
            if len(gu) != 1 or len(down) != 1:
                sys.exit(f"error: {layout}'s gate_up or down is more than one block; this benchmark chains one each")
            pairs.append((gu[0], down[0]))
        copies = len(pairs)
        first, second = pairs[0]
        x = torch.randn(1, first.shape[1], device=dev, dtype=torch.bfloat16)
        mid = torch.empty(1, first.shape[0], device=dev, dtype=torch.bfloat16)
        out = torch.empty(1, second.shape[0], device=dev, dtype=torch.bfloat16)
        two_launches(x, first, second, mid, out, 0)
        ref_mid, ref_out = mid.clone(), out.clone()
        nbytes = sum(w.nbytes for w in pairs[0])
        entry = {"bytes": nbytes, "variants": {}}
        variants = {"two launches": lambda i: two_launches(x, *pairs[i % copies], mid, out, 0),
                    "two launches, PDL, weights before the wait":
                        lambda i: two_launches(x, *pairs[i % copies], mid, out, 2 | ROW_PDL_EARLY_W),
                    "one chained launch, weights after the wait":
                        lambda i: chained_rows(x, *pairs[i % copies], mid, out, sync, False),
                    "one chained launch, weights before the wait":
                        lambda i: chained_rows(x, *pairs[i % copies], mid, out, sync, True)}
        for name, fn in variants.items():
            mid.zero_()
            out.zero_()
            fn(0)
            right = torch.equal(mid, ref_mid) and torch.equal(out, ref_out) and sync.tolist() == [0, 0, 0]
            us = time_graph(fn, args.iters, args.calls)
            entry["variants"][name] = {"us": us, "of_copy_bandwidth": nbytes / (us * 1e-6) / bw, "right": right}
            print(f"{layout:7s} {name:45s} {us:7.2f} us = {100 * nbytes / (us * 1e-6) / bw:5.1f}% of copy"
                  f"{'' if right else '  WRONG'}", flush=True)
        report["layouts"][layout] = entry
        del pairs, first, second
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print("\n| layout | " + " | ".join(next(iter(report["layouts"].values()))["variants"]) + " |")
    print("|---" * (1 + len(variants)) + "|")
    for layout, e in report["layouts"].items():
        print(f"| {layout} | " + " | ".join(f"{v['us']:.2f} us{'' if v['right'] else ' WRONG'}"
                                            for v in e["variants"].values()) + " |")


if __name__ == "__main__":
    main()
