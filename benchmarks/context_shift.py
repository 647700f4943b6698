"""How well an EAGLE-3 head drafts on the contexts greedy answers make against those sampled
answers make.

The demo's head is trained on the target's greedy replies. A sampled answer walks through
contexts no greedy reply shows (a less likely word, then whatever follows it), and its verify
steps keep a draft with probability sum_v min(p_T(v), q_T(v)) (p, q: the target's and the head's
next-token distributions at the request's temperature T). This has the target answer the same
requests twice, greedily and at T, then runs the head's first draft step at every answer
position with the target's own features (teacher forced: what a verify step hands the head) and
reports, for each kind of answer:

- overlap: sum_v min(p_T, q_T), the chance a draft drawn at T is kept;
- KL(p_T || q_T) over the head's vocabulary (p renormalized there; `outside`: p's mass beyond
  it): how far the head's distribution is from the target's, apart from how spread the
  target's own is (overlap alone falls on text where the target is unsure, head or not);
- the target's entropy at T, and top-1: the head's argmax equal to the target's.

A head that fits sampled contexts worse than greedy ones (higher KL there) is what training on
sampled replies (`train-draft --sampled-replies`) is for.

With `--depth K` it also unrolls chains of K drafts the way training-time test does (each draft
after the first continuing from the head's own state, the earlier drafts the answer's own
tokens) and reports each depth's overlap and top-1, and over chains started at every answer
position: the greedy chain's accepted length, exact on greedy answers (walked from the first
position as the engine steps), and on either kind an estimate at T, 1 + the sum over depths of
the product of the overlaps so far. Neither depends on a random draw, so two heads compare
without the noise of a sampled bench run. It also reports the share of answer tokens outside the
head's draft vocabulary, and the greedy chains' accepted length with each of those counted as
drafted: a bound on what a larger draft vocabulary (train-draft --init --draft-vocab) could give.

    python benchmarks/context_shift.py --requests 16 --new-tokens 192 --out shift.json
    python benchmarks/context_shift.py --requests 12 --new-tokens 256 --depth 5 --head HEAD --out chains.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SPANS = ((1, 32), (32, 128), (128, 1 << 30))  # answer positions reported apart
ENTROPY_BINS = (0.0, 0.1, 0.5, 1.0, 2.0, 1e9)  # the target's entropy at T (nats), KL compared bin by bin


def _load(device: str, head: str, model: str):
    """(loaded target, teacher, head in eval mode, draft ids) through train-draft's own loading."""
    from app.cli import build_parser
    from speculative.train.command import _init_draft, _read_init, _shape_of_init
    from speculative.train.export import default_aux_layers
    from speculative.train.target import start_run
    from speculative.train.teacher import Teacher

    args = build_parser().parse_args(["train-draft", "--model", model, "--out", "/nonexistent", "--init", head,
                                      "--device", device])
    run = start_run(args, lambda opts: _shape_of_init(opts, args))
    loaded, opts = run.loaded, run.opts
    aux = default_aux_layers(loaded.config.num_layers)
    init = _read_init(opts, loaded, aux, run.target_name)
    draft, _ = _init_draft(loaded, aux, init.draft_ids.to(run.device), opts)
    init.load_into(draft)
    draft.eval()
    teacher = Teacher(loaded, aux, opts.max_len, 8 << 30)
    return loaded, teacher, draft, init.draft_ids.to(run.device)


@torch.no_grad()
def first_drafts(teacher, draft, seq, key, steps: int = 1) -> tuple:
    """The head's drafts at every position of `seq` on the target's own features (teacher
    forced), for the answer positions it drafts: (its logits (steps, n, Vd): depth d + 1 of a
    chain whose earlier drafts were the answer's own tokens, the chain ending at that position
    (depth 1: the first draft there), as training-time test unrolls it; its normed state before
    lm_head at depth 1 (n, H), the target's final states (n, Ht), the target's greedy tokens (n,),
    the answer token index drafted (n,); token 0 is the target's own, from the prefill)."""
    from speculative.train.data import Sequence
    from speculative.train.ttt import TTTBatch, unroll

    seen = {}

    def keep_first(module, inputs, output) -> None:  # depth 1's state; returns None: the output stays
        seen.setdefault("x", inputs[0].detach())

    hook = draft.lm_head.register_forward_hook(keep_first)
    try:
        batch = TTTBatch.from_rows([teacher.features_many([(key, Sequence(seq.ids, seq.response_start))])],
                                   len(seq.ids) - 1)
        q_logits = torch.stack([step[0] for step in unroll(draft, teacher.embed, batch, steps)]).float()
    finally:
        hook.remove()
    index = batch.positions[0] - (seq.response_start - 2)  # entry e drafts answer token e - (start - 2)
    at = batch.is_response[0] & (index >= 1)
    return q_logits[:, at], seen["x"][0][at].float(), batch.label_hidden[0][at], batch.greedy[0][at], index[at]


