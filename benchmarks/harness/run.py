"""run_bench: `localchat bench`: plain decoding with no draft loaded, with the draft loaded and
speculation off, speculation on, and transformers `generate`, in one process."""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

import torch

from engine.errors import UserError
from speculative.testing import ForcedEagle3Speculator

from benchmarks.harness.counts import apply_counts
from benchmarks.harness.limits import decode_bytes
from benchmarks.harness.peer import time_transformers
from benchmarks.harness.prompts import bench_prompts, read_prompts_file, system_prompt
from benchmarks.harness.report import _table, summary
from benchmarks.harness.shapes import random_engine
from benchmarks.harness.timing import copy_bandwidth, time_decode


# What each setting is: its engine (the loaded one, or without_draft()) and whether it speculates.
NO_DRAFT, DRAFT_OFF, SPEC = "no_draft", "plain", "spec"


def changed_options(options) -> dict:
    """The target's KernelOptions fields that differ from the defaults (the LOCALCHAT_* switches a
    run was made under), less batch_invariant and spec_alts, which the engine sets for its draft."""
    from engine.options import KernelOptions

    default = KernelOptions()
    return {f.name: getattr(options, f.name) for f in dataclasses.fields(options)
            if f.name not in ("batch_invariant", "spec_alts") and getattr(options, f.name) != getattr(default, f.name)}


