"""benchmarks/tree_shapes.py: every shape of one process's sweep answers as speculation off does
(greedy trees are lossless), each summary holds what the report needs, and bad input is one line."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.tree_shapes import DRAFT_OFF, NO_DRAFT, settings, step_ms, table, time_shapes
from speculative.tree.shape import TreeShape
# the tree tests' tiny target and a head ranking its tokens
from tests.speculative.test_tree_engine import A, B, C, PROMPT, _engine, _ranked_draft, chained, target  # noqa: F401
from tests.tiny import read_config

ROOT = Path(__file__).resolve().parents[2]


def test_a_sweep_times_each_shape_against_no_draft_and_stays_lossless(target, chained, tmp_path):
    e = _engine(chained, _ranked_draft(tmp_path, read_config(target), [C, A, B]))
    ids = e.tokenizer.apply_chat_template(PROMPT)
    shapes = {"3,3,12": TreeShape(3, 3, 12), "2,4,7": TreeShape(2, 4, 7), "off": None}
    out = time_shapes(e, shapes, [ids, ids[:-1]], 24, 0.0)
    assert list(out) == [NO_DRAFT, DRAFT_OFF, *shapes]
    for name in shapes:
        s = out[name]
        assert s["same_tokens_as_draft_off"] == 2, name
        assert s["decode_tok_s"] > 0 and s["speedup_vs_no_draft"] > 0 and s["accept_len_mean"] >= 1
    assert out["3,3,12"]["verify_tokens"] == 13 and out["2,4,7"]["verify_tokens"] == 8
    # the head ranks c first: its chain accepts nothing drafted, the trees the later siblings a, b
    assert out["off"]["accept_len_mean"] == 1 and out["3,3,12"]["accept_len_mean"] > 1
    assert "accept_len_mean" not in out[NO_DRAFT]
    text = table({"settings": out})
    assert len(text.splitlines()) == 1 + len(out) and "3,3,12" in text
    tree = out["3,3,12"]  # a verify step's time: its accepted tokens at the shape's speed
    assert step_ms(tree) == pytest.approx(1000 * tree["accept_len_mean"] / tree["decode_tok_s"])
    assert step_ms(out[NO_DRAFT]) == pytest.approx(1000 / out[NO_DRAFT]["decode_tok_s"])
    assert f"{step_ms(tree):7.3f}" in next(line for line in text.splitlines() if line.startswith("3,3,12"))
    json.dumps(out)  # the report is JSON


def test_a_shape_with_lookup_chains_is_a_setting_of_its_own(target, chained, tmp_path, monkeypatch):
    """SHAPE~lookupN (--lookup N): the same shape with prompt-lookup chains, timed beside it in the
    same sweep; lossless, and here (the target repeats a, b) accepting more; the plain shape keeps
    the engine's own (none here)."""
    from benchmarks.tree_shapes import parse

    monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", "0")

    args = parse(["--tree", "2,4,7", "--tree", "off", "--lookup", "4", "--out", str(tmp_path / "x.json")])
    assert list(args.shapes) == ["2,4,7", "off", "2,4,7~lookup4"]
    e = _engine(chained, _ranked_draft(tmp_path, read_config(target), [C, A, B]))
    # a shape alone keeps the engine's own chains (LOCALCHAT_TREE_LOOKUP's, none here)
    assert [s[4] for s in settings(e, args.shapes)] == [0, 0, 0, 0, 4]
    ids = e.tokenizer.apply_chat_template(PROMPT)
    out = time_shapes(e, args.shapes, [ids, ids[:-1]], 32, 0.0)
    plain, lookup = out["2,4,7"], out["2,4,7~lookup4"]
    assert plain["same_tokens_as_draft_off"] == lookup["same_tokens_as_draft_off"] == 2
    assert lookup["accept_len_mean"] > plain["accept_len_mean"] + 0.5
    assert lookup["verify_tokens"] == plain["verify_tokens"] == 8
    assert e.speculator.tree_step(TreeShape(2, 4, 7)).lookup in (0, 4)


@pytest.mark.parametrize("args,message", [
    (["--tree", "4,x"], "tree_shapes.py: --tree '4,x': use off, auto, or TOPK,DEPTH,TOKENS"),
    (["--tree", "auto"], "tree_shapes.py: --tree auto: give shapes"),
    (["--tree", "4,4,8", "--prompts", "0"], "tree_shapes.py: --prompts and --new-tokens must be 1 or more"),
    (["--tree", "4,4,8", "--prompts-file", "/nonexistent"], "tree_shapes.py: --prompts-file /nonexistent: no such"),
    (["--tree", "4,4,8", "--lookup", "16"], "tree_shapes.py: --lookup 16: give 0 (none) to 15"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    out = tmp_path / "shapes.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tree_shapes.py"), "--out", str(out), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and run.stderr.startswith(message)
    assert not out.exists()
