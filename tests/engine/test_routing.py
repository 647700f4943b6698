"""The kernel routing table (engine/routing.py) read on the CPU: which kernel and tile each
projection of the 8B's and the demo model's decode and verify steps gets, by options."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine import routing
from engine.kernels.gemv import GemvConfig
from engine.options import CUBLAS, KernelOptions
from engine.routing import DRAFT, GEMV, INVARIANT, ROW, UNFUSED, Route
from speculative.tree.shape import MAX_TOKENS

BF16, F32 = torch.bfloat16, torch.float32
DEFAULT, INVARIANT_OPTIONS = KernelOptions(), KernelOptions(batch_invariant=True)
EACH_ROW_OPTIONS = KernelOptions(batch_invariant=True, each_row=True)
# (N, K) of each projection's weight
LLAMA_8B = {"qkv": (6144, 4096), "o_proj": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336),
            "lm_head": (128256, 4096)}
SMOLLM2 = {"qkv": (960, 576), "o_proj": (576, 576), "gate_up": (3072, 576), "down": (576, 1536),
           "lm_head": (49152, 576)}
LONG_K, SHORT_K = routing.ROW_TILE_LONG_K, routing.ROW_TILE
CUBLAS_ROUTE, OUR_TABLE = Route(CUBLAS), Route(GEMV)


@pytest.mark.parametrize("shapes,o_proj_tile,down_tile", [(LLAMA_8B, LONG_K, LONG_K), (SMOLLM2, SHORT_K, SHORT_K)],
                         ids=["8b", "smollm2"])
def test_one_row_projections_without_a_draft(shapes, o_proj_tile, down_tile):
    """A decode step without a draft: o_proj and down on our GEMV's one-row tile (the longer K step
    from K = 4096 on), qkv on our GEMV's own table, gate_up and lm_head on cuBLAS."""
    want = {"qkv": OUR_TABLE, "o_proj": Route(GEMV, o_proj_tile), "gate_up": CUBLAS_ROUTE,
            "down": Route(GEMV, down_tile), "lm_head": CUBLAS_ROUTE}
    for role, shape in shapes.items():
        assert routing.linear_route(DEFAULT, ROW, role, 1, shape, BF16) == want[role], role
    # outside the fused one-row set (fusion off): qkv and gate_up on cuBLAS, o_proj and down as before
    for role, shape in shapes.items():
        want_unfused = want[role] if role in ("o_proj", "down") else CUBLAS_ROUTE
        assert routing.linear_route(DEFAULT, UNFUSED, role, 1, shape, BF16) == want_unfused, role
    no_qkv_gemv = KernelOptions(qkv_gemv=False)  # LOCALCHAT_ROW_GEMV=cublas
    assert routing.linear_route(no_qkv_gemv, ROW, "qkv", 1, shapes["qkv"], BF16) == CUBLAS_ROUTE


