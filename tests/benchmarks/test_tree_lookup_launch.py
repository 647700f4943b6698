"""benchmarks/tree_lookup_launch.py: its random trees are trees the lookup launch takes (depth
order, siblings distinct, no deeper than asked), and bad input (or no GPU) is one line."""

import random
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.tree_lookup_launch import random_tree

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("nodes", [2, 15, 24, 63])
def test_random_trees_are_kept_trees_in_verify_order(nodes):
    tree = random_tree(random.Random(nodes), nodes, 6, 8)
    parents, depths, tokens, scores = (tree.parents.tolist(), tree.depths.tolist(), tree.tokens.tolist(),
                                       tree.scores.tolist())
    assert len(parents) == nodes and max(depths) <= 8 and depths == sorted(depths)
    for i, p in enumerate(parents):
        assert p < i and depths[i] == (1 if p < 0 else depths[p] + 1)
        assert p < 0 or scores[i] < scores[p]
        assert [tokens[j] for j, q in enumerate(parents) if q == p].count(tokens[i]) == 1


@pytest.mark.parametrize("args,message", [
    (["--nodes", "1"], "tree_lookup_launch.py: --nodes: give counts from 2 to 63"),
    (["--warps", "3"], "tree_lookup_launch.py: --warps: give 1, 2, 4, 8 or 16"),
    (["--nodes", "4", "--length", "5"], "tree_lookup_launch.py: --length: give 1 to 8"),
    (["--history", "0"], "tree_lookup_launch.py: --history and --per-graph must be 1 or more"),
] + ([] if torch.cuda.is_available() else [([], "tree_lookup_launch.py: needs a CUDA GPU")]))
def test_bad_input_is_one_line(tmp_path, args, message):
    out = tmp_path / "launch.json"
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "tree_lookup_launch.py"), "--out", str(out),
                          *args], capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == ""
    assert run.stderr.strip().splitlines() == [run.stderr.strip()] and run.stderr.startswith(message)
    assert not out.exists()
