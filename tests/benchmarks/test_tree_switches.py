"""benchmarks/tree_switches.py: bad input refused in one line before anything runs; --dry-run lists
one bench run for each shape and arm; a real run on the CPU writes one row a run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "benchmarks" / "tree_switches.py")


@pytest.mark.parametrize("args,message", [
    (["--tree", "auto"], "--tree 'auto': give TOPK,DEPTH,TOKENS"),
    (["--tree", "4,x,8"], "--tree '4,x,8': give TOPK,DEPTH,TOKENS"),
    (["--arms", "base,fast"], "--arms: unknown fast; use base, before, down, no_draft_rows"),
    (["--prompts", "0"], "--prompts, --new-tokens and --timeout must be positive"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    out = tmp_path / "switches.json"
    run = subprocess.run([sys.executable, SCRIPT, "--out", str(out), *args], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().startswith(f"tree_switches.py: {message}") and len(run.stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_a_dry_run_lists_each_shape_and_arm(tmp_path):
    run = subprocess.run([sys.executable, SCRIPT, "--out", str(tmp_path / "s.json"), "--dry-run", "--tree", "4,4,8",
                          "--tree", "off", "--arms", "base,before"], capture_output=True, text=True, timeout=120)
    lines = run.stdout.strip().splitlines()
    assert run.returncode == 0 and len(lines) == 4
    assert [("--tree 4,4,8" in line, line.startswith("LOCALCHAT_DRAFT_ROWS=0")) for line in lines] == [
        (True, False), (True, True), (False, False), (False, True)]
    assert all("LOCALCHAT_ROW_STATS=down" in line for line in lines[1::2])
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow  # real weights on the CPU
def test_a_run_writes_a_row_for_each_shape_and_arm(demo_gguf, tmp_path):
    out = tmp_path / "switches.json"
    run = subprocess.run([sys.executable, SCRIPT, "--out", str(out), "--tree", "2,2,3", "--arms", "base,before",
                          "--prompts", "1", "--new-tokens", "8", "--timeout", "500"], cwd=ROOT, env=dict(os.environ),
                         capture_output=True, text=True, timeout=1100)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [(r["arm"], r["tree"], r["rc"]) for r in report["runs"]] == [("base", "2,2,3", 0), ("before", "2,2,3", 0)]
    for row in report["runs"]:
        assert row["no_draft_tok_s"] > 0 and row["spec_tok_s"] > 0 and row["accept_len"] >= 1
        assert row["report"]["spec"]["decode_tok_s"] == row["spec_tok_s"]
    assert report["arms"]["before"]["LOCALCHAT_TREE_SELECT_PASSES"] == "0"
