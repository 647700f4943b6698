"""Fixtures for Hub tests: tiny real model folders, the fake Hub, and huggingface_hub pointed at it.

Import the fixtures into a test module: `from tests.hub_fixtures import fake_hub, hub_env  # noqa: F401`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.hub_server import FakeHub, FakeRepo

CHAT_TEMPLATE = (
    "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}</s>{% endfor %}"
    "{% if add_generation_prompt %}<s>assistant:{% endif %}"
)


def _st_bytes(tensors: dict[str, np.ndarray]) -> bytes:
    from safetensors.numpy import save

    return save(tensors, metadata={"format": "pt"})


def tokenizer_files(vocab_size: int) -> dict[str, bytes]:
    """A word-level tokenizer with exactly `vocab_size` tokens, and its config with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    specials = ["<unk>", "<s>", "</s>"]
    words = ["hello", "world", "the", "a", "is", ":", "user", "assistant", "system", "."]
    vocab = specials + words + [f"w{i}" for i in range(vocab_size - len(specials) - len(words))]
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "chat_template": CHAT_TEMPLATE, "model_max_length": 512}
    return {"tokenizer.json": tok.to_str().encode(), "tokenizer_config.json": json.dumps(config).encode()}


def tiny_llama_files(vocab: int = 256, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2,
                     inter: int = 128, seed: int = 0) -> dict[str, bytes]:
    """A Llama checkpoint with random weights, in two safetensors shards with an index."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {"model.embed_tokens.weight": w(vocab, hidden), "model.norm.weight": np.ones(hidden, np.float32),
               "lm_head.weight": w(vocab, hidden)}
    for i in range(layers):
        p = f"model.layers.{i}."
        tensors |= {
            p + "input_layernorm.weight": np.ones(hidden, np.float32),
            p + "post_attention_layernorm.weight": np.ones(hidden, np.float32),
            p + "self_attn.q_proj.weight": w(heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": w(kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": w(hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": w(inter, hidden),
            p + "mlp.up_proj.weight": w(inter, hidden),
            p + "mlp.down_proj.weight": w(hidden, inter),
        }
    names = sorted(tensors)
    shards = {"model-00001-of-00002.safetensors": names[: len(names) // 2],
              "model-00002-of-00002.safetensors": names[len(names) // 2:]}
    files = {shard: _st_bytes({n: tensors[n] for n in ns}) for shard, ns in shards.items()}
    index = {"metadata": {"total_size": sum(t.nbytes for t in tensors.values())},
             "weight_map": {n: shard for shard, ns in shards.items() for n in ns}}
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
              "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
              "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
              "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float32"}
    return files | tokenizer_files(vocab) | {
        "model.safetensors.index.json": json.dumps(index).encode(),
        "config.json": json.dumps(config).encode(),
        "generation_config.json": json.dumps({"bos_token_id": 1, "eos_token_id": 2}).encode(),
        "README.md": b"# tiny llama\n",
        "pytorch_model.bin": b"pickled weights we must never fetch",
        "original/consolidated.pth": b"not needed",
    }


def tiny_eagle3_files(target_vocab: int = 256, hidden: int = 64, heads: int = 4, kv_heads: int = 2,
                      inter: int = 128, draft_vocab: int = 64, seed: int = 1) -> dict[str, bytes]:
    """An EAGLE-3 head in the official format: one layer reading 3 target layers, reduced vocabulary."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads

    def w(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    tensors = {
        "fc.weight": w(hidden, 3 * hidden),
        "midlayer.input_layernorm.weight": np.ones(hidden, np.float32),
        "midlayer.hidden_norm.weight": np.ones(hidden, np.float32),
        "midlayer.post_attention_layernorm.weight": np.ones(hidden, np.float32),
        "midlayer.self_attn.q_proj.weight": w(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": w(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": w(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": w(inter, hidden),
        "midlayer.mlp.up_proj.weight": w(inter, hidden),
        "midlayer.mlp.down_proj.weight": w(hidden, inter),
        "norm.weight": np.ones(hidden, np.float32),
        "lm_head.weight": w(draft_vocab, hidden),
        "d2t": np.zeros(draft_vocab, np.int64),
        "t2d": np.arange(target_vocab) < draft_vocab,
    }
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": target_vocab,
              "draft_vocab_size": draft_vocab, "hidden_size": hidden, "intermediate_size": inter,
              "num_hidden_layers": 1, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
              "max_position_embeddings": 512, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "torch_dtype": "float32"}
    return {"model.safetensors": _st_bytes(tensors), "config.json": json.dumps(config).encode()}


@pytest.fixture(scope="session")
def fake_hub():
    hub = FakeHub()
    hub.add(FakeRepo("tiny/llama", tiny_llama_files()))
    hub.add(FakeRepo("tiny/gated-llama", tiny_llama_files(seed=3), gated=True))
    hub.add(FakeRepo("tiny/llama-eagle3", tiny_eagle3_files()))
    hub.add(FakeRepo("tiny/wide-eagle3", tiny_eagle3_files(hidden=96, heads=4)))
    hub.add(FakeRepo("tiny/no-weights", {"config.json": b"{}", "README.md": b"empty"}))
    pickled = {k: v for k, v in tiny_eagle3_files().items() if k == "config.json"}
    hub.add(FakeRepo("tiny/bin-only-eagle3", pickled | {"pytorch_model.bin": b"\x80\x02pickled head"}))
    hub.start()
    yield hub
    hub.stop()


@pytest.fixture
def hub_env(fake_hub, tmp_path, monkeypatch):
    """huggingface_hub talks to the fake Hub with a fresh HF_HOME; returns the cache folder."""
    from huggingface_hub import constants, hf_api

    from engine.hub import transfer as hub_transfer

    home = tmp_path / "hf_home"
    for var in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_CACHE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_ENDPOINT", fake_hub.url)
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "localchat"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setattr(constants, "ENDPOINT", fake_hub.url)
    monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", fake_hub.url + "/{repo_id}/resolve/{revision}/{filename}")
    monkeypatch.setattr(constants, "HF_HOME", str(home))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(home / "token"))
    monkeypatch.setattr(constants, "HF_STORED_TOKENS_PATH", str(home / "stored_tokens"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    # Module-level helpers such as huggingface_hub.whoami (used by login) are bound to one HfApi
    # made at import, with the endpoint of that moment: an earlier test that imported it (through
    # transformers, say) would send them to the real Hub.
    monkeypatch.setattr(hf_api.api, "endpoint", fake_hub.url)
    # a dropped transfer is resumed after a wait; not in tests
    monkeypatch.setattr(hub_transfer, "RETRY_DELAYS_S", (0.0,) * len(hub_transfer.RETRY_DELAYS_S))
    fake_hub.reset()
    yield Path(home / "hub")
    fake_hub.reset()


def cache_files(cache: Path) -> list[str]:
    """Every file under the cache (blobs, snapshots, temporaries), relative, for 'nothing half-written' checks."""
    if not cache.exists():
        return []
    return sorted(str(p.relative_to(cache)) for p in cache.rglob("*") if p.is_file() or p.is_symlink())
