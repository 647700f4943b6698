"""GGUF files: model config from metadata, tensors renamed to Hugging Face names and dequantized."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from .errors import ModelLoadError

# GGUF architecture -> the Hugging Face class we build for it.
_ARCHITECTURES = {"llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}

_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
}
_GLOBAL_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def open_gguf(path: Path):
    import gguf

    try:
        return gguf.GGUFReader(str(path))
    except Exception as e:  # the reader raises bare ValueError/struct errors on bad files
        from .hub_cache import repair_hint

        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(
            f"{path} is not a readable GGUF file: {first} (file truncated or corrupt?); {repair_hint(path)}"
        ) from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def hf_config(reader, path: Path) -> dict:
    """A `config.json`-style dict built from the GGUF metadata."""
    arch = _field(reader, "general.architecture")
    if arch not in _ARCHITECTURES:
        raise ModelLoadError(f"{path.name}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(_ARCHITECTURES)})")
    names = {t.name for t in reader.tensors}
    heads = _field(reader, f"{arch}.attention.head_count")
    hidden = _field(reader, f"{arch}.embedding_length")
    vocab = _field(reader, f"{arch}.vocab_size") or len(reader.fields["tokenizer.ggml.tokens"].data)
    cfg = {
        "architectures": [_ARCHITECTURES[arch]],
        "vocab_size": int(vocab),
        "hidden_size": int(hidden),
        "intermediate_size": int(_field(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_field(reader, f"{arch}.block_count")),
        "num_attention_heads": int(heads),
        "num_key_value_heads": int(_field(reader, f"{arch}.attention.head_count_kv", heads)),
        "head_dim": int(_field(reader, f"{arch}.attention.key_length", hidden // heads)),
        "rms_norm_eps": float(_field(reader, f"{arch}.attention.layer_norm_rms_epsilon", 1e-6)),
        "rope_theta": float(_field(reader, f"{arch}.rope.freq_base", 10000.0)),
        "max_position_embeddings": int(_field(reader, f"{arch}.context_length", 4096)),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _field(reader, "tokenizer.ggml.bos_token_id"),
        "eos_token_id": _field(reader, "tokenizer.ggml.eos_token_id"),
    }
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": float(_field(reader, f"{arch}.rope.scaling.factor", 1.0)),
                               "original_max_position_embeddings":
                                   int(_field(reader, f"{arch}.rope.scaling.original_context_length", 0)) or None}
    return cfg


def hf_name(gguf_name: str) -> str | None:
    stem, _, leaf = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{leaf}"
    return None


def _unpermute(w: np.ndarray, n_heads: int) -> np.ndarray:
    """llama.cpp stores Llama q/k rows interleaved per head; restore the HF half-split order."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def iter_gguf_tensors(reader, cfg: dict, path: Path) -> Iterator[tuple[str, torch.Tensor]]:
    import gguf

    is_llama = _field(reader, "general.architecture") in ("llama", "mistral")
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            yield t.name, torch.empty(0)  # reported as unexpected by the loader
            continue
        try:
            arr = gguf.quants.dequantize(t.data, t.tensor_type)
        except NotImplementedError:
            raise ModelLoadError(f"{path.name}: tensor {t.name} uses GGUF type {t.tensor_type.name}, "
                                 "which this version cannot dequantize") from None
        arr = np.asarray(arr, dtype=np.float32).reshape([int(d) for d in reversed(t.shape)])
        if is_llama and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            arr = _unpermute(arr, heads)
        if not arr.flags.writeable or not arr.flags.c_contiguous:
            arr = np.array(arr, order="C")
        yield name, torch.from_numpy(arr)