@pytest.mark.parametrize("rows", [1, 2, 6, 16])
@pytest.mark.parametrize("mode", [ROW, INVARIANT, UNFUSED])
def test_batch_invariant_steps_run_one_tile_for_every_row_count(rows, mode):
    """With a draft loaded, every projection of a step of up to 16 bf16 rows runs one kernel and
    tile whatever the row count and kernel set: the 8B's (and the demo's lm_head) the tensor-core
    tile, the demo's layers the one-row route row by row; 17 rows (outside a tree's INVARIANT set)
    or fp32 go to cuBLAS."""
    for role, shape in LLAMA_8B.items():
        want = Route(GEMV, routing.invariant_tile(shape), invariant=True)
        assert routing.linear_route(INVARIANT_OPTIONS, mode, role, rows, shape, BF16) == want
        # 17 rows: cuBLAS, except in the INVARIANT set (only a draft tree's verify rows get there)
        assert routing.linear_route(INVARIANT_OPTIONS, mode, role, 17, shape, BF16) == (
            want if mode == INVARIANT else CUBLAS_ROUTE)
        assert routing.linear_route(INVARIANT_OPTIONS, mode, role, rows, shape, F32) == CUBLAS_ROUTE
    for role, shape in SMOLLM2.items():
        want = Route(GEMV, routing.invariant_tile(shape), invariant=True)  # each_row off (the default)
        assert routing.linear_route(INVARIANT_OPTIONS, mode, role, rows, shape, BF16) == want
        got = routing.linear_route(EACH_ROW_OPTIONS, mode, role, rows, shape, BF16)
        if role == "lm_head":  # 56 MB
            assert got == Route(GEMV, routing.invariant_tile(shape), invariant=True)
            continue
        one_row = routing.linear_route(DEFAULT, mode, role, 1, shape, BF16)
        assert got == Route(GEMV, one_row.tile, each_row=True), role  # gate_up's cuBLAS: our built-in tile
    smol_layer, layer_8b = (tuple(s for r, s in m.items() if r != "lm_head") for m in (SMOLLM2, LLAMA_8B))
    assert routing.each_row_layer(EACH_ROW_OPTIONS, smol_layer, BF16)
    assert not routing.each_row_layer(INVARIANT_OPTIONS, smol_layer, BF16)
    assert not routing.each_row_layer(EACH_ROW_OPTIONS, layer_8b, BF16)
    assert not routing.each_row_layer(DEFAULT, (SMOLLM2["qkv"],), BF16)


def test_several_rows_without_invariance_and_drafts():
    """Several rows without batch invariance (a prefill's tail, a draft-extend) go to cuBLAS; a
    draft's projections take our GEMV for up to 16 rows (several rows on the invariant tile with
    draft_rows, the default), its bits being of no concern to the output."""
    for role, shape in SMOLLM2.items():
        assert routing.linear_route(DEFAULT, ROW, role, 6, shape, BF16) == CUBLAS_ROUTE
        for options in (DEFAULT, INVARIANT_OPTIONS):
            apart = dataclasses.replace(options, draft_rows=False)
            assert routing.linear_route(apart, DRAFT, role, 6, shape, BF16) == OUR_TABLE
            assert routing.linear_route(options, DRAFT, role, 17, shape, BF16) == CUBLAS_ROUTE
            assert routing.linear_route(options, DRAFT, role, 1, shape, F32) == CUBLAS_ROUTE
        # with draft_rows (the default), several rows take the invariant set's tile (one row keeps
        # the built-in one)
        rows_options = DEFAULT
        assert DEFAULT.draft_rows
        for rows in (2, 6, 16):
            assert routing.linear_route(rows_options, DRAFT, role, rows, shape, BF16) == Route(
                GEMV, routing.invariant_tile(shape), invariant=True)
        assert routing.linear_route(rows_options, DRAFT, role, 1, shape, BF16) == OUR_TABLE
        assert routing.linear_route(rows_options, DRAFT, role, 17, shape, BF16) == CUBLAS_ROUTE


def test_layer_mode():
    assert routing.layer_mode(DEFAULT, 1, BF16, packed=False) == ROW
    assert [routing.layer_mode(DEFAULT, m, BF16, False) for m in (2, 16, 17)] == [UNFUSED] * 3
    assert routing.layer_mode(DEFAULT, 1, F32, False) == routing.layer_mode(DEFAULT, 1, BF16, True) == UNFUSED
    modes = [routing.layer_mode(INVARIANT_OPTIONS, m, BF16, False) for m in (1, 6, 16, 17)]
    assert modes == [INVARIANT] * 3 + [UNFUSED]
    small = [routing.layer_mode(INVARIANT_OPTIONS, m, BF16, False, each_row=True) for m in (1, 6, 16, 17)]
    assert small == [ROW] * 3 + [UNFUSED]  # a small layer: the one-row set, row by row
    apart = KernelOptions(batch_invariant=True, fuse_invariant=False)
    assert routing.layer_mode(apart, 6, BF16, False) == routing.layer_mode(apart, 1, BF16, False) == UNFUSED
    assert routing.layer_mode(KernelOptions(fuse=False), 1, BF16, False) == UNFUSED


