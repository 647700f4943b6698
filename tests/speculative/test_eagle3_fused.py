"""The EAGLE-3 layer with the GPU kernels (Eagle3Layer.fused_forward) equals the torch layer.

CUDA tests are marked gpu; on CPU they run through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone: it sets TRITON_INTERPRET=1 for the process).
"""

from __future__ import annotations

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"

from engine.config import ModelConfig  # noqa: E402
from engine.kv_cache import KVCache  # noqa: E402
from engine.rope import rope_cos_sin  # noqa: E402
from speculative.config import DraftConfig  # noqa: E402
from speculative.eagle3 import Eagle3Draft  # noqa: E402
from speculative.train_export import head_config  # noqa: E402

CUDA = pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")])
CPU = pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)"))

# SmolLM2-135M's shape: hidden 576, 9 heads of 64, 3 KV heads.
TARGET = ModelConfig(architecture="LlamaForCausalLM", vocab_size=512, hidden_size=576, intermediate_size=1536,
                     num_layers=30, num_heads=9, num_kv_heads=3, head_dim=64, max_position_embeddings=2048)


def _ops():
    from engine.kernels.activation import silu_and_mul
    from engine.kernels.attention import decode_attention
    from engine.kernels.norm import add_rms_norm
    from engine.kernels.rope import rope_and_cache
    from engine.ops import Ops

    return Ops(add_rms_norm, silu_and_mul, rope_and_cache, decode_attention)


@pytest.mark.parametrize("device", [CUDA, CPU])
@pytest.mark.parametrize("norm_before_residual", [False, True])
def test_fused_draft_step_equals_torch(device, norm_before_residual):
    dev = torch.device(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    cfg = head_config(TARGET, 256, (2, 15, 27))
    cfg["norm_before_residual"] = norm_before_residual
    dc = DraftConfig.from_hf(cfg, TARGET)
    max_len = 256
    torch.manual_seed(0)
    drafts = []
    for ops in (_ops(), None):
        d = Eagle3Draft(dc, TARGET, max_len, ops)
        drafts.append(d)
    with torch.no_grad():
        for p in drafts[1].parameters():
            p.normal_(0, 0.05)
        for n, p in drafts[1].named_parameters():
            if n.endswith("norm.weight"):
                p.add_(1.0)
        drafts[0].load_state_dict(drafts[1].state_dict())
    drafts = [d.to(dev, dtype).eval() for d in drafts]
    for d in drafts:
        d.cos_sin = rope_cos_sin(dc.layer_config(TARGET), max_len).to(dev)
    assert drafts[0].fused and not drafts[1].fused
    assert drafts[0].midlayer.norm_before_residual == norm_before_residual
    embed = torch.nn.Embedding(TARGET.vocab_size, TARGET.hidden_size).to(dev, dtype)
    caches = [KVCache(1, max_len, dc.num_kv_heads, dc.head_dim, dtype, dev) for _ in drafts]
    g = torch.Generator().manual_seed(1)
    # Extend over 12 positions, then three chained single-token steps.
    ids = torch.randint(0, TARGET.vocab_size, (12,), generator=g).to(dev)
    aux = (torch.randn(12, 3 * TARGET.hidden_size, generator=g) * 0.5).to(dev, dtype)
    pos = torch.arange(12, device=dev)
    outs = []
    with torch.inference_mode():
        for d, kv in zip(drafts, caches):
            logits, hidden = d(ids, pos, aux, True, embed, kv, start_pos=0)
            steps = [(logits, hidden)]
            for s in range(3):
                tok = torch.tensor([s + 3], device=dev)
                p = torch.tensor([12 + s], device=dev)
                logits, hidden = d(tok, p, hidden[-1:], False, embed, kv, start_pos=12 + s)
                steps.append((logits, hidden))
            outs.append(steps)
    tol = dict(atol=3e-2, rtol=3e-2) if dtype == torch.bfloat16 else dict(atol=2e-3, rtol=2e-3)
    for (lf, hf), (lt, ht) in zip(*outs):
        torch.testing.assert_close(hf.float(), ht.float(), **tol)
        scale = lt.abs().max()
        assert (lf - lt).abs().max() <= 0.03 * scale
    # The cache rows written by both agree too.
    torch.testing.assert_close(caches[0].k[0][:15].float(), caches[1].k[0][:15].float(), **tol)
    torch.testing.assert_close(caches[0].v[0][:15].float(), caches[1].v[0][:15].float(), **tol)
