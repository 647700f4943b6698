"""bench_packed.py's shapes from a config.json and its sweep of packed_gemv tiles for a short K:
the projections a small model's layer runs, and tiles that all fit and include the shipped one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.bench_packed import PARTS, SHAPES, SWEEP, model_shapes, small_sweep
from engine.kernels.packed_gemv import default_tile

CONFIGS = Path(__file__).resolve().parents[2] / "benchmarks" / "configs"


def test_a_configs_layer_gives_its_four_projections_and_their_parts():
    shapes, parts = model_shapes(json.loads((CONFIGS / "smollm2-135m.json").read_text()))
    assert shapes == {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536)}
    assert parts == {"qkv": [576, 192, 192], "o_proj": [576], "gate_up": [1536, 1536], "down": [576]}
    assert model_shapes(None) == (SHAPES, PARTS)
    # with the lm_head: the vocabulary by the hidden size, one part
    shapes, parts = model_shapes(json.loads((CONFIGS / "smollm2-135m.json").read_text()), lm_head=True)
    assert shapes["lm_head"] == (49152, 576) and parts["lm_head"] == [49152] and len(shapes) == 5
    assert model_shapes(None, lm_head=True)[0] == {**SHAPES, "lm_head": (128256, 4096)}
    assert "lm_head" not in SHAPES  # the 8B's own tables stay as they were
    # no head_dim and no kv heads given: hidden / heads, and as many kv heads as heads
    shapes, parts = model_shapes({"architectures": ["LlamaForCausalLM"], "hidden_size": 1024, "num_attention_heads": 16,
                                  "intermediate_size": 2816, "vocab_size": 1000, "num_hidden_layers": 2})
    assert shapes["qkv"] == (3072, 1024) and parts["qkv"] == [1024, 1024, 1024]
    for role, (n, _) in shapes.items():
        assert sum(parts[role]) == n


@pytest.mark.parametrize("config", ["smollm2-135m.json", "llama-3.2-1b.json"])
def test_the_short_k_sweep_fits_every_projection_and_holds_the_shipped_tile(config):
    shapes, _ = model_shapes(json.loads((CONFIGS / config).read_text()), lm_head=True)
    for group in (32, 128):  # Q4_0/Q4_1/Q8_0's blocks, AWQ's groups
        for role, (n, k) in shapes.items():
            tiles = small_sweep(k, group)
            assert tiles and len(set(tiles)) == len(tiles)
            for t in tiles:
                assert k % (t.block_k * t.split_k) == 0, (role, t)
                assert t.block_k % group == 0 or group % t.block_k == 0, (role, t)
            assert default_tile(n, k, group) in tiles + SWEEP, (config, role, group)


def test_a_short_k_takes_whole_k_tiles_only_where_columns_fill_the_gpu():
    """The demo's tied lm_head (49,152 x 576) has 768 tiles of 64 columns: 64 columns over steps
    of 64, K whole; its layer's projections (96 tiles of 32 columns at most) keep K in six."""
    from engine.kernels.packed_gemv import SHORT_SPLIT, PackedTile

    assert default_tile(49152, 576, 32) == PackedTile(64, 64, 1, 2)
    assert default_tile(49152, 576, 128) == PackedTile(64, 64, 1, 2)
    assert default_tile(512 * 64, 576, 32) == PackedTile(64, 64, 1, 2)
    assert default_tile(511 * 64, 576, 32).split_k == SHORT_SPLIT
    for n, k, step in ((3072, 576, 32), (960, 576, 32), (576, 1536, 128)):
        assert default_tile(n, k, 32) == PackedTile(32, step, SHORT_SPLIT, 2)
    assert default_tile(49152, 576, 32, short=False).block_n == 64 and default_tile(49152, 4096, 32).block_k == 128


def test_an_unknown_role_is_refused_in_one_line(tmp_path):
    """--roles names only shapes the run has: another name stops before anything is timed, with
    one line naming it and the shapes there are (no traceback)."""
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_packed.py"
    run = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "x.json"), "--roles", "lm_head,qkv"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "Traceback" not in run.stderr
    assert run.stderr.strip().splitlines()[-1].endswith(
        "--roles: no shape named lm_head (there are qkv, o_proj, gate_up, down)")
    assert not (tmp_path / "x.json").exists()
