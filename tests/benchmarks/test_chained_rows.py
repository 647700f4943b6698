"""bench_chained_rows.py's chained launch gives two launches' bits (its command line:
test_kernel_bench_args.py)."""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch


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