def chain_acceptance(overlaps: torch.Tensor, k: int) -> torch.Tensor:
    """Per chain start j (entries of one answer, in order): 1 + sum over s <= k of the product of
    overlaps[i, j + i] for i < s, overlaps (k, n) the chance that depth i + 1's draft at the
    answer position it drafts is kept, and 0 past the answer's end. With 0/1 overlaps (the
    head's argmax is the target's greedy token) this is the accepted length of a greedy chain of
    k started there; with sum(min(p, q)) at T, an estimate of a sampled chain's (the earlier
    drafts taken to be the answer's own tokens)."""
    n = overlaps.shape[1]
    total = torch.ones(n, dtype=torch.float64)
    run = torch.ones(n, dtype=torch.float64)
    for i in range(min(k, overlaps.shape[0])):
        shifted = torch.zeros(n, dtype=torch.float64)
        shifted[:n - i] = overlaps[i, i:].double()
        run = run * shifted
        total += run
    return total


def walked(accept_len: torch.Tensor) -> tuple[int, float]:
    """(steps, tokens) of the steps a run takes from the first position, each moving on by its
    accepted length (rounded down: exact for greedy chains)."""
    j, steps, made, n = 0, 0, 0.0, accept_len.shape[0]
    while j < n:
        a = int(accept_len[j])
        steps, made, j = steps + 1, made + a, j + a
    return steps, made


