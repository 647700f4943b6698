"""AWQ, GPTQ and FP8 references equal the formats' documented formulas, on words packed by
tests/tiny_quant.py's packers (written from AutoAWQ's and AutoGPTQ's own pack loops)."""

import numpy as np
import pytest
import torch

from engine.errors import ModelLoadError
from engine.weights.int4 import AWQ_ORDER, unpack_along_k, unpack_along_n
from engine.weights.packed import awq_weight, dequantize, fp8_weight, gptq_weight
from tests.tiny_quant import (AWQ_ORDER_MAP, awq_tensors, fp8_tensors, gptq_tensors, int4_weight, pack_awq,
                              pack_gptq_cols, pack_gptq_rows)

N, K = 48, 256


def _t(a: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(a))


def _weight(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((N, K)) * 0.05 + rng.uniform(-0.02, 0.02, size=(N, 1))).astype(np.float32)


def test_the_packers_put_the_nibbles_where_the_formats_say():
    values = np.arange(16, dtype=np.int64).reshape(1, 16) % 16  # columns 0..15 hold 0..15
    word = int(pack_awq(values)[0, 0].view(np.uint32))
    assert [(word >> (4 * i)) & 0xF for i in range(8)] == [0, 2, 4, 6, 1, 3, 5, 7]  # AutoAWQ's order_map
    assert list(AWQ_ORDER) == AWQ_ORDER_MAP
    assert unpack_along_n(_t(pack_awq(values)), interleaved=True).tolist() == values.tolist()
    assert unpack_along_n(_t(pack_gptq_cols(values))).tolist() == values.tolist()
    rows = np.arange(16, dtype=np.int64).reshape(16, 1)
    assert int(pack_gptq_rows(rows)[0, 0]) == 0x76543210  # rows 0..7, row 0 in the low bits
    assert unpack_along_k(_t(pack_gptq_rows(rows))).tolist() == rows.tolist()


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
def test_awq_equals_its_formula(group_size):
    arrays, meant = awq_tensors(_weight(group_size + 7), group_size)
    packed = awq_weight(_t(arrays["qweight"]), _t(arrays["qzeros"]), _t(arrays["scales"]), group_size, "test")
    assert packed.shape == (N, K) and packed.group_size == (K if group_size == -1 else group_size)
    assert torch.equal(dequantize(packed), _t(meant))
    assert torch.allclose(dequantize(packed), _t(_weight(group_size + 7)), atol=0.02)


@pytest.mark.parametrize("group_size", [32, 64, 128, -1])
@pytest.mark.parametrize("sym,v2", [(True, False), (False, False), (True, True), (False, True)])
def test_gptq_equals_its_formula(group_size, sym, v2):
    arrays, meant = gptq_tensors(_weight(group_size + 11), group_size, sym=sym, v2=v2)
    packed = gptq_weight(_t(arrays["qweight"]), _t(arrays["qzeros"]), _t(arrays["scales"]), _t(arrays["g_idx"]),
                         group_size, zero_offset=0 if v2 else 1, where="test")
    assert torch.equal(dequantize(packed), _t(meant))


def test_gptq_symmetric_zeros_are_stored_as_seven_in_the_original_format():
    arrays, _ = gptq_tensors(_weight(3), 128, sym=True, v2=False)
    assert (arrays["qzeros"].view(np.uint32) == 0x77777777).all()


def test_gptq_act_order_is_refused_in_one_line():
    arrays, _ = gptq_tensors(_weight(4), 128, sym=True, v2=False)
    g_idx = np.random.default_rng(0).permutation(arrays["g_idx"])
    with pytest.raises(ModelLoadError, match="act-order") as e:
        gptq_weight(_t(arrays["qweight"]), _t(arrays["qzeros"]), _t(arrays["scales"]), _t(g_idx), 128, 1,
                    "m: model.layers.0.mlp.up_proj")
    assert "\n" not in str(e.value) and "model.layers.0.mlp.up_proj.g_idx" in str(e.value)


def test_inconsistent_shapes_are_refused_naming_the_tensor():
    arrays, _ = awq_tensors(_weight(5), 64)
    with pytest.raises(ModelLoadError, match=r"m: q_proj.qzeros has shape \(2, 6\), expected \(4, 6\)"):
        awq_weight(_t(arrays["qweight"]), _t(arrays["qzeros"][:2]), _t(arrays["scales"]), 64, "m: q_proj")
    with pytest.raises(ModelLoadError, match="not a whole number of groups of 128"):
        awq_weight(_t(arrays["qweight"][:192]), _t(arrays["qzeros"]), _t(arrays["scales"]), 128, "m: q_proj")


@pytest.mark.parametrize("per_channel", [False, True])
def test_fp8_equals_weight_times_scale(per_channel):
    w = torch.from_numpy(_weight(6))
    parts, meant = fp8_tensors(w, per_channel)
    scale = parts["weight_scale"].reshape(-1) if per_channel else parts["weight_scale"]  # (N,) is taken too
    packed = fp8_weight(parts["weight"], scale, "test")
    ours = dequantize(packed)
    assert torch.equal(ours, parts["weight"].float() * parts["weight_scale"]) and torch.equal(ours, meant)
    assert torch.allclose(ours, w, atol=0.01, rtol=0.07)


def test_fp8_refuses_a_grid_of_scales_its_config_names_no_block_for_and_other_dtypes():
    w8 = torch.zeros(N, K, dtype=torch.float8_e4m3fn)
    with pytest.raises(ModelLoadError, match=r"expected one scale per tensor or one per output channel"):
        fp8_weight(w8, torch.ones(N // 16, K // 128), "m: o_proj")
    with pytest.raises(ModelLoadError, match=r"weight_scale_inv has shape \(2, 2\): expected a \(1, 2\) grid"):
        fp8_weight(w8, torch.ones(2, 2), "m: o_proj", (128, 128), "weight_scale_inv")
    with pytest.raises(ModelLoadError, match="float8_e4m3fn"):
        fp8_weight(w8.to(torch.float8_e5m2), torch.ones(()), "m: o_proj")


def test_int4_formula_by_hand():
    """The formula the tests hold the engine to, on numbers one can check: (q - zero) * scale."""
    q = np.tile(np.array([0, 15, 8, 3] * 8).reshape(32, 1), (1, 8))  # (K, N) = (32, 8)
    w = int4_weight(q, np.full((1, 8), 8), np.full((1, 8), 0.5, dtype=np.float16), 32)
    assert w.shape == (8, 32) and w[0, :4].tolist() == [-4.0, 3.5, 0.0, -2.5]
