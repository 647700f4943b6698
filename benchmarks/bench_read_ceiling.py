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

With all four roles it also reads a whole layer's four projections, the bound on what fewer
launches could win: four flat launches one after another, without PDL and with it (each
launched while the one before runs, its loads issued before its wait, as the engine launches its
one-row kernel); one persistent launch (a few programs
a multiprocessor, each streaming chunks of each projection in turn) with a grid-wide barrier
between the projections, as a layer in one kernel would need between its dependent steps; the
same with each program's first loads of the next projection issued before it waits at a
barrier (weights do not depend on the step before them); the same launch without the barriers
(what the barriers cost); one launch of a program a chunk, each projection's programs waiting
until the one before is done (loads issued before or after the wait); and one flat launch over the four
buffers as one (no launch or barrier between them at all).

    python benchmarks/bench_read_ceiling.py --out read_ceiling.json [--roles gate_up,qkv]
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
from benchmarks.harness.timing import copy_bandwidth, kernel_bench_args  # noqa: E402

# (rows, bytes a row) of the 8B's projections packed at 4 bits
SHAPES = {"qkv": (6144, 2048), "o_proj": (4096, 2048), "gate_up": (28672, 2048), "down": (4096, 7168)}
# (rows a program, int32 words a step, warps, stages; 0 = steps unrolled)
TILES = [(4, 512, 4, 0), (8, 512, 4, 0), (16, 512, 8, 0), (4, 256, 2, 0), (2, 512, 2, 0), (8, 256, 4, 0),
         (32, 512, 8, 0), (4, 512, 8, 0), (4, 128, 1, 3), (8, 128, 2, 3), (8, 256, 4, 3)]
# (int32 words a program, warps)
FLAT = [(2048, 4), (4096, 4), (8192, 8), (16384, 8), (32768, 8)]
LAYER = ("qkv", "o_proj", "gate_up", "down")  # a layer's projections, in the order a step reads them
# the persistent layer read: (programs a multiprocessor, int32 words a load, loads a program issues
# before it uses them, warps)
PERSISTENT = [(1, 2048, 4, 8), (1, 4096, 4, 16), (2, 2048, 4, 8), (2, 2048, 2, 8), (4, 1024, 4, 4),
              (4, 2048, 2, 8), (8, 1024, 2, 4)]
