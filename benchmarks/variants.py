"""Kernel-routing variants of the plain decode step, in one process: each variant gets its own
engine, built with its own KernelOptions (engine/options.py; its graphs capture the kernels the
options pick), measured in alternating rounds so that clock drift falls on all of them. Random
bf16 weights from a config (as `bench --random-weights`), 512-token prompt, plain decode.

Variants (comma-separated, any order; the first is the baseline of the ratios), each a change to
the options from the environment (KernelOptions.from_env):
  base          those options as they are
  row_cublas    qkv of a one-token step on cuBLAS instead of our GEMV (qkv_gemv=False)
  pdl_off       programmatic dependent launch off (pdl=False)
  fuse_off      no norm/activation folded into a projection (fuse=False)
  fuse_invariant_off  with a draft, the unfused batch-invariant ops (fuse_invariant=False)
  fused_draft_off  the draft's torch layer instead of its GPU kernels (fused_draft=False)
  lean_off      the greedy iteration before the lean draft step: the draft's fused_forward, an
                argmax, gather and copy per draft token, and acceptance in torch ops, instead of
                the lean draft step, argmax_pick and greedy_verify (lean_draft=False)
  altsN         N alternatives for each draft in greedy verify steps (spec_alts=N; alts0: the plain
                chain; altsauto: the default shape, as many as fill 16 rows; alts2-1-0: 2 for
                draft 1, 1 for draft 2, none after)
  rope_apart    a one-row step launches RoPE + cache write apart from attention
                (rope_in_attention=False)
  gated_off     the MLP of a one-token step as gate_up then silu_mul_gemv, instead of gated_gemv
                (silu(gate) * up in gate_up's epilogue) and a plain down GEMV (gated_mlp=False)
  tail_off      a one-token step's o_proj and down without the residual add and next RMSNorm in
                their last program: those norms launch apart (norm_tail=False)
  tiles:SPEC    M = 1 tiles by weight shape (row_tiles, parse_row_tiles below),
                e.g. tiles:4096x14336/4/1024/1/4/3|6144x4096/cublas
  joined by '+': row_cublas+tail_off
The variants measured and removed from the engine are in docs/performance.md.

Models: a --random-weights name or config JSON (plain decode, 512 random token ids; with
--force-accept N also speculation with a random EAGLE-3 head of the model's shape that accepts
N - 1 drafts, and the speculator's per-part times), or `demo` (the demo model with its shipped
head: plain decode and greedy speculation on held-out prompts).

    python benchmarks/variants.py --models llama-8b --variants base,row_cublas,tail_off --out v.json
    python benchmarks/variants.py --models demo --variants base,lean_off --prompts 8 --out lean.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# Variants that set options fields to fixed values: name -> {field: value}.
FIXED = {
    "row_cublas": {"qkv_gemv": False}, "pdl_off": {"pdl": False}, "fuse_off": {"fuse": False},
    "fuse_invariant_off": {"fuse_invariant": False}, "fused_draft_off": {"fused_draft": False},
    "lean_off": {"lean_draft": False}, "rope_apart": {"rope_in_attention": False},
    "gated_off": {"gated_mlp": False}, "tail_off": {"norm_tail": False},
}


def variant_options(spec: str, base):
    """The KernelOptions `spec` names: base with each '+'-joined part's changes. An unknown part
    or a bad tile spec stops with one line."""
    from engine.options import parse_spec_alts

    changes: dict = {}
    for part in spec.split("+"):
        try:
            if part in FIXED:
                changes.update(FIXED[part])
            elif part.startswith("tiles:"):
                tiles = {**dict(changes.get("row_tiles", base.row_tiles)), **dict(parse_row_tiles(part[6:]))}
                changes["row_tiles"] = tuple(tiles.items())
            elif part.startswith("alts") and len(part) > 4:
                changes["spec_alts"] = parse_spec_alts(part[4:].replace("-", ","))
            elif part != "base":
                raise ValueError(f"unknown variant {part!r}")
        except ValueError as e:  # engine.errors.UserError is one too
            raise SystemExit(f"variants.py: {e}") from None
    return dataclasses.replace(base, **changes)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--models", default="llama-8b", help="comma-separated: a --random-weights name or config JSON")
    ap.add_argument("--variants", default="base,row_cublas")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompts", type=int, default=8, help="demo: held-out chat prompts")
    ap.add_argument("--prompt-set", choices=["chitchat", "instruct"], default="chitchat", help="demo: which prompts")
    ap.add_argument("--force-accept", type=int, default=None, help="random weights: add a random head (see above)")
    ap.add_argument("--max-seq-len", type=int, default=1024, help="random weights: KV cache rows (bench: 4096)")
    ap.add_argument("--device", default="cuda", help="cpu: a smoke run of the script")
    a = ap.parse_args()

    import torch

    from benchmarks.harness.compare import comparison_model
    from benchmarks.harness.timing import alternating_rounds
    from engine.options import KernelOptions
    from speculative.testing import ForcedEagle3Speculator

    names = [v for v in a.variants.split(",") if v]
    base = KernelOptions.from_env()
    options = {name: variant_options(name, base) for name in names}  # unknown names fail before any model is built
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else a.device
    report = {"machine": {"device": gpu, "torch": torch.__version__, "python": platform.python_version()},
              "rounds": a.rounds, "new_tokens": a.new_tokens, "results": {}}
    for model in [m for m in a.models.split(",") if m]:
        make, workload = comparison_model(model, a.device, a.prompts, a.prompt_set, a.force_accept,
                                          a.max_seq_len)
        engines = {name: make(options[name]) for name in names}
        prompts, which, modes = workload(engines[names[0]])
        res = {"prompt_set": which}
        for mode, spec in modes:
            accept: dict = {}
            speeds, tokens = alternating_rounds(engines, prompts, a.new_tokens, spec, a.rounds, accept)
            base = statistics.mean(speeds[names[0]])
            res[mode] = {}
            for name in names:
                mean = statistics.mean(speeds[name])
                res[mode][name] = {"tok_s": round(mean, 1), "ratio": round(mean / base, 4),
                                   "rounds": [round(x, 1) for x in speeds[name]],
                                   "same_tokens_as_first": tokens[name] == tokens[names[0]]}
                acc = ""
                if spec and accept.get(name):
                    res[mode][name]["accept_len_mean"] = round(statistics.mean(accept[name]), 3)
                    acc = f"  accept {res[mode][name]['accept_len_mean']:.2f}"
                print(f"{Path(model).stem:14s} {mode:11s} {name:18s} {mean:8.1f} tok/s  x{mean / base:.3f}  "
                      f"same tokens: {tokens[name] == tokens[names[0]]}{acc}", flush=True)
                e = engines[name]
                if spec and isinstance(e.speculator, ForcedEagle3Speculator) and a.device == "cuda":
                    parts = e.speculator.measure_components(e.runner)
                    res[mode][name]["parts_ms"] = {k: round(v, 4) for k, v in parts.items()}
                    print(f"{'':26s} {name:18s} " + "  ".join(f"{k} {v:.4f}" for k, v in parts.items()), flush=True)
        report["results"][Path(model).stem] = res
        del engines
        if a.device == "cuda":
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(report, indent=1))


def parse_row_tiles(spec: str) -> tuple:
    """A row_tiles value from "NxK/block_n/block_k/split_k/warps/stages|NxK/cublas|...", e.g.
    "4096x14336/4/1024/1/4/3|6144x4096/cublas". A bad entry raises a one-line ValueError."""
    from engine.kernels.gemv import GemvConfig
    from engine.options import CUBLAS

    tiles = {}
    for entry in filter(None, spec.split("|")):
        try:
            shape, *fields = entry.split("/")
            n, k = (int(v) for v in shape.split("x"))
            tiles[(n, k)] = CUBLAS if fields == [CUBLAS] else GemvConfig(*(int(v) for v in fields))
        except (TypeError, ValueError):
            raise ValueError(f"row tiles: cannot read {entry!r} (NxK/bn/bk/split/warps/stages or NxK/cublas)") from None
    return tuple(tiles.items())


if __name__ == "__main__":
    main()

