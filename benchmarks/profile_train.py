"""Where `localchat train-draft` spends its time, phase by phase, on one GPU:

  generate   the target's greedy replies (batched), tokens/s
  features   the teacher's packed forwards (aux states, labels), tokens/s
  step       one training step with the features cached, ms, and its top CUDA kernels

    python benchmarks/profile_train.py --model demo --gen 4096 --out profile_train.json

Uses the defaults of `train-draft` on the device (sequence length, batch, draft vocabulary,
unrolled steps); the profiler runs only over a few cached steps (its own overhead is large).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def sync():
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def top_kernels(prof, n: int) -> list[dict]:
    rows = []
    for e in prof.key_averages():
        t = getattr(e, "device_time_total", 0) or 0
        if t and e.device_type.name == "CUDA":
            rows.append({"name": e.key[:90], "ms": t / 1e3, "calls": e.count})
    rows.sort(key=lambda r: -r["ms"])
    return rows[:n]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="demo")
    ap.add_argument("--gen", type=int, default=4096, help="training prompts the target answers")
    ap.add_argument("--feature-seqs", type=int, default=2000, help="conversations run through the teacher")
    ap.add_argument("--steps", type=int, default=20, help="timed training steps (features cached)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()

    import torch
    from torch.profiler import ProfilerActivity, profile

    from speculative.train.teacher import Teacher
    from speculative.train.command import _init_draft
    from speculative.train.options import TrainOptions, feature_cache_bytes
    from speculative.train.target import load_target
    from speculative.train.export import default_aux_layers
    from speculative.train.loop import Batcher, train_step
    from speculative.train.prepare import choose_draft_vocab, prepare_data

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
    args = SimpleNamespace(model=a.model, out="unused", gen=a.gen, time_budget=None)
    opts = TrainOptions.from_args(args, dev)
    loaded, name, _ = load_target(opts, dev)
    opts = feature_cache_bytes(opts, dev)
    teacher = Teacher(loaded, default_aux_layers(loaded.config.num_layers), opts.max_len, opts.cache_bytes)
    report: dict = {"model": name, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                    "torch": torch.__version__, "seq_len": opts.seq_len, "batch_tokens": opts.batch_tokens,
                    "ttt_steps": opts.ttt_steps, "draft_vocab": opts.draft_vocab}

    phases: dict = {}
    data = prepare_data(opts, loaded, teacher, time.perf_counter(), None, phases)  # no reply cache: timed
    made = sum(len(s.ids) - s.response_start for s in data.gen + data.val_gen)
    report["generate"] = {"replies": len(data.gen), "tokens": made, "s": phases.get("generate_s"),
                          "tokens_per_s": made / max(phases.get("generate_s", 0) or 1e-9, 1e-9)}
    print(f"generate: {report['generate']['tokens_per_s']:,.0f} tokens/s", flush=True)

    items = [(("text", i), s) for i, s in enumerate(data.text[:a.feature_seqs])]
    sync()
    t = time.perf_counter()
    teacher.features_many(items)
    sync()
    n = sum(len(s.ids) for _, s in items)
    report["features"] = {"tokens": n, "s": time.perf_counter() - t, "tokens_per_s": n / (time.perf_counter() - t)}
    print(f"features: {report['features']['tokens_per_s']:,.0f} tokens/s", flush=True)

    draft_ids, _ = choose_draft_vocab(data.text, data.gen, loaded.config.vocab_size, opts.draft_vocab, dev)
    draft, _ = _init_draft(loaded, teacher.aux_layer_ids, draft_ids, opts)
    params = [p for p in draft.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4, fused=dev.type == "cuda")
    # Only conversations whose features are cached: the steps time the draft alone.
    pools = {"text": data.text[:a.feature_seqs]}
    batcher = Batcher(pools, 0.0, opts.seq_len, max(1, opts.batch_tokens // opts.seq_len), 0)

    def step() -> None:
        train_step(draft, teacher, batcher.next_rows(), opts, draft_ids, opt, params)

    for _ in range(3):
        step()
    sync()
    t = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    report["step"] = {"ms": (time.perf_counter() - t) / a.steps * 1e3}
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(3):
            step()
        sync()
    report["step"]["top_kernels_3_steps"] = top_kernels(prof, 25)
    print(f"step: {report['step']['ms']:.1f} ms", flush=True)
    for k in report["step"]["top_kernels_3_steps"][:8]:
        print(f"  {k['ms']:8.2f} ms {k['calls']:6d}x {k['name']}")
    if a.out:
        Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