# the chained layer read, a program a chunk: (int32 words a program, warps)
CHAIN = [(2048, 4), (4096, 4), (8192, 8)]
MAX_SPINS = 1 << 20  # polls of a barrier before a program gives up (a launch too large to be resident
# at once would otherwise hang the GPU); a give-up is flagged and the figures marked wrong


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
    def read_flat_kernel(w_ptr, out_ptr, n_words, CHUNK: tl.constexpr, PDL: tl.constexpr = False):
        """XORs CHUNK contiguous int32 words a program: out[program] = them XORed. PDL: launched
        while the kernel before runs, as the engine's one-row kernel is: the load issued, then the
        wait for the kernel before, the store, then the next kernel let in."""
        pid = tl.program_id(0)
        offs = pid.to(tl.int64) * CHUNK + tl.arange(0, CHUNK)
        v = tl.load(w_ptr + offs, mask=offs < n_words, other=0)
        if PDL:
            tl.extra.cuda.gdc_wait()
        tl.store(out_ptr + pid, tl.xor_sum(v, 0))
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()


    @triton.jit
    def read_layer_kernel(w0, w1, w2, w3, n0, n1, n2, n3, out_ptr, bar_ptr, CHUNK: tl.constexpr,
                          UNROLL: tl.constexpr, BARRIER: tl.constexpr, PREFETCH: tl.constexpr, SPINS: tl.constexpr):
        """Each program XORs chunks pid, pid + G, ... of each of the four buffers in turn (out[phase
        * G + pid]); BARRIER: no program starts a buffer before all have finished the one before;
        PREFETCH: a program's first UNROLL chunks of the next buffer are loaded before it waits (the
        weights of a layer's next step do not depend on the step before, so a layer in one kernel
        could keep memory busy across its barriers this way). bar_ptr: four int32: arrivals and
        exits (zero at launch and again at exit), a give-up flag, and the arrivals the last program
        out counted (3 G where each program arrived once at each barrier)."""
        pid = tl.program_id(0)
        g = tl.num_programs(0)
        span = CHUNK * UNROLL
        block = pid * span + tl.arange(0, UNROLL)[:, None] * CHUNK + tl.arange(0, CHUNK)[None, :]
        for phase in tl.static_range(4):
            if phase == 0:
                w, n = w0, n0
            elif phase == 1:
                w, n = w1, n1
            elif phase == 2:
                w, n = w2, n2
            else:
                w, n = w3, n3
            if PREFETCH and phase > 0:
                acc = tl.xor_sum(pre, 0)
                first = pid * span + g * span
            else:
                acc = tl.zeros([CHUNK], tl.int32)
                first = pid * span
            for start in range(first, n, g * span):
                for u in tl.static_range(UNROLL):
                    offs = start + u * CHUNK + tl.arange(0, CHUNK)
                    acc ^= tl.load(w + offs, mask=offs < n, other=0)
            tl.store(out_ptr + phase * g + pid, tl.xor_sum(acc, 0))
            if phase < 3:
                if PREFETCH:  # loaded now, first used after the barrier
                    if phase == 0:
                        pre = tl.load(w1 + block, mask=block < n1, other=0)
                    elif phase == 1:
                        pre = tl.load(w2 + block, mask=block < n2, other=0)
                    else:
                        pre = tl.load(w3 + block, mask=block < n3, other=0)
                if BARRIER:
                    tl.atomic_add(bar_ptr, 1, sem="release")
                    spins = 0
                    while (tl.load(bar_ptr, volatile=True) < (phase + 1) * g) & (spins < SPINS):
                        spins += 1
                    if spins >= SPINS:
                        tl.atomic_max(bar_ptr + 2, 1)
        if BARRIER:  # the last program out resets the counters: every other one is past its last poll
            if tl.atomic_add(bar_ptr + 1, 1, sem="acq_rel") == g - 1:
                tl.store(bar_ptr + 3, tl.load(bar_ptr, volatile=True))
                tl.store(bar_ptr, 0)
                tl.store(bar_ptr + 1, 0)


    @triton.jit
    def read_chain_kernel(w0, w1, w2, w3, n0, n1, n2, n3, t0, t1, t2, t3, out_ptr, sync_ptr, CHUNK: tl.constexpr,
                          EARLY: tl.constexpr, SPINS: tl.constexpr):
        """A program a chunk, the four buffers' chunks in one launch: a program takes the next ticket
        (the order programs start in, so it waits only on programs already running, and a launch of
        any size cannot hang) and reads chunk `ticket` of the four buffers' t0 + t1 + t2 + t3; it
        starts its buffer only when every chunk of the buffer before is done, as a step that needs the
        step before it would. EARLY: its chunk's load is issued before it waits. out[ticket] = the
        chunk's XOR. sync_ptr: eight int32, zero at launch and again at exit (tickets, chunks done of
        each buffer, exits), then a give-up flag."""
        t = tl.atomic_add(sync_ptr, 1)
        if t < t0:
            w, n, local, phase, before = w0, n0, t, 0, 0
        elif t < t0 + t1:
            w, n, local, phase, before = w1, n1, t - t0, 1, t0
        elif t < t0 + t1 + t2:
            w, n, local, phase, before = w2, n2, t - t0 - t1, 2, t1
        else:
            w, n, local, phase, before = w3, n3, t - t0 - t1 - t2, 3, t2
        offs = local * CHUNK + tl.arange(0, CHUNK)
        if EARLY:
            v = tl.load(w + offs, mask=offs < n, other=0)
        if phase > 0:
            spins = 0
            while (tl.load(sync_ptr + phase, volatile=True) < before) & (spins < SPINS):
                spins += 1
            if spins >= SPINS:
                tl.atomic_max(sync_ptr + 6, 1)
        if not EARLY:
            v = tl.load(w + offs, mask=offs < n, other=0)
        tl.store(out_ptr + t, tl.xor_sum(v, 0))
        tl.atomic_add(sync_ptr + 1 + phase, 1, sem="release")
        if tl.atomic_add(sync_ptr + 5, 1, sem="acq_rel") == t0 + t1 + t2 + t3 - 1:
            for i in tl.static_range(6):
                tl.store(sync_ptr + i, 0)


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


