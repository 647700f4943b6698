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
from benchmarks.bench_packed import blocks_for
from engine.kernels.packed_gemv import packed_row_gemv

@triton.jit
def bulk_pf(base, nbytes, CHUNK, PER: tl.constexpr):
    # program p: chunks p*PER .. p*PER+PER-1 of CHUNK bytes, one a thread
    i = tl.program_id(0) * PER + tl.arange(0, PER)
    off = i.to(tl.int64) * CHUNK.to(tl.int64)
    n = tl.minimum(nbytes - off, CHUNK)
    n = tl.where(n > 0, (n + 15) // 16 * 16, 0).to(tl.int32)
    p = base.to(tl.pointer_type(tl.uint8)) + off
    tl.inline_asm_elementwise("{ .reg .pred q; setp.gt.s32 q, $2, 0; @q cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
                              "=r,l,r", [p, n], dtype=tl.int32, is_pure=False, pack=1)

@triton.jit
def line_pf(base, nbytes, PER: tl.constexpr):
    i = tl.program_id(0) * PER + tl.arange(0, PER)
    off = i.to(tl.int64) * 128
    p = base.to(tl.pointer_type(tl.uint8)) + tl.minimum(off, nbytes - 1)
    tl.inline_asm_elementwise("prefetch.global.L2 [$1]; // $0", "=r,l", [p], dtype=tl.int32, is_pure=False, pack=1)

def prefetch(tensors, mode, programs):
    for t in tensors:
        nb = t.numel() * t.element_size()
        if mode == "bulk":
            chunk = max(16, -(-nb // (programs * 128)) // 16 * 16 + 16)
            per = 128
            grid = -(-nb // (chunk * per))
            bulk_pf[(grid,)](t, nb, CHUNK=chunk, PER=per, num_warps=4)
        else:
            lines = -(-nb // 128)
            per = -(-lines // programs)
            per = triton.next_power_of_2(per)
            line_pf[(-(-lines // per),)](t, nb, PER=per, num_warps=4)

def timed(fn, reps, copies):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(2): fn(i)
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        for i in range(copies): fn(i)
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): g.replay()
    b.record(); torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / (reps * copies)

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev = "cuda"
    gen = torch.Generator(device=dev); gen.manual_seed(0)
    clock_mhz = torch.cuda.get_device_properties(0).clock_rate / 1e3 if hasattr(torch.cuda.get_device_properties(0), "clock_rate") else 1755
    res = {"device": torch.cuda.get_device_name(), "cases": []}
    x = torch.randn(1, 4096, device=dev, dtype=torch.bfloat16)
    for role, copies in (("o_proj", 16), ("qkv", 10), ("gate_up", 4)):
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
        for T in (0, 3, 6):
            cyc = int(T * clock_mhz)
            def sleep():
                if cyc: torch.cuda._sleep(cyc)
            t_sleep = timed(lambda i: sleep(), 50, copies) if T else 0.0
            base = timed(lambda i: (sleep(), gemv(i)), 50, copies)
            row = {"role": role, "MB": round(mb, 2), "T_us": T, "sleep_us": round(t_sleep, 2), "base_us": round(base, 2)}
            for mode, programs in (("bulk", 1), ("bulk", 8), ("bulk", 64), ("bulk", 132), ("line", 132), ("line", 528)):
                if T == 0 and programs not in (132,):
                    continue
                pf = timed(lambda i: (prefetch(tensors(i), mode, programs), sleep(), gemv(i)), 50, copies)
                pf_only = timed(lambda i: (prefetch(tensors(i), mode, programs), sleep()), 50, copies)
                row[f"{mode}{programs}"] = round(pf, 2)
                row[f"{mode}{programs}_alone"] = round(pf_only, 2)
            res["cases"].append(row)
            print(json.dumps(row), flush=True)
        warm = timed(lambda i: gemv(0), 50, copies)
        print(json.dumps({"role": role, "warm_same_copy_us": round(warm, 2)}), flush=True)
        res["cases"].append({"role": role, "warm_same_copy_us": round(warm, 2)})
        del sets; torch.cuda.empty_cache()
    args.out.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