@torch.no_grad()
def measure(teacher, draft, draft_ids, seqs, temperature: float, depth: int = 1) -> dict:
    """Per answer position: overlap, KL, entropy at `temperature`, top-1; totals and by span.
    depth > 1: also each chain depth's overlap and top-1 (the earlier drafts the answer's own
    tokens), and chains of `depth` started at every position (chain_acceptance): the mean
    estimated accepted length at `temperature`, and the greedy chain's exact one, walked."""
    model = teacher.model
    rows = {name: [] for name in ("overlap", "kl", "outside", "entropy", "top1", "pos")}
    chains = {name: [] for name in ("overlap", "top1", "estimate", "greedy", "oov", "greedy_oov_drafted")}
    in_vocab = torch.zeros(model.lm_head.weight.shape[0], dtype=torch.bool)
    in_vocab[draft_ids.cpu()] = True
    walks = [0, 0.0]
    inv = 1.0 / temperature
    for i, seq in enumerate(seqs):
        if len(seq.ids) - seq.response_start < 2:
            continue
        q_all, _, label_hidden, greedy, index = first_drafts(teacher, draft, seq, ("shift", id(seq), i), depth)
        q_logits = q_all[0]
        p = torch.softmax(model.logits(label_hidden.to(model.lm_head.weight.dtype)).float() * inv, -1)
        if depth > 1:
            q_deep = torch.zeros(depth, *p.shape)
            q_deep[:, :, draft_ids] = torch.softmax(q_all * inv, -1)
            overlap = torch.minimum(p[None], q_deep).sum(-1)  # (depth, n)
            top1 = (draft_ids[q_all.argmax(-1)] == greedy[None]).float()
            chains["overlap"].append(overlap)
            chains["top1"].append(top1)
            chains["estimate"].append(chain_acceptance(overlap, depth))
            exact = chain_acceptance(top1, depth)
            chains["greedy"].append(exact)
            # what the tokens outside the head's vocabulary cost: the same chains with every such
            # token counted as drafted (a bound on what a larger draft vocabulary could give)
            oov = ~in_vocab[greedy.cpu()]
            chains["oov"].append(oov.float())
            chains["greedy_oov_drafted"].append(chain_acceptance(torch.maximum(top1, oov.float()[None]), depth))
            steps, made = walked(exact)
            walks[0] += steps
            walks[1] += made
        q_small = torch.softmax(q_logits * inv, -1)
        q = torch.zeros_like(p)
        q[:, draft_ids] = q_small
        rows["overlap"].append(torch.minimum(p, q).sum(-1))
        logp = torch.log(p.clamp_min(1e-30))
        rows["entropy"].append(-(p * logp).sum(-1))
        # KL over the draft vocabulary (p renormalized there), and p's mass it lacks, apart
        p_in = p[:, draft_ids]
        rows["outside"].append(1 - p_in.sum(-1))
        p_in = p_in / p_in.sum(-1, keepdim=True).clamp_min(1e-30)
        rows["kl"].append((p_in * (torch.log(p_in.clamp_min(1e-30)) - torch.log(q_small.clamp_min(1e-30)))).sum(-1))
        rows["top1"].append((draft_ids[q_small.argmax(-1)] == greedy).float())
        rows["pos"].append(index)
    cat = {k: torch.cat(v) for k, v in rows.items()}

    def summary(sel) -> dict:
        return {"positions": int(sel.sum()), **{k: round(float(cat[k][sel].mean()), 4)
                                                 for k in ("overlap", "kl", "outside", "entropy", "top1")}}
    out = summary(torch.ones_like(cat["pos"], dtype=torch.bool))
    out["by_span"] = {f"{a}-{b if b < 1 << 29 else 'end'}": summary((cat["pos"] >= a) & (cat["pos"] < b))
                      for a, b in SPANS}
    # Overlap falls where the target is unsure whatever the head does; within one band of the
    # target's entropy the two kinds of answer are compared on like positions.
    out["by_entropy"] = {f"{a:g}-{b:g}": summary((cat["entropy"] >= a) & (cat["entropy"] < b))
                         for a, b in zip(ENTROPY_BINS, ENTROPY_BINS[1:])}
    if depth > 1:
        ov, t1 = torch.cat(chains["overlap"], 1), torch.cat(chains["top1"], 1)
        out["chain"] = {
            "depth": depth,
            "overlap_by_depth": [round(float(x), 4) for x in ov.mean(1)],
            "top1_by_depth": [round(float(x), 4) for x in t1.mean(1)],
            "estimated_accept_len": round(float(torch.cat(chains["estimate"]).mean()), 4),
            # the target's greedy tokens are the answer's only in greedy answers
            "greedy_accept_len_every_start": round(float(torch.cat(chains["greedy"]).mean()), 4),
            "greedy_accept_len_walked": round(walks[1] / max(walks[0], 1), 4),
            "outside_vocab_share": round(float(torch.cat(chains["oov"]).mean()), 4),
            "greedy_accept_len_every_start_outside_drafted": round(float(torch.cat(chains["greedy_oov_drafted"]).mean()), 4),
            "top1_by_depth_inside_vocab": [round(float(x), 4) for x in
                                           (t1 * (1 - torch.cat(chains["oov"]))[None]).sum(1)
                                           / (1 - torch.cat(chains["oov"])).sum().clamp_min(1)],
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--head", default="demo-eagle3", help="an EAGLE-3 head for the model (train-draft --init's)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--samples", type=int, default=2, help="sampled answers per request (seeds)")
    ap.add_argument("--depth", type=int, default=1,
                    help="also chains of this many drafts: each depth's overlap, and the accepted lengths")
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    ap.add_argument("--system", default="You are a helpful assistant.")
    args = ap.parse_args()

    from benchmarks.harness.prompts import read_prompts_file
    from speculative.train.batched_generate import reply_batch

    t0 = time.perf_counter()
    loaded, teacher, draft, draft_ids = _load(args.device, args.head, args.model)
    tok = loaded.tokenizer
    texts = read_prompts_file(args.prompts_file)[:args.requests]
    system = [{"role": "system", "content": args.system}] if args.system else []
    prompts = [tok.apply_chat_template(system + [{"role": "user", "content": t}]) for t in texts]
    limits = [args.new_tokens] * len(prompts)

    from speculative.train.data import Sequence

    def answers(temperature: float, seed: int) -> list:
        replies = reply_batch(teacher.model, prompts, limits, teacher.eos_ids, temperatures=[temperature] * len(prompts),
                               seed=seed)
        return [Sequence(p + r, response_start=len(p)) for p, r in zip(prompts, replies)]

    report = {"model": args.model, "head": args.head, "device": args.device, "torch": torch.__version__,
              "temperature": args.temperature, "requests": len(prompts), "new_tokens": args.new_tokens,
              "system": args.system, "prompts_file": Path(args.prompts_file).name}
    greedy = answers(0.0, 0)
    report["greedy_answers"] = measure(teacher, draft, draft_ids, greedy, args.temperature, args.depth)
    sampled = [s for seed in range(args.samples) for s in answers(args.temperature, 1 + seed)]
    if sampled:  # --samples 0: greedy answers only
        report["sampled_answers"] = measure(teacher, draft, draft_ids, sampled, args.temperature, args.depth)
        for field in ("greedy_accept_len_every_start", "greedy_accept_len_walked"):  # greedy answers' only
            report["sampled_answers"].get("chain", {}).pop(field, None)
    report["wall_s"] = round(time.perf_counter() - t0, 1)
    args.out.write_text(json.dumps(report, indent=1))
    cols = ("positions", "overlap", "kl", "outside", "entropy", "top1")
    print(f"{'answers':<16}" + "".join(f"{c:>10}" for c in cols))
    for name in [n for n in ("greedy_answers", "sampled_answers") if n in report]:
        r = report[name]
        parts = [*((f"  pos {k}", v) for k, v in r["by_span"].items()),
                 *((f"  H {k}", v) for k, v in r["by_entropy"].items())]
        for label, s in [(name.split("_")[0], r), *parts]:
            print(f"{label:<16}" + "".join(f"{s[c]:>10}" for c in cols))
    if args.depth > 1:
        for name in [n for n in ("greedy_answers", "sampled_answers") if n in report]:
            c = report[name]["chain"]
            walked_len = f"; greedy chains walked {c['greedy_accept_len_walked']}" if "greedy_accept_len_walked" in c else ""
            print(f"{name.split('_')[0]}: chains of {args.depth}: overlap by depth {c['overlap_by_depth']}, "
                  f"estimated accepted length at T {c['estimated_accept_len']}{walked_len}")
    assert not math.isnan(report.get("sampled_answers", report["greedy_answers"])["overlap"])


if __name__ == "__main__":
    main()
