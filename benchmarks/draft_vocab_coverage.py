"""How much of a target's answers an EAGLE-3 head's draft vocabulary can draft at all.

A head proposes only tokens of its reduced vocabulary (`d2t`); an answer token outside it ends
the chain wherever it comes. The target answers requests greedily (by default the unseen
requests the speed figures use, under the app's default system prompt), and this reports:

- coverage: the share of answer tokens inside the head's vocabulary;
- with the context: the share inside it or already in the prompt or the answer so far (what a
  vocabulary extended per request by the context's tokens could draft), and with the prompt's
  tokens alone;
- larger vocabularies: the head's vocabulary extended by the tokens most frequent in the
  training conversations (and with `--request-sets`, the request sets' texts), to 8,192 ... 24,576;
- the outside tokens most often met;
- with `--context-rows`: the head's first draft at every answer position (teacher forced) scored
  over its own rows plus the target's lm_head rows of the context's tokens outside its
  vocabulary, untrained (the head's normed state times those rows, optionally scaled and
  offset by a pair fitted on the first half of the positions and checked on the second):
  whether such rows, as they are, would add right drafts or take the argmax from right ones.

    python benchmarks/draft_vocab_coverage.py --out coverage.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SIZES = (8192, 12288, 16384, 24576)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--head", default="demo-eagle3")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    ap.add_argument("--system", default="You are a helpful assistant.")
    ap.add_argument("--request-sets", action="store_true",
                    help="rank the added tokens by the request sets' texts too (fetches them like train-draft)")
    ap.add_argument("--context-rows", action="store_true", help="score the context's tokens with the target's rows")
    args = ap.parse_args()

    from benchmarks.context_shift import _load
    from benchmarks.harness.prompts import read_prompts_file
    from speculative.train import prompt_sets
    from speculative.train.batched_generate import reply_batch
    from speculative.train.data import load_conversations, split, tokenize

    t0 = time.perf_counter()
    loaded, teacher, draft, draft_ids = _load(args.device, args.head, args.model)
    tok = loaded.tokenizer
    V = teacher.model.lm_head.weight.shape[0]
    system = [{"role": "system", "content": args.system}] if args.system else []
    texts = read_prompts_file(args.prompts_file)
    prompts = [tok.apply_chat_template(system + [{"role": "user", "content": t}]) for t in texts]
    replies = reply_batch(teacher.model, prompts, [args.new_tokens] * len(prompts), teacher.eos_ids)
    answer = torch.tensor([t for r in replies for t in r])
    inside = torch.zeros(V, dtype=torch.bool)
    inside[draft_ids.cpu()] = True

    def coverage(mask: torch.Tensor) -> float:
        return round(float(mask[answer].double().mean()), 4)

    with_context = with_prompt = 0
    for p, r in zip(prompts, replies):
        seen, asked = set(p), set(p)
        for t in r:
            with_context += int(bool(inside[t]) or t in seen)
            with_prompt += int(bool(inside[t]) or t in asked)
            seen.add(t)

    convs, _ = load_conversations(None)
    train_convs, _ = split(convs)
    counts = torch.zeros(V, dtype=torch.double)
    for s in tokenize(tok, train_convs, 512):
        counts += torch.bincount(torch.tensor(s.ids[1:]), minlength=V).double()
    ranked_by = "the training conversations"
    if args.request_sets:
        for name in prompt_sets.known_sets():
            for text in prompt_sets.split_requests(name, False):
                counts += torch.bincount(torch.tensor(tok.encode(text), dtype=torch.long), minlength=V).double()
        ranked_by += " and the request sets' training requests"
    score = counts.clone()
    score[inside] = float("inf")  # the head's own tokens first, then by frequency
    order = torch.argsort(score, descending=True)
    larger = {}
    for n in SIZES:
        mask = torch.zeros(V, dtype=torch.bool)
        mask[order[:n]] = True
        larger[str(n)] = coverage(mask)
    outside = Counter(int(t) for t in answer if not inside[t])
    report = {"model": args.model, "head": args.head, "draft_vocab": int(inside.sum()),
              "prompts_file": Path(args.prompts_file).name, "requests": len(prompts), "system": args.system,
              "new_tokens": args.new_tokens, "answer_tokens": len(answer), "coverage": coverage(inside),
              "coverage_with_context": round(with_context / max(len(answer), 1), 4),
              "coverage_with_prompt": round(with_prompt / max(len(answer), 1), 4),
              "larger_vocabularies": larger, "larger_ranked_by": ranked_by,
              "most_common_outside": [[tok.decode([t]), c] for t, c in outside.most_common(30)],
              **({"context_rows": context_rows(teacher, draft, draft_ids, prompts, replies, inside)}
                 if args.context_rows else {}),
              "wall_s": round(time.perf_counter() - t0, 1)}
    args.out.write_text(json.dumps(report, indent=1))
    print(f"{len(answer)} answer tokens: {report['coverage']:.1%} inside the head's {report['draft_vocab']} tokens, "
          f"{report['coverage_with_context']:.1%} with the context's tokens, {report['coverage_with_prompt']:.1%} with the prompt's")
    for n, c in larger.items():
        print(f"  extended to {n}: {c:.1%}")
    print("outside most often:", report["most_common_outside"][:12])
    if "context_rows" in report:
        print("context rows:", report["context_rows"])


@torch.no_grad()
def context_rows(teacher, draft, draft_ids, prompts, replies, inside) -> dict:
    """The head's own argmax against its argmax over its rows and the target's rows of the
    context's outside tokens (a * logit + b for those), per answer position, against the target's
    greedy token; (a, b) fitted on the first half of the positions, checked on the second."""
    from benchmarks.context_shift import first_drafts
    from speculative.train.data import Sequence

    W = teacher.model.lm_head.weight.float()
    ids = draft_ids.cpu()
    own_max, own_tok, ext_max, ext_tok, gold = [], [], [], [], []
    for i, (p, r) in enumerate(zip(prompts, replies)):
        seq = Sequence(p + r, response_start=len(p))
        q, x, _, greedy, index = first_drafts(teacher, draft, seq, ("rows", i))
        q = q[0]
        for j, e in enumerate((index + len(p) - 2).tolist()):  # the entry, the answer's tokens before it known
            m, a = q[j].cpu().max(0)
            own_max.append(float(m))
            own_tok.append(int(ids[a]))
            gold.append(int(greedy[j]))
            ctx = sorted({t for t in seq.ids[:e + 2] if not inside[t]})
            if ctx:
                m2, a2 = (x[j] @ W[ctx].T).max(0)
                ext_max.append(float(m2))
                ext_tok.append(ctx[int(a2)])
            else:
                ext_max.append(float("-inf"))
                ext_tok.append(-1)
    om, em, ot, et, g = (torch.tensor(v) for v in (own_max, ext_max, own_tok, ext_tok, gold))

    def right(sl, a, b):
        return float((torch.where(a * em[sl] + b > om[sl], et[sl], ot[sl]) == g[sl]).double().mean())
    n = len(g) // 2
    first, second = slice(0, n), slice(n, None)
    grid = [(a, b) for a in (0.3, 0.5, 0.7, 0.8, 0.9, 1.0, 1.2) for b in range(-14, 4)]
    a, b = max(grid, key=lambda ab: right(first, *ab))
    return {"positions": len(g), "own_rows_right": round(float((ot == g).double().mean()), 4),
            "ceiling_right": round(float(((ot == g) | (et == g)).double().mean()), 4),
            "target_rows_as_they_are_right": round(right(slice(None), 1.0, 0.0), 4),
            "fitted_scale_offset": [a, b], "second_half_own_rows_right": round(float((ot[second] == g[second]).double().mean()), 4),
            "second_half_fitted_right": round(right(second, a, b), 4)}


if __name__ == "__main__":
    main()
