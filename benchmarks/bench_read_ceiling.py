"""How fast a Triton kernel can merely read a packed projection's bytes, on the GPU.

The one-row kernel (packed_row_gemv) reaches some 70% of the copy bandwidth on an H200's
gate_up and 84-88% on an H100's. This asks whether the reading alone, laid out as that kernel
lays it out (a program's rows by a step of K, loaded into registers and combined), can do better:
if the bare reads of the same tiles stop near the same share, the tiles' loads in flight are
the limit and a faster decode cannot help; if they reach much more, the decoding is what costs.

For each of the 8B's four projections packed at 4 bits (N rows of K / 2 bytes: qkv 6,144 x
2,048 bytes, o_proj 4,096 x 2,048, gate_up 28,672 x 2,048, down 4,096 x 7,168), it times in
CUDA graphs over copies larger than L2:
- tiles: ROWS rows a program, STEP int32 words a step, the steps unrolled (as the row kernel's
  are) or in a loop of `num_stages` (copies into shared memory), WARPS warps;
- flat: each program one contiguous chunk of the buffer (the most a plain streaming read gets);
- torch's own row sum over the same bytes, as a library's reduction reads them;
and prints each one's GB/s as a share of the copy bandwidth measured in the same run.

    python benchmarks/bench_read_ceiling.py --out read_ceiling.json [--roles gate_up,qkv]
"""

from __future__ import annotations

import argparse
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
from benchmarks.harness.timing import copy_bandwidth  # noqa: E402

# (rows, bytes a row) of the 8B's projections packed at 4 bits
SHAPES = {"qkv": (6144, 2048), "o_proj": (4096, 2048), "gate_up": (28672, 2048), "down": (4096, 7168)}
# (rows a program, int32 words a step, warps, stages; 0 = steps unrolled)
TILES = [(4, 512, 4, 0), (8, 512, 4, 0), (16, 512, 8, 0), (4, 256, 2, 0), (2, 512, 2, 0), (8, 256, 4, 0),
         (32, 512, 8, 0), (4, 512, 8, 0), (4, 128, 1, 3), (8, 128, 2, 3), (8, 256, 4, 3)]
# (int32 words a program, warps)
FLAT = [(2048, 4), (4096, 4), (8192, 8), (16384, 8), (32768, 8)]


if triton is not None:
    @triton.jit
    def read_tiles_kernel(w_ptr, out_ptr, n_rows, row_words, ROWS: tl.constexpr, STEP: tl.constexpr,
                          N_STEPS: tl.constexpr, STAGES: tl.constexpr):
        """XORs ROWS rows of int32 words, STEP words a step: out[row] = the row's words XORed (every
        load used, nothing to round)."""
        pid = tl.program_id(0)
        rows = pid * ROWS + tl.arange(0, ROWS)
        cols = tl.arange(0, STEP)
        base = w_ptr + rows[:, None].to(tl.int64) * row_words + cols[None, :]
        live = rows[:, None] < n_rows
        acc = tl.zeros([ROWS, STEP], tl.int32)
        if STAGES == 0:
            for s in tl.static_range(N_STEPS):
                acc ^= tl.load(base + s * STEP, mask=live & (s * STEP + cols[None, :] < row_words), other=0)
        else:
            for s in tl.range(0, N_STEPS, num_stages=STAGES):
                acc ^= tl.load(base + s * STEP, mask=live & (s * STEP + cols[None, :] < row_words), other=0)
        tl.store(out_ptr + rows, tl.xor_sum(acc, 1), mask=rows < n_rows)


    @triton.jit
    def read_flat_kernel(w_ptr, out_ptr, n_words, CHUNK: tl.constexpr):
        """XORs CHUNK contiguous int32 words a program: out[program] = them XORed."""
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(w_ptr + offs, mask=offs < n_words, other=0)
        tl.store(out_ptr + pid, tl.xor_sum(v, 0))


def xor_rows(w: torch.Tensor) -> torch.Tensor:
    """Each row's words XORed (the reference for read_tiles)."""
    out = w[:, 0].clone()
    for j in range(1, w.shape[1]):
        out ^= w[:, j]
    return out


def read_tiles(w: torch.Tensor, out: torch.Tensor, rows: int, step: int, warps: int, stages: int) -> torch.Tensor:
    n, words = w.shape
    read_tiles_kernel[(triton.cdiv(n, rows),)](w, out, n, words, ROWS=rows, STEP=step,
                                               N_STEPS=triton.cdiv(words, step), STAGES=stages,
                                               num_warps=warps, num_stages=max(stages, 1))
    return out