def read_flat(w: torch.Tensor, out: torch.Tensor, chunk: int, warps: int, pdl: bool = False) -> torch.Tensor:
    n = w.numel()
    extra = dict(PDL=True, launch_pdl=True) if pdl else {}
    read_flat_kernel[(triton.cdiv(n, chunk),)](w, out, n, CHUNK=chunk, num_warps=warps, **extra)
    return out


def read_layer(ws: list[torch.Tensor], out: torch.Tensor, bar: torch.Tensor, programs: int, chunk: int,
               unroll: int, warps: int, barrier: bool, prefetch: bool = False):
    """The four buffers' words read by one launch of `programs` programs (read_layer_kernel); returns
    Triton's compiled kernel (its registers and shared memory tell how many fit a multiprocessor)."""
    return read_layer_kernel[(programs,)](*ws, *(w.numel() for w in ws), out, bar, CHUNK=chunk, UNROLL=unroll,
                                          BARRIER=barrier, PREFETCH=prefetch, SPINS=MAX_SPINS, num_warps=warps)


def chain_counts(ws: list[torch.Tensor], chunk: int) -> list[int]:
    """Chunks of each buffer: the programs read_chain gives it."""
    return [triton.cdiv(w.numel(), chunk) for w in ws]


def read_chain(ws: list[torch.Tensor], out: torch.Tensor, sync: torch.Tensor, chunk: int, warps: int, early: bool):
    """The four buffers read by one launch of a program a chunk, buffer after buffer (read_chain_kernel)."""
    counts = chain_counts(ws, chunk)
    read_chain_kernel[(sum(counts),)](*ws, *(w.numel() for w in ws), *counts, out, sync, CHUNK=chunk, EARLY=early,
                                      SPINS=MAX_SPINS, num_warps=warps)
    return out


def chain_xors(out: torch.Tensor, counts: list[int]) -> list[int]:
    """Each buffer's XOR from read_chain's per-chunk XORs."""
    ends = [sum(counts[:i + 1]) for i in range(4)]
    return [int(xor_rows(out[e - c:e][None, :])[0]) for e, c in zip(ends, counts)]


def layer_xors(out: torch.Tensor, programs: int) -> list[int]:
    """Each buffer's XOR from read_layer's per-program XORs."""
    per = out[:4 * programs].view(4, programs)
    return xor_rows(per).tolist()


