"""The kernel benchmarks' shared command line (benchmarks/harness/timing.py kernel_bench_args): each
refuses an unknown name and a machine without a GPU in one line, writing nothing."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# (script, its names' flag, a good name, a bad one, the refusal's end)
SCRIPTS = [
    ("bench_read_ceiling.py", "--roles", "qkv", "qkv,lm_head",
     "--roles: no shape named lm_head (there are qkv, o_proj, gate_up, down)"),
    ("bench_chained_rows.py", "--layouts", "AWQ", "AWQ,Q3_X",
     "--layouts: no layout named Q3_X (there are Q4_K_M, Q5_K_M, Q4_K, Q5_K, Q4_0, Q4_1, Q8_0, Q6_K, AWQ, FP8)"),
]


def run(tmp_path, script, *extra):
    return subprocess.run([sys.executable, str(BENCHMARKS / script), "--out", str(tmp_path / "x.json"), *extra],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("script,flag,good,bad,refusal", SCRIPTS)
def test_an_unknown_name_is_refused_in_one_line(tmp_path, script, flag, good, bad, refusal):
    got = run(tmp_path, script, flag, bad)
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines()[-1].endswith(refusal)
    assert not (tmp_path / "x.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
@pytest.mark.parametrize("script,flag,good,bad,refusal", SCRIPTS)
def test_without_a_gpu_it_says_so_in_one_line(tmp_path, script, flag, good, bad, refusal):
    got = run(tmp_path, script, flag, good)
    assert got.returncode == 1 and "Traceback" not in got.stderr
    assert got.stderr.strip() == "error: this benchmark needs a CUDA GPU and Triton"
    assert not (tmp_path / "x.json").exists()