def read_flat(w: torch.Tensor, out: torch.Tensor, chunk: int, warps: int) -> torch.Tensor:
    n = w.numel()
    read_flat_kernel[(triton.cdiv(n, chunk),)](w, out, n, CHUNK=chunk, num_warps=warps)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--roles", default=",".join(SHAPES))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    roles = [r for r in args.roles.split(",") if r]
    unknown = [r for r in roles if r not in SHAPES]
    if unknown:
        ap.error(f"--roles: no shape named {', '.join(sorted(unknown))} (there are {', '.join(SHAPES)})")
    if triton is None or not torch.cuda.is_available():
        sys.exit("error: this benchmark needs a CUDA GPU and Triton")
    dev = torch.device("cuda")
    bw = copy_bandwidth(dev)
    report = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
              "copy_GBps": bw / 1e9, "shapes": {}}
    print(f"{report['device']}: copy bandwidth {bw / 1e9:,.0f} GB/s", flush=True)
    for role in roles:
        n, nbytes = SHAPES[role]
        words = nbytes // 4
        copies = max(2, (256 << 20) // (n * nbytes) + 1)
        ws = [torch.randint(-2**31, 2**31 - 1, (n, words), dtype=torch.int32, device=dev) for _ in range(copies)]
        ref = xor_rows(ws[0])
        total = n * nbytes
        rows_out = torch.empty(n, dtype=torch.int32, device=dev)
        entry = {"rows": n, "bytes": total, "tiles": [], "flat": []}

        def share(us: float) -> float:
            return total / (us * 1e-6) / bw

        us = time_graph(lambda i: ws[i % copies].view(torch.float32).sum(1), args.iters, args.calls)
        entry["torch_row_sum"] = {"us": us, "of_copy_bandwidth": share(us)}
        print(f"{role:8s} {total / 1e6:6.1f} MB  torch row sum {us:7.2f} us = {100 * share(us):5.1f}% of copy", flush=True)
        for rows, step, warps, stages in TILES:
            if step > words:
                continue
            got = read_tiles(ws[0], rows_out, rows, step, warps, stages)
            right = bool(torch.equal(got, ref))
            us = time_graph(lambda i: read_tiles(ws[i % copies], rows_out, rows, step, warps, stages),
                            args.iters, args.calls)
            entry["tiles"].append({"rows": rows, "step_words": step, "warps": warps, "stages": stages,
                                   "us": us, "of_copy_bandwidth": share(us), "right": right})
            print(f"{role:8s} tile {rows}x{step * 4}B w{warps} {'unrolled' if not stages else f'p{stages}':8s} "
                  f"{us:7.2f} us = {100 * share(us):5.1f}% of copy{'' if right else '  WRONG'}", flush=True)
        for chunk, warps in FLAT:
            flat_out = torch.empty(triton.cdiv(n * words, chunk), dtype=torch.int32, device=dev)
            us = time_graph(lambda i: read_flat(ws[i % copies], flat_out, chunk, warps), args.iters, args.calls)
            entry["flat"].append({"chunk_words": chunk, "warps": warps, "us": us, "of_copy_bandwidth": share(us)})
            print(f"{role:8s} flat {chunk * 4 // 1024} KB a program w{warps}  {us:7.2f} us = "
                  f"{100 * share(us):5.1f}% of copy", flush=True)
        report["shapes"][role] = entry
        del ws
        torch.cuda.empty_cache()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print("\n| projection | MB | torch row sum | best tile | best flat |\n|---|---|---|---|---|")
    for role, e in report["shapes"].items():
        bt = max(e["tiles"], key=lambda t: t["of_copy_bandwidth"])
        bf = max(e["flat"], key=lambda t: t["of_copy_bandwidth"])
        print(f"| {role} | {e['bytes'] / 1e6:.1f} | {100 * e['torch_row_sum']['of_copy_bandwidth']:.1f}% | "
              f"{100 * bt['of_copy_bandwidth']:.1f}% ({bt['rows']}x{bt['step_words'] * 4}B w{bt['warps']} "
              f"p{bt['stages']}) | {100 * bf['of_copy_bandwidth']:.1f}% ({bf['chunk_words'] * 4 // 1024} KB) |")


if __name__ == "__main__":
    main()
