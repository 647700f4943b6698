"""How many tokens a verify step accepts for every draft-tree shape, from one growth a position.

Greedy tree speculation accepts the longest path of the tree whose tokens are the target's next
greedy tokens; lossless, the answer is plain decoding's whatever the shape. So once the target's
greedy answer is known, the accepted length of a step at position n depends only on the tree
grown at n. This has the engine decode each unseen request greedily with draft trees of TOPK and
DEPTH, one verify step a token (no draft accepted, so that every answer position gets its
growth), and keeps every candidate the growth made there (`grow_tree`'s k + (DEPTH - 1) k^2
nodes, each with its cumulative draft log-probability). Every shape TOPK,D,TOKENS with D at most
DEPTH is then one selection from those candidates (the levels up to D, the best TOKENS of them
by score, as `grow_tree` keeps them), and the steps a real run of that shape takes are walked
from the first answer token: accepted length = 1 + the drafts the step at n accepts, the next
step at n + that length. TOPK 1 gives chains (1,k,k: the draft's argmax k times).

What it leaves out: the chain's runners-up (a GPU verifies each draft's second choice too where
that pays: engine/spec_pays.py), and the rounding of a GPU's bf16 (this runs where the engine
does, fp32 on a CPU).

    python benchmarks/tree_acceptance.py --topk 1 2 3 4 6 8 --depth 8 --out tree_acceptance.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

# shapes reported: (topk, depth, tokens); every tokens <= 16 fits one verify forward of 16 rows
# with the root on a batch-invariant GPU target (the demo's), more takes two
DEFAULT_TOKENS = (4, 6, 8, 10, 12, 15, 20, 24, 32, 48, 63)


def record_growths(engine, shape_k: int, depth: int, prompts: list[list[int]], new_tokens: int, log=print) -> list:
    """Decodes each prompt greedily with trees of shape_k, depth, every step accepting no draft;
    returns per prompt (the whole sequence's ids, [(n, target ids, parents, depths, scores) of
    every candidate grown at the root n, in the tree's verify order])."""
    import speculative.eagle3.tree_loop as tree_loop
    from engine.types import SamplingParams
    from speculative.tree.grow import DraftTree
    from speculative.tree.shape import TreeShape

    small = TreeShape(shape_k, depth, 1)  # one node verified: a 2-row forward a step
    everything = TreeShape(shape_k, depth, 1)
    object.__setattr__(everything, "tokens", shape_k + (depth - 1) * shape_k * shape_k)  # past MAX_TOKENS
    engine.set_tree(small)
    step = engine.speculator.tree_step(small)
    if step.on_device:
        raise SystemExit("tree_acceptance.py records the CPU's tree step (explicit masks); run it with --device cpu")
    draft = step.parts.draft
    grown: list = []
    grow = step._grow

    def grow_all(n):
        step.shape = everything
        try:
            tree = grow(n)
        finally:
            step.shape = small
        grown.append((int(n), draft.to_target_ids(tree.tokens).tolist(), tree.parents.tolist(), tree.depths.tolist(),
                      tree.scores.tolist()))
        return DraftTree(tree.tokens[:1], tree.parents[:1], tree.depths[:1], tree.scores[:1])

    walk = tree_loop.greedy_tree_path

    def accept_none(tree, target_choice, max_depth=None):
        path, count, _ = walk(tree, target_choice, max_depth)
        return path, torch.zeros_like(count), target_choice[0]

    step._grow = grow_all
    tree_loop.greedy_tree_path = accept_none
    out = []
    try:
        for i, ids in enumerate(prompts):
            engine.reset()
            grown.clear()
            t0 = time.perf_counter()
            answer = [t for ev in engine.stream_ids(ids, SamplingParams(max_tokens=new_tokens), speculative=True)
                      for t in ev.token_ids]
            out.append((list(ids) + answer, list(grown)))
            log(f"  topk {shape_k}: request {i + 1}/{len(prompts)}: {len(answer)} tokens, {len(grown)} growths, "
                f"{time.perf_counter() - t0:.1f} s")
    finally:
        step._grow = grow
        tree_loop.greedy_tree_path = walk
    return out


def _kept(growth, depth: int, tokens: int) -> set[int]:
    """The nodes a shape keeps: the best `tokens` by score of those at most `depth` deep, ties to
    the earlier (shallower) node, as grow_tree keeps them."""
    _, ids, parents, depths, scores = growth
    inside = [i for i in range(len(ids)) if depths[i] <= depth]
    return set(sorted(inside, key=lambda i: (-scores[i], i))[:tokens])


def _follow(growth, kept: set[int], cont: list[int], most: int) -> int:
    """How many of cont's first tokens (at most `most`) a path of kept nodes spells."""
    _, ids, parents, _, _ = growth
    at, count = -1, 0
    while count < min(most, len(cont)):
        nxt = [i for i in kept if parents[i] == at and ids[i] == cont[count]]
        if not nxt:
            break
        at, count = nxt[0], count + 1
    return count


def accepted(growth, cont: list[int], depth: int, tokens: int) -> int:
    """Drafts a step accepts with the shape (topk of the growth, depth, tokens): the deepest node
    of the kept ones whose path spells cont's first tokens."""
    return _follow(growth, _kept(growth, depth, tokens), cont, depth)


def lookup(context: list[int], length: int, caps: dict[int, int] | None = None,
           earlier: list[int] | None = None, fallback: bool = False) -> list[int]:
    """A prompt-lookup proposal: the `length` tokens that followed the latest earlier occurrence
    of the context's last tokens (4, else 3, else 2: the engine's GRAMS), in the prompt or the
    answer so far; [] if none occurs. caps: a match of g tokens proposes at most caps[g].
    earlier: other conversations' answers too (each after a -1, which no token matches), searched
    before the context, so that the context's own occurrences come first; fallback: only where
    the context alone has none."""
    if earlier is not None:
        own = lookup(context, length, caps) if fallback else []
        found = own or lookup(earlier + [-1] + context, length, caps)
        return found[:found.index(-1)] if -1 in found else found  # no proposal runs past an answer's end
    end = len(context)
    from speculative.tree.lookup import GRAMS  # the engine's rule: the longest first

    for g in GRAMS:
        if end <= g:
            continue
        tail = context[end - g:]
        for j in range(end - g - 1, -1, -1):  # the occurrence ending just before the tail's own
            if context[j:j + g] == tail:
                return context[j + g:j + g + (length if caps is None else min(length, caps.get(g, 0)))]
    return []


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def walk_steps(seq: list[int], growths: list, depth: int, tokens: int, lookup_len: int = 0,
               rows: list | None = None, in_place: bool = False,
               caps: dict[int, int] | None = None, earlier: list[int] | None = None,
               fallback: bool = False) -> tuple[int, int]:
    """(verify steps, tokens they gave) for the shape's own run over one answer: from the first
    root, each step's accepted drafts plus the target's token. lookup_len: beside the tree, a
    chain of up to that many prompt-lookup tokens (`lookup`) is verified too, and the step
    accepts the longer of its two paths; `rows` then gets each step's lookup nodes that the tree's
    kept nodes do not already hold (the verify rows the chain adds). in_place: those nodes take
    the places of the tree's lowest-scored ones, so that a step verifies `tokens` nodes in all.
    caps: the chain's length by the tokens its match took (`lookup`); earlier, fallback: other
    conversations' answers searched too (`lookup`)."""
    by_n = {g[0]: g for g in growths}
    if not by_n:
        return 0, 0
    n, end, steps, made = min(by_n), len(seq), 0, 0
    while n in by_n and n + 1 < end:
        # the drafts past the sequence's end are unknown (EOS, or the answer cut at --new-tokens):
        # the last step counts what it accepted of the tokens there are, and the target's one
        growth = by_n[n]
        kept = _kept(growth, depth, tokens)
        proposal = lookup(seq[:n + 1], lookup_len, caps, earlier, fallback) if lookup_len else []
        added = len(proposal) - _follow(growth, kept, proposal, len(proposal))
        if in_place and added:
            # the tree's best nodes less those the chain adds, so that both come to `tokens` (the
            # best nodes of a tree hold every kept node's parent: scores fall along a path)
            proposal, m = proposal[:tokens], tokens
            while True:
                kept = _kept(growth, depth, m)
                added = len(proposal) - _follow(growth, kept, proposal, len(proposal))
                if m + added <= tokens:
                    break
                m = tokens - added  # fewer tree nodes may share less of the chain: again
        a = _follow(growth, kept, seq[n + 1:n + 1 + depth], depth)
        if lookup_len:
            a = max(a, common_prefix(proposal, seq[n + 1:n + 1 + lookup_len]))
            if rows is not None:
                rows.append(added)
        steps, made, n = steps + 1, made + a + 1, n + a + 1
    return steps, made


def _caps(spec: str) -> dict[int, int]:
    """"14/12/6": a chain of up to 14 tokens after a 4-token match, 12 after 3, 6 after 2."""
    parts = spec.split("/")
    if len(parts) != 3 or not all(p.isdigit() for p in parts) or not any(int(p) for p in parts):
        raise SystemExit(f"tree_acceptance.py: --lookup-caps {spec!r}: give A/B/C, the chain's length after "
                         "a match of 4, 3 and 2 tokens (e.g. 14/12/6)")
    return dict(zip((4, 3, 2), map(int, parts)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None, help="the EAGLE-3 head (default: the model's own)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--topk", type=int, nargs="+", default=[1, 2, 3, 4, 6, 8])
    ap.add_argument("--depth", type=int, default=8)
    ap.add_argument("--tokens", type=int, nargs="+", default=list(DEFAULT_TOKENS))
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=192)
    ap.add_argument("--lookup", type=int, nargs="*", default=[],
                    help="also walk each shape with a prompt-lookup chain of up to L tokens: beside the tree "
                         "(SHAPE+lookupL) and in the places of its lowest-scored nodes (SHAPE~lookupL)")
    ap.add_argument("--lookup-caps", nargs="*", default=[], metavar="A/B/C",
                    help="also walk each shape with a chain in place whose length follows its match: up to A "
                         "tokens after a 4-token match, B after 3, C after 2 (SHAPE~capsA/B/C)")
    ap.add_argument("--lookup-earlier", action="store_true",
                    help="also walk each shape with a chain in place that searches the answers to the requests "
                         "before it too (SHAPE~lookupL+earlier), and one that searches them only where its own "
                         "conversation has no match (SHAPE~lookupL+fallback)")
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    ap.add_argument("--system", default="You are a helpful assistant.")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    caps = {spec: _caps(spec) for spec in args.lookup_caps}

    from engine.engine import Engine

    t_start = time.perf_counter()
    engine = Engine.load(args.model, draft=args.draft, device=args.device)
    if engine.speculator is None or not hasattr(engine.speculator, "tree_step"):
        raise SystemExit(f"{args.model}: no EAGLE-3 head loaded; trees need one")
    tok = engine.tokenizer
    texts = [line.strip() for line in Path(args.prompts_file).read_text().splitlines() if line.strip()]
    system = [{"role": "system", "content": args.system}] if args.system else []
    prompts = [tok.apply_chat_template(system + [{"role": "user", "content": t}]) for t in texts[:args.requests]]

    runs, answers = {}, None
    for k in args.topk:
        t0 = time.perf_counter()
        recorded = record_growths(engine, k, args.depth, prompts, args.new_tokens)
        seqs = [seq for seq, _ in recorded]
        if answers is None:
            answers = seqs
        elif seqs != answers:  # lossless: every topk decodes the same answers
            raise SystemExit(f"topk {k}: the answers differ from topk {args.topk[0]}'s; the run is not lossless")
        shapes = {}
        for d in range(1, args.depth + 1):
            most = k + (d - 1) * k * k
            # a chain (TOPK 1) keeps its d drafts
            for n_tok in [d] if k == 1 else sorted({min(t, most) for t in args.tokens if t >= 1}):
                steps = made = 0
                for seq, growths in recorded:
                    s, m = walk_steps(seq, growths, d, n_tok)
                    steps, made = steps + s, made + m
                shapes[f"{k},{d},{n_tok}"] = {"topk": k, "depth": d, "tokens": n_tok, "verify_rows": n_tok + 1,
                                              "steps": steps, "accept_len": round(made / max(steps, 1), 4)}
                for length in args.lookup:
                    for in_place in (False, True):
                        steps = made = 0
                        added: list[int] = []
                        for seq, growths in recorded:
                            s, m = walk_steps(seq, growths, d, n_tok, length, added, in_place)
                            steps, made = steps + s, made + m
                        # the verify rows a step needs: the tree's, and the most the chain adds (in
                        # place: none, the chain's nodes replace the tree's last)
                        shapes[f"{k},{d},{n_tok}{'~' if in_place else '+'}lookup{length}"] = {
                            "topk": k, "depth": d, "tokens": n_tok, "lookup": length, "in_place": in_place,
                            "verify_rows": n_tok + 1 + (0 if in_place else length),
                            "lookup_rows_mean": round(sum(added) / max(len(added), 1), 3),
                            "steps": steps, "accept_len": round(made / max(steps, 1), 4)}
                    for mode in ("earlier", "fallback") if args.lookup_earlier else ():
                        steps = made = 0
                        prior: list[int] = []
                        for (seq, growths), prompt in zip(recorded, prompts):  # the requests in order
                            s, m = walk_steps(seq, growths, d, n_tok, length, None, True, None, prior,
                                              mode == "fallback")
                            steps, made = steps + s, made + m
                            prior = prior + [-1] + seq[len(prompt):]
                        shapes[f"{k},{d},{n_tok}~lookup{length}+{mode}"] = {
                            "topk": k, "depth": d, "tokens": n_tok, "lookup": length, "in_place": True,
                            "earlier_answers": mode, "verify_rows": n_tok + 1, "steps": steps,
                            "accept_len": round(made / max(steps, 1), 4)}
                for spec, by_gram in caps.items():
                    steps = made = 0
                    for seq, growths in recorded:
                        s, m = walk_steps(seq, growths, d, n_tok, max(by_gram.values()), None, True, by_gram)
                        steps, made = steps + s, made + m
                    shapes[f"{k},{d},{n_tok}~caps{spec}"] = {
                        "topk": k, "depth": d, "tokens": n_tok, "lookup_caps": by_gram, "in_place": True,
                        "verify_rows": n_tok + 1, "steps": steps, "accept_len": round(made / max(steps, 1), 4)}
        runs[str(k)] = {"seconds": round(time.perf_counter() - t0, 1), "shapes": shapes}
        print(f"topk {k}: {time.perf_counter() - t0:.0f} s", flush=True)

    result = {
        "model": args.model, "draft": args.draft or "the model's own", "device": args.device,
        "torch": torch.__version__, "dtype": str(engine.runner.dtype),
        "requests": len(prompts), "new_tokens": args.new_tokens, "system": args.system, "lookup": args.lookup,
        "lookup_caps": args.lookup_caps, "lookup_earlier": args.lookup_earlier,
        "prompts_file": Path(args.prompts_file).name,
        "answer_tokens": sum(len(s) - len(p) for s, p in zip(answers, prompts)),
        "seconds": round(time.perf_counter() - t_start, 1), "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    # the best shape for each row budget (one 16-row forward: tokens <= 15), and the chains
    print(f"{'shape':>18} {'rows':>5} {'accepted length':>16}")
    every = [(name, s) for run in runs.values() for name, s in run["shapes"].items()]
    for rows in sorted({s["verify_rows"] for _, s in every}):
        name, best = max(((n, s) for n, s in every if s["verify_rows"] == rows), key=lambda ns: ns[1]["accept_len"])
        print(f"{name:>18} {rows:>5} {best['accept_len']:>16.3f}")


if __name__ == "__main__":
    main()
