"""benchmarks/variants.py: each variant is a KernelOptions built from the base options, and nothing
global changes."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from engine.kernels.gemv import GemvConfig
from engine.options import CUBLAS, KernelOptions

_spec = importlib.util.spec_from_file_location(
    "bench_variants", Path(__file__).resolve().parents[2] / "benchmarks" / "variants.py")
variants = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(variants)


def test_variant_options_change_what_they_name():
    base = KernelOptions(row_tiles=(((6144, 4096), CUBLAS),))
    spec = "row_cublas+tail_off+tiles:4096x14336/8/1024/1/4/3+pdl_off+alts2-1"
    got = variants.variant_options(spec, base)
    assert got == dataclasses.replace(base, qkv_gemv=False, norm_tail=False, pdl=False, spec_alts=(2, 1),
                                      row_tiles=(((6144, 4096), CUBLAS), ((4096, 14336), GemvConfig(8, 1024, 1, 4, 3))))
    assert variants.variant_options("base", base) == base
    assert variants.variant_options("alts0", base).spec_alts == 0
    assert variants.variant_options("altsauto", base).spec_alts == "auto"
    fields = {f.name: f.default for f in dataclasses.fields(KernelOptions)}
    for name, changes in variants.FIXED.items():  # every fixed variant turns a winner's switch off
        assert variants.variant_options(name, base) == dataclasses.replace(base, **changes)
        assert all(fields[f] is True and v is False for f, v in changes.items()), name


@pytest.mark.parametrize("spec,says", [("row_cublas+nope", "unknown variant 'nope'"),
                                       ("row_all", "unknown variant 'row_all'"),
                                       ("tiles:4096x14336/8", "cannot read '4096x14336/8'"),
                                       ("alts2-x", "LOCALCHAT_SPEC_ALTS")])
def test_bad_variant_stops_with_one_line(spec, says):
    with pytest.raises(SystemExit, match="variants.py: .*" + says):
        variants.variant_options(spec, KernelOptions())


def test_row_tiles_spec():
    """row_tiles (benchmarks/variants.py tiles:SPEC): tiles or cuBLAS by weight shape; a bad entry
    is a one-line error."""
    tiles = variants.parse_row_tiles("4096x14336/4/1024/1/4/3|6144x4096/cublas|")
    assert tiles == (((4096, 14336), GemvConfig(4, 1024, 1, 4, 3)), ((6144, 4096), CUBLAS))
    assert KernelOptions(row_tiles=tiles).row_tile((6144, 4096)) == CUBLAS
    for bad in ("4096x14336/4/1024", "4096/4/1024/1/4/3", "axb/cublas", "4096x4096/4/x/1/4/3"):
        with pytest.raises(ValueError, match="row tiles: cannot read"):
            variants.parse_row_tiles(bad)
