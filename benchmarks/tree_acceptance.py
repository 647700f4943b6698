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


def accepted(growth, cont: list[int], depth: int, tokens: int) -> int:
    """Drafts a step accepts with the shape (topk of the growth, depth, tokens): the deepest node
    of the kept ones whose path spells cont's first tokens."""
    _, ids, parents, depths, scores = growth
    inside = [i for i in range(len(ids)) if depths[i] <= depth]
    # the best `tokens` by score, ties to the earlier (shallower) node, as grow_tree keeps them
    kept = set(sorted(inside, key=lambda i: (-scores[i], i))[:tokens])
    at, count = -1, 0
    while count < min(depth, len(cont)):
        nxt = [i for i in kept if parents[i] == at and ids[i] == cont[count]]
        if not nxt:
            break
        at, count = nxt[0], count + 1
    return count


def walk_steps(seq: list[int], growths: list, depth: int, tokens: int) -> tuple[int, int]:
    """(verify steps, tokens they gave) for the shape's own run over one answer: from the first
    root, each step's accepted drafts plus the target's token."""
    by_n = {g[0]: g for g in growths}
    if not by_n:
        return 0, 0
    n, end, steps, made = min(by_n), len(seq), 0, 0
    while n in by_n and n + 1 < end:
        # the drafts past the sequence's end are unknown (EOS, or the answer cut at --new-tokens):
        # the last step counts what it accepted of the tokens there are, and the target's one
        a = accepted(by_n[n], seq[n + 1:n + 1 + depth], depth, tokens)
        steps, made, n = steps + 1, made + a + 1, n + a + 1
    return steps, made


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
    ap.add_argument("--prompts-file", default=str(Path(__file__).parent / "prompts" / "unseen_requests.txt"))
    ap.add_argument("--system", default="You are a helpful assistant.")
    ap.add_argument("--out", required=True)
    args = ap.parse_args()

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
        runs[str(k)] = {"seconds": round(time.perf_counter() - t0, 1), "shapes": shapes}
        print(f"topk {k}: {time.perf_counter() - t0:.0f} s", flush=True)

    result = {
        "model": args.model, "draft": args.draft or "the model's own", "device": args.device,
        "torch": torch.__version__, "dtype": str(engine.runner.dtype),
        "requests": len(prompts), "new_tokens": args.new_tokens, "system": args.system,
        "prompts_file": Path(args.prompts_file).name,
        "answer_tokens": sum(len(s) - len(p) for s, p in zip(answers, prompts)),
        "seconds": round(time.perf_counter() - t_start, 1), "runs": runs,
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    # the best shape for each row budget (one 16-row forward: tokens <= 15), and the chains
    print(f"{'shape':>10} {'rows':>5} {'accepted length':>16}")
    every = [s for run in runs.values() for s in run["shapes"].values()]
    for rows in sorted({s["verify_rows"] for s in every}):
        best = max((s for s in every if s["verify_rows"] == rows), key=lambda s: s["accept_len"])
        print(f"{best['topk']},{best['depth']},{best['tokens']:>3} {rows:>5} {best['accept_len']:>16.3f}")


if __name__ == "__main__":
    main()
