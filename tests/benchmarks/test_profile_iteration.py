"""benchmarks/profile_iteration.py refuses bad input in one line, before it loads anything."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("args,message", [
    (["--tree", "4,x"], "--tree '4,x': use off, auto, or TOPK,DEPTH,TOKENS"),
    (["--tree", "off"], "--tree off: give a tree, TOPK,DEPTH,TOKENS"),
    (["--tree", "4,4,8", "--temperature", "0.7"], "--tree profiles the greedy tree step: leave out --temperature"),
])
def test_bad_input_is_one_line(tmp_path, args, message):
    out = tmp_path / "profile.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "profile_iteration.py"), str(out), *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and run.stderr.startswith(message)
    assert not out.exists()
