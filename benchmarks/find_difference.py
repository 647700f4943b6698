"""Where greedy speculation and plain decoding part: which kernels, which rows, which positions.

Two checks, on prompts the drafts never saw, under the app's system prompt:

1. Teacher-forced rows. For each prompt, plain decoding's answer is fed back to the target in
   chunks of 1 (the decode step), of the verify step's row count and of 16 rows, each from a fresh
   prefill; the logits of every answer token and the K/V cache left behind are compared bit for
   bit with the 1-row run. A batch-invariant target gives the same bits for every chunk size.
2. End to end. Greedy speculation against plain decoding with the draft loaded, token for token,
   for each draft and with the runners-up rows on and off (LOCALCHAT_SPEC_ALTS=0).

    python benchmarks/find_difference.py --prompts 8 --out find_difference.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def first_difference(a: list[int], b: list[int]) -> int | None:
    if a == b:
        return None
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def teacher_forced(engine, prompt: list[int], answer: list[int], chunk):
    """(logits (len(answer), V) of each answer token's step, K (L, T, H, D), V) after a fresh
    prefill and the answer fed in chunks of `chunk` rows ("1e": one row, eagerly, no graph)."""
    import torch

    from engine.forward_batch import ForwardBatch

    runner = engine.runner
    engine.reset()
    dev = runner.device
    with torch.inference_mode():
        runner.forward(torch.tensor(prompt[:-1], device=dev), 0, all_logits=False)
        seq = [prompt[-1]] + answer[:-1]  # row j's logits choose answer[j]
        pos, rows = len(prompt) - 1, []
        eager = chunk == "1e"
        step = 1 if eager else chunk
        for i in range(0, len(seq), step):
            ids = seq[i:i + step]
            if eager:
                out = runner.model(ForwardBatch.eager(torch.tensor(ids, device=dev), pos), runner.kv)
                logits = runner.model.logits(out.hidden)
            else:
                logits, _, _ = runner.forward(torch.tensor(ids, device=dev), pos)
            rows.append(logits[:len(ids)].float().clone())
            pos += len(ids)
        kv = runner.kv
        return torch.cat(rows), kv.k_all[:, :pos].clone(), kv.v_all[:, :pos].clone()


def compare_forced(engine, prompt, answer, chunks) -> dict:
    import torch

    ref_logits, ref_k, ref_v = teacher_forced(engine, prompt, answer, 1)
    out = {}
    for chunk in chunks:
        logits, k, v = teacher_forced(engine, prompt, answer, chunk)
        diff_rows = (logits != ref_logits).any(dim=1).nonzero().flatten().tolist()
        kv_diff = ((k != ref_k) | (v != ref_v)).flatten(2).any(dim=2)  # (L, T)
        pos_diff = kv_diff.any(dim=0).nonzero().flatten().tolist()
        layer_diff = kv_diff.any(dim=1).nonzero().flatten().tolist()
        argmax_diff = (logits.argmax(-1) != ref_logits.argmax(-1)).nonzero().flatten().tolist()
        out[str(chunk)] = {
            "rows_differing": len(diff_rows), "first_row_differing": diff_rows[0] if diff_rows else None,
            "max_abs_logit_diff": float((logits - ref_logits).abs().max()),
            "argmax_differing": len(argmax_diff),
            "kv_positions_differing": len(pos_diff),
            "first_kv_position_differing": pos_diff[0] - len(prompt) + 1 if pos_diff else None,
            "first_kv_layer_differing": layer_diff[0] if layer_diff else None,
        }
        del logits, k, v
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def end_to_end(engine, prompts, params) -> dict:
    rows = []
    for ids in prompts:
        engine.reset()
        plain = list(engine.stream_ids(ids, params, speculative=False))
        plain_ids = [t for e in plain for t in e.token_ids]
        engine.reset()
        spec = list(engine.stream_ids(ids, params, speculative=True))
        spec_ids = [t for e in spec for t in e.token_ids]
        rows.append({"tokens": len(plain_ids), "first_difference": first_difference(plain_ids, spec_ids),
                     "accepted_length": spec[-1].stats.accept_len_mean if spec else None})
    return {"identical": sum(r["first_difference"] is None for r in rows), "prompts": len(rows), "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--drafts", default="demo-eagle3,demo-mtp")
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--forced-prompts", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=384)
    ap.add_argument("--alts", default=",0", help="LOCALCHAT_SPEC_ALTS values to try ('' = the default)")
    ap.add_argument("--forced-only", action="store_true", help="the teacher-forced check alone")
    ap.add_argument("--variants", default="", help="';'-separated env settings to repeat the forced check "
                    "under, e.g. 'LOCALCHAT_ROPE_IN_ATTENTION=0;LOCALCHAT_PDL=0'")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

    import torch

    from app.settings import Settings
    from benchmarks.harness.prompts import read_prompts_file
    from engine.engine import Engine
    from engine.types import SamplingParams

    texts = read_prompts_file(args.prompts_file)[:args.prompts]
    params = SamplingParams(max_tokens=args.max_tokens)
    result = {"device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
              "torch": torch.__version__, "max_tokens": args.max_tokens, "prompts_file": args.prompts_file,
              "forced": {}, "end_to_end": {}}
    t0 = time.time()
    for variant in [v for v in args.variants.split(";") if v]:
        env = dict(kv.split("=", 1) for kv in variant.split(","))
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        engine = Engine.load(args.model, draft=args.drafts.split(",")[0])
        system = [{"role": "system", "content": Settings().system_prompt}]
        forced = []
        for t in texts[:args.forced_prompts]:
            ids = engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": t}])
            engine.reset()
            answer = [x for e in engine.stream_ids(ids, params, speculative=False) for x in e.token_ids]
            forced.append({"answer_tokens": len(answer), **compare_forced(engine, ids, answer, ["1e", 6, 16])})
        result["forced"][variant] = forced
        print(variant, "forced:", json.dumps(forced), flush=True)
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        del engine
        torch.cuda.empty_cache()
    for draft in ([] if args.forced_only else args.drafts.split(",")):
        for alts in args.alts.split(","):
            os.environ["LOCALCHAT_SPEC_ALTS"] = alts
            engine = Engine.load(args.model, draft=draft)
            system = [{"role": "system", "content": Settings().system_prompt}]
            prompts = [engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": t}]) for t in texts]
            name = f"{draft} alts={alts or 'default'}"
            if alts == args.alts.split(",")[0]:  # teacher-forced rows: the target alone, once per draft
                forced = []
                for ids in prompts[:args.forced_prompts]:
                    engine.reset()
                    answer = [t for e in engine.stream_ids(ids, params, speculative=False) for t in e.token_ids]
                    chunks = sorted({engine.speculator.k + 1, 16})
                    forced.append({"answer_tokens": len(answer), **compare_forced(engine, ids, answer, chunks)})
                result["forced"][draft] = forced
                print(name, "forced:", json.dumps(forced), flush=True)
            e2e = end_to_end(engine, prompts, params)
            result["end_to_end"][name] = e2e
            print(name, f"identical {e2e['identical']}/{e2e['prompts']}",
                  [r["first_difference"] for r in e2e["rows"]], f"{time.time() - t0:.0f}s", flush=True)
            del engine
            torch.cuda.empty_cache()
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
