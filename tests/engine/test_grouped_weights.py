"""GroupedWeight (the GPU layout of every quantized format) decodes to the values of each format's
own reference, and the packed GEMV kernel (Triton's interpreter on the CPU, the GPU when there is
one) multiplies by them as the dequantize-at-load path does.

The kernel tests run on the CPU only with LOCALCHAT_TRITON_INTERPRET=1 (run this file alone):
    LOCALCHAT_TRITON_INTERPRET=1 python -m pytest tests/engine/test_grouped_weights.py
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

from engine.weights.gguf_blocks import BLOCKS  # noqa: E402
from engine.weights.grouped import (  # noqa: E402
    BITS5, FP8, INT8, NIBBLES, SIGNED_BITS5, SIGNED_BITS6, SIGNED_NIBBLES, dequantize_grouped, from_packed,
    grouped_blocks, rows_of,
)
from engine.weights.packed import (  # noqa: E402
    awq_weight, dequantize, fp8_weight, gguf_weight, gptq_weight, int_weight,
)
from tests.tiny_gguf import random_blocks  # noqa: E402
from tests.tiny_quant import awq_tensors, ct_int_tensors, fp8_block_tensors, fp8_tensors, gptq_tensors  # noqa: E402

# What each GGUF type's q values need: nibbles (unsigned or signed) or a byte.
GGUF_STORAGE = {"Q4_0": SIGNED_NIBBLES, "Q4_1": NIBBLES, "Q5_0": SIGNED_BITS5, "Q5_1": BITS5, "Q8_0": INT8,
                "Q2_K": NIBBLES, "Q3_K": SIGNED_NIBBLES, "Q4_K": NIBBLES, "Q5_K": BITS5, "Q6_K": SIGNED_BITS6}


def _gguf(kind: str, rows: int, cols: int, seed: int):
    rng = np.random.default_rng(seed)
    return gguf_weight(kind, torch.from_numpy(random_blocks(kind, rows, cols, rng)), (rows, cols))


def _int4(method: str, n: int, k: int, group: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    if method == "awq":
        t, _ = awq_tensors(w, group)
        return awq_weight(*(torch.from_numpy(t[x]) for x in ("qweight", "qzeros")),
                          torch.from_numpy(t["scales"]).half(), group, "layer")
    t, _ = gptq_tensors(w, group, sym=False, v2=method == "gptq_v2")
    return gptq_weight(torch.from_numpy(t["qweight"]), torch.from_numpy(t["qzeros"]),
                       torch.from_numpy(t["scales"]).half(), torch.from_numpy(t["g_idx"]), group,
                       0 if method == "gptq_v2" else 1, "layer")


def _fp8(n: int, k: int, per_channel: bool):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n)) * 0.1
    t, _ = fp8_tensors(w, per_channel)
    return fp8_weight(t["weight"], t["weight_scale"], "layer")


def _ct_int(n: int, k: int, bits: int, group: int, sym: bool, layout: str = "packed", seed: int = 0):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
    t, _ = ct_int_tensors(w, bits, group, sym, layout)
    data = torch.from_numpy(t.get("weight_packed", t.get("weight")))
    zero = torch.from_numpy(t["weight_zero_point"]) if "weight_zero_point" in t else None
    shape = torch.from_numpy(t["weight_shape"]) if "weight_shape" in t else None
    return int_weight(data, torch.from_numpy(t["weight_scale"]).half(), zero, shape, None, "layer")


def _fp8_block(n: int, k: int, block: tuple[int, int]):
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(n + k)) * 0.1
    t, _ = fp8_block_tensors(w, block)
    return fp8_weight(t["weight"], t["weight_scale_inv"], "layer", block)


def _packed_cases():
    cases = [(f"gguf {k}", [_gguf(k, 8, 2 * BLOCKS[k][0], i)]) for i, k in enumerate(BLOCKS)]
    cases += [(f"{m} g{g}", [_int4(m, 32, 256, g)]) for m in ("awq", "gptq", "gptq_v2") for g in (32, 64, 128)]
    cases += [("fp8 per tensor", [_fp8(16, 64, False)]), ("fp8 per channel", [_fp8(16, 64, True)])]
    # compressed-tensors integers (packed int4 and int8, int8 a byte; symmetric or with zero
    # points) and FP8 blocks (edge blocks cut short; a block wider than K's divisor)
    cases += [("ct int4 g128 sym", [_ct_int(32, 256, 4, 128, True)]),
              ("ct int4 g32 asym", [_ct_int(32, 256, 4, 32, False, seed=1)]),
              ("ct int8 g64 asym", [_ct_int(32, 256, 8, 64, False, seed=2)]),
              ("ct int8 per channel int8", [_ct_int(32, 256, 8, -1, True, "int8", seed=3)]),
              ("fp8 block 128", [_fp8_block(40, 256, (128, 128))]),
              ("fp8 block 16x64 K96", [_fp8_block(24, 96, (16, 64))])]
    # fused projections of several parts (q and k in one format; a Q4_K_M file's v in another)
    cases += [("Q4_K q+k", [_gguf("Q4_K", 8, 512, 1), _gguf("Q4_K", 4, 512, 2)]),
              ("Q4_K+Q6_K", [_gguf("Q4_K", 8, 512, 1), _gguf("Q4_K", 4, 512, 2), _gguf("Q6_K", 4, 512, 3)]),
              ("Q4_0+Q8_0", [_gguf("Q4_0", 8, 64, 4), _gguf("Q8_0", 8, 64, 5)])]
    return cases


CASES = _packed_cases()


@pytest.mark.parametrize("name,parts", CASES, ids=[c[0] for c in CASES])
def test_grouped_layout_decodes_to_the_formats_own_values(name, parts):
    """Every value equal to the format's reference (itself equal to gguf's numpy dequantize bit for
    bit: test_packed_gguf.py); only the sign of a zero may differ (q * s + o against (q - z) * s)."""
    blocks = grouped_blocks(parts)
    assert [b.format for b in blocks] == list(dict.fromkeys(p.format for p in parts))  # a block per format
    g = blocks[0]
    want = torch.cat([dequantize(p) for p in parts])
    got = torch.cat([dequantize_grouped(b) for b in blocks])
    assert got.dtype == torch.float32 and got.shape == want.shape
    assert torch.equal(got, want), float((got - want).abs().max())
    if name.startswith("gguf "):
        assert g.kind == GGUF_STORAGE[name[5:]]
    if name.startswith("fp8"):
        assert g.kind == FP8 and g.offset is None and g.group == (g.shape[1] if "block" not in name else
                                                                   {"fp8 block 128": 128, "fp8 block 16x64 K96": 32}[name])
    if name.startswith("ct "):
        assert g.kind == (SIGNED_NIBBLES if "int4" in name else INT8) and (g.offset is None) == ("asym" not in name)
    # the bytes a step reads stay near the file's: GGUF's own (Q2_K and Q3_K keep their 2 and 3
    # bits in nibbles), AWQ/GPTQ's with an fp32 offset a group
    limit = {"Q2_K": 2.0, "Q3_K": 1.35, "AWQ": 1.5, "GPTQ": 1.5}.get(g.format, 1.05)
    if len(blocks) == 1 and g.format not in ("FP8", "INT"):
        assert g.nbytes <= limit * sum(p.nbytes for p in parts), (g.nbytes, sum(p.nbytes for p in parts))


def test_scales_stay_half_where_that_is_exact():
    q40 = from_packed([_gguf("Q4_0", 8, 64, 0)])
    assert q40.scale.dtype == torch.float16 and q40.offset is None  # d itself
    assert from_packed([_int4("awq", 32, 256, 128)]).scale.dtype == torch.float16


def test_k_quants_keep_the_files_factors():
    """d * sc and dmin * m as the file keeps them: an fp16 unit a super-block, a code a sub-block."""
    q4k = from_packed([_gguf("Q4_K", 8, 512, 0)])
    assert (q4k.unit, q4k.scale.dtype, q4k.offset.dtype) == (8, torch.uint8, torch.uint8)
    assert q4k.scale_unit.shape == q4k.offset_unit.shape == (8, 2) and q4k.scale_unit.dtype == torch.float16
    q6k = from_packed([_gguf("Q6_K", 8, 512, 0)])
    assert (q6k.kind, q6k.unit, q6k.scale.dtype, q6k.offset) == (SIGNED_BITS6, 16, torch.int8, None)
    assert q6k.qh.shape == (8, 512 // 4) and q6k.q.shape == (8, 256)
    cut = rows_of(q6k, 2, 5)
    assert torch.equal(dequantize_grouped(cut), dequantize_grouped(q6k)[2:5])


def test_k_quants_with_offsets_keep_a_groups_factors_side_by_side():
    """Q2_K and Q4_K: each group's scale and offset codes adjacent in one buffer, and each
    super-block's two units adjacent in another (the one-row kernel's two loads), through row cuts
    and moves; the values as before. Q5_K (a plane of high bits too), Q6_K (no offsets) and AWQ
    keep plain tensors."""
    from engine.weights.grouped import is_paired, paired

    for kind in ("Q2_K", "Q4_K"):
        g = from_packed([_gguf(kind, 8, 512, 1), _gguf(kind, 4, 512, 2)])
        assert is_paired(g), kind
        assert g.offset.data_ptr() == g.scale.data_ptr() + 1 and g.offset_unit.data_ptr() == g.scale_unit.data_ptr() + 2
        plain = replace(g, **{name: getattr(g, name).contiguous()
                              for name in ("scale", "offset", "scale_unit", "offset_unit")})
        assert not is_paired(plain) and is_paired(paired(plain))
        assert torch.equal(dequantize_grouped(g), dequantize_grouped(plain))
        assert g.nbytes == plain.nbytes
        cut = rows_of(g, 3, 10)
        assert is_paired(cut) and torch.equal(dequantize_grouped(cut), dequantize_grouped(g)[3:10])
        moved = g.to("cpu")
        assert is_paired(moved) and torch.equal(dequantize_grouped(moved), dequantize_grouped(g))
    for other in (from_packed([_gguf("Q5_K", 8, 512, 0)]), from_packed([_gguf("Q6_K", 8, 512, 0)]),
                  from_packed([_int4("awq", 32, 256, 128)])):
        assert not is_paired(other) and paired(other) is other


def test_one_grouped_weight_holds_one_format():
    with pytest.raises(ValueError):
        from_packed([_fp8(16, 64, True), _gguf("Q8_0", 16, 64, 0)])
    with pytest.raises(ValueError):
        from_packed([_gguf("Q4_K", 8, 512, 1), _gguf("Q6_K", 4, 512, 3)])


# --- the kernel -------------------------------------------------------------------------------
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs CUDA")])
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1"))
KERNEL_CASES = [c for c in CASES if c[0] in ("gguf Q4_0", "gguf Q4_1", "gguf Q5_0", "gguf Q4_K", "gguf Q5_K",
                                               "gguf Q6_K", "gguf Q8_0", "gguf Q2_K", "gguf Q3_K", "awq g128",
                                               "gptq g32", "Q4_K q+k", "fp8 per channel", "ct int4 g32 asym",
                                               "ct int8 per channel int8", "fp8 block 128")]


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_packed_gemv_equals_dequantize_then_matmul(device, name, parts):
    """1, 5 and 16 rows, with and without a bias, q made a float by its bits or by a conversion,
    K split or not, == the weight dequantized and rounded as a load does, then F.linear; each row
    of the 16-row call has the bits of its 1-row call."""
    from engine.kernels.packed_gemv import packed_gemv, packed_gemv_ref

    if name.startswith("fp8") and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    g = from_packed(parts).to(device)
    n, k = g.shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(n + k)
    x = torch.randn(16, k, generator=gen).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    from engine.kernels.packed_gemv import PackedTile

    tiles = [None, PackedTile(16, 32), PackedTile(16, 32, magic=False), PackedTile(32, 64, split_k=2),
             PackedTile(16, 32, split_k=4, magic=False), PackedTile(64, 64, num_warps=2)]  # the last: a short K's where columns fill the GPU
    for tile in tiles:
        if tile is not None and (k % (tile.block_k * tile.split_k)
                                 or (tile.block_k % g.group and g.group % tile.block_k)):
            continue
        for b in (None, bias):
            singles = torch.cat([packed_gemv(x[i:i + 1], g, b, tile) for i in range(16)])
            for m in (1, 5, 16):
                out = packed_gemv(x[:m], g, b, tile)
                assert out.shape == (m, n) and out.dtype == dtype
                torch.testing.assert_close(out.float(), packed_gemv_ref(x[:m], g, b).float(), **tol)
                assert torch.equal(out, singles[:m]), (name, m, tile)


# every kind: nibbles, the 5- and 6-bit kinds (their high bits in a plane), int8, FP8; and K no
# power of two (3 blocks of 256, 3 groups of 128, FP8's 5 chunks of 512), whose last steps pass
# K's end
ROW_CASES = KERNEL_CASES + [
    ("gguf Q6_K K768", [_gguf("Q6_K", 8, 768, 9)]), ("gguf Q8_0 K96", [_gguf("Q8_0", 8, 96, 10)]),
    ("awq g128 K384", [_int4("awq", 32, 384, 128)]), ("fp8 per tensor K2560", [_fp8(16, 2560, False)])]


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", ROW_CASES, ids=[c[0] for c in ROW_CASES])
def test_packed_row_gemv_equals_dequantize_then_matmul(device, name, parts):
    """The one-row kernel (an engine with no draft loaded), several tiles, K split or not, with and
    without a bias, x in bf16, fp16 and (the interpreter) fp32: == the weight dequantized and
    rounded as a load does, then F.linear."""
    from engine.kernels.packed_gemv import RowTile, packed_gemv_ref, packed_row_gemv, tile_group

    if name.startswith("fp8") and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    g = from_packed(parts).to(device)
    n, k = g.shape
    group = tile_group(k, g.group)
    gen = torch.Generator().manual_seed(n + k + 1)
    x32 = torch.randn(1, k, generator=gen)
    bias32 = torch.randn(n, generator=gen)
    # the 5th and 6th: a step's vectors fill the warp; the others leave threads over; the last
    # two pass K's end (a step longer than K, or than K's share)
    tiles = [None, RowTile(8, 32), RowTile(4, 64, split_k=2, vec=4), RowTile(16, 32, split_k=4),
             RowTile(4, 256, num_warps=1, vec=4), RowTile(2, 512, num_warps=1, vec=8),
             RowTile(4, 1024, num_warps=1, vec=8), RowTile(4, 512, split_k=2, num_warps=1, vec=8)]
    for dtype in ((torch.bfloat16, torch.float16) + ((torch.float32,) if device == "cpu" else ())):
        x, bias = x32.to(device, dtype), bias32.to(device, dtype)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        want = {b is None: packed_gemv_ref(x.float(), g, None if b is None else b.float()) for b in (None, bias)}
        for tile in tiles:
            if tile is not None and (k % tile.split_k or (k // tile.split_k) % min(group, tile.block_k)
                                     or (tile.block_k % group and group % tile.block_k)):
                continue
            for b in (None, bias):
                out = packed_row_gemv(x, g, b, tile)
                assert out.shape == (1, n) and out.dtype == dtype
                torch.testing.assert_close(out.float(), want[b is None].to(dtype).float(), **tol)


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("kind", ["Q4_K", "Q2_K"])
def test_paired_factors_give_the_bits_of_plain_ones(device, kind):
    """Every kernel reads a k-quant's factors side by side (the one-row kernel in two loads, the
    others through strides) with the same bits as from four plain tensors."""
    from engine.kernels.packed_gemv import RowTile, dequantize_packed, packed_gemv, packed_row_gemv
    from engine.kernels.packed_rows import packed_rows_gemv
    from engine.weights.grouped import is_paired

    g = from_packed([_gguf(kind, 24, 1024, 5)]).to(device)
    assert is_paired(g)
    plain = replace(g, **{name: getattr(g, name).contiguous() for name in ("scale", "offset", "scale_unit",
                                                                           "offset_unit")})
    x = torch.randn(3, 1024, generator=torch.Generator().manual_seed(7)).to(device, torch.bfloat16 if device == "cuda" else torch.float32)
    for tile in (None, RowTile(8, 256, split_k=2, vec=4)):
        for int8_x in (True, False):
            assert torch.equal(packed_row_gemv(x[:1], g, None, tile, int8_x=int8_x),
                               packed_row_gemv(x[:1], plain, None, tile, int8_x=int8_x))
    assert torch.equal(packed_gemv(x, g), packed_gemv(x, plain))
    assert torch.equal(packed_rows_gemv(x, g), packed_rows_gemv(x, plain))
    assert torch.equal(dequantize_packed(g, torch.bfloat16), dequantize_packed(plain, torch.bfloat16))


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("n_a,n_b,splits,k", [(40, 24, None, 2048), (640, 8, None, 2048), (40, 24, (2, 2), 2048),
                                               (24, 40, (2, 1), 2048), (40, 24, None, 768)])
def test_two_blocks_in_one_row_launch_give_the_bits_of_two_launches(device, n_a, n_b, splits, k):
    """A Q4_K_M-style projection (Q4_K q and k, Q6_K v) in one launch of the one-row kernel, each
    block with its own kind, tile and split of K (the split-K counters of the second after the
    first's): each output the bits of its own launch, with and without a bias and int8 x; a short
    K (768, a small model's one-warp tiles) too."""
    from engine.kernels.packed_gemv import RowTile, blocks_fit_one_launch, packed_row_gemv, packed_row_gemv_blocks

    a = from_packed([_gguf("Q4_K", n_a // 2, k, 1), _gguf("Q4_K", n_a // 2, k, 2)]).to(device)
    b = from_packed([_gguf("Q6_K", n_b, k, 3)]).to(device)
    assert blocks_fit_one_launch([a, b]) and not blocks_fit_one_launch([a])
    gen = torch.Generator().manual_seed(n_a)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(1, k, generator=gen).to(device, dtype)
    bias = torch.randn(n_a + n_b, generator=gen).to(device, dtype)
    # the default tiles, or K split in two (both blocks, or the first only: the split-K counters)
    tiles = (None, None) if splits is None else tuple(RowTile(4, 1024, split_k=s, vec=8) for s in splits)
    for with_bias in (False, True):
        for int8_x in (True, False):
            ba, bb = (bias[:n_a], bias[n_a:]) if with_bias else (None, None)
            out = torch.full((1, n_a + n_b), float("nan"), dtype=dtype, device=device)
            packed_row_gemv_blocks(x, [a, b], [ba, bb], [out[:, :n_a], out[:, n_a:]], int8_x=int8_x, tiles=tiles)
            assert torch.equal(out[:, :n_a], packed_row_gemv(x, a, ba, tiles[0], int8_x=int8_x))
            assert torch.equal(out[:, n_a:], packed_row_gemv(x, b, bb, tiles[1], int8_x=int8_x))


@pytest.mark.parametrize("device", [CUDA, CPU])
def test_int8_default_row_tile_passes_k_end(device):
    """int8's default one-row tile, 8 rows over steps of 4,096 inputs, on a K of 6,144 (its last
    step half past K's end) and 12 rows (the last program's rows clamped): == the dequantized
    matmul."""
    from engine.kernels.packed_gemv import RowTile, default_row_tile, packed_gemv_ref, packed_row_gemv

    g = from_packed([_gguf("Q8_0", 12, 6144, 11)]).to(device)
    assert default_row_tile(12, 6144, g.group, 4) == RowTile(8, 4096, vec=16)
    gen = torch.Generator().manual_seed(12)
    x32 = torch.randn(1, 6144, generator=gen)
    for dtype in (torch.bfloat16,) + ((torch.float32,) if device == "cpu" else ()):
        x = x32.to(device, dtype)
        tol = dict(atol=1e-4, rtol=1e-4) if dtype == torch.float32 else dict(atol=3e-2, rtol=3e-2)
        want = packed_gemv_ref(x.float(), g).to(dtype).float()
        torch.testing.assert_close(packed_row_gemv(x, g).float(), want, **tol)


def _rounded_x(x: torch.Tensor, block: int) -> torch.Tensor:
    """x as packed_row_gemv's int8_x path rounds it: each block of inputs (a thread's vector) to
    int8 with one scale, max|x| / 127, rounded to nearest."""
    b = x.float().reshape(-1, block)
    amax = b.abs().amax(dim=1, keepdim=True)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return (torch.round(b * inv) * (amax * (1.0 / 127.0))).reshape(x.shape)


def _int8_x_tiles(g):
    """The one-row tiles the int8-x tests run on g: the default and three others, those whose K
    steps fit its K and groups, each with its thread vector's inputs (the rounding's vector)."""
    from engine.kernels.packed_gemv import RowTile, row_tile_for

    k = g.shape[1]
    for tile in (None, RowTile(4, 256, num_warps=1, vec=16), RowTile(2, 512, num_warps=1, vec=8),
                 RowTile(4, 64, split_k=2, vec=4)):
        if tile is not None and (k % tile.split_k or (k // tile.split_k) % min(g.group, tile.block_k)
                                 or (tile.block_k % g.group and g.group % tile.block_k)):
            continue
        t = tile or row_tile_for(g)
        per_word = 4 if g.kind == INT8 else 8
        yield tile, per_word * min(t.vec // 4, min(g.group, t.block_k) // per_word)


INT8_X_CASES = [c for c in KERNEL_CASES if not c[0].startswith("fp8")] + [
    ("awq g128 K384", [_int4("awq", 32, 384, 128)]), ("gguf Q8_0 K96", [_gguf("Q8_0", 8, 96, 10)]),
    ("gguf Q6_K K768", [_gguf("Q6_K", 8, 768, 9)])]


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", INT8_X_CASES, ids=[c[0] for c in INT8_X_CASES])
def test_packed_row_gemv_int8_x_is_the_weights_times_x_rounded(device, name, parts):
    """int8_x on every kind but FP8 (nibbles, the 5- and 6-bit kinds, int8): the weights' exact values times x rounded to int8 per vector
    (integer dot products), == F.linear of the dequantized weight and that rounded x within float
    rounding (fp32 x under the interpreter; bf16 on the GPU); and within a few percent of the
    unrounded reference. FP8 ignores int8_x."""
    from engine.kernels.packed_gemv import RowTile, packed_gemv_ref, packed_row_gemv

    g = from_packed(parts).to(device)
    n, k = g.shape
    x32 = torch.randn(1, k, generator=torch.Generator().manual_seed(n + k + 5))
    x32[0, :8] = 0.0  # a vector of zeros in part: its scale and its products stay finite
    w = dequantize_grouped(g).float()
    for tile, vector in _int8_x_tiles(g):
        for dtype in (torch.bfloat16,) + ((torch.float32,) if device == "cpu" else ()):
            x = x32.to(device, dtype)
            got = packed_row_gemv(x, g, None, tile, int8_x=True).float()
            want = F.linear(_rounded_x(x, vector), w)
            scale = float(want.abs().max())
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            assert float((got - want).abs().max()) <= tol * scale, (name, tile, dtype)
            plain = packed_gemv_ref(x.float(), g)
            assert float((got - plain).abs().max()) <= 0.05 * float(plain.abs().max()), (name, tile, dtype)
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        return
    other = from_packed([_fp8(16, 256, True)]).to(device)
    x = torch.randn(1, 256, generator=torch.Generator().manual_seed(6)).to(device, torch.bfloat16)
    assert torch.equal(packed_row_gemv(x, other, None, RowTile(4, 256, num_warps=1, vec=16), int8_x=True),
                       packed_row_gemv(x, other, None, RowTile(4, 256, num_warps=1, vec=16)))


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", INT8_X_CASES, ids=[c[0] for c in INT8_X_CASES])
def test_packed_row_gemv_takes_x_rounded_before_the_launch(device, name, parts):
    """A RoundedX (x rounded once, vectors of 32 inputs, the weight's word order): the weights'
    exact values times that x within float rounding, on every tile; where the kernel's own vector
    is 32 inputs too, the bits of int8_x. The other word order, or FP8, is refused."""
    from engine.kernels.packed_gemv import packed_row_gemv, rounds_x
    from engine.kernels.rounded_x import round_x

    g = from_packed(parts).to(device)
    n, k = g.shape
    x32 = torch.randn(1, k, generator=torch.Generator().manual_seed(n + k + 6))
    x32[0, 32:64] = 0.0  # a vector of zeros: its scale and its products stay finite
    w = dequantize_grouped(g).float()
    for tile, vector in _int8_x_tiles(g):
        for dtype in (torch.bfloat16,) + ((torch.float32,) if device == "cpu" else ()):
            x = x32.to(device, dtype)
            rx = round_x(x, rounds_x(g))
            got = packed_row_gemv(rx, g, None, tile)
            assert got.dtype == dtype and got.shape == (1, n)
            want = F.linear(_rounded_x(x, 32), w)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            assert float((got.float() - want).abs().max()) <= tol * float(want.abs().max()), (name, tile, dtype)
            if vector == 32 and device == "cpu":
                assert torch.equal(got, packed_row_gemv(x, g, None, tile, int8_x=True)), (name, tile)
    with pytest.raises(AssertionError):
        packed_row_gemv(round_x(x32.to(device, torch.bfloat16), not rounds_x(g)), g)


# under the interpreter (slow) a kind of each family: nibbles with groups, paired k-quant factors,
# high bits, int8, FP8, two parts; on the GPU every row case
def test_a_row_tile_fits_a_weight_of_whole_chunks_a_share():
    """row_tile_fits_weight (the tile sweeps of bench_packed.py): a tile serves a weight whose K is
    whole shares of whole chunks, each chunk inside one group; a last step past K's end is fine."""
    from engine.kernels.packed_gemv import RowTile, row_tile_fits_weight

    awq = from_packed([_int4("awq", 32, 384, 128)])  # K of 3 groups of 128
    q6 = from_packed([_gguf("Q6_K", 8, 768, 9)])
    assert row_tile_fits_weight(awq, RowTile(4, 128, num_warps=1))
    assert row_tile_fits_weight(awq, RowTile(4, 256, num_warps=1))  # the last step past K's end
    assert not row_tile_fits_weight(awq, RowTile(4, 128, split_k=2, num_warps=1))  # shares of 192
    assert row_tile_fits_weight(q6, RowTile(4, 256, split_k=3, num_warps=1))
    assert not row_tile_fits_weight(q6, RowTile(4, 256, split_k=5, num_warps=1))


def test_default_row_tiles_fill_their_warps():
    """The one-row kernel's default tiles: on the 8B shape's projections a step's 8- or 16-byte
    vectors fill all four warps (tiles that left threads over ran 2x-6x slower on an H200); a
    short K, as a small model's, gets one warp."""
    from engine.kernels.packed_gemv import default_row_tile

    for n, k in ((6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)):
        for group in (16, 32, 64, 128):
            for per_word in (8, 4):  # nibbles, bytes
                tile = default_row_tile(n, k, group, per_word)
                words = min(tile.vec // 4, min(group, tile.block_k) // per_word)
                assert tile.num_warps == 4 and tile.block_k // (per_word * words) >= 32 * tile.num_warps, (k, group, tile)
                # nibbles: steps that divide K; int8: 8 rows over 4,096 inputs, the last step of
                # 14,336 past its end
                if per_word == 8:
                    assert k % tile.block_k == 0
                else:
                    assert (tile.block_n, tile.block_k, tile.vec) == (8, 4096, 16)
    small = default_row_tile(576, 576, 32)
    assert small.num_warps == 1 and 576 % small.block_k == 0
    # K no multiple of 2,048 (Qwen2.5-7B's 3,584 and 18,944): steps of 2,048, the last past K's end
    for k in (3584, 18944, 3072):
        tile = default_row_tile(4096, k, 32)
        assert (tile.block_k, tile.num_warps) == (2048, 4) and k % tile.block_k, k


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_long_step_kernels_equal_the_reference(device, name, parts):
    """A prefill's two GPU ways: dequantize_packed gives dequantize_grouped's values rounded once
    (bit for bit, in bf16 on the GPU, fp32 under the interpreter); packed_matmul over 40 rows (three
    row blocks, the last partial) == the dequantized weight's matmul, with and without a bias."""
    from engine.kernels.packed_gemv import MatmulTile, dequantize_packed, packed_gemv_ref, packed_matmul

    if name.startswith("fp8") and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    g = from_packed(parts).to(device)
    n, k = g.shape
    want = dequantize_grouped(g)
    # (the interpreter casts to bf16 by truncation, the GPU to nearest: bf16 on the GPU only)
    for dtype in ((torch.bfloat16,) if device == "cuda" else (torch.float32,)):
        assert torch.equal(dequantize_packed(g, dtype), want.to(dtype)), (name, dtype)
        assert torch.equal(dequantize_packed(rows_of(g, 2, n), dtype), want[2:].to(dtype)), (name, dtype)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(n + k + 2)
    x = torch.randn(40, k, generator=gen).to(device, dtype)
    bias = torch.randn(n, generator=gen).to(device, dtype)
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    for tile in (None, MatmulTile(16, 16, 32)):
        if tile is not None and (k % tile.block_k or (tile.block_k % g.group and g.group % tile.block_k)):
            continue
        for b in (None, bias):
            out = packed_matmul(x, g, b, tile)
            assert out.shape == (40, n) and out.dtype == dtype
            torch.testing.assert_close(out.float(), packed_gemv_ref(x, g, b).float(), **tol)


def test_a_long_step_runs_the_way_asked(monkeypatch):
    """PackedLinear's long steps: an unknown way is refused; on the CPU every way is the torch
    reference's slices (the kernels' ways are the GPU's)."""
    from engine.packed_linear import PackedLinear

    linear = PackedLinear([from_packed([_gguf("Q4_0", 8, 64, 4)])])
    x = torch.randn(20, 64, generator=torch.Generator().manual_seed(3))
    want = linear(x, prefill="torch")
    for how in ("dequant", "fused"):
        assert torch.equal(linear(x, prefill=how), want)
    with pytest.raises(ValueError, match="prefill: 'fast'"):
        linear(x, prefill="fast")


def test_the_row_kernel_serves_every_k_it_has_a_tile_for_and_auto_counts_the_wide_ones():
    """row_kernel_k: any K of whole 32-input vectors with a step that fits its groups (the demo's
    576 and 1,536 included); row_kernel_wide, which the loader's auto rule counts, only K that fill
    four warps (2,048 and longer, Qwen2.5-7B's 3,584 and the 8B's 14,336 too)."""
    from engine.kernels.packed_gemv import default_row_tile, row_kernel_k, row_kernel_wide

    for k, group in ((576, 32), (1536, 32), (96, 32), (768, 256), (384, 128), (4096, 128), (14336, 32)):
        assert row_kernel_k(k, group), (k, group)
        assert default_row_tile(1, k, group).block_k <= max(k, 2048)
    for k, group in ((48, 16), (100, 4)):  # not whole vectors of 32
        assert not row_kernel_k(k, group), (k, group)
    for k, group in ((2048, 32), (3584, 128), (4096, 256), (14336, 32)):
        assert row_kernel_wide(k, group), (k, group)
    for k, group in ((576, 32), (1536, 32), (1024, 128)):
        assert not row_kernel_wide(k, group), (k, group)


def test_only_an_engine_without_a_draft_runs_one_row_steps_on_the_row_kernel():
    """No draft (batch_invariant off): a one-row step of any kind takes packed_row_gemv; a loaded
    draft, several rows, or LOCALCHAT_PACKED_ROW=0 keep a batch-invariant kernel, so
    verify rows still carry the decode step's bits: packed_rows_gemv for the kinds with integer
    values (int8_rows, LOCALCHAT_PACKED_INVARIANT_X=int8, the default), packed_gemv for FP8 or
    with LOCALCHAT_PACKED_INVARIANT_X=bf16."""
    from engine.kernels.packed_gemv import packed_gemv, packed_row_gemv
    from engine.kernels.packed_rows import packed_rows_gemv
    from engine.ops import routed_linear
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear, kernel_for

    # K = 2,048: steps that fill the row kernel's four warps; a short K (a small model's, the demo's
    # 576) one-warp tiles on the same kernel
    by_kind = {f"gguf {kind}": from_packed([_gguf(kind, 8, 2048, i)])
               for i, kind in enumerate(("Q4_0", "Q4_K", "Q6_K", "Q5_0", "Q8_0"))}
    by_kind.update({"awq g128": from_packed([_int4("awq", 32, 2048, 128)]),
                    "gptq g32": from_packed([_int4("gptq", 32, 2048, 32)]),
                    "fp8 per channel": from_packed([_fp8(16, 2048, True)]),
                    "short K": from_packed([_gguf("Q4_0", 8, 576, 7)])})
    for name, block in by_kind.items():
        assert kernel_for(block, 1, one_row=True) is packed_row_gemv, name
        assert kernel_for(block, 1, one_row=False) is packed_gemv
        assert kernel_for(block, 5, one_row=True) is packed_gemv
        invariant = packed_gemv if name.startswith("fp8") else packed_rows_gemv
        assert kernel_for(block, 1, one_row=False, int8_rows=True) is invariant, name
        assert kernel_for(block, 16, one_row=True, int8_rows=True) is invariant, name
        assert kernel_for(block, 1, one_row=True, int8_rows=True) is packed_row_gemv, name

    asked = []

    class Recording(PackedLinear):
        def forward(self, x, one_row=False, prefill="fused", int8_x=False, int8_rows=False, one_launch=False,
                    row_pdl=0, rounded=None, pdl=0, short=True):
            asked.append((one_row, int8_x, int8_rows, one_launch, row_pdl, pdl, short))
            return x

    linear = Recording([by_kind["short K"]])  # K = 576: packed_gemv with PDL (packed_gemv_pdl_k)
    x = torch.zeros(1, linear.in_features)
    # the PDL mode 2 with the bit for the first step's weights before the wait (4) by default
    for options, want in ((KernelOptions(), (True, True, False, True, 6, 1, True)),
                          (KernelOptions(batch_invariant=True), (False, True, False, True, 6, 1, True)),
                          (KernelOptions(packed_row=False), (False, True, False, True, 6, 1, True)),
                          (KernelOptions(packed_row_x="bf16"), (True, False, False, True, 6, 1, True)),
                          (KernelOptions(batch_invariant=True, packed_invariant_x="int8"),
                           (False, True, True, True, 6, 1, True)),
                          (KernelOptions(packed_one_launch=False), (True, True, False, False, 6, 1, True)),
                          (KernelOptions(packed_row_pdl=1), (True, True, False, True, 5, 1, True)),
                          (KernelOptions(packed_row_pdl=0), (True, True, False, True, 0, 1, True)),
                          (KernelOptions(packed_row_early_weights=False), (True, True, False, True, 2, 1, True)),
                          (KernelOptions(packed_row_pdl=1, packed_row_early_weights=False),
                           (True, True, False, True, 1, 1, True)),
                          # packed_gemv without PDL, or the 8B's tile rule at a short K
                          (KernelOptions(packed_gemv_pdl=0), (True, True, False, True, 6, 0, True)),
                          (KernelOptions(packed_gemv_pdl=2), (True, True, False, True, 6, 2, True)),
                          (KernelOptions(packed_short_tiles=False), (True, True, False, True, 6, 1, False)),
                          # no PDL anywhere: none for the row kernel either
                          (KernelOptions(pdl=False), (True, True, False, True, 0, 0, True))):
        routed_linear(options, "unfused", x, linear, "qkv")
        assert asked[-1] == want, options
    # K = 2,048: packed_gemv without PDL, unless packed_gemv_pdl_k takes it in
    long = Recording([by_kind["gguf Q4_0"]])
    x = torch.zeros(1, long.in_features)
    for options, pdl in ((KernelOptions(), 0), (KernelOptions(packed_gemv_pdl_k=4096), 1),
                         (KernelOptions(packed_gemv_pdl_k=4096, packed_gemv_pdl=2), 2)):
        routed_linear(options, "unfused", x, long, "qkv")
        assert asked[-1][5] == pdl, options


@pytest.mark.parametrize("device", [CUDA, CPU])
def test_a_projection_of_mixed_formats_keeps_a_block_per_format(device):
    """q and k in Q4_K, v in Q6_K (a Q4_K_M file): two blocks, each in its own storage; the
    PackedLinear over them (a launch per block into its columns) == the dequantized weight's matmul."""
    from engine.packed_linear import PackedLinear
    parts = [_gguf("Q4_K", 8, 512, 1), _gguf("Q4_K", 4, 512, 2), _gguf("Q6_K", 4, 512, 3)]
    blocks = grouped_blocks(parts)
    assert [b.format for b in blocks] == ["Q4_K", "Q6_K"] and [b.kind for b in blocks] == [NIBBLES, SIGNED_BITS6]
    assert [b.shape for b in blocks] == [(12, 512), (4, 512)]
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    bias = torch.nn.Parameter(torch.randn(16).to(device, dtype), requires_grad=False)
    linear = PackedLinear([b.to(device) for b in blocks], bias)
    x = torch.randn(3, 512, generator=torch.Generator().manual_seed(0)).to(device, dtype)
    want = torch.nn.functional.linear(x, torch.cat([dequantize(p) for p in parts]).to(device, dtype), bias)
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    if device == "cpu":  # the kernel, under the interpreter (the module itself dequantizes off CUDA)
        from engine.kernels.packed_gemv import packed_gemv

        out = torch.empty(3, 16)
        packed_gemv(x, blocks[0], bias[:12], out=out[:, :12])
        packed_gemv(x, blocks[1], bias[12:], out=out[:, 12:])
        torch.testing.assert_close(out, want, **tol)
    torch.testing.assert_close(linear(x).float(), want.float(), **tol)
    assert torch.equal(linear.dequantized(torch.float32).cpu(), torch.cat([dequantize(p) for p in parts]))


def test_random_packed_refuses_a_layout_before_replacing_any_layer():
    """pack_model (memory_breakdown.py calls it directly) checks the layout against the model's
    widths once, up front: a hidden size of 96 is no multiple of Q4_K's 256-input blocks, and no
    projection has been replaced when the one-line error comes."""
    from benchmarks.harness.random_packed import pack_model
    from benchmarks.harness.shapes import _random_tensors
    from engine.config import ModelConfig
    from engine.errors import UserError
    from engine.loader import build_model
    from engine.packed_linear import PackedLinear

    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 96, "intermediate_size": 256,
           "num_hidden_layers": 2, "num_attention_heads": 3, "num_key_value_heads": 1, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64}
    cfg = ModelConfig.from_hf(raw, "tiny")
    dev = torch.device("cpu")
    model = build_model(cfg, _random_tensors(cfg, dev, torch.float32), "tiny", dev, torch.float32, 64)
    with pytest.raises(UserError, match="blocks of 256 inputs do not divide this model's hidden 96"):
        pack_model(model, "Q4_K_M")
    assert not any(isinstance(m, PackedLinear) for m in model.modules())
    assert pack_model(model, "Q4_1") > 0  # blocks of 32 divide it


def test_random_packed_layouts_pack_a_model():
    """The benchmarks' random packed models (--random-quant): every decoder-layer projection a
    PackedLinear of the layout (FP8: finite e4m3 values, one scale a channel), Q4_K_M's Q6_K v and
    down on the layers llama.cpp gives more bits, and the model still runs (the CPU dequantizes each call)."""
    from benchmarks.harness.random_packed import pack_model, table_kinds, use_more_bits
    from benchmarks.harness.shapes import _random_tensors
    from engine.config import ModelConfig
    from engine.loader import build_model
    from engine.forward_batch import ForwardBatch
    from engine.kv_cache import KVCache
    from engine.packed_linear import PackedEmbedding, PackedLinear

    raw = {"architectures": ["LlamaForCausalLM"], "vocab_size": 64, "hidden_size": 256, "intermediate_size": 512,
           "num_hidden_layers": 8, "num_attention_heads": 4, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
           "max_position_embeddings": 64}
    cfg = ModelConfig.from_hf(raw, "tiny")
    dev = torch.device("cpu")
    for layout in ("Q4_K_M", "AWQ", "Q8_0", "FP8", "FP8-block", "W4A16"):
        model = build_model(cfg, _random_tensors(cfg, dev, torch.float32), "tiny", dev, torch.float32, 64)
        assert pack_model(model, layout) > 0
        for i, layer in enumerate(model.model.layers):
            qkv, down = layer.self_attn.qkv_proj, layer.mlp.down_proj
            assert isinstance(qkv, PackedLinear) and isinstance(down, PackedLinear)
            if layout == "Q4_K_M":
                more = use_more_bits(i, len(model.model.layers))
                assert qkv.format == ("Q4_K+Q6_K" if more else "Q4_K") and down.format == ("Q6_K" if more else "Q4_K")
            else:
                assert qkv.format == {"FP8-block": "FP8", "W4A16": "INT"}.get(layout, layout)
            if layout == "FP8":
                assert all(torch.isfinite(b.q.float()).all() and b.scale.shape == (b.shape[0], 1) for b in qkv.blocks)
            if layout == "FP8-block":  # groups of 128 inputs, a scale each
                assert all(b.group == 128 and b.scale.shape == (b.shape[0], 2) for b in qkv.blocks)
            if layout == "W4A16":
                assert all(b.kind == SIGNED_NIBBLES and b.offset is None and b.group == 128 for b in qkv.blocks)
        embed, head = model.model.embed_tokens, model.lm_head
        if layout in ("AWQ", "FP8", "FP8-block", "W4A16"):  # as their checkpoints keep them
            assert isinstance(embed, torch.nn.Embedding) and isinstance(head, torch.nn.Linear)
        else:
            assert (embed.format, head.format) == table_kinds(layout) == (("Q4_K", "Q6_K") if layout == "Q4_K_M"
                                                                          else (layout, layout))
            assert isinstance(embed, PackedEmbedding) and isinstance(head, PackedLinear)
        ids = torch.tensor([3, 63, 0])
        out = model(ForwardBatch.eager(ids, 0), KVCache(cfg.num_layers, 64, cfg.num_kv_heads, cfg.head_dim,
                                                        torch.float32, dev))
        assert torch.isfinite(model.logits(out.hidden)).all()
        hidden = torch.randn(3, 256)
        assert torch.isfinite(model.model.layers[0].mlp.gate_up_proj(hidden)).all()
    assert [use_more_bits(i, 32) for i in range(8)] == [True] * 4 + [False, False, True, False]


def test_long_steps_dequantize_a_slice_of_rows_at_a_time(monkeypatch):
    """Prefill (and the CPU) dequantize a few output rows at a time, never the whole weight: the
    result is the whole dequantized weight's matmul, bias included (to the last bits a matmul of
    another width may round differently)."""
    import engine.packed_linear as packed_linear
    from engine.packed_linear import PackedLinear
    parts = [_gguf("Q4_K", 8, 512, 1), _gguf("Q4_K", 4, 512, 2), _gguf("Q6_K", 4, 512, 3)]
    bias = torch.nn.Parameter(torch.randn(16), requires_grad=False)
    linear = PackedLinear(grouped_blocks(parts), bias)
    x = torch.randn(20, 512, generator=torch.Generator().manual_seed(1))
    whole = torch.nn.functional.linear(x, torch.cat([dequantize(p) for p in parts]), bias)
    torch.testing.assert_close(linear(x), whole, rtol=1e-6, atol=1e-5)  # a slice a block
    monkeypatch.setattr(packed_linear, "DEQUANT_CHUNK", 3 * 512)  # three rows a slice
    torch.testing.assert_close(linear(x), whole, rtol=1e-6, atol=1e-5)


@pytest.mark.parametrize("kind", list(BLOCKS))
def test_the_fit_estimate_counts_the_packed_bytes(kind):
    """engine/hub/fit.py's bits a weight of each GGUF type takes packed are what from_packed keeps."""
    from engine.hub.fit import PACKED_BITS

    g = from_packed([_gguf(kind, 16, 1024, 7)])
    assert g.nbytes * 8 / (16 * 1024) == pytest.approx(PACKED_BITS[kind], abs=1e-6)


ROWS_CASES = [c for c in KERNEL_CASES if not c[0].startswith("fp8")] + [
    ("awq g128 K384", [_int4("awq", 32, 384, 128)]), ("gguf Q8_0 K96", [_gguf("Q8_0", 8, 96, 10)]),
    ("gguf Q6_K K768", [_gguf("Q6_K", 8, 768, 9)]), ("gptq g64", [_int4("gptq", 24, 256, 64)]),
    # K split in four, four steps a lane: where a compiler free to fuse multiply-adds made the one-row
    # kernel's sums part from the others' (an 8B projection's shape)
    ("gguf Q4_K K4096", [_gguf("Q4_K", 32, 4096, 12)])]


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", ROWS_CASES, ids=[c[0] for c in ROWS_CASES])
def test_packed_rows_gemv_is_the_weights_times_x_rounded_and_batch_invariant(device, name, parts):
    """The int8 tensor-core GEMV (a quantized target with a draft loaded), every integer kind,
    several tiles, K split or not, with and without a bias: == the weights' exact values times x
    rounded to int8 per 32 inputs (float rounding apart: the odd input a step of rounding away where
    x * 127 / max|x| falls within an ulp of a half), within a few percent of the unrounded
    reference, and each row of a 5- or 16-row call has the bits of its 1-row call."""
    from engine.kernels.packed_rows import RowsTile, packed_rows_gemv, packed_rows_ref, rows_kernel_fits

    g = from_packed(parts).to(device)
    assert rows_kernel_fits(g)
    n, k = g.shape
    gen = torch.Generator().manual_seed(n + k + 7)
    x32 = torch.randn(16, k, generator=gen)
    x32[3, :40] = 0.0  # a chunk of zeros: its scale and its products stay finite
    x32[5] *= 1e-3  # rows of other sizes beside each other
    bias32 = torch.randn(n, generator=gen)
    w = dequantize_grouped(g).float()
    # the default tile; two lanes a column and K split in two; one lane, K split in four (a share
    # of vectors no multiple of the lanes where K is 96: 3 vectors, lanes past the share's end)
    cases = [(None, torch.float32, False), (RowsTile(8, 2, split_k=2, num_warps=1), torch.float32, True),
             (RowsTile(4, 8, split_k=1, num_warps=1), torch.bfloat16, False), (None, torch.bfloat16, True)]
    for tile, dtype, with_bias in cases:
        if device == "cuda" and dtype == torch.float32 or tile is not None and (k // 32) % tile.split_k:
            continue
        x, bias = x32.to(device, dtype), bias32.to(device, dtype) if with_bias else None
        got = packed_rows_gemv(x, g, bias, tile)
        assert got.shape == (16, n) and got.dtype == dtype
        assert torch.equal(packed_rows_gemv(x[:5], g, bias, tile), got[:5]), (name, tile)
        assert torch.equal(packed_rows_gemv(x[:2], g, bias, tile), got[:2]), (name, tile)
        for i in (0, 3, 5, 15):
            assert torch.equal(packed_rows_gemv(x[i:i + 1], g, bias, tile), got[i:i + 1]), (name, tile, i)
        b32 = None if bias is None else bias.float()
        want = packed_rows_ref(x.float(), g, b32)
        scale = want.abs().amax(dim=1, keepdim=True)
        err = (got.float() - want).abs() / scale
        close = 1e-5 if dtype == torch.float32 else 1e-2
        assert float((err <= close).float().mean()) >= 0.9 and float(err.max()) <= 3e-3 + close, (name, tile, dtype)
        plain = F.linear(x.float(), w, b32)
        assert bool(((got.float() - plain).abs() <= 0.05 * scale).all()), (name, tile, dtype)


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name,parts", KERNEL_CASES, ids=[c[0] for c in KERNEL_CASES])
def test_packed_embed_rows_equal_the_lookup_reference(device, name, parts):
    """packed_embed_rows (a packed table's lookup in one launch) gives PackedEmbedding's torch
    lookup bit for bit (in bf16 on the GPU, fp32 under the interpreter): ids in any order,
    repeated, the table's last row, 1 to 40 of them (blocks of 16 ids, the last partial), none."""
    from engine.kernels.packed_gemv import packed_embed_rows
    from engine.packed_linear import PackedEmbedding

    if name.startswith("fp8") and device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 needs compute capability 8.9")
    g = from_packed(parts).to(device)
    n, k = g.shape
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    table = PackedEmbedding(g, dtype)
    gen = torch.Generator().manual_seed(n + k)
    for t in (1, 3, 16, 40):
        ids = torch.randint(0, n, (t,), generator=gen)
        ids[0] = n - 1  # the table's last row
        if t > 1:
            ids[-1] = ids[0]  # a row twice
        ids = ids.to(device)
        got = packed_embed_rows(ids, g, dtype)
        assert got.shape == (t, k) and got.dtype == dtype
        assert torch.equal(got, table(ids)), (name, t)
        assert torch.equal(table(ids.view(1, t), kernel=True), table(ids.view(1, t))), (name, t)
    assert packed_embed_rows(ids[:0], g, dtype).shape == (0, k)


def test_a_packed_table_is_looked_up_by_our_kernel_where_the_gpu_kernels_run(monkeypatch):
    """Ops.lookup: a PackedEmbedding on the GPU kernels (Ops.routed) decodes its rows with
    packed_embed_rows (the default), under the step's PDL setting; off the GPU kernels, with
    LOCALCHAT_PACKED_EMBED=0, or for a plain nn.Embedding, the module's own lookup."""
    from engine.kernels import packed_gemv
    from engine.ops import Ops
    from engine.options import KernelOptions
    from engine.packed_linear import PackedEmbedding

    g = from_packed([_gguf("Q4_1", 8, 64, 0)])
    table = PackedEmbedding(g, torch.float32)
    plain = torch.nn.Embedding(8, 64)
    calls = []

    def spy(ids, weight, dtype, pdl=False):
        calls.append(pdl)
        return dequantize_grouped(weight).index_select(0, ids).to(dtype)

    monkeypatch.setattr(packed_gemv, "packed_embed_rows", spy)
    ids = torch.tensor([[7, 0, 7]])
    want = table(ids)
    assert want.shape == (1, 3, 64) and not calls
    default = KernelOptions.from_env({})
    for ops, used in ((Ops.for_device(torch.device("cpu"), default), []), (Ops.routed(default), [True]),
                      (Ops.routed(KernelOptions(pdl=False)), [False]),
                      (Ops.routed(KernelOptions.from_env({"LOCALCHAT_PACKED_EMBED": "0"})), [])):
        calls.clear()
        assert torch.equal(ops.lookup(table, ids), want)
        assert calls == used
        calls.clear()
        assert torch.equal(ops.lookup(plain, ids), plain(ids)) and not calls
