"""A tiny GGUF file for tests: a tiny Llama from tests/tiny.py written as llama.cpp would (F32, gpt2 tokenizer)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.tiny import CHAT_TEMPLATE, make_tiny_model

_LAYER = {"self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
          "self_attn.o_proj": "attn_output", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
          "mlp.down_proj": "ffn_down", "input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_GLOBAL = {"model.embed_tokens": "token_embd", "model.norm": "output_norm", "lm_head": "output"}


def _gguf_name(hf_name: str) -> str:
    stem, _, leaf = hf_name.rpartition(".")
    if stem in _GLOBAL:
        return f"{_GLOBAL[stem]}.{leaf}"
    _, _, layer, rest = stem.split(".", 3)
    return f"blk.{layer}.{_LAYER[rest]}.{leaf}"


def _permute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp's interleaved row order of the Llama q/k projections (engine/weights/gguf.py undoes it)."""
    return w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def make_tiny_gguf(path: Path, work: Path) -> Path:
    """Writes `path`, a GGUF of a random 2-layer Llama (hidden 64) with its byte-level BPE
    tokenizer and chat template; `work` is a scratch folder for the HF checkpoint."""
    import gguf
    from safetensors.numpy import load_file

    folder = make_tiny_model(Path(work) / "hf", "llama", rope_scaling=None)
    cfg = json.loads((folder / "config.json").read_text())
    tok = json.loads((folder / "tokenizer.json").read_text())
    vocab = sorted(tok["model"]["vocab"].items(), key=lambda kv: kv[1])
    for added in tok["added_tokens"]:
        assert vocab[added["id"]][0] == added["content"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in tok["model"]["merges"]]
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_tokenizer_model("gpt2")
    w.add_token_list([t for t, _ in vocab])
    w.add_token_types([3 if i in special else 1 for i in range(len(vocab))])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"])
    w.add_chat_template(CHAT_TEMPLATE)
    for name, arr in load_file(str(folder / "model.safetensors")).items():
        if name.endswith("q_proj.weight"):
            arr = _permute(arr, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            arr = _permute(arr, cfg["num_key_value_heads"])
        w.add_tensor(_gguf_name(name), np.ascontiguousarray(arr, dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
