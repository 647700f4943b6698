"""packed_gemv with the norm or the activation inside its launch (KernelOptions.packed_prologue):
the same values as the launches it replaces, the stream stored once, and each row's bits its own.
On the CPU under Triton's interpreter (LOCALCHAT_TRITON_INTERPRET=1), and on a GPU."""

from __future__ import annotations

import os

import pytest
import torch

from engine.weights.grouped import dequantize_grouped
from tests.engine.test_grouped_weights import _gguf, _int4

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1"
CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                                        reason="needs CUDA")])
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1"))

# K = 576 takes the short-K tile (K in six shares); 512 the other rule; AWQ's groups of 128
CASES = {"Q4_1 K=576": lambda: [_gguf("Q4_1", 40, 576, 1)],
         "Q4_K + Q6_K K=512": lambda: [_gguf("Q4_K", 24, 512, 2), _gguf("Q6_K", 8, 512, 3)],
         "AWQ g128 K=1024": lambda: [_int4("awq", 32, 1024, 128)]}


def _linear(parts, device):
    from engine.packed_linear import PackedLinear
    from engine.weights.grouped import grouped_blocks

    return PackedLinear([b.to(device) for b in grouped_blocks(parts)])


def _dtype(device):
    return torch.bfloat16 if device == "cuda" else torch.float32


def _norm_ref(x, residual, weight, eps):
    """add_rms_norm's values: the stream rounded, normed, rounded, times the weight, rounded."""
    h = x if residual is None else (x.float() + residual.float()).to(x.dtype)
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype).float()
    return (normed * weight.float()).to(x.dtype), h


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("with_residual", [True, False])
def test_the_norm_inside_equals_the_norm_then_the_projection(device, name, with_residual):
    linear = _linear(CASES[name](), device)
    k, dtype = linear.in_features, _dtype(device)
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(16, k, generator=gen).to(device, dtype)
    res = torch.randn(16, k, generator=gen).to(device, dtype) if with_residual else None
    weight = (1 + 0.1 * torch.randn(k, generator=gen)).to(device, dtype)
    got, stream = linear.norm_forward(x, res, weight, 1e-5)
    normed, h = _norm_ref(x, res, weight, 1e-5)
    assert torch.equal(stream, h)  # the stream, stored once, exactly x + residual rounded
    want = torch.nn.functional.linear(normed, torch.cat([dequantize_grouped(b).to(dtype) for b in linear.blocks]))
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got.float(), want.float(), **tol)
    # each row's bits its own: the 16-row call's rows are the 1-row calls'
    for i in (0, 7, 15):
        one, one_stream = linear.norm_forward(x[i:i + 1], None if res is None else res[i:i + 1], weight, 1e-5)
        assert torch.equal(one, got[i:i + 1]) and torch.equal(one_stream, stream[i:i + 1]), i


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("name", list(CASES))
def test_the_activation_inside_equals_the_activation_then_the_projection(device, name):
    from engine.kernels.activation import silu_and_mul
    from engine.kernels.packed_gemv import packed_gemv

    linear = _linear(CASES[name](), device)
    k, dtype = linear.in_features, _dtype(device)
    gate_up = torch.randn(16, 2 * k, generator=torch.Generator().manual_seed(6)).to(device, dtype)
    got = linear.silu_forward(gate_up)
    act = silu_and_mul(gate_up, pdl=False)
    # the launches it replaces: silu_and_mul's, then the projection's
    apart = torch.cat([packed_gemv(act, b) for b in linear.blocks], dim=1)
    assert torch.equal(got, apart)  # the same values, rounded alike, summed in the same order
    for i in (0, 9):
        assert torch.equal(linear.silu_forward(gate_up[i:i + 1]), got[i:i + 1]), i


def test_the_option_picks_the_prologue_set_for_a_quantized_layers_invariant_steps():
    import dataclasses

    from engine.layer_kernels import PackedPrologueLayerKernels
    from engine.options import KernelOptions

    assert not KernelOptions().packed_prologue
    assert KernelOptions.from_env({"LOCALCHAT_PACKED_PROLOGUE": "1"}).packed_prologue
    opts = dataclasses.replace(KernelOptions(), packed_prologue=True)
    assert isinstance(PackedPrologueLayerKernels(opts, lambda x, linear, role: x), PackedPrologueLayerKernels)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_packed_target_with_the_prologue_speculates_like_plain_decoding(tmp_path, monkeypatch):
    """The whole engine with packed_prologue on: greedy speculation over the packed target gives its
    plain decoding's tokens, and its steps did run the norms and activations inside."""
    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear
    from tests.engine.test_packed_gpu import tokens
    from tests.tiny_quant import awq_target_with_head

    calls = []

    def counted(name, method):
        def run(self, *args, **kwargs):
            calls.append(name)
            return method(self, *args, **kwargs)
        return run

    monkeypatch.setattr(PackedLinear, "norm_forward", counted("norm", PackedLinear.norm_forward))
    monkeypatch.setattr(PackedLinear, "silu_forward", counted("silu", PackedLinear.silu_forward))
    target, head = awq_target_with_head(tmp_path)
    engine = Engine.load(str(target), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True, packed_prologue=True))
    plain = tokens(engine, speculative=False)
    assert tokens(engine, speculative=True) == plain
    assert "norm" in calls and "silu" in calls
