"""Many draft-tree shapes timed in one process, as a user meets them: the engine loaded once with
its EAGLE-3 head, its no-draft twin over the same weights (Engine.without_draft) as the baseline,
the same engine with speculation off, then each --tree shape (off: the chain), every setting on
every prompt, alternating per prompt (the order rotating from one prompt to the next), each timed
answer after an uncounted 8-token warm-up of its own (a shape's first answer captures its graph).
Answers end at EOS, as in the app; tokens/s as `localchat bench` sums them. One load, one
no-draft baseline and one Triton warm-up for the whole sweep, where a `localchat bench` each
pays them for every shape.

    python benchmarks/tree_shapes.py --model demo --tree 4,8,15 --tree 4,8,24 --tree off --out FILE

Writes JSON (the machine, every setting's figures, a shape's speed-up over no draft, and whether
its greedy answers equal speculation off's) and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PROMPTS = ROOT / "benchmarks" / "prompts" / "unseen_requests.txt"
NO_DRAFT, DRAFT_OFF = "no_draft", "draft_off"


def fail(message: str) -> None:
    print(f"tree_shapes.py: {message}", file=sys.stderr)
    raise SystemExit(1)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    from engine.errors import UserError
    from engine.options import TREE_LOOKUP_MOST
    from speculative.tree.shape import parse_tree

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="demo")
    ap.add_argument("--draft", default=None, help="an EAGLE-3 head (default: the model's own, as `localchat run`)")
    ap.add_argument("--tree", action="append", required=True,
                    help="a shape, TOPK,DEPTH,TOKENS, or off (the chain); repeat it")
    ap.add_argument("--prompts-file", default=str(PROMPTS), help="one request a line")
    ap.add_argument("--prompts", type=int, default=12, help="the file's first N requests")
    ap.add_argument("--new-tokens", type=int, default=384, help="the longest answer")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--lookup", type=int, default=None,
                    help="also each tree shape with a prompt-lookup chain of up to N tokens in its last nodes' "
                         "places (SHAPE~lookupN; greedy; 0: none), beside the engine's own (LOCALCHAT_TREE_LOOKUP)")
    ap.add_argument("--device", default=None)
    ap.add_argument("--out", required=True, help="the JSON report")
    a = ap.parse_args(argv)
    shapes = {}
    for spec in a.tree:
        try:
            shape = parse_tree(spec)
        except UserError as e:
            fail(str(e))
        if shape == "auto":
            fail("--tree auto: give shapes, TOPK,DEPTH,TOKENS, or off")
        shapes[str(shape) if shape is not None else "off"] = shape
    a.shapes = shapes
    if a.prompts < 1 or a.new_tokens < 1:
        fail("--prompts and --new-tokens must be 1 or more")
    if a.lookup is not None and not 0 <= a.lookup <= TREE_LOOKUP_MOST:
        fail(f"--lookup {a.lookup}: give 0 (none) to {TREE_LOOKUP_MOST}")
    if a.lookup is not None:
        shapes.update({f"{name}~lookup{a.lookup}": (shape, a.lookup) for name, shape in list(shapes.items())
                       if shape is not None})
    if not 0 <= a.temperature <= 2:
        fail(f"--temperature {a.temperature}: give 0 to 2")
    if not Path(a.prompts_file).is_file():
        fail(f"--prompts-file {a.prompts_file}: no such file")
    if not Path(a.out).resolve().parent.is_dir():
        fail(f"--out {a.out}: its folder does not exist")
    return a


def settings(engine, shapes: dict) -> list[tuple[str, object, bool, object, int]]:
    """(name, engine, speculative, tree shape, lookup chain) of each setting: no draft, speculation
    off, then a shape each (None: the chain; a (shape, N) pair: the shape with lookup chains of N;
    a shape alone: the engine's own, LOCALCHAT_TREE_LOOKUP's)."""
    own = engine.runner.model.ops.options.tree_lookup
    return ([(NO_DRAFT, engine.without_draft(), False, None, 0), (DRAFT_OFF, engine, False, None, 0)]
            + [(name, engine, True, *(shape if isinstance(shape, tuple) else (shape, own)))
               for name, shape in shapes.items()])


def time_shapes(engine, shapes: dict, prompts: list[list[int]], new_tokens: int, temperature: float) -> dict:
    """{setting: its runs' summary} over the prompts (token ids), alternating as the module says;
    each shape's summary adds its speed-up over no draft and, greedy, how many answers equal
    speculation off's."""
    from benchmarks.harness.report import summary
    from benchmarks.harness.timing import time_decode

    order = settings(engine, shapes)
    runs: dict[str, list[dict]] = {name: [] for name, *_ in order}
    for i, ids in enumerate(prompts):
        for name, eng, speculative, shape, lookup in order[i % len(order):] + order[:i % len(order)]:
            if speculative:
                eng.set_tree(shape)
                if shape is not None:
                    eng.speculator.tree_step(shape).set_lookup(lookup)
            time_decode(eng, ids, 8, speculative, temperature)
            runs[name].append(time_decode(eng, ids, new_tokens, speculative, temperature, ignore_eos=False))
    # a step gives at most depth + 1 tokens (16 + 1)
    out = {name: summary(r, 18 if name in shapes else 0) for name, r in runs.items()}
    base = out[NO_DRAFT]["decode_tok_s"]
    for name in shapes:
        out[name]["speedup_vs_no_draft"] = out[name]["decode_tok_s"] / base
        if temperature == 0:
            out[name]["same_tokens_as_draft_off"] = sum(
                a["token_ids"] == b["token_ids"] for a, b in zip(runs[name], runs[DRAFT_OFF]))
    out[DRAFT_OFF]["speedup_vs_no_draft"] = out[DRAFT_OFF]["decode_tok_s"] / base
    return out


def step_ms(setting: dict) -> float:
    """The wall time of one step, ms: a verify step (its accepted tokens at the setting's speed),
    or a plain setting's token."""
    return 1000.0 * setting.get("accept_len_mean", 1.0) / setting["decode_tok_s"]


def table(report: dict) -> str:
    lines = [f"{'setting':16s} {'tok/s':>8s} {'vs none':>8s} {'accepted':>8s} {'rows':>5s} {'ms/step':>7s} {'same':>5s}"]
    for name, s in report["settings"].items():
        same = s.get("same_tokens_as_draft_off")
        spec = f"{s['accept_len_mean']:8.2f} {s['verify_tokens']:5.1f}" if "accept_len_mean" in s else " " * 14
        lines.append(f"{name:16s} {s['decode_tok_s']:8.1f} {s.get('speedup_vs_no_draft', 1.0):7.3f}x {spec} "
                     f"{step_ms(s):7.3f} {'' if same is None else same:>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from app.settings import Settings
    from benchmarks.harness.prompts import read_prompts_file
    from engine.engine import Engine

    requests = read_prompts_file(args.prompts_file)[:args.prompts]
    engine = Engine.load(args.model, draft=args.draft, device=args.device)
    if not hasattr(engine.speculator, "set_tree"):
        fail(f"{engine.draft_name or 'no draft'}: trees need an EAGLE-3 head (--draft)")
    system = [{"role": "system", "content": Settings().system_prompt}]
    prompts = [engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": r}]) for r in requests]
    dev = engine.runner.device
    report = {"machine": {"platform": platform.platform(), "python": platform.python_version(),
                          "torch": torch.__version__,
                          "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"},
              "model": engine.model_name, "draft": engine.draft_name, "prompts_file": args.prompts_file,
              "prompts": len(prompts), "new_tokens": args.new_tokens, "temperature": args.temperature,
              "system_prompt": system[0]["content"],
              # the LOCALCHAT_* switches the run was given (KernelOptions.from_env)
              "switches": {k: v for k, v in sorted(os.environ.items())
                           if k.startswith("LOCALCHAT_") and k not in ("LOCALCHAT_HOME", "LOCALCHAT_TEST_HOME")},
              "settings": time_shapes(engine, args.shapes, prompts, args.new_tokens, args.temperature)}
    Path(args.out).write_text(json.dumps(report, indent=1))
    print(table(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
