"""Whether requesting a packed projection's weights into L2 during a stretch that leaves the memory
idle (a decode step's attention, norms, activation) makes the projection faster (CUDA, Hopper).

Per case, one CUDA graph over copies of the 8B's AWQ projections (more bytes than L2 holds, so
each GEMV starts cold), microseconds a repetition:
  base:  stand-in(T) -> packed_row_gemv(W_i)
  MODE:  prefetch(W_i) by P programs -> stand-in(T) -> packed_row_gemv(W_i)
  MODE_alone: the same without the GEMV (what the prefetch kernel and the stand-in take)
  warm_same_copy_us: the GEMV over one copy again and again (its weights in L2)
The stand-in is torch.cuda._sleep (one program spinning T us); MODE is bulk (one
cp.async.bulk.prefetch.L2 request a thread) or line (a prefetch.global.L2 a 128-byte line).

    python benchmarks/bench_l2_prefetch.py --out benchmarks/results/h100_l2_prefetch.json
"""
import argparse
import json
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from benchmarks.bench_gemv import time_graph  # noqa: E402
from benchmarks.bench_packed import blocks_for  # noqa: E402
from engine.kernels.packed_gemv import packed_row_gemv  # noqa: E402

LANES = 128  # threads a prefetch program (four warps), one request each
STRETCHES_US = (0, 3, 6)  # the idle stretch the stand-in spins for
# (mode, programs): bulk requests from 1 to 132 programs, line requests from 132 and 528
WAYS = (("bulk", 1), ("bulk", 8), ("bulk", 64), ("bulk", 132), ("line", 132), ("line", 528))
REPS = 50


@triton.jit
def bulk_prefetch(base, nbytes, chunk, PER: tl.constexpr):
    """Program p requests chunks p * PER .. p * PER + PER - 1 of `chunk` bytes into L2, one a thread
    (each a multiple of 16 bytes; past nbytes, none)."""
    i = tl.program_id(0) * PER + tl.arange(0, PER)
    off = i.to(tl.int64) * chunk.to(tl.int64)
    n = tl.minimum(nbytes - off, chunk)
    n = tl.where(n > 0, (n + 15) // 16 * 16, 0).to(tl.int32)
    tl.inline_asm_elementwise(
        "{ .reg .pred q; setp.gt.s32 q, $2, 0; @q cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [base.to(tl.pointer_type(tl.uint8)) + off, n], dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def line_prefetch(base, nbytes, PER: tl.constexpr):
    """Program p requests lines p * PER .. p * PER + PER - 1 (128 bytes each) into L2."""
    i = tl.program_id(0) * PER + tl.arange(0, PER)
    off = tl.minimum(i.to(tl.int64) * 128, nbytes - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [base.to(tl.pointer_type(tl.uint8)) + off],
                              dtype=tl.int32, is_pure=False, pack=1)


def prefetch(tensors, mode: str, programs: int) -> None:
    """Each tensor's bytes requested into L2 by about `programs` programs."""
    for t in tensors:
        nbytes = t.numel() * t.element_size()
        if mode == "bulk":
            chunk = max(16, -(-nbytes // (programs * LANES)) // 16 * 16 + 16)
            bulk_prefetch[(-(-nbytes // (chunk * LANES)),)](t, nbytes, chunk, PER=LANES, num_warps=4)
        else:
            lines = -(-nbytes // 128)
            per = triton.next_power_of_2(-(-lines // programs))
            line_prefetch[(-(-lines // per),)](t, nbytes, PER=per, num_warps=4)


def timed(fn, copies: int) -> float:
    """Microseconds a call of fn(i), from a CUDA graph of fn(0) .. fn(copies - 1) replayed REPS times."""
    return time_graph(fn, REPS, copies)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    clock_mhz = props.clock_rate / 1e3 if hasattr(props, "clock_rate") else 1755  # the stand-in's cycles a us
    res = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
           "cases": []}
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    for role, copies in (("o_proj", 16), ("qkv", 10), ("gate_up", 4)):  # copies: more bytes than L2
        sets = [blocks_for("AWQ", role, dev, gen) for _ in range(copies)]
        n = sum(b.shape[0] for b in sets[0])
        out = torch.empty(1, n, device=dev, dtype=torch.bfloat16)
        mb = sum(b.nbytes for b in sets[0]) / 1e6

        def gemv(i):
            start = 0
            for b in sets[i]:
                packed_row_gemv(x, b, None, None, out=out[:, start:start + b.shape[0]], int8_x=True, pdl=2)
                start += b.shape[0]

        def tensors(i):
            return [t for b in sets[i] for t in b.tensors() if t is not None]

        for stretch in STRETCHES_US:
            cycles = int(stretch * clock_mhz)

            def stand_in():
                if cycles:
                    torch.cuda._sleep(cycles)

            row = {"role": role, "MB": round(mb, 2), "T_us": stretch,
                   "sleep_us": round(timed(lambda i: stand_in(), copies), 2) if stretch else 0.0,
                   "base_us": round(timed(lambda i: (stand_in(), gemv(i)), copies), 2)}
            for mode, programs in WAYS:
                if stretch == 0 and programs != 132:
                    continue
                both = timed(lambda i: (prefetch(tensors(i), mode, programs), stand_in(), gemv(i)), copies)
                alone = timed(lambda i: (prefetch(tensors(i), mode, programs), stand_in()), copies)
                row[f"{mode}{programs}"] = round(both, 2)
                row[f"{mode}{programs}_alone"] = round(alone, 2)
            res["cases"].append(row)
            print(json.dumps(row), flush=True)
        warm = {"role": role, "warm_same_copy_us": round(timed(lambda i: gemv(0), copies), 2)}
        res["cases"].append(warm)
        print(json.dumps(warm), flush=True)
        del sets
        torch.cuda.empty_cache()
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
