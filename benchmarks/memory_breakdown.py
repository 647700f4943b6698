"""Where a random-weight engine's GPU memory goes, phase by phase: torch's allocated bytes after
the model is built, after its projections are packed (--quant), after the KV cache and the decode
graph, and at the peak of a prefill and a few decode steps; with the largest tensors alive at the
end, by the module that holds them. JSON to --out.

    python benchmarks/memory_breakdown.py --quant Q4_K_M --out mem.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def gb(n: int) -> float:
    return round(n / 1e9, 3)


def main() -> None:
    from benchmarks.harness.random_packed import pack_model
    from benchmarks.harness.shapes import LLAMA_8B, _random_tensors
    from engine.config import ModelConfig
    from engine.loader import build_model
    from engine.options import KernelOptions
    from engine.runner import ModelRunner
    from engine.types import SamplingParams

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quant", default=None, help="a random_packed layout (Q4_K_M, AWQ, ...); none: bf16")
    ap.add_argument("--max-seq-len", type=int, default=4096)
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    dev = torch.device("cuda")
    phases = {}

    def mark(name: str) -> None:
        torch.cuda.synchronize()
        phases[name] = {"allocated_GB": gb(torch.cuda.memory_allocated()),
                        "peak_since_last_GB": gb(torch.cuda.max_memory_allocated()),
                        "reserved_GB": gb(torch.cuda.memory_reserved())}
        torch.cuda.reset_peak_memory_stats()
        print(f"{name:28s} allocated {phases[name]['allocated_GB']:7.3f} GB, peak since the last "
              f"{phases[name]['peak_since_last_GB']:7.3f} GB", flush=True)

    cfg = ModelConfig.from_hf(LLAMA_8B, "llama-8b")
    model = build_model(cfg, _random_tensors(cfg, dev, torch.bfloat16), "random", dev, torch.bfloat16,
                        args.max_seq_len, KernelOptions())
    mark("model built (bf16)")
    if args.quant:
        pack_model(model, args.quant)
        torch.cuda.empty_cache()
        mark(f"projections packed ({args.quant})")
    runner = ModelRunner(model, args.max_seq_len)
    mark("KV cache")
    runner.capture([1])
    mark("decode graph captured")
    ids = torch.randint(0, cfg.vocab_size, (args.prompt_tokens,), device=dev)
    logits, _, _ = runner.forward(ids, 0, all_logits=False)
    mark(f"prefill of {args.prompt_tokens}")
    token = logits[-1].argmax().view(1)
    for i in range(8):
        logits, _, _ = runner.forward(token, args.prompt_tokens + i)
        token = logits[-1].argmax().view(1)
    mark("8 decode steps")
    by_owner: dict[str, int] = {}
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        if t.device.type == "cuda":
            owner = "layers" if ".layers." in f".{name}" else name.rpartition(".")[0]  # the module
            by_owner[owner] = by_owner.get(owner, 0) + t.numel() * t.element_size()
    by_owner["kv cache"] = runner.kv.nbytes
    held = {k: gb(v) for k, v in sorted(by_owner.items(), key=lambda kv: -kv[1])}
    print("held by:", held, flush=True)
    args.out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                    "quant": args.quant, "max_seq_len": args.max_seq_len, "phases": phases,
                                    "held_GB": held}, indent=1))


if __name__ == "__main__":
    main()
