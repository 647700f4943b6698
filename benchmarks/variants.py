"""Kernel-routing variants of the plain decode step, in one process: each variant gets its own
engine (its graphs capture the kernels the variant picks), measured in alternating rounds so
that clock drift falls on all of them. Random bf16 weights from a config (as `bench
--random-weights`), 512-token prompt, plain decode.

Variants (comma-separated, any order; the first is the baseline of the ratios):
  base          the defaults
  row_qkv       LOCALCHAT_ROW_GEMV=qkv (the default): qkv of a one-token step on our GEMV too
  row_layers    LOCALCHAT_ROW_GEMV=layers: qkv and gate_up of a one-token step run our GEMV as
                well, so every launch inside a decoder layer is one of our PDL kernels
  row_cublas    LOCALCHAT_ROW_GEMV=cublas: qkv, gate_up and lm_head on cuBLAS
  row_all       LOCALCHAT_ROW_GEMV=all: qkv, gate_up and lm_head of a one-token step run our
                GEMV as well, so every launch of the step is one of our PDL kernels
  pdl_off       programmatic dependent launch off
  fuse_all      fuse every norm/activation with its projection, even the shapes FUSED_TILES keeps
                unfused (LOCALCHAT_FUSE=all)
  lean_off      the greedy iteration as in session 8: the draft's fused_forward, an argmax, gather
                and copy per draft token, and acceptance in torch ops, instead of the lean draft
                step, argmax_pick and greedy_verify (LOCALCHAT_LEAN_DRAFT=0)
  altsN         N alternatives for each draft in greedy verify steps (LOCALCHAT_SPEC_ALTS=N;
                alts0: the plain chain; altsauto: the default shape, as many as fill 16 rows;
                alts2-1-0: 2 for draft 1, 1 for draft 2, none after)
  rope_apart    a one-row step launches RoPE + cache write apart from attention
                (LOCALCHAT_ROPE_IN_ATTENTION=0; engine/ops.py)
  qkv_norm      the layer's input norm inside the qkv GEMV (LOCALCHAT_NORM_GEMV=qkv)
  mlp_norm      the post-attention norm inside gate_up on our GEMV (LOCALCHAT_NORM_GEMV=gate_up)
  gated, gated_off  the MLP of a one-token step as gated_gemv (silu(gate) * up in gate_up's epilogue)
                and a plain down GEMV, or gate_up then silu_mul_gemv (engine/ops.py GATED_MLP)
  tail, tail_off  a one-token step's o_proj and down add the residual and run the next RMSNorm in
                their last program, where it would be a launch of its own (engine/ops.py NORM_TAIL)
  tiles:SPEC    M = 1 tiles by weight shape (LOCALCHAT_ROW_TILES, engine/ops.py parse_row_tiles),
                e.g. tiles:4096x14336/4/1024/1/4/3|6144x4096/cublas
  joined by '+': row_cublas+tail_off

Models: a --random-weights name or config JSON (plain decode, 512 random token ids; with
--force-accept N also speculation with a random EAGLE-3 head of the model's shape that accepts
N - 1 drafts, and the speculator's per-part times), or `demo` (the demo model with its shipped
head: plain decode and greedy speculation on held-out prompts).

    python benchmarks/variants.py --models llama-8b --variants base,row_cublas,tail_off --out v.json
    python benchmarks/variants.py --models demo --variants base,lean_off --prompts 8 --out lean.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


# Variants that set one module switch to a fixed value: name -> (module, attribute, value).
FIXED = {
    "row_all": ("engine.ops", "ROW_GEMV", "all"), "row_layers": ("engine.ops", "ROW_GEMV", "layers"),
    "row_cublas": ("engine.ops", "ROW_GEMV", "cublas"), "row_qkv": ("engine.ops", "ROW_GEMV", "qkv"),
    "fuse_all": ("engine.ops", "_FUSE_ALL", True), "rope_apart": ("engine.ops", "ROPE_IN_ATTENTION", False),
    "gated": ("engine.ops", "GATED_MLP", True), "gated_off": ("engine.ops", "GATED_MLP", False),
    "tail": ("engine.ops", "NORM_TAIL", True), "tail_off": ("engine.ops", "NORM_TAIL", False),
    "lean_off": ("speculative.eagle3", "LEAN_DRAFT", False),
}


@contextlib.contextmanager
def variant(spec: str):
    """Set the module switches `spec` names, and put them back after."""
    import importlib
    import os

    from engine import kernels, ops

    saved: dict = {}  # (module, attribute) -> the value before the first change

    def switch(module, name: str, value) -> None:
        module = importlib.import_module(module) if isinstance(module, str) else module
        saved.setdefault((module, name), getattr(module, name))
        setattr(module, name, value)

    saved_pdl, saved_alts = kernels._pdl_override, os.environ.get("LOCALCHAT_SPEC_ALTS")
    try:
        for part in spec.split("+"):
            if part == "base":
                pass
            elif part in FIXED:
                switch(*FIXED[part])
            elif part == "pdl_off":
                kernels.set_pdl(False)
            elif part in ("qkv_norm", "mlp_norm"):
                switch(ops, "NORM_GEMV", ops.NORM_GEMV | {"qkv" if part == "qkv_norm" else "gate_up"})
            elif part.startswith("tiles:"):
                switch(ops, "ROW_TILES", {**ops.ROW_TILES, **ops.parse_row_tiles(part[6:])})
            elif part.startswith("alts") and (part[4:].replace("-", "").isdigit() or part[4:] == "auto"):
                os.environ["LOCALCHAT_SPEC_ALTS"] = part[4:].replace("-", ",")
            else:
                raise SystemExit(f"variants.py: unknown variant {part!r}")
        yield
    finally:
        for (module, name), value in saved.items():
            setattr(module, name, value)
        kernels.set_pdl(saved_pdl)
        if saved_alts is None:
            os.environ.pop("LOCALCHAT_SPEC_ALTS", None)
        else:
            os.environ["LOCALCHAT_SPEC_ALTS"] = saved_alts


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

    from app.bench import alternating_rounds, comparison_model

    names = [v for v in a.variants.split(",") if v]
    for name in names:  # unknown names fail before any model is built
        with variant(name):
            pass
    gpu = torch.cuda.get_device_name(0) if a.device == "cuda" else a.device
    report = {"machine": {"device": gpu, "torch": torch.__version__, "python": platform.python_version()},
              "rounds": a.rounds, "new_tokens": a.new_tokens, "results": {}}
    for model in [m for m in a.models.split(",") if m]:
        make, workload = comparison_model(model, a.device, a.prompts, a.prompt_set, a.force_accept,
                                          a.max_seq_len)
        engines = {}
        for name in names:
            with variant(name):
                engines[name] = make()
        prompts, which, modes = workload(engines[names[0]])
        res = {"prompt_set": which}
        for mode, spec in modes:
            accept: dict = {}
            speeds, tokens = alternating_rounds(engines, prompts, a.new_tokens, spec, a.rounds, variant, accept)
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
                if spec and e.speculator is not None and e.speculator.force_accept and a.device == "cuda":
                    with variant(name):
                        parts = e.speculator.measure_components(e.runner)
                    res[mode][name]["parts_ms"] = {k: round(v, 4) for k, v in parts.items()}
                    print(f"{'':26s} {name:18s} " + "  ".join(f"{k} {v:.4f}" for k, v in parts.items()), flush=True)
        report["results"][Path(model).stem] = res
        del engines
        if a.device == "cuda":
            torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