def resident(kernel, warps: int, props) -> int:
    """Programs of a compiled kernel that fit one multiprocessor at once (threads, registers, shared
    memory, the 32-block cap): a barrier across the grid hangs unless all its programs are resident."""
    threads = 32 * warps
    regs = max(1, getattr(kernel, "n_regs", 0) or 1)
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536) or 65536
    smem = getattr(kernel, "shared", None)
    if smem is None:
        smem = getattr(getattr(kernel, "metadata", None), "shared", 0) or 0
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 << 10) or (228 << 10)
    fits = [32, props.max_threads_per_multi_processor // threads, regs_per_sm // (-(-regs * threads // 256) * 256)]
    if smem:
        fits.append(smem_per_sm // smem)
    return max(0, min(fits))


def time_layer(ws_copies: list[list[torch.Tensor]], flat_best: dict, iters: int, calls: int, bw: float,
               dev) -> dict:
    """A layer's four projections read four ways (the module's docstring), each checked against torch's
    XORs and timed in CUDA graphs over copies larger than L2."""
    copies = len(ws_copies)
    total = sum(w.numel() * 4 for w in ws_copies[0])
    refs = [int(xor_rows(w.reshape(1, -1))[0]) for w in ws_copies[0]]
    props = torch.cuda.get_device_properties(dev)
    sms = props.multi_processor_count
    entry = {"bytes": total, "sms": sms, "persistent": []}

    def share(us: float) -> float:
        return total / (us * 1e-6) / bw

    outs = {r: torch.empty(triton.cdiv(ws_copies[0][i].numel(), flat_best[r][0]), dtype=torch.int32, device=dev)
            for i, r in enumerate(LAYER)}

    def four(i, pdl=False):
        for j, r in enumerate(LAYER):
            read_flat(ws_copies[i % copies][j], outs[r], *flat_best[r], pdl=pdl)

    us = time_graph(four, iters, calls)
    entry["four_flat_launches"] = {"us": us, "of_copy_bandwidth": share(us),
                                   "chunks": {r: list(flat_best[r]) for r in LAYER}}
    print(f"layer    {total / 1e6:6.1f} MB  four flat launches {us:7.2f} us = {100 * share(us):5.1f}% of copy",
          flush=True)
    from engine.kernels import pdl_args  # the engine's own test of PDL support

    if "launch_pdl" in pdl_args(dev, True):
        us = time_graph(lambda i: four(i, True), iters, calls)
        entry["four_flat_launches_pdl"] = {"us": us, "of_copy_bandwidth": share(us)}
        print(f"layer    four flat launches, PDL {us:7.2f} us = {100 * share(us):5.1f}% of copy", flush=True)
    one = [torch.cat([w.reshape(-1) for w in ws]) for ws in ws_copies]
    chunk, warps = max(flat_best.values())
    one_out = torch.empty(triton.cdiv(one[0].numel(), chunk), dtype=torch.int32, device=dev)
    us = time_graph(lambda i: read_flat(one[i % copies], one_out, chunk, warps), iters, calls)
    entry["one_flat_launch"] = {"us": us, "of_copy_bandwidth": share(us), "chunk_words": chunk, "warps": warps}
    print(f"layer    one flat launch over all four {us:7.2f} us = {100 * share(us):5.1f}% of copy", flush=True)
    del one, one_out
    entry["chain"] = []
    sync = torch.zeros(8, dtype=torch.int32, device=dev)
    for chunk, warps in CHAIN:
        counts = chain_counts(ws_copies[0], chunk)
        out = torch.zeros(sum(counts), dtype=torch.int32, device=dev)
        for early in (False, True):
            read_chain(ws_copies[0], out, sync, chunk, warps, early)
            right = chain_xors(out, counts) == refs and int(sync[6]) == 0
            if int(sync[6]):
                sync.zero_()
            us = time_graph(lambda i: read_chain(ws_copies[i % copies], out, sync, chunk, warps, early), iters, calls)
            right = right and int(sync[6]) == 0 and sync[:6].tolist() == [0] * 6
            entry["chain"].append({"chunk_words": chunk, "warps": warps, "early": early, "us": us,
                                   "of_copy_bandwidth": share(us), "right": right})
            print(f"layer    chain {chunk * 4 // 1024} KB a program w{warps} {'loads early' if early else 'loads after '}"
                  f" {us:7.2f} us = {100 * share(us):5.1f}% of copy{'' if right else '  WRONG'}", flush=True)
            sync.zero_()
    bar = torch.zeros(4, dtype=torch.int32, device=dev)
    for per_sm, chunk, unroll, warps in PERSISTENT:
        programs = per_sm * sms
        out = torch.zeros(4 * programs, dtype=torch.int32, device=dev)
        # one program compiles each (its barriers open at once); the tightest sets the residency
        fit = min(resident(read_layer(ws_copies[0], out, bar, 1, chunk, unroll, warps, True, pre), warps, props)
                  for pre in (False, True))
        row = {"programs_per_sm": per_sm, "chunk_words": chunk, "unroll": unroll, "warps": warps,
               "resident_per_sm": fit, "registers": getattr(kernel, "n_regs", None)}
        if fit < per_sm:
            row["skipped"] = "more programs a multiprocessor than fit at once"
            entry["persistent"].append(row)
            print(f"layer    persistent {per_sm}/SM {chunk * 4 // 1024} KB x{unroll} w{warps}: only {fit} fit",
                  flush=True)
            continue
        for mode, barrier, pre in (("barriers", True, False), ("barriers_prefetch", True, True),
                                   ("no_barriers", False, False)):
            out.zero_()
            read_layer(ws_copies[0], out, bar, programs, chunk, unroll, warps, barrier, pre)
            right = layer_xors(out, programs) == refs and int(bar[2]) == 0
            if barrier:  # each program arrived once at each of the three barriers
                right = right and int(bar[3]) == 3 * programs
            if int(bar[2]):  # a program gave up waiting: not all were resident, timing it would crawl
                row[mode] = {"gave_up": True, "right": False}
                print(f"layer    persistent {per_sm}/SM: a barrier gave up waiting", flush=True)
                bar.zero_()
                break
            us = time_graph(lambda i: read_layer(ws_copies[i % copies], out, bar, programs, chunk, unroll, warps,
                                                 barrier, pre), iters, calls)
            right = right and int(bar[2]) == 0 and int(bar[0]) == 0
            row[mode] = {"us": us, "of_copy_bandwidth": share(us), "right": right}
            print(f"layer    persistent {per_sm}/SM {chunk * 4 // 1024} KB x{unroll} w{warps} "
                  f"{mode.replace('_', ' '):17s} {us:7.2f} us = {100 * share(us):5.1f}% of copy"
                  f"{'' if right else '  WRONG'}", flush=True)
            bar.zero_()
        entry["persistent"].append(row)
    return entry


def main() -> None:
    args, roles = kernel_bench_args(__doc__.splitlines()[0], "--roles", list(SHAPES), "shape")
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
    if all(r in roles for r in LAYER):
        best = {r: max(report["shapes"][r]["flat"], key=lambda t: t["of_copy_bandwidth"]) for r in LAYER}
        flat_best = {r: (b["chunk_words"], b["warps"]) for r, b in best.items()}
        layer_bytes = sum(SHAPES[r][0] * SHAPES[r][1] for r in LAYER)
        copies = max(2, (256 << 20) // layer_bytes + 1)
        ws_copies = [[torch.randint(-2**31, 2**31 - 1, (SHAPES[r][0] * SHAPES[r][1] // 4,), dtype=torch.int32,
                                    device=dev) for r in LAYER] for _ in range(copies)]
        report["layer"] = time_layer(ws_copies, flat_best, args.iters, args.calls, bw, dev)
        del ws_copies
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print("\n| projection | MB | torch row sum | best tile | best flat |\n|---|---|---|---|---|")
    for role, e in report["shapes"].items():
        bt = max(e["tiles"], key=lambda t: t["of_copy_bandwidth"])
        bf = max(e["flat"], key=lambda t: t["of_copy_bandwidth"])
        print(f"| {role} | {e['bytes'] / 1e6:.1f} | {100 * e['torch_row_sum']['of_copy_bandwidth']:.1f}% | "
              f"{100 * bt['of_copy_bandwidth']:.1f}% ({bt['rows']}x{bt['step_words'] * 4}B w{bt['warps']} "
              f"p{bt['stages']}) | {100 * bf['of_copy_bandwidth']:.1f}% ({bf['chunk_words'] * 4 // 1024} KB) |")
    if "layer" in report:
        e = report["layer"]
        print(f"\n| a layer's four reads ({e['bytes'] / 1e6:.1f} MB) | us | of copy |\n|---|---|---|")
        for name, key in (("four flat launches", "four_flat_launches"),
                          ("four flat launches with PDL, loads before the wait", "four_flat_launches_pdl"),
                          ("one flat launch", "one_flat_launch")):
            if key in e:
                print(f"| {name} | {e[key]['us']:.2f} | {100 * e[key]['of_copy_bandwidth']:.1f}% |")
        for early in (False, True):
            done = [r for r in e["chain"] if r["early"] == early and r["right"]]
            if done:
                b = min(done, key=lambda r: r["us"])
                print(f"| a program a chunk, each projection after the one before, loads "
                      f"{'before' if early else 'after'} the wait ({b['chunk_words'] * 4 // 1024} KB, w{b['warps']}) | "
                      f"{b['us']:.2f} | {100 * b['of_copy_bandwidth']:.1f}% |")
        for mode in ("barriers", "barriers_prefetch", "no_barriers"):
            done = [r for r in e["persistent"] if mode in r and r[mode]["right"]]
            if done:
                b = min(done, key=lambda r: r[mode]["us"])
                print(f"| persistent, {mode.replace('_', ' ')} ({b['programs_per_sm']}/SM, "
                      f"{b['chunk_words'] * 4 // 1024} KB x{b['unroll']}, w{b['warps']}) | {b[mode]['us']:.2f} | "
                      f"{100 * b[mode]['of_copy_bandwidth']:.1f}% |")


if __name__ == "__main__":
    main()
