"""train-draft's two target-side phases, old path against new in one process, on a model of a
given shape with random bf16 weights (no download; the demo's shape by default):

- generation of training replies (speculative/train/batched_generate.py reply_batch): the host reading each
  step's tokens (SYNC_EVERY = 1) against reading them every SYNC_EVERY steps;
- teacher features (a packed forward with aux layers, speculative/train/teacher.py): padded groups
  of similar lengths against one variable-length flash call per layer.

Rounds alternate (old, new, old, new) so clock drift falls on both. Random weights rarely emit
EOS, so every generated reply runs to its limit; prompt and reply lengths are drawn like the
chat data's (prompts 40-400 tokens, packs of 8,192 tokens of 30-900-token sequences).

    python benchmarks/teacher_paths.py --out teacher_paths.json [--config CONFIG.json]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
ROOT = Path(__file__).resolve().parent


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--config", default=str(ROOT / "configs" / "smollm2-135m.json"))
    ap.add_argument("--rows", type=int, default=2048, help="prompts per generation batch")
    ap.add_argument("--reply", type=int, default=128, help="tokens per reply")
    ap.add_argument("--packs", type=int, default=20, help="packed forwards per features round")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cuda")
    a = ap.parse_args()

    import torch

    import engine.attention as attention
    from benchmarks.harness.shapes import random_engine
    from speculative.train import batched_generate as batched
    from engine.forward_batch import ForwardBatch

    sync = lambda: torch.cuda.synchronize() if a.device == "cuda" else None  # noqa: E731
    runner = random_engine(a.config, a.device, 1024, use_graphs=False).runner
    model = runner.model
    cfg = model.config
    g = torch.Generator().manual_seed(0)

    def draw(lo, hi, n):
        return [int(x) for x in torch.randint(lo, hi, (n,), generator=g)]

    vocab = min(cfg.vocab_size, 30000)
    prompts = [draw(100, vocab, n) for n in draw(40, 400, a.rows)]
    packs = []
    for _ in range(a.packs):
        lengths = []
        while sum(lengths) < 8192 - 900:
            lengths.append(draw(30, 900, 1)[0])
        packs.append((torch.randint(100, vocab, (sum(lengths),), generator=g).to(a.device), lengths))
    aux = tuple(sorted({2, cfg.num_layers // 2, cfg.num_layers - 3}))

    def generate(every):
        batched.SYNC_EVERY = every
        sync()
        t = time.perf_counter()
        out = batched.reply_batch(model, prompts, [a.reply] * len(prompts), ())
        sync()
        return sum(len(r) for r in out) / (time.perf_counter() - t), out

    @torch.no_grad()
    def features(varlen):
        attention.USE_VARLEN = varlen
        outs = []
        sync()
        t = time.perf_counter()
        for ids, lengths in packs:
            o = model(ForwardBatch.packed(ids, lengths), runner.kv, aux)
            outs.append((o.hidden, o.aux_hidden))
        sync()
        return sum(len(ids) for ids, _ in packs) / (time.perf_counter() - t), outs

    default_sync = batched.SYNC_EVERY
    report = {"machine": {"device": torch.cuda.get_device_name(0) if a.device == "cuda" else a.device,
                          "torch": torch.__version__, "python": platform.python_version()},
              "model": f"{Path(a.config).name}, random bf16 weights", "rounds": a.rounds, "results": {}}
    cases = [("generation", generate, (1, default_sync), f"{a.rows} prompts of 40-400 tokens, {a.reply}-token replies"),
             ("features", features, (False, True), f"{a.packs} packs of about 8,192 tokens, aux layers {list(aux)}")]
    for name, run, (old, new), what in cases:
        run(old), run(new)  # warm-up: kernels, allocator, plans
        speeds = {old: [], new: []}
        results = {}
        for _ in range(a.rounds):
            for setting in (old, new):
                s, results[setting] = run(setting)
                speeds[setting].append(s)
        if name == "generation":
            same = results[old] == results[new]
        else:
            diffs = [max((x.float() - y.float()).abs().max().item() for x, y in zip(p, q))
                     for p, q in zip(results[old], results[new])]
            same = max(diffs)
        o, n = statistics.mean(speeds[old]), statistics.mean(speeds[new])
        report["results"][name] = {"setup": what, "old": str(old), "new": str(new), "old_tok_s": round(o),
                                   "new_tok_s": round(n), "ratio": round(n / o, 3),
                                   "rounds_old": [round(x) for x in speeds[old]],
                                   "rounds_new": [round(x) for x in speeds[new]],
                                   ("same_tokens" if name == "generation" else "max_abs_diff"): same}
        print(f"{name:10s} old ({old}) {o:10,.0f} tok/s   new ({new}) {n:10,.0f} tok/s   x{n / o:.2f}   "
              f"{'same tokens' if name == 'generation' else 'max abs diff'}: {same}", flush=True)
    batched.SYNC_EVERY, attention.USE_VARLEN = default_sync, True
    report["varlen_failed"] = attention._VARLEN_FAILED
    Path(a.out).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
