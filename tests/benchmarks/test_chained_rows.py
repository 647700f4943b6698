"""bench_chained_rows.py refuses what it cannot run in one line, and its chained launch gives two
launches' bits."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_chained_rows.py"


def run(tmp_path, *extra):
    return subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "x.json"), *extra],
                          capture_output=True, text=True, timeout=120)


def test_an_unknown_layout_is_refused_in_one_line(tmp_path):
    got = run(tmp_path, "--layouts", "AWQ,Q3_X")
    assert got.returncode == 2 and "Traceback" not in got.stderr
    assert got.stderr.strip().splitlines()[-1].endswith("--layouts: no layout named Q3_X (there are Q4_K_M, "
                                                        "Q5_K_M, Q4_K, Q5_K, Q4_0, Q4_1, Q8_0, Q6_K, AWQ, FP8)")
    assert not (tmp_path / "x.json").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for a machine without a GPU")
def test_without_a_gpu_it_says_so_in_one_line(tmp_path):
    got = run(tmp_path, "--layouts", "AWQ")
    assert got.returncode == 1 and "Traceback" not in got.stderr
    assert got.stderr.strip() == "error: this benchmark needs a CUDA GPU and Triton"


@pytest.mark.skipif(not torch.cuda.is_available() and (os.environ.get("TRITON_INTERPRET") != "1"
                                                      or importlib.util.find_spec("triton") is None),
                    reason="a CUDA GPU, or Triton's interpreter (TRITON_INTERPRET=1 with Triton installed)")
@pytest.mark.parametrize("layout", ["AWQ", "Q6_K"])
def test_one_chained_launch_gives_two_launches_bits(layout):
    """gate_up's programs then down's over its output, in one launch, the second's weights loaded
    before its wait or after: the same bits as two launches of the one-row kernel (the same
    programs), and the launch's counters back at zero."""
    from benchmarks.bench_chained_rows import chained_rows, two_launches
    from benchmarks.bench_packed import blocks_for

    dev = "cuda" if torch.cuda.is_available() else "cpu"
    gen = torch.Generator(device=dev).manual_seed(3)
    shapes, parts = {"gate_up": (2048, 2048), "down": (64, 2048)}, {"gate_up": [1024, 1024], "down": [64]}
    (first,) = blocks_for(layout, "gate_up", dev, gen, shapes, parts)
    (second,) = blocks_for(layout, "down", dev, gen, shapes, parts)
    x = torch.randn(1, 2048, generator=gen, device=dev).to(torch.bfloat16)
    mid = torch.zeros(1, 2048, dtype=torch.bfloat16, device=dev)
    out = torch.zeros(1, 64, dtype=torch.bfloat16, device=dev)
    two_launches(x, first, second, mid, out, 0)
    ref_mid, ref_out = mid.clone(), out.clone()
    assert ref_out.abs().sum() > 0
    for early in (False, True):
        mid.zero_()
        out.zero_()
        sync = torch.zeros(3, dtype=torch.int32, device=dev)
        chained_rows(x, first, second, mid, out, sync, early)
        assert torch.equal(mid, ref_mid) and torch.equal(out, ref_out), early
        assert sync.tolist() == [0, 0, 0]
