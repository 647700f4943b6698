"""Timed decoding: one answer's speeds, several engines in alternating rounds, and copy bandwidth."""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from engine.types import SamplingParams


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def copy_bandwidth(device) -> float:
    """Bytes/s of a large device-to-device copy (read + write counted)."""
    if device.type != "cuda":
        return 0.0
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    sync()
    n = 20
    t = time.perf_counter()
    for _ in range(n):
        b.copy_(a)
    sync()
    bw = 2 * a.numel() * n / (time.perf_counter() - t)
    del a, b
    return bw


def time_decode(engine, prompt_ids, new_tokens, speculative, temperature=0.0, ignore_eos=True) -> dict:
    """One answer of at most new_tokens tokens from an empty cache: its decode speed (tokens after
    the first over the time after the first), time to first token, prefill speed, accepted lengths
    and token ids. ignore_eos: exactly new_tokens tokens, an EOS ending nothing (comparisons of
    kernel variants time the same work); False: the answer ends where the model ends it, as in
    the app (`localchat bench`)."""
    engine.reset()
    params = SamplingParams(max_tokens=new_tokens, temperature=temperature, seed=0, ignore_eos=ignore_eos)
    last, ids = None, []
    for ev in engine.stream_ids(prompt_ids, params, speculative=speculative):
        last = ev
        ids.extend(ev.token_ids)
    s = last.stats
    return {"decode_tok_s": s.decode_tok_s, "ttft_s": s.ttft_s, "prefill_tok_s": s.prefill_tokens / s.ttft_s,
            "generated_tokens": s.generated_tokens, "decode_s": s.decode_s, "accept_len_mean": s.accept_len_mean,
            "accept_hist": s.accept_hist, "accept_by_span": s.accept_by_span, "verify_steps": s.verify_steps,
            "verify_tokens": s.verify_tokens,
            "token_ids": ids}


def summed_tok_s(runs: list[dict]) -> float:
    """Decode tokens/s of several answers: the tokens after each answer's first, summed, over their
    decode times, summed. Every setting of `localchat bench` is measured this way: with answers
    ending at EOS their lengths differ, and a mean of per-answer speeds would weigh a 5-token
    answer as much as a 300-token one."""
    tokens = sum(max(r["generated_tokens"] - 1, 0) for r in runs)
    seconds = sum(r["decode_s"] for r in runs)
    return tokens / seconds if seconds > 0 else 0.0


def alternating_rounds(engines: dict, prompts: list, new_tokens: int, speculative: bool, rounds: int,
                       accept: dict | None = None) -> tuple[dict, dict]:
    """Decode speed of several engines over the same prompts, in alternating rounds so that clock
    drift falls on all of them, after one uncounted warm-up each (first-use allocations and
    caches); and the first 64 tokens each gives for prompts[0], to compare. Each engine carries
    its own kernel options (Engine.load(options=...)). Returns ({name: mean tok/s of each round},
    {name: tokens}); accept, when given, gets {name: the mean accepted length over the prompts,
    each round}."""
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


def kernel_bench_args(description: str, flag: str, known, what: str, default=None):
    """A kernel benchmark's command line: --out, a comma-separated `flag` of names out of `known`
    (`default`'s, or all; `what` one of them is called in the refusal), --iters and --calls
    (time_graph's); an unknown name is refused in one argparse line (exit 2), and a machine
    without a CUDA GPU and Triton in one line (exit 1). Returns (args, the names)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(flag, default=",".join(default or known))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--calls", type=int, default=8)
    args = ap.parse_args()
    names = [x for x in getattr(args, flag.lstrip("-").replace("-", "_")).split(",") if x]
    unknown = [x for x in names if x not in known]
    if unknown:
        ap.error(f"{flag}: no {what} named {', '.join(sorted(unknown))} (there are {', '.join(known)})")
    if importlib.util.find_spec("triton") is None or not torch.cuda.is_available():
        sys.exit("error: this benchmark needs a CUDA GPU and Triton")
    return args, names
