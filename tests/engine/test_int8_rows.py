"""engine/weights/int8_rows.py: int8 rows with a scale each, widened on load."""

import pytest
import torch

from engine.errors import ModelLoadError
from engine.weights.int8_rows import widen_rows, quantize_rows, widen_int8_rows


def test_rows_round_trip_within_half_a_step():
    w = torch.randn(40, 24, generator=torch.Generator().manual_seed(0)) * torch.linspace(0.01, 3, 40)[:, None]
    w[7] = 0.0  # a row of zeros stays zeros
    q, scale = quantize_rows(w)
    assert q.dtype == torch.int8 and scale.shape == (40,) and int(q.abs().max()) == 127
    back = widen_rows(q, scale)
    assert ((back - w).abs() <= scale[:, None] / 2 + 1e-6).all()
    assert torch.equal(back[7], torch.zeros(24))


def test_widening_pairs_a_weight_with_its_scale_in_either_order():
    w = torch.randn(6, 8)
    q, scale = quantize_rows(w)
    other = torch.ones(3)
    for order in ([("a.weight", q), ("a.weight_scale", scale)], [("a.weight_scale", scale), ("a.weight", q)]):
        out = dict(widen_int8_rows([("b", other), *order], "head"))
        assert set(out) == {"a.weight", "b"} and torch.equal(out["a.weight"], widen_rows(q, scale))
    column = dict(widen_int8_rows([("a.weight", q), ("a.weight_scale", scale[:, None])], "head"))
    assert torch.equal(column["a.weight"], widen_rows(q, scale))  # a (rows, 1) scale, channel-wise
    # another format's scale (no int8 weight beside it) passes through for the loader to judge
    fp8 = dict(widen_int8_rows([("c.weight", w.to(torch.bfloat16)), ("c.weight_scale", scale[:, None])], "head"))
    assert set(fp8) == {"c.weight", "c.weight_scale"} and fp8["c.weight_scale"].shape == (6, 1)


@pytest.mark.parametrize("tensors,says", [
    ([("a.weight", torch.zeros(4, 2, dtype=torch.int8))], "head: a.weight is int8 without its a.weight_scale"),
    ([("a.weight", torch.zeros(4, 2, dtype=torch.int8)), ("a.weight_scale", torch.ones(3))],
     "head: a.weight_scale holds 3 scales for 4 int8 rows"),
])
def test_a_half_without_the_other_is_refused_in_one_line(tensors, says):
    with pytest.raises(ModelLoadError, match=says):
        list(widen_int8_rows(tensors, "head"))
