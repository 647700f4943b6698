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
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import make_tiny_model, read_config
    from tests.tiny_quant import quantized_folder

    src = make_tiny_model(tmp_path / "float", "llama", num_layers=3, hidden=128, seed=5)
    awq = {"quant_method": "awq", "bits": 4, "group_size": 64, "zero_point": True, "version": "gemm"}
    quantized_folder(src, tmp_path / "awq", "awq", awq, group_size=64)
    cfg = read_config(src)
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(128, 128, 3, cfg["vocab_size"], 200, seed=1),
                      128, (1, 2, 3))
    prompt = list(range(3, 40))

    def tokens(engine, speculative=None):
        engine.tokenizer.eos_token_ids = frozenset()
        return [t for ev in engine.stream_ids(prompt, SamplingParams(max_tokens=48), speculative=speculative)
                for t in ev.token_ids]

    packed = Engine.load(str(tmp_path / "awq"), draft=str(head), device="cuda", draft_steps=3,
                         options=KernelOptions(packed_weights=True))
    assert packed.runs_as == "AWQ-int4-g64"
    assert isinstance(packed.runner.model.model.layers[0].self_attn.qkv_proj, PackedLinear)
    plain = tokens(packed, speculative=False)
    assert tokens(packed, speculative=True) == plain
    dense = Engine.load(str(tmp_path / "awq"), device="cuda", options=KernelOptions(packed_weights=False))
    assert dense.runs_as == "bf16"
    x = torch.randn(5, 128, device="cuda", dtype=torch.bfloat16)
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        a = packed.runner.model.model.layers[1].get_submodule(name)
        b = dense.runner.model.model.layers[1].get_submodule(name)
        xin = x if name != "mlp.down_proj" else torch.randn(5, b.in_features, device="cuda", dtype=torch.bfloat16)
        torch.testing.assert_close(a(xin).float(), b(xin).float(), atol=3e-2, rtol=3e-2)
