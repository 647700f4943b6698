"""gemv kernels (plain, RMSNorm prologue, SiLU-mul prologue) == their torch references.

CUDA tests are marked gpu; on CPU they run through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone: it sets TRITON_INTERPRET=1 for the process).

    LOCALCHAT_TRITON_INTERPRET=1 python -m pytest tests/engine/test_gemv.py
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

import engine.kernels.gemv as gemv_module  # noqa: E402
from engine.kernels.gemv import (  # noqa: E402
    GemvConfig, default_config, gated_gemv, gated_gemv_ref, gemv, gemv_add_norm, gemv_add_norm_ref, gemv_ref,
    rms_norm_gated_gemv, rms_norm_gated_gemv_ref, rms_norm_gemv, rms_norm_gemv_ref, silu_mul_gemv, silu_mul_gemv_ref,
)

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)"))
BF16_TOL = dict(atol=2e-2, rtol=2e-2)
# The interpreter truncates at each rounding to bf16; prologues round 2-3 times before the dot.
INTERPRETER_TOL = dict(atol=4e-2, rtol=4e-2)

# (M, N, K): SmolLM2-135M qkv / o / gate_up / down, odd sizes, and (CUDA only) Llama-3.1-8B.
SMALL_SHAPES = [(1, 960, 576), (1, 576, 576), (1, 3072, 576), (1, 576, 1536), (6, 576, 1536), (16, 960, 576),
                (3, 100, 300), (1, 37, 1000)]
LLAMA8B_SHAPES = [(m, n, k) for m in (1, 6) for n, k in [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096)]]
# Configs that force the split-K reduction, uneven K splits and masked column tiles.
FORCED = [GemvConfig(8, 128, 4, 4, 2), GemvConfig(16, 64, 3, 4, 2), GemvConfig(32, 256, 2, 8, 3)]


def tol(device):
    return INTERPRETER_TOL if device == "cpu" else BF16_TOL


def make(m, n, k, device, seed, k_in=None):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k_in or k, generator=gen).to(device, torch.bfloat16)
    weight = (torch.randn(n, k, generator=gen) / k**0.5).to(device, torch.bfloat16)
    bias = torch.randn(n, generator=gen).to(device, torch.bfloat16)
    return gen, x, weight, bias


def shapes_for(device):
    return SMALL_SHAPES + (LLAMA8B_SHAPES if device == "cuda" else [])


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("config", [None] + FORCED, ids=["default", "split4", "split3", "split2"])
def test_gemv(device, config):
    for m, n, k in shapes_for(device) if config is None else [(1, 200, 1000), (5, 200, 1000)]:
        _, x, weight, bias = make(m, n, k, device, m * n + k)
        out = gemv(x, weight, config=config)
        assert out.shape == (m, n) and out.dtype == torch.bfloat16
        torch.testing.assert_close(out, gemv_ref(x, weight), **tol(device))
        torch.testing.assert_close(gemv(x, weight, bias, config), gemv_ref(x, weight, bias), **tol(device))


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("config", [None, FORCED[0]], ids=["default", "split4"])
def test_rms_norm_gemv(device, config):
    """One-row launches take the one-load rms pre-pass up to ONE_PASS_MAX elements, the others
    (several rows; 9000 > ONE_PASS_MAX) the loop over K."""
    shapes = shapes_for(device) + [(1, 24, 9000)] if config is None else [(1, 200, 1000), (5, 200, 1000)]
    for m, n, k in shapes:
        gen, x, weight, _ = make(m, n, k, device, m * n + k + 1)
        residual = (torch.randn(m, k, generator=gen) * 3).to(device, torch.bfloat16)
        norm_weight = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, torch.bfloat16)
        out, new_residual = rms_norm_gemv(x, residual, norm_weight, 1e-5, weight, config=config)
        want, want_residual = rms_norm_gemv_ref(x, residual, norm_weight, 1e-5, weight)
        out_first, stream = rms_norm_gemv(x, None, norm_weight, 1e-5, weight, config=config)
        assert stream is x
        torch.testing.assert_close(out_first, rms_norm_gemv_ref(x, None, norm_weight, 1e-5, weight)[0], **tol(device))
        assert out.shape == (m, n) and new_residual.shape == x.shape
        torch.testing.assert_close(out, want, **tol(device))
        if device == "cuda":
            assert torch.equal(new_residual, want_residual)
        else:
            torch.testing.assert_close(new_residual, want_residual, **tol(device))


def test_norm_mode_choice():
    """The one-load mean square serves one-row launches up to ONE_PASS_MAX elements; everything
    else loops."""
    g = gemv_module
    assert g.norm_mode(1, 576) == g.norm_mode(1, g.ONE_PASS_MAX) == g.norm_mode(1, 4096) == g.ONE_PASS
    assert g.norm_mode(1, g.ONE_PASS_MAX + 1) == g.LOOP
    assert g.norm_mode(16, 576) == g.LOOP  # several rows, the invariant tile


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("config", [None, FORCED[1]], ids=["default", "split3"])
def test_silu_mul_gemv(device, config):
    for m, n, k in shapes_for(device) if config is None else [(1, 200, 1000), (5, 200, 1000)]:
        _, gate_up, weight, _ = make(m, n, k, device, m * n + k + 2, k_in=2 * k)
        gate_up = gate_up * (3 if device == "cuda" else 1)  # interpreter: truncation bias grows with |act|
        out = silu_mul_gemv(gate_up, weight, config=config)
        assert out.shape == (m, n)
        torch.testing.assert_close(out, silu_mul_gemv_ref(gate_up, weight), **tol(device))


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("config", [None, GemvConfig(8, 128, 1, 4, 2)], ids=["default", "8x128"])
def test_gated_gemv(device, config):
    """One row through [gate; up] with silu(gate) * up in the epilogue (and the norm prologue) ==
    the projection, then silu_and_mul; odd sizes mask the last column tile and K step."""
    shapes = [(1, 2 * 48, 300), (1, 2 * 37, 1000)] + ([(1, 3072, 576), (1, 28672, 4096)] if device == "cuda" else [])
    for m, n2, k in shapes:
        gen, x, weight, bias = make(m, n2, k, device, n2 + k + 3)
        x = x * (3 if device == "cuda" else 1)
        for b in (None, bias):
            out = gated_gemv(x, weight, b, config)
            assert out.shape == (1, n2 // 2) and out.dtype == torch.bfloat16
            torch.testing.assert_close(out, gated_gemv_ref(x, weight, b), **tol(device))
        residual = (torch.randn(1, k, generator=gen) * 3).to(device, torch.bfloat16)
        norm_weight = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, torch.bfloat16)
        for res in (None, residual):
            out, stream = rms_norm_gated_gemv(x, res, norm_weight, 1e-5, weight, bias, config)
            want, want_stream = rms_norm_gated_gemv_ref(x, res, norm_weight, 1e-5, weight, bias)
            torch.testing.assert_close(out, want, **tol(device))
            torch.testing.assert_close(stream, want_stream, **tol(device))


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("config", [None, "row_tile", GemvConfig(8, 128, 1, 4, 2)], ids=["default", "row_tile", "8x128"])
def test_gemv_add_norm(device, config):
    """One row: the projection, the residual add and the RMSNorm of the sum in one launch (the last
    program norms) == gemv then add_rms_norm, with the built-in tile (split-K dropped), the
    decode step's row tile or another; odd N masks the last column tile, and launches one after
    another find the counter back at zero."""
    from engine.routing import row_tile

    shapes = [(1, 37, 300), (1, 576, 1536), (1, 200, 1000)] + ([(1, 4096, 4096), (1, 4096, 14336)]
                                                              if device == "cuda" else [])
    for m, n, k in shapes:
        gen, x, weight, bias = make(m, n, k, device, n + k + 5)
        residual = (torch.randn(1, n, generator=gen) * 3).to(device, torch.bfloat16)
        norm_weight = (1 + 0.1 * torch.randn(n, generator=gen)).to(device, torch.bfloat16)
        for b in (None, bias):
            for _ in range(2):
                tile = row_tile(k) if config == "row_tile" else config
                normed, stream = gemv_add_norm(x, weight, b, residual, norm_weight, 1e-5, tile)
                want, want_stream = gemv_add_norm_ref(x, weight, b, residual, norm_weight, 1e-5)
                assert normed.shape == stream.shape == (1, n) and normed.dtype == torch.bfloat16
                torch.testing.assert_close(stream, want_stream, **tol(device))
                torch.testing.assert_close(normed, want, **tol(device))
    assert int(gemv_module._tail_counter(x.device).sum().item()) == 0  # the counters the launches used


def test_gemv_add_norm_ref_is_gemv_then_add_rms_norm():
    from engine.kernels.norm import add_rms_norm_ref

    gen = torch.Generator().manual_seed(4)
    x, weight, bias = torch.randn(1, 40, generator=gen), torch.randn(24, 40, generator=gen), torch.randn(24, generator=gen)
    residual, norm_weight = torch.randn(1, 24, generator=gen), torch.randn(24, generator=gen)
    want = add_rms_norm_ref(x @ weight.T + bias, residual, norm_weight, 1e-6)
    got = gemv_add_norm_ref(x, weight, bias, residual, norm_weight, 1e-6)
    torch.testing.assert_close(got[0], want[0])
    torch.testing.assert_close(got[1], want[1])
    with pytest.raises(AssertionError):
        gemv_add_norm(x, weight, bias, residual, norm_weight, 1e-6, GemvConfig(8, 64, 2, 4, 2))  # no split-K


def test_gated_config_takes_the_row_in_one_step():
    """Up to 4,096 elements of K in one step (the 8B's gate_up: 4 x 4096; SmolLM2's: 4 x 1024),
    longer rows in 4,096-element steps; never split-K."""
    from engine.kernels.gemv import gated_config

    for (n, k), block_k in {(14336, 4096): 4096, (1536, 576): 1024, (100, 300): 512, (8, 8192): 4096}.items():
        cfg = gated_config(n, k)
        assert (cfg.block_n, cfg.block_k, cfg.split_k) == (4, block_k, 1)


def test_gated_refs_match_unfused():
    gen = torch.Generator().manual_seed(2)
    x, weight, bias = torch.randn(1, 40, generator=gen), torch.randn(20, 40, generator=gen), torch.randn(20, generator=gen)
    from engine.kernels.activation import silu_and_mul_ref

    torch.testing.assert_close(gated_gemv_ref(x, weight, bias), silu_and_mul_ref(x @ weight.T + bias))
    with pytest.raises(AssertionError):
        gated_gemv(x.repeat(17, 1), weight)  # up to 16 rows


def test_default_config_table():
    """Llama-8B decode shapes fill the GPU with column tiles alone; SmolLM2's short-N shapes
    split K; every config covers K."""
    for n, k in [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (128256, 4096)]:
        assert default_config(1, n, k).split_k == 1
    assert default_config(1, 576, 1536).split_k > 1 and default_config(1, 576, 576).split_k > 1
    for m in (1, 6, 16):
        for n, k in [(6144, 4096), (4096, 4096), (4096, 14336), (576, 576), (960, 576), (576, 1536), (100, 40)]:
            cfg = default_config(m, n, k)
            assert 1 <= cfg.split_k <= 8 and cfg.block_k * cfg.split_k * 64 >= k


def test_refs_match_unfused_sequences():
    gen = torch.Generator().manual_seed(0)
    x, residual = torch.randn(3, 64, generator=gen), torch.randn(3, 64, generator=gen)
    norm_weight, weight = torch.randn(64, generator=gen), torch.randn(10, 64, generator=gen)
    from engine.kernels.activation import silu_and_mul_ref
    from engine.kernels.norm import add_rms_norm_ref

    normed, h = add_rms_norm_ref(x, residual, norm_weight, 1e-6)
    out, new_residual = rms_norm_gemv_ref(x, residual, norm_weight, 1e-6, weight)
    torch.testing.assert_close(out, normed @ weight.T)
    assert torch.equal(new_residual, h)
    gate_up = torch.randn(3, 128, generator=gen)
    torch.testing.assert_close(silu_mul_gemv_ref(gate_up, weight), silu_and_mul_ref(gate_up) @ weight.T)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_split_k_graph_replay():
    """Captured once and replayed with new inputs: the split-K counters reset every launch."""
    gen, x, weight, bias = make(1, 4096, 14336, "cuda", 0)
    cfg = GemvConfig(16, 512, 4, 4, 3)
    gemv(x, weight, bias, cfg)  # compile outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = gemv(x, weight, bias, cfg)
    for _ in range(10):
        x.copy_(torch.randn(x.shape, generator=gen))
        graph.replay()
        torch.testing.assert_close(out, gemv_ref(x, weight, bias), **BF16_TOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,k", [(960, 576), (3072, 576), (576, 1536), (4096, 4096), (49152, 576)])
def test_invariant_rows_equal_single_row_bits(n, k):
    """Batch-invariant mode: each row of an M-row call has exactly the bits of a 1-row call."""
    g = torch.Generator(device="cuda").manual_seed(n + k)
    w = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16) * 0.05
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    singles = torch.cat([gemv(x[i:i + 1], w, invariant=True) for i in range(16)])
    for m in (2, 6, 9, 16):
        assert torch.equal(gemv(x[:m], w, invariant=True), singles[:m]), m
    ref = torch.nn.functional.linear(x, w)
    assert (singles.float() - ref.float()).abs().max() < 0.05


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,k", [(960, 576), (3072, 576), (576, 1536), (4096, 4096), (200, 1000)])
def test_each_row_rows_equal_single_row_bits(n, k):
    """each_row (the one-row kernel over several rows), every op and epilogue: each row of an
    M-row call has exactly the bits of a 1-row call, split-K and norm tail included, and the
    counters come back to zero."""
    from engine.routing import row_tile

    g = torch.Generator(device="cuda").manual_seed(n + k)
    x = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    res = torch.randn(16, k, device="cuda", generator=g).to(torch.bfloat16)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    w2 = (torch.randn(2 * n, k, device="cuda", generator=g) * 0.05).to(torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(k, device="cuda", generator=g)).to(torch.bfloat16)
    out_res = torch.randn(16, n, device="cuda", generator=g).to(torch.bfloat16)
    out_nw = (1 + 0.1 * torch.randn(n, device="cuda", generator=g)).to(torch.bfloat16)
    gu = torch.randn(16, 2 * k, device="cuda", generator=g).to(torch.bfloat16)
    ops = {  # each of rows a .. b - 1
        "gemv": lambda a, b: gemv(x[a:b], w, each_row=True),
        "gemv row_tile": lambda a, b: gemv(x[a:b], w, config=row_tile(k), each_row=True),
        "rms_norm_gemv": lambda a, b: torch.cat(rms_norm_gemv(x[a:b], res[a:b], nw, 1e-5, w, each_row=True), 1),
        "silu_mul_gemv": lambda a, b: silu_mul_gemv(gu[a:b], w, each_row=True),
        "gated_gemv": lambda a, b: gated_gemv(x[a:b], w2),
        "rms_norm_gated_gemv": lambda a, b: torch.cat(rms_norm_gated_gemv(x[a:b], res[a:b], nw, 1e-5, w2), 1),
        "gemv_add_norm": lambda a, b: torch.cat(gemv_add_norm(x[a:b], w, None, out_res[a:b], out_nw, 1e-5), 1),
    }
    for name, op in ops.items():
        singles = torch.cat([op(i, i + 1) for i in range(16)])
        for m in (2, 6, 16):
            assert torch.equal(op(0, m), singles[:m]), (name, m)
    assert int(gemv_module._tail_counter(x.device).sum().item()) == 0
    assert int(gemv_module._tile_counters(x.device).sum().item()) == 0
    torch.testing.assert_close(gemv(x, w, each_row=True), gemv_ref(x, w), **BF16_TOL)


# (rows, hidden H, the producer's K, the consumer's N): SmolLM2's o_proj -> gate_up and down -> qkv,
# odd sizes (masked column tiles), and (CUDA only) the 8B's down -> gate_up.
STATS_SHAPES = [(1, 576, 576, 3072), (6, 576, 1536, 960), (16, 576, 576, 960), (3, 200, 300, 100)]


@pytest.mark.parametrize("device", [CUDA, CPU])
def test_add_stats_then_rstd_is_the_norm_and_the_projection(device):
    """gemv_add_stats (the stream, hg = h * g and the squares, in the producer's epilogue) then
    gemv_rstd (1 / rms from the squares, applied after the consumer's dot) == gemv, add_rms_norm,
    then the projection; with the invariant tiles the engine routes to, and with the producer on
    the one-row kernel row by row (each_row, routing.stats_route)."""
    from engine.kernels.gemv import gemv_add_stats, gemv_add_stats_ref, gemv_rstd, gemv_rstd_ref
    from engine.routing import invariant_tile, row_tile

    shapes = STATS_SHAPES + ([(6, 4096, 14336, 28672)] if device == "cuda" else [])
    for (m, hid, k, n), each_row in [(s, e) for s in shapes for e in (False, True)]:
        gen, x, w1, b1 = make(m, hid, k, device, hid + k)
        residual = torch.randn(m, hid, generator=gen).to(device, torch.bfloat16)
        g = (1 + 0.2 * torch.randn(hid, generator=gen)).to(device, torch.bfloat16)
        w2 = (torch.randn(n, hid, generator=gen) / hid**0.5).to(device, torch.bfloat16)
        b2 = torch.randn(n, generator=gen).to(device, torch.bfloat16)
        hg, h, sq = gemv_add_stats(x, w1, b1, residual, g, config=row_tile(k) if each_row else invariant_tile((hid, k)),
                                   each_row=each_row)
        assert sq.shape == (m, -(-hid // (row_tile(k).block_n if each_row else invariant_tile((hid, k)).block_n)))
        ref_hg, ref_h, ref_sq = gemv_add_stats_ref(x, w1, b1, residual, g)
        torch.testing.assert_close(h, ref_h, **tol(device))
        torch.testing.assert_close(hg, ref_hg, **tol(device))
        torch.testing.assert_close(sq.sum(-1, keepdim=True), ref_sq, rtol=2e-2, atol=1e-2)
        out = gemv_rstd(hg, sq, 1e-5, w2, b2, config=invariant_tile((n, hid)))
        torch.testing.assert_close(out, gemv_rstd_ref(hg, sq, 1e-5, w2, b2), **tol(device))
        unfused, _ = rms_norm_gemv_ref(F.linear(x, w1, b1), residual, g, 1e-5, w2, b2)
        torch.testing.assert_close(out, unfused, **tol(device))


# (rows, hidden H, intermediate I, tile): SmolLM2's gate_up on its invariant tile, an odd I (a
# masked last tile) on the swapped tile and on an unswapped 16-column one, and (CUDA only) the 8B's.
GATE_SHAPES = [(1, 576, 1536, None), (6, 576, 1536, None), (3, 200, 100, None),
               (16, 200, 100, GemvConfig(16, 128, 1, 4, 2)), (2, 96, 40, GemvConfig(32, 64, 1, 4, 2, swap_ab=True))]


@pytest.mark.parametrize("device", [CUDA, CPU])
def test_gated_rstd_is_the_projection_then_the_activation(device):
    """gemv_rstd(gate=True) on an MLP's [gate; up] weight == gemv_rstd, then silu(gate) * up: within
    bf16 of the reference, and on the GPU bit for bit the two launches it replaces."""
    from engine.kernels.activation import silu_and_mul
    from engine.kernels.gemv import gemv_rstd, gemv_rstd_ref
    from engine.routing import invariant_tile

    shapes = GATE_SHAPES + ([(6, 4096, 14336, None)] if device == "cuda" else [])
    for m, hid, inter, cfg in shapes:
        gen, hg, w, b = make(m, 2 * inter, hid, device, hid + inter)
        sq = (hid * (0.5 + torch.rand(m, 5, generator=gen)) / 5).to(device)
        cfg = cfg or invariant_tile((2 * inter, hid))
        for bias in (None, b):
            act = gemv_rstd(hg, sq, 1e-5, w, bias, config=cfg, gate=True)
            assert act.shape == (m, inter)
            ref = gemv_rstd_ref(hg, sq, 1e-5, w, bias, gate=True)
            torch.testing.assert_close(act, ref, **tol(device))
            if device == "cuda":
                pair = silu_and_mul(gemv_rstd(hg, sq, 1e-5, w, bias, config=cfg))
                assert torch.equal(act, pair), (m, hid, inter, cfg)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("hid,inter", [(576, 1536), (4096, 14336)])
def test_gated_rstd_rows_equal_single_row_bits(hid, inter):
    from engine.kernels.gemv import gemv_rstd
    from engine.routing import invariant_tile

    gen, hg, w, _ = make(16, 2 * inter, hid, "cuda", hid)
    sq = (hid * (0.5 + torch.rand(16, 3, generator=gen)) / 3).to("cuda")
    run = lambda a, b: gemv_rstd(hg[a:b], sq[a:b], 1e-5, w, config=invariant_tile((2 * inter, hid)), gate=True)  # noqa: E731
    singles = torch.cat([run(i, i + 1) for i in range(16)])
    for m in (2, 6, 9, 16):
        assert torch.equal(run(0, m), singles[:m]), m


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("each_row", [False, True], ids=["tile", "each_row"])
@pytest.mark.parametrize("hid,k,n", [(576, 576, 3072), (576, 1536, 960), (4096, 4096, 6144), (4096, 14336, 28672)])
def test_add_stats_and_rstd_rows_equal_single_row_bits(hid, k, n, each_row):
    from engine.kernels.gemv import gemv_add_stats, gemv_rstd
    from engine.routing import invariant_tile, row_tile

    gen, x, w1, _ = make(16, hid, k, "cuda", hid + n)
    residual = torch.randn(16, hid, generator=gen).to("cuda", torch.bfloat16)
    g = (1 + 0.2 * torch.randn(hid, generator=gen)).to("cuda", torch.bfloat16)
    w2 = (torch.randn(n, hid, generator=gen) / hid**0.5).to("cuda", torch.bfloat16)

    def both(a, b):
        hg, h, sq = gemv_add_stats(x[a:b], w1, None, residual[a:b], g,
                                   config=row_tile(k) if each_row else invariant_tile((hid, k)), each_row=each_row)
        return torch.cat([hg, h, gemv_rstd(hg, sq, 1e-5, w2, config=invariant_tile((n, hid)))], 1), sq

    singles = [both(i, i + 1) for i in range(16)]
    for m in (2, 6, 9, 16):
        out, sq = both(0, m)
        assert torch.equal(out, torch.cat([s[0] for s in singles[:m]])), m
        assert torch.equal(sq, torch.cat([s[1] for s in singles[:m]])), m


# A draft tree's verify step in one forward: 17 to 64 rows in 16-row tiles along the grid's third
# axis. (rows, N, K, tile): SmolLM2's qkv on its invariant tile, and forced split-K tiles (the
# counters of every row tile) over odd sizes.
TREE_ROWS_CASES = [(25, 960, 576, None), (64, 100, 300, GemvConfig(16, 64, 3, 4, 2)),
                   (17, 37, 200, GemvConfig(32, 64, 2, 4, 2))]


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("rows,n,k,config", TREE_ROWS_CASES)
def test_invariant_launches_over_16_rows_equal_their_16_row_chunks(device, rows, n, k, config):
    """Every invariant op of a tree's verify rows (gemv, the norm and activation prologues, the
    stats epilogue on the tile and row by row, the scaled and gated consumer) gives each row the
    bits the same op gives it in launches of at most 16 rows (the tiles and their rows sit alike),
    values as the references, and leaves the split-K counters at zero. On a GPU, each row also
    equals its one-row launch (test_invariant_rows_equal_single_row_bits' property)."""
    from engine.kernels.gemv import MAX_ROWS, MAX_TREE_ROWS, gemv_add_stats, gemv_rstd
    from engine.routing import invariant_tile, row_tile

    assert MAX_ROWS < rows <= MAX_TREE_ROWS
    gen, x, w, bias = make(rows, n, k, device, rows + n)
    res = torch.randn(rows, k, generator=gen).to(device, torch.bfloat16)
    nw = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, torch.bfloat16)
    gu = torch.randn(rows, 2 * k, generator=gen).to(device, torch.bfloat16)
    stream = torch.randn(rows, n, generator=gen).to(device, torch.bfloat16)
    g = (1 + 0.1 * torch.randn(n, generator=gen)).to(device, torch.bfloat16)
    w_up = (torch.randn(2 * 64, n, generator=gen) / n**0.5).to(device, torch.bfloat16)
    cfg = config or invariant_tile((n, k))

    def stats(a, b, each_row):
        tile = replace(row_tile(k) if each_row else cfg, split_k=1)  # an epilogue needs whole columns
        hg, h, sq = gemv_add_stats(x[a:b], w, bias, stream[a:b], g, config=tile, each_row=each_row)
        rstd = gemv_rstd(hg, sq, 1e-5, w_up, config=invariant_tile((2 * 64, n)), gate=True)
        return torch.cat([hg, h, rstd], 1)

    ops = {  # each over rows a .. b - 1
        "gemv": lambda a, b: gemv(x[a:b], w, bias, config=cfg, invariant=True),
        "rms_norm_gemv": lambda a, b: torch.cat(rms_norm_gemv(x[a:b], res[a:b], nw, 1e-5, w, config=cfg,
                                                              invariant=True), 1),
        "silu_mul_gemv": lambda a, b: silu_mul_gemv(gu[a:b], w, config=cfg, invariant=True),
        "stats, rstd": lambda a, b: stats(a, b, False),
        "stats row by row, rstd": lambda a, b: stats(a, b, True),
    }
    for name, op in ops.items():
        whole = op(0, rows)
        assert torch.equal(whole, torch.cat([op(a, min(a + MAX_ROWS, rows)) for a in range(0, rows, MAX_ROWS)])), name
        if device == "cuda":
            assert torch.equal(whole, torch.cat([op(i, i + 1) for i in range(rows)])), name
    torch.testing.assert_close(ops["gemv"](0, rows), gemv_ref(x, w, bias), **tol(device))
    torch.testing.assert_close(ops["rms_norm_gemv"](0, rows)[:, :n], rms_norm_gemv_ref(x, res, nw, 1e-5, w)[0],
                               **tol(device))
    assert int(gemv_module._tile_counters(x.device).sum().item()) == 0
    with pytest.raises(AssertionError):
        gemv(torch.zeros(MAX_TREE_ROWS + 1, k, dtype=torch.bfloat16, device=device), w, invariant=True)
    with pytest.raises(AssertionError):  # the kernels of other launches keep their 16 rows
        gemv(x[:MAX_ROWS + 1], w)
