"""`localchat bench`: plain decode, speculation, and transformers `generate`, in one process."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

LLAMA_8B = {
    "architectures": ["LlamaForCausalLM"], "vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336,
    "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8, "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0, "max_position_embeddings": 131072, "tie_word_embeddings": False,
    "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192},
}


# How much a run measures: the full run, and --quick's first look (a count given explicitly wins).
FULL_BENCH = {"prompts": 4, "new_tokens": 256, "prompt_tokens": 512}
QUICK_BENCH = {"prompts": 1, "new_tokens": 64, "prompt_tokens": 128}


def apply_counts(args) -> None:
    """Fills the counts not given on the command line from --quick's or the full run's."""
    counts = QUICK_BENCH if getattr(args, "quick", False) else FULL_BENCH
    for name, value in counts.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)


def _sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    import torch

    if device.type != "cuda":
        return 0.0
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    _sync()
    n = 20
    t = time.perf_counter()
    for _ in range(n):
        b.copy_(a)
    _sync()
    bw = 2 * a.numel() * n / (time.perf_counter() - t)
    del a, b
    return bw


def time_decode(engine, prompt_ids, new_tokens, speculative, temperature=0.0):
    from engine.types import SamplingParams

    engine.reset()
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, seed=0, ignore_eos=True)
    last = None
    for ev in engine.stream_ids(prompt_ids, params, speculative=speculative):
        last = ev
    s = last.stats
    return {"decode_tok_s": s.decode_tok_s, "ttft_s": s.ttft_s, "prefill_tok_s": s.prefill_tokens / s.ttft_s,
            "generated_tokens": s.generated_tokens, "accept_len_mean": s.accept_len_mean,
            "accept_hist": s.accept_hist}


def alternating_rounds(engines: dict, prompts: list, new_tokens: int, speculative: bool, rounds: int,
                       accept: dict | None = None) -> tuple[dict, dict]:
    """Decode speed of several engines over the same prompts, in alternating rounds so that clock
    drift falls on all of them, after one uncounted warm-up each (first-use allocations and
    caches); and the first 64 tokens each gives for prompts[0], to compare. Each engine carries
    its own kernel options (Engine.load(options=...)). Returns ({name: mean tok/s of each round},
    {name: tokens}); accept, when given, gets {name: the mean accepted length over the prompts,
    each round}."""
    import statistics

    from engine.types import SamplingParams

    speeds, tokens = {name: [] for name in engines}, {}
    for e in engines.values():
        time_decode(e, prompts[0], new_tokens, speculative)
    for _ in range(rounds):
        for name, e in engines.items():
            runs = [time_decode(e, p, new_tokens, speculative) for p in prompts]
            speeds[name].append(statistics.mean(r["decode_tok_s"] for r in runs))
            if accept is not None:
                accept.setdefault(name, []).append(statistics.mean(r["accept_len_mean"] for r in runs))
    for name, e in engines.items():
        e.reset()
        tokens[name] = [t for ev in e.stream_ids(prompts[0], SamplingParams(max_tokens=64), speculative=speculative)
                        for t in ev.token_ids]
    return speeds, tokens


def comparison_model(model: str, device: str, n_prompts: int, prompt_set: str = "chitchat",
                     force_accept: int | None = None, max_seq_len: int = 1024):
    """What benchmarks that compare settings in one process (pdl.py, variants.py) run on `model`:
    `demo` (the demo model with its shipped head; held-out chat prompts of prompt_set; plain and
    greedy speculative decoding), or a --random-weights name or config JSON (random bf16 weights,
    512 random token ids, plain decoding; with force_accept also speculation with a random head
    that accepts force_accept - 1 drafts; a KV cache of max_seq_len rows, where `localchat bench`
    has 4096). Returns (make: KernelOptions -> a new Engine with them, workload: engine ->
    (prompt token ids, what they are, [(mode name, speculative)]))."""
    from types import SimpleNamespace

    import torch

    from engine.engine import Engine

    from app.bench_setup import build_bench_engine, chat_prompts_from

    if model == "demo":
        def workload(engine):
            msgs, which = chat_prompts_from(n_prompts, prompt_set)
            return ([engine.tokenizer.apply_chat_template(m) for m in msgs], which,
                    [("plain", False), ("speculative", True)])

        return (lambda options: Engine.load("demo", device=device, options=options)), workload
    args = SimpleNamespace(random_weights=model, device=device, max_seq_len=max_seq_len, force_accept=force_accept,
                           draft_steps=5, no_graphs=False)
    prompt = torch.randint(0, 32000, (512,), generator=torch.Generator().manual_seed(0)).tolist()
    modes = [("plain", False)] + ([("speculative", True)] if force_accept else [])
    return (lambda options: build_bench_engine(args, options)), (lambda e: ([prompt], "512 random token ids", modes))


def time_transformers(engine, prompt_ids, new_tokens, src_path=None):
    """transformers `generate` on the same weights (copied into its own model)."""
    import torch
    import transformers

    cfg = engine.runner.config
    model = engine.runner.model
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings)
    with torch.device(engine.runner.device):
        hf = transformers.LlamaForCausalLM(hf_cfg).to(engine.runner.dtype).eval()
    sd = {}
    for name, p in model.state_dict().items():
        if ".qkv_proj." in name:
            q, k, v = p.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
            for n, t in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
                sd[name.replace("qkv_proj", n)] = t
        elif ".gate_up_proj." in name:
            g, u = p.chunk(2)
            sd[name.replace("gate_up_proj", "gate_proj")], sd[name.replace("gate_up_proj", "up_proj")] = g, u
        else:
            sd[name] = p
    hf.load_state_dict(sd, strict=False)
    x = torch.tensor([prompt_ids], device=engine.runner.device)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(x))
    with torch.no_grad():
        hf.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        _sync()
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        _sync()
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        out = hf.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        _sync()
        total = time.perf_counter() - t
    del hf
    n = out.shape[1] - x.shape[1]
    return {"decode_tok_s": (n - 1) / max(total - ttft, 1e-9), "ttft_s": ttft, "generated_tokens": n,
            "version": transformers.__version__}


def cmd_bench(args) -> int:
    import torch

    from engine.errors import UserError

    from app.bench_setup import bench_prompts, build_bench_engine

    apply_counts(args)
    if args.prompt_tokens < 1 or args.new_tokens < 2:
        raise UserError("--prompt-tokens must be >= 1 and --new-tokens >= 2")
    if args.prompts < 1:
        raise UserError(f"--prompts must be at least 1, got {args.prompts}")
    if args.out:  # checked now, not after minutes of benchmarking
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
        from speculative.testing import ForcedEagle3Speculator

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


def accept_hist_total(runs: list[dict], length: int = 0) -> list[int]:
    """The prompts' accept_hist summed (at least `length` entries): entry n counts the verify
    steps that gave n tokens."""
    total = [0] * length
    for run in runs:
        hist = run.get("accept_hist") or []
        total += [0] * (len(hist) - len(total))
        for n, count in enumerate(hist):
            total[n] += count
    return total


def _hist_line(hist: list[int]) -> str:
    steps = sum(hist)
    return " · ".join(f"{n}: {c / steps * 100:.0f}%" for n, c in enumerate(hist) if n) if steps else ""


def _table(r: dict) -> str:
    rows = [("prompts", f"{r['prompts']}: {r['prompt_set']}"),
            ("startup (load + capture)", f"{r['startup_s']:.2f} s"),
            ("plain decode", f"{r['plain']['decode_tok_s']:.1f} tok/s"),
            ("plain TTFT", f"{r['plain']['ttft_s'] * 1000:.1f} ms")]
    if r.get("bandwidth_limit_tok_s"):
        rows.append(("bandwidth limit", f"{r['bandwidth_limit_tok_s']:.1f} tok/s "
                                        f"({r['plain']['fraction_of_bandwidth_limit'] * 100:.1f}% reached)"))
    if "spec" in r:
        rows.append(("speculative decode", f"{r['spec']['decode_tok_s']:.1f} tok/s, accept len "
                                           f"{r['spec']['accept_len_mean']:.2f}, {r['spec']['speedup']:.2f}x plain"))
        if _hist_line(r["spec"].get("accept_hist", [])):
            rows.append(("tokens per verify step", _hist_line(r["spec"]["accept_hist"])))
        if any(r.get("draft_alternatives") or ()) and not r.get("temperature"):
            rows.append(("runners-up verified", ", ".join(map(str, r["draft_alternatives"])) + " (drafts 1.."
                         f"{len(r['draft_alternatives'])})"))
    if "transformers" in r:
        rows.append(("transformers generate", f"{r['transformers']['decode_tok_s']:.1f} tok/s "
                                              f"(ours {r['speedup_vs_transformers']:.1f}x)"))
    return "\n".join(f"{a:<26} {b}" for a, b in rows)