def run_bench(args) -> int:
    """args: `localchat bench`'s (app/cli.py). Prints the report (a table, or JSON with --json),
    writes it to --out when given, and returns the exit status."""
    file_prompts = check_args(args)
    t0 = time.perf_counter()
    engine = build_bench_engine(args)
    startup_s = time.perf_counter() - t0
    dev = engine.runner.device
    system = None if args.random_weights else system_prompt(args)
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__, "device": torch.cuda.get_device_name(0) if dev.type == "cuda"
                          else platform.processor() or "cpu", "cuda": torch.version.cuda,
                          "cpu_threads": torch.get_num_threads()},
              "model": engine.model_name, "draft": engine.draft_name, "draft_steps": args.draft_steps,
              "tree": str(args.tree) if getattr(args, "tree", None) else None,
              # the shape greedy answers ran: --tree's, or the one auto calibrated (None: chains)
              "tree_used": str(engine.speculator.tree) if getattr(engine.speculator, "tree", None) else None,
              "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens, "quick": bool(getattr(args, "quick", False)),
              "ignore_eos": args.ignore_eos, "system_prompt": system,
              "tok_s": "decode tokens after each answer's first, summed over the prompts, over their summed decode "
                       "time; the same for every setting",
              "startup_s": startup_s,
              "startup_phases_s": getattr(engine, "load_phases", None),
              "graphs": engine.runner.uses_graphs, "temperature": args.temperature,
              "kernel_options": changed_options(engine.runner.model.ops.options)}
    bw = copy_bandwidth(dev)
    if dev.type == "cuda":  # peak_gpu_mem_GB: the engine's from here on, not the probe's 2 GiB of buffers
        torch.cuda.reset_peak_memory_stats(dev)
    model = engine.runner.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters()) + packed_bytes(engine)
    # the limit: the bytes one decode step reads (an untied embedding table gives one row of itself)
    step_bytes = decode_bytes(model)
    report.update(copy_bandwidth_GBps=bw / 1e9, weight_bytes=weight_bytes, decode_bytes=step_bytes,
                  bandwidth_limit_tok_s=bw / step_bytes if bw else None)
    prompts, report["prompt_set"] = bench_prompts(engine, args, system, file_prompts)
    report["prompts"] = len(prompts)
    if not args.no_spec:
        report["runners_up"] = choose_runners_up(engine, args, prompts)
    alts = getattr(engine.speculator, "alts", ())
    # runners-up each draft gets in greedy verify steps (EAGLE-3; none when sampling)
    report["draft_alternatives"] = list(alts) if any(alts) else None
    settings = bench_settings(engine, args.no_spec)
    report["order"] = [name for name, _, _ in settings]
    runs = time_settings(settings, prompts, args)
    report[NO_DRAFT] = summary(runs[NO_DRAFT])
    report[DRAFT_OFF] = summary(runs[DRAFT_OFF]) if engine.has_draft else report[NO_DRAFT]
    if report["bandwidth_limit_tok_s"]:
        for name in {NO_DRAFT, DRAFT_OFF}:
            report[name]["fraction_of_bandwidth_limit"] = report[name]["decode_tok_s"] / report["bandwidth_limit_tok_s"]
    base = report[NO_DRAFT]["decode_tok_s"]
    greedy = args.temperature == 0
    if engine.has_draft:
        report[DRAFT_OFF]["speedup_vs_no_draft"] = report[DRAFT_OFF]["decode_tok_s"] / base
        if greedy:
            report[DRAFT_OFF]["same_tokens_as_no_draft"] = same_tokens(runs[DRAFT_OFF], runs[NO_DRAFT])
    if runs.get(SPEC):
        spec = report[SPEC] = summary(runs[SPEC], args.draft_steps + 2)
        spec["speedup_vs_no_draft"] = spec["decode_tok_s"] / base
        spec["speedup_vs_draft_off"] = spec["decode_tok_s"] / report[DRAFT_OFF]["decode_tok_s"]
        if greedy:
            spec["same_tokens_as_no_draft"] = same_tokens(runs[SPEC], runs[NO_DRAFT])
            spec["same_tokens_as_draft_off"] = same_tokens(runs[SPEC], runs[DRAFT_OFF])
        if isinstance(engine.speculator, ForcedEagle3Speculator) and dev.type == "cuda":
            spec["loop_cost"] = engine.speculator.measure_components(engine.runner)
    if not args.no_peer:
        peer = time_transformers(engine, prompts[0], min(args.new_tokens, 64))
        report["transformers"] = peer
        report["speedup_vs_transformers"] = base / peer["decode_tok_s"]
    if dev.type == "cuda":
        report["peak_gpu_mem_GB"] = torch.cuda.max_memory_allocated() / 1e9
    text = json.dumps(report, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(text if args.json else _table(report))
    return 0


def choose_runners_up(engine, args, prompts) -> dict | None:
    """Greedy chains with the head's runners-up or without, as --runners-up says; auto: as the app
    chooses, from its first-load measurement (engine/spec_pays.py) for a real model, and for
    random weights from the same measurement over two of the bench's prompts. None where the
    draft has no such choice (MTP layers, trees, a CPU, LOCALCHAT_SPEC_ALTS set)."""
    from engine import spec_pays

    if not spec_pays.chooses_runners_up(engine):
        return None
    choice = getattr(args, "runners_up", "auto")
    if choice != "auto":
        engine.speculator.use_runners_up(choice == "on")
        return {"kept": choice == "on", "by": f"--runners-up {choice}"}
    if not args.random_weights:
        engine.speculation_pays()
        return {"kept": engine.speculator.runners_up, "by": "the app's first-load measurement"}

    def timer(eng, ids, speculative, n):
        run = time_decode(eng, ids, n, speculative, ignore_eos=args.ignore_eos)
        return max(run["generated_tokens"] - 1, 0), run["decode_s"]

    tokens = min(args.new_tokens, 128)
    speeds = spec_pays.alternate({"spec": (engine, True, True), "spec_chain": (engine, True, False)},
                                 prompts[:2], tokens, timer, warmup=tokens,
                                 warm_each=str(engine.device).startswith("cuda"))
    return {"kept": spec_pays.choose_runners_up(engine, speeds), "by": "measured on 2 of the prompts",
            "spec_runners_up_tok_s": speeds["spec"], "spec_chain_tok_s": speeds["spec_chain"]}


def bench_settings(engine, no_spec: bool) -> list[tuple[str, object, bool]]:
    """(name, engine, speculative) of each setting timed: the engine with no draft loaded (the
    loaded one, or its twin over the same weights: Engine.without_draft), and with a draft the
    loaded engine with speculation off and on."""
    settings = [(NO_DRAFT, engine.without_draft(), False)]
    if engine.has_draft:
        settings.append((DRAFT_OFF, engine, False))
        if not no_spec:
            settings.append((SPEC, engine, True))
    return settings


def time_settings(settings, prompts, args) -> dict[str, list[dict]]:
    """Every setting on every prompt, alternating per prompt (the order rotating from one prompt to
    the next, so that drift falls on all of them alike), each timed run after an uncounted 8-token
    warm-up of the same setting on that prompt at the same temperature (a sampled answer's first
    run captures the sampled iteration's graph, which must not fall inside a timed answer)."""
    runs: dict[str, list[dict]] = {name: [] for name, _, _ in settings}
    for i, ids in enumerate(prompts):
        for name, engine, speculative in settings[i % len(settings):] + settings[:i % len(settings)]:
            time_decode(engine, ids, 8, speculative, args.temperature)
            runs[name].append(time_decode(engine, ids, args.new_tokens, speculative, args.temperature,
                                          ignore_eos=args.ignore_eos))
    return runs


def packed_bytes(engine) -> int:
    """The bytes of the model's packed (quantized) projections, which are buffers, not parameters."""
    from engine.packed_linear import PackedLinear

    return sum(m.nbytes for m in engine.runner.model.modules() if isinstance(m, PackedLinear))


def same_tokens(runs: list[dict], base: list[dict]) -> int:
    """How many of the prompts' answers have exactly the tokens of `base`'s."""
    return sum(a["token_ids"] == b["token_ids"] for a, b in zip(runs, base))


def build_bench_engine(args, options=None):
    """The engine a run times: loaded as `localchat run` loads it, or on --random-weights.
    options: a random-weight model's kernel switches (None: from the environment)."""
    if not args.random_weights:
        from app.commands import load_engine

        return load_engine(args, quiet=args.json)
    engine = random_engine(args.random_weights, args.device, args.max_seq_len, options, args.force_accept,
                           args.draft_steps, not args.no_graphs, getattr(args, "threads", None),
                           getattr(args, "random_quant", None))
    if getattr(args, "tree", None) is not None:
        engine.set_tree(args.tree)
    return engine


def check_args(args) -> list[str] | None:
    """The counts, --prompts-file and --out, checked before any model loads (not after minutes of
    benchmarking). Returns --prompts-file's prompts (None without one); --prompts then defaults to
    all of them."""
    file_prompts = None
    quant = getattr(args, "random_quant", None)
    if quant is not None:
        from benchmarks.harness.random_packed import LAYOUTS

        if not args.random_weights:
            raise UserError("--random-quant packs a --random-weights model; a quantized checkpoint runs packed as it is")
        if quant not in LAYOUTS:
            raise UserError(f"--random-quant {quant!r}: choose one of {', '.join(LAYOUTS)}")
    if args.prompts_file is not None:
        if args.random_weights:
            raise UserError("--prompts-file needs a model with a tokenizer; --random-weights times random token ids")
        file_prompts = read_prompts_file(args.prompts_file)
        if args.prompts is None:
            args.prompts = len(file_prompts)
        elif args.prompts > len(file_prompts):
            raise UserError(f"--prompts {args.prompts} asks for more than the {len(file_prompts)} prompts in "
                            f"{args.prompts_file}")
    apply_counts(args)
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
    return file_prompts