def test_a_trees_verify_rows_run_the_invariant_set_in_one_forward():
    """A draft tree's rows (up to 64) keep the INVARIANT set, its projections the invariant tile
    and its sublayer ends the stats epilogue, where a prefill of as many rows stays unfused on
    cuBLAS; with tree_one_forward off, or where the INVARIANT set does not serve (fusion off, the
    one-row set row by row, packed layers), a tree verifies 16 rows a forward."""
    tree = [routing.layer_mode(INVARIANT_OPTIONS, m, BF16, False, tree=True) for m in (16, 17, 25, 64, 65)]
    assert tree == [INVARIANT] * 4 + [UNFUSED]
    assert routing.layer_mode(INVARIANT_OPTIONS, 25, BF16, False) == UNFUSED  # a prefill's rows
    assert routing.layer_mode(DEFAULT, 25, BF16, False, tree=True) == UNFUSED  # no draft: no invariance
    for role, shape in SMOLLM2.items():  # lm_head too: Ops.tree_project takes these routes
        route = routing.linear_route(INVARIANT_OPTIONS, INVARIANT, role, 25, shape, BF16)
        assert route == Route(GEMV, routing.invariant_tile(shape), invariant=True), role
        assert routing.linear_route(INVARIANT_OPTIONS, UNFUSED, role, 25, shape, BF16) == CUBLAS_ROUTE
    one = INVARIANT_OPTIONS
    assert one.tree_one_forward  # the default
    assert routing.tree_rows(one, packed=False) == 64 == MAX_TOKENS + 1  # the largest tree and its root
    for options, packed in [(one, True), (EACH_ROW_OPTIONS, False),
                            (dataclasses.replace(one, tree_one_forward=False), False),
                            (dataclasses.replace(one, fuse_invariant=False), False),
                            (dataclasses.replace(one, fuse=False), False)]:
        assert routing.tree_rows(options, packed) == 16, (options, packed)


def test_fused_norms_and_activations():
    """The FUSED_TILES decisions: the 8B keeps its norms apart (K = 4096: each program's pre-pass
    costs more than the norm's launch) and so its one-row o_proj and down carry them; the demo's
    one-row norms fold into qkv and gate_up; the invariant set keeps the measured losers apart."""
    for options, mode, rows in ((DEFAULT, ROW, 1), (INVARIANT_OPTIONS, INVARIANT, 6)):
        assert routing.norm_tile(options, mode, rows, LLAMA_8B["qkv"]) == UNFUSED
        assert routing.norm_tile(options, mode, rows, LLAMA_8B["gate_up"]) == UNFUSED
        assert routing.norm_tile(options, mode, rows, SMOLLM2["qkv"]) is None  # the built-in tile
    assert routing.norm_tile(DEFAULT, ROW, 1, SMOLLM2["gate_up"]) is None
    assert routing.norm_tile(INVARIANT_OPTIONS, INVARIANT, 6, SMOLLM2["gate_up"]) == UNFUSED
    assert routing.norm_tile(DEFAULT, ROW, 6, SMOLLM2["gate_up"]) == UNFUSED  # several rows: the invariant entries
    assert routing.norm_tile(INVARIANT_OPTIONS, ROW, 6, SMOLLM2["gate_up"], each_row=True) is None  # row by row
    assert routing.norm_tile(DEFAULT, ROW, 1, (32000, 4096)) == UNFUSED  # not listed, K = 4096
    assert routing.down_tile(DEFAULT, ROW, 1, LLAMA_8B["down"]) == LONG_K
    assert routing.down_tile(DEFAULT, ROW, 1, SMOLLM2["down"]) == SHORT_K
    assert routing.down_tile(INVARIANT_OPTIONS, INVARIANT, 6, LLAMA_8B["down"]) == UNFUSED
    assert routing.down_tile(INVARIANT_OPTIONS, INVARIANT, 6, SMOLLM2["down"]) == UNFUSED
    for (mode, kernel, _, _), tile in routing.FUSED_TILES.items():
        assert mode in (ROW, INVARIANT) and kernel in ("rms_norm_gemv", "silu_mul_gemv")
        assert tile == UNFUSED or isinstance(tile, GemvConfig)


