"""run_bench: `localchat bench`, plain decode, speculation, and transformers `generate` in one process."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

import torch

from engine.errors import UserError
from speculative.testing import ForcedEagle3Speculator

from benchmarks.harness.counts import apply_counts
from benchmarks.harness.peer import time_transformers
from benchmarks.harness.prompts import bench_prompts
from benchmarks.harness.report import _table, accept_hist_total
from benchmarks.harness.shapes import random_engine
from benchmarks.harness.timing import copy_bandwidth, time_decode


def run_bench(args) -> int:
    """args: `localchat bench`'s (app/cli.py). Prints the report (a table, or JSON with --json),
    writes it to --out when given, and returns the exit status."""
    apply_counts(args)
    check_args(args)
    t0 = time.perf_counter()
    engine = build_bench_engine(args)
    startup_s = time.perf_counter() - t0
    dev = engine.runner.device
    alts = getattr(engine.speculator, "alts", ())
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev.type == "cuda"
                          else platform.processor() or "cpu", "cuda": torch.version.cuda,
                          "cpu_threads": torch.get_num_threads()},
              "model": engine.model_name, "draft": engine.draft_name, "draft_steps": args.draft_steps,
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "quick": bool(getattr(args, "quick", False)),
              "startup_s": startup_s,
              "startup_phases_s": getattr(engine, "load_phases", None),
              "graphs": engine.runner.uses_graphs, "temperature": args.temperature,
              # runners-up each draft gets in greedy verify steps (EAGLE-3; none when sampling)
              "draft_alternatives": list(alts) if any(alts) else None}
    bw = copy_bandwidth(dev)
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.runner.model.parameters())
    report.update(copy_bandwidth_GBps=bw / 1e9, weight_bytes=weight_bytes,
                  bandwidth_limit_tok_s=bw / weight_bytes if bw else None)
    prompts, report["prompt_set"] = bench_prompts(engine, args)
    report["prompts"] = len(prompts)
    runs = {"plain": [], "spec": []}
    for ids in prompts:
        time_decode(engine, ids, 8, speculative=False)  # warm-up
        runs["plain"].append(time_decode(engine, ids, args.new_tokens, False, args.temperature))
        if engine.has_draft and not args.no_spec:
            time_decode(engine, ids, 8, speculative=True)
            runs["spec"].append(time_decode(engine, ids, args.new_tokens, True, args.temperature))

    def mean(rs, key):
        return sum(r[key] for r in rs) / len(rs) if rs else None

    report["plain"] = {k: mean(runs["plain"], k) for k in ("decode_tok_s", "ttft_s", "prefill_tok_s")}
    if report["bandwidth_limit_tok_s"]:
        report["plain"]["fraction_of_bandwidth_limit"] = report["plain"]["decode_tok_s"] / report["bandwidth_limit_tok_s"]
    if runs["spec"]:
        report["spec"] = {k: mean(runs["spec"], k) for k in ("decode_tok_s", "ttft_s", "accept_len_mean")}
        report["spec"]["speedup"] = report["spec"]["decode_tok_s"] / report["plain"]["decode_tok_s"]
        report["spec"]["per_prompt"] = runs["spec"]
        report["spec"]["accept_hist"] = accept_hist_total(runs["spec"], args.draft_steps + 2)
        if isinstance(engine.speculator, ForcedEagle3Speculator) and dev.type == "cuda":
            report["spec"]["loop_cost"] = engine.speculator.measure_components(engine.runner)
    if not args.no_peer:
        peer = time_transformers(engine, prompts[0], min(args.new_tokens, 64))
        report["transformers"] = peer
        report["speedup_vs_transformers"] = report["plain"]["decode_tok_s"] / peer["decode_tok_s"]
    if dev.type == "cuda":
        report["peak_gpu_mem_GB"] = torch.cuda.max_memory_allocated() / 1e9
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text if args.json else _table(report))
    return 0


def build_bench_engine(args, options=None):
    """The engine a run times: loaded as `localchat run` loads it, or on --random-weights.
    options: a random-weight model's kernel switches (None: from the environment)."""
    if not args.random_weights:
        from app.commands import load_engine

        return load_engine(args, quiet=args.json)
    return random_engine(args.random_weights, args.device, args.max_seq_len, options, args.force_accept,
                         args.draft_steps, not args.no_graphs, getattr(args, "threads", None))


def check_args(args) -> None:
    """The counts and --out, checked before any model loads (not after minutes of benchmarking)."""
    if args.prompt_tokens < 1 or args.new_tokens < 2:
        raise UserError("--prompt-tokens must be >= 1 and --new-tokens >= 2")
    if args.prompts < 1:
        raise UserError(f"--prompts must be at least 1, got {args.prompts}")
    if args.out:
        out = Path(args.out).expanduser()
        existed = out.exists()
        try:
            with open(out, "a"):
                pass
            if not existed:
                out.unlink()
        except OSError as e:
            raise UserError(f"--out {args.out}: cannot write a file there ({e.strerror or type(e).__name__})") \
                from None
