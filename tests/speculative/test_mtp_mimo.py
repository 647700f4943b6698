"""A checkpoint in the MiMo-7B Hub layout: the target ignores its MTP layers, the draft uses them."""

import json

import pytest
import torch
from safetensors.torch import load_file

from engine.engine import Engine
from engine.errors import UserError
from engine.types import SamplingParams
from tests.speculative.mtp_layers import make_mimo
from tests.tiny import make_tiny_model

PROMPT = [{"role": "user", "content": "Hello, how are you today?"}]


@pytest.fixture(scope="module")
def mimo(tmp_path_factory):
    return make_mimo(make_tiny_model(tmp_path_factory.mktemp("mimo") / "mimo", "qwen2", num_layers=2, seed=9))


def _tokens(engine, speculative, n=128):
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    events = list(engine.stream_ids(ids, SamplingParams(max_tokens=n), speculative=speculative))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


def test_mimo_target_loads_without_its_mtp_layers(mimo):
    e = Engine.load(str(mimo), device="cpu")
    assert e.runner.config.architecture == "MiMoForCausalLM" and not e.has_draft
    assert e.runner.model.model.layers[0].self_attn.qkv_proj.bias is not None  # Qwen2: q/k/v bias
    assert e.runner.model.model.layers[0].self_attn.o_proj.bias is None


@pytest.mark.parametrize("draft", ["mtp:builtin", "the folder"])
def test_mimo_builtin_mtp_decodes_losslessly(mimo, draft):
    e = Engine.load(str(mimo), draft=str(mimo) if draft == "the folder" else draft, device="cpu")
    e.tokenizer.eos_token_ids = frozenset()
    spec = e.speculator
    assert spec.config.format == "mimo" and spec.config.num_layers == 1 and spec.k == 1
    index = json.loads((mimo / "model.safetensors.index.json").read_text())["weight_map"]
    shard = load_file(str(mimo / index["model.mtp_layers.0.input_proj.weight"]))
    layer = spec.draft.mtp_layers[0]
    assert torch.equal(layer.input_proj.weight, shard["model.mtp_layers.0.input_proj.weight"])
    assert torch.equal(layer.hidden_layernorm.weight, shard["model.mtp_layers.0.hidden_layernorm.weight"])
    kv = shard["model.mtp_layers.0.self_attn.k_proj.bias"]
    q = shard["model.mtp_layers.0.self_attn.q_proj.bias"].shape[0]
    assert torch.equal(layer.self_attn.qkv_proj.bias[q:q + kv.shape[0]], kv)
    plain, _ = _tokens(e, False)
    spec_out, stats = _tokens(e, True)
    assert spec_out == plain and stats.verify_steps > 0


def test_mimo_layout_reads_hidden_first(mimo):
    """MiMo's input_proj reads [hidden_layernorm(h), token_layernorm(e)]: zeroing its first half
    makes the layer blind to the incoming state."""
    e = Engine.load(str(mimo), draft="mtp:builtin", device="cpu")
    layer = e.speculator.draft.mtp_layers[0]
    H = layer.input_proj.weight.shape[0]
    layer.input_proj.weight[:, :H] = 0
    from engine.forward_batch import ForwardBatch
    from engine.kv_cache import KVCache

    ids = torch.tensor([5, 6, 7])
    spec = e.speculator
    outs = []
    for h in (torch.randn(3, H), torch.randn(3, H)):
        kv = KVCache(1, 64, spec.config.num_kv_heads, spec.config.head_dim, torch.float32, "cpu")
        outs.append(spec.draft.step(0, ids, h, ForwardBatch.eager(ids, 1), spec.embed, kv, spec.cos_sin)[1])
    assert torch.allclose(outs[0], outs[1])


def test_builtin_mtp_needs_mtp_layers(tmp_path):
    plain = make_tiny_model(tmp_path / "q", "qwen2")
    with pytest.raises(UserError, match="ships no MTP layers"):
        Engine.load(str(plain), draft="mtp:builtin", device="cpu")