def test_gated_mlp_and_norm_tails():
    for shapes in (LLAMA_8B, SMOLLM2):
        assert routing.is_gated(DEFAULT, ROW, 1, shapes["gate_up"], BF16)
        assert routing.gated_tile(DEFAULT, shapes["gate_up"]) is None  # gemv.gated_config
        assert not routing.is_gated(INVARIANT_OPTIONS, INVARIANT, 1, shapes["gate_up"], BF16)
        assert not routing.is_gated(DEFAULT, ROW, 2, shapes["gate_up"], BF16)
        assert routing.is_gated(INVARIANT_OPTIONS, ROW, 16, shapes["gate_up"], BF16, each_row=True)
        assert routing.carries_norm(INVARIANT_OPTIONS, ROW, 6, BF16, "lm_head", shapes["lm_head"], each_row=True)
        assert not routing.carries_norm(DEFAULT, ROW, 6, BF16, "lm_head", shapes["lm_head"])
        assert not routing.is_gated(KernelOptions(gated_mlp=False), ROW, 1, shapes["gate_up"], BF16)
        assert not routing.is_gated(KernelOptions(row_tiles=((shapes["gate_up"], CUBLAS),)), ROW, 1,
                                    shapes["gate_up"], BF16)
        # the final norm always rides on the last down projection of a one-row step
        assert routing.carries_norm(DEFAULT, ROW, 1, BF16, "lm_head", shapes["lm_head"])
        assert not routing.carries_norm(DEFAULT, INVARIANT, 1, BF16, "lm_head", shapes["lm_head"])
        assert not routing.carries_norm(KernelOptions(norm_tail=False), ROW, 1, BF16, "lm_head", shapes["lm_head"])
    # o_proj carries the post-attention norm, down the next input norm, where those stay apart
    assert routing.carries_norm(DEFAULT, ROW, 1, BF16, "gate_up", LLAMA_8B["gate_up"])
    assert routing.carries_norm(DEFAULT, ROW, 1, BF16, "qkv", LLAMA_8B["qkv"])
    assert not routing.carries_norm(DEFAULT, ROW, 1, BF16, "gate_up", SMOLLM2["gate_up"])
    assert not routing.carries_norm(DEFAULT, ROW, 1, BF16, "qkv", SMOLLM2["qkv"])
    assert routing.tail_tile(DEFAULT, LLAMA_8B["down"]) == LONG_K
    assert routing.tail_tile(DEFAULT, SMOLLM2["o_proj"]) == SHORT_K


def test_invariant_gate_up_runs_the_activation_on_plain_weights():
    """The invariant set's gate_up takes the activation into its launch (gemv_rstd gate=True) for a
    plain bf16 weight with gated_mlp, never for another dtype or a packed weight."""
    for shapes in (LLAMA_8B, SMOLLM2):
        linear = torch.nn.Linear(shapes["gate_up"][1], shapes["gate_up"][0], bias=False, device="meta",
                                 dtype=BF16)
        assert routing.gates_invariant(INVARIANT_OPTIONS, linear, BF16)
        assert not routing.gates_invariant(dataclasses.replace(INVARIANT_OPTIONS, gated_mlp=False), linear, BF16)
        assert not routing.gates_invariant(INVARIANT_OPTIONS, linear, torch.float32)
    packed = torch.nn.Module()
    packed.weight = None  # a PackedLinear keeps its blocks elsewhere
    assert not routing.gates_invariant(INVARIANT_OPTIONS, packed, BF16)


