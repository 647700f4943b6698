"""comparison_model: what benchmarks that compare kernel options in one process (pdl.py, variants.py) run."""

from __future__ import annotations

import torch

from engine.engine import Engine

from benchmarks.harness.prompts import chat_prompts_from
from benchmarks.harness.shapes import random_engine


def comparison_model(model: str, device: str, n_prompts: int, prompt_set: str = "chitchat",
                     force_accept: int | None = None, max_seq_len: int = 1024):
    """`model`: `demo` (the demo model with its shipped head; held-out chat prompts of prompt_set;
    plain and greedy speculative decoding), or a --random-weights name or config JSON (random bf16
    weights, 512 random token ids, plain decoding; with force_accept also speculation with a random
    head that accepts force_accept - 1 drafts; a KV cache of max_seq_len rows, where `localchat
    bench` has 4096). Returns (make: KernelOptions -> a new Engine with them, workload: engine ->
    (prompt token ids, what they are, [(mode name, speculative)]))."""
    if model == "demo":
        def workload(engine):
            msgs, which = chat_prompts_from(n_prompts, prompt_set)
            return ([engine.tokenizer.apply_chat_template(m) for m in msgs], which,
                    [("plain", False), ("speculative", True)])

        return (lambda options: Engine.load("demo", device=device, options=options)), workload
    prompt = torch.randint(0, 32000, (512,), generator=torch.Generator().manual_seed(0)).tolist()
    modes = [("plain", False)] + ([("speculative", True)] if force_accept else [])

    def make(options):
        return random_engine(model, device, max_seq_len, options, force_accept)

    return make, (lambda e: ([prompt], "512 random token ids", modes))
