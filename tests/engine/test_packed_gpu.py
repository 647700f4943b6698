"""On a GPU: a quantized checkpoint loaded packed (LOCALCHAT_PACKED_WEIGHTS=1) decodes through
packed_gemv, close to the same checkpoint dequantized to bf16, and greedy speculation over the packed
target (a draft loaded: the batch-invariant kernels) gives plain decoding's tokens."""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def test_a_packed_target_decodes_and_speculates_like_plain_decoding(tmp_path):
    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.packed_linear import PackedLinear
    from engine.types import SamplingParams
    from tests.tiny_quant import awq_target_with_head

    target, head = awq_target_with_head(tmp_path)
    prompt = list(range(3, 40))

    def tokens(engine, speculative=None):
        engine.tokenizer.eos_token_ids = frozenset()
        return [t for ev in engine.stream_ids(prompt, SamplingParams(max_tokens=48), speculative=speculative)
                for t in ev.token_ids]

    packed = Engine.load(str(target), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True))
    assert packed.runs_as == "AWQ-int4-g64"
    assert isinstance(packed.runner.model.model.layers[0].self_attn.qkv_proj, PackedLinear)
    plain = tokens(packed, speculative=False)
    assert tokens(packed, speculative=True) == plain
    dense = Engine.load(str(target), device="cuda", options=KernelOptions(packed_weights=False))
    assert dense.runs_as == "bf16"
    x = torch.randn(5, 128, device="cuda", dtype=torch.bfloat16)
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        xin = x if name != "mlp.down_proj" else torch.randn(5, b.in_features, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(a(xin).float(), b(xin).float(), atol=3e-2, rtol=3e-2)
