"""benchmarks/variants.py's switches: each sets what it names and everything goes back after."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

from engine import kernels, ops

_spec = importlib.util.spec_from_file_location(
    "bench_variants", Path(__file__).resolve().parents[2] / "benchmarks" / "variants.py")
variants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variants)


def _state():
    return (ops.ROW_GEMV, dict(ops.ROW_TILES), ops.NORM_GEMV, ops.NORM_TAIL, kernels._pdl_override,
            os.environ.get("LOCALCHAT_SPEC_ALTS"))


def test_variant_sets_and_restores_every_switch():
    before = _state()
    spec = "row_cublas+tail_off+qkv_norm+mlp_norm+tiles:4096x14336/8/1024/1/4/3+pdl_off+alts2-1"
    with variants.variant(spec):
        assert ops.ROW_GEMV == "cublas" and ops.NORM_TAIL is False and ops.NORM_GEMV >= {"qkv", "gate_up"}
        assert ops.ROW_TILES[(4096, 14336)] == ops.GemvConfig(8, 1024, 1, 4, 3)
        assert kernels._pdl_override is False and os.environ["LOCALCHAT_SPEC_ALTS"] == "2,1"
    assert _state() == before
    for name, (module, attr, value) in variants.FIXED.items():  # every fixed switch names a real attribute
        with variants.variant(name):
            assert getattr(importlib.import_module(module), attr) == value
    assert _state() == before


def test_unknown_variant_stops_with_one_line_and_restores():
    before = _state()
    with pytest.raises(SystemExit, match="variants.py: unknown variant 'nope'"):
        with variants.variant("row_all+nope"):
            pass
    assert _state() == before