def test_invariant_tiles_by_shape():
    """The swept winners: short K, small weights, N within one wave of 64-column programs (the 8B's
    o_proj and down: 32 x 512), many waves up to 64K (the 8B's gate_up: 128 x 128, 8 warps), else
    64 x 256."""
    tile = routing.invariant_tile
    assert tile(SMOLLM2["qkv"]) == tile(SMOLLM2["lm_head"]) == GemvConfig(64, 128, 1, 4, 3, swap_ab=True)
    assert tile(SMOLLM2["down"]) == GemvConfig(16, 128, 1, 4, 4)
    assert tile(LLAMA_8B["o_proj"]) == tile(LLAMA_8B["down"]) == GemvConfig(32, 512, 1, 4, 4, swap_ab=True)
    assert tile(LLAMA_8B["gate_up"]) == GemvConfig(128, 128, 1, 8, 4, swap_ab=True)
    assert tile(LLAMA_8B["qkv"]) == tile(LLAMA_8B["lm_head"]) == GemvConfig(64, 256, 1, 4, 4, swap_ab=True)


def test_small_sublayer_ends_may_run_their_stats_row_by_row():
    """stats_route: the invariant set's o_proj or down on the one-row tile row by row where its role
    is in row_stats and its weight is small (SmolLM2's), on its invariant tile otherwise (the 8B's,
    a role left out, row_stats empty: the default)."""
    down = dataclasses.replace(DEFAULT, row_stats=("down",))
    assert routing.stats_route(down, "down", SMOLLM2["down"]) == (routing.row_tile(1536), True)
    assert routing.stats_route(down, "o_proj", SMOLLM2["o_proj"]) == (routing.invariant_tile(SMOLLM2["o_proj"]), False)
    both = dataclasses.replace(DEFAULT, row_stats=("o_proj", "down"))
    assert routing.stats_route(both, "o_proj", SMOLLM2["o_proj"]) == (routing.row_tile(576), True)
    for role in ("o_proj", "down"):
        assert routing.stats_route(both, role, LLAMA_8B[role]) == (routing.invariant_tile(LLAMA_8B[role]), False)
        assert routing.stats_route(DEFAULT, role, SMOLLM2[role])[1] is False  # none, the default


def test_row_tiles_override_one_row_projections():
    """Benchmarks' row_tiles send a one-row projection's shape to a tile of our GEMV or to cuBLAS
    (o_proj, down; qkv and gate_up of the fused one-row set; silu_mul_gemv's tile); lm_head, the
    unfused set's qkv and gate_up, and invariant steps ignore them; a split tile drops the tail."""
    tile, split = GemvConfig(2, 1024, 1, 4, 3), GemvConfig(4, 512, 2, 4, 3)
    options = KernelOptions(row_tiles=((LLAMA_8B["o_proj"], CUBLAS), (LLAMA_8B["gate_up"], tile),
                                       (LLAMA_8B["qkv"], tile), (LLAMA_8B["lm_head"], tile), (LLAMA_8B["down"], split)))

    def route(mode, role, rows=1, opts=options):
        return routing.linear_route(opts, mode, role, rows, LLAMA_8B[role], BF16)

    assert route(ROW, "o_proj") == CUBLAS_ROUTE and route(UNFUSED, "o_proj") == CUBLAS_ROUTE
    assert route(ROW, "gate_up") == route(ROW, "qkv") == Route(GEMV, tile)
    assert route(UNFUSED, "gate_up") == route(UNFUSED, "qkv") == route(ROW, "lm_head") == CUBLAS_ROUTE
    assert route(ROW, "down") == Route(GEMV, split) and routing.tail_tile(options, LLAMA_8B["down"]) is None
    assert routing.tail_tile(options, LLAMA_8B["o_proj"]) is None
    assert routing.down_tile(options, ROW, 1, LLAMA_8B["down"]) == split
    cublas_down = dataclasses.replace(options, row_tiles=((LLAMA_8B["down"], CUBLAS),))
    assert routing.down_tile(cublas_down, ROW, 1, LLAMA_8B["down"]) == UNFUSED
    invariant = dataclasses.replace(options, batch_invariant=True)
    assert route(ROW, "o_proj", 1, invariant) == Route(GEMV, routing.invariant_tile(LLAMA_8B["o_proj"]), invariant=True)
    assert route(ROW, "gate_up", 6, invariant) == Route(GEMV, routing.invariant_tile(LLAMA_8B["gate_up"]), invariant=True)
