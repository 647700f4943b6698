"""--tree auto: the draft shape that decodes fastest for this model, draft and device, found by a
short calibration and remembered.

The calibration times greedy speculation with chains and with each candidate tree on the same
few prompts (chat-style requests under the app's default system prompt, answers cut at
CALIBRATION_TOKENS), one after the other, and keeps the fastest by tokens per second. The
result is cached in the cache folder under the model, the draft, the device's name, torch's
version, the kernel switches a tree step's cost depends on (KernelOptions.tree_level and
TREE_SWITCHES, the lookup chain's length with them) and the contents of this file and of the
tree step it times (eagle3/tree_loop.py, kernels/tree_level.py and tree_lookup.py, lookup.py), so
later loads read it at once and a changed tree step is timed again. A CPU takes chains without
calibrating: there each verified row costs its arithmetic, and trees (13-25 rows a step) lost to
the chain on the demo model (docs/performance.md).
"""

from __future__ import annotations

from pathlib import Path

from engine.spec_pays import answer_tok_s, cache_key as measurement_key
from speculative.tree.shape import TreeShape

# the fastest trees on the demo with the tree kernels, from a shallow wide one to a deep one,
# each verified in one forward (docs/performance.md). With the prompt-lookup chain (12 deep) the
# shallow 16-row trees win: on an H100 over 24 requests 4,4,15 ran 2.45x of no draft (3.88 tokens
# a step), 4,5,15 2.40x (3.95), 4,7,15 2.26x (4.01), 4,8,15 2.19x (4.02); each level less saves
# some 32 us a step and the chain takes over the depth
CANDIDATES = (TreeShape(4, 4, 8), TreeShape(3, 5, 8), TreeShape(4, 6, 12), TreeShape(4, 4, 15), TreeShape(4, 5, 15),
              TreeShape(4, 8, 15))
# and where a tree of more than 15 nodes is verified in one forward (routing.tree_rows), one that
# accepts more: on the same runs 4,5,24 accepted 4.16 at 2.14x (4,4,24 4.05 at 2.16x, 4,7,24 4.26
# at 2.05x); a target whose verify rows cost less may differ
WIDE_CANDIDATES = (TreeShape(4, 5, 24),)
CALIBRATION_TOKENS = 48
PROMPTS = ("Explain in two sentences why the sky is blue.",
           "Write a short list of three tips for learning a new language.",
           "What is the difference between a list and a tuple in Python?")


# the kernel switches, besides tree_level, that change what a tree step costs
TREE_SWITCHES = ("rope_in_tree", "draft_rows", "tree_kv_move", "tree_select_passes", "tree_level_keys",
                 "tree_select_blocks", "tree_one_forward", "tree_level_split", "tree_lookup")


def candidates_for(engine) -> tuple[TreeShape, ...]:
    """The shapes calibrate times on `engine`: CANDIDATES, and WIDE_CANDIDATES where its target
    verifies more than 16 rows in one forward (two forwards a step cost more than the rows buy)."""
    from engine import routing

    model = engine.runner.model
    wide = routing.tree_rows(model.ops.options, model.any_packed_layer()) > routing.MAX_ROWS
    return CANDIDATES + (WIDE_CANDIDATES if wide else ())


def cache_key(engine) -> str:
    here = Path(__file__)
    options = engine.runner.model.ops.options
    settings = ["tree auto" if options.tree_level else "tree auto, torch ops"]
    for name in TREE_SWITCHES:  # a switch by its name, a count (tree_lookup's) with its value
        value = getattr(options, name, False)
        if value:
            settings.append(name if value is True else f"{name}={value}")
    code = (here, here.parents[1] / "eagle3" / "tree_loop.py", here.parents[1] / "kernels" / "tree_level.py",
            here.parents[1] / "kernels" / "tree_lookup.py", here.parent / "lookup.py")
    return measurement_key(engine, ", ".join(settings), code)


def _tok_s(engine, shape: TreeShape | None, prompts, tokens: int) -> float:
    engine.set_tree(shape)
    answers = [answer_tok_s(engine, prompt, True, tokens) for prompt in prompts]
    seconds = sum(s for _, s in answers)
    return sum(n for n, _ in answers) / seconds if seconds else 0.0


def calibrate(engine, candidates=CANDIDATES, prompts=PROMPTS, tokens: int = CALIBRATION_TOKENS,
              timer=_tok_s) -> tuple[TreeShape | None, dict[str, float]]:
    """(the fastest shape, None for chains; tokens/s of each, chains under "off"). One warm-up
    answer of each first (a tree's first answer compiles and captures what it needs)."""
    shapes = [None, *candidates]
    for shape in shapes:
        timer(engine, shape, prompts[:1], 8)
    speeds = {("off" if s is None else str(s)): timer(engine, s, prompts, tokens) for s in shapes}
    best = max(shapes, key=lambda s: speeds["off" if s is None else str(s)])
    engine.set_tree(best)
    return best, speeds


def auto_tree(engine, cache_file: Path | None = None, log=None) -> TreeShape | None:
    """The shape --tree auto runs with on `engine` (an EAGLE-3 head loaded), from the cache or a
    calibration now (written to the cache). Chains on a CPU."""
    from engine.paths import cache_dir, read_json_cache, write_json_cache

    if engine.device == "cpu":
        return None
    cache_file = cache_file or cache_dir() / "tree-calibration.json"
    key = cache_key(engine)
    cached = read_json_cache(cache_file)
    if key in cached and isinstance(cached[key], dict):
        return _shape(cached[key].get("best"))
    if log:
        log("calibrating --tree auto for this model and GPU (once)")
    best, speeds = calibrate(engine, candidates_for(engine))
    cached[key] = {"best": "off" if best is None else str(best), "tok_s": speeds}
    write_json_cache(cache_file, cached)
    return best


def _shape(text) -> TreeShape | None:
    from engine.errors import UserError
    from speculative.tree.shape import parse_tree

    try:
        shape = parse_tree(str(text))
    except UserError:
        return None
    return shape if isinstance(shape, TreeShape) else None
