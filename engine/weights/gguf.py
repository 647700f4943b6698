"""GGUF files: model config from metadata, tensors renamed to Hugging Face names, quantized ones
kept as their blocks (PackedWeight)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from engine.config_checks import (MAX_HEAD_DIM, MAX_HEADS, MAX_HIDDEN, MAX_INTERMEDIATE, MAX_LAYERS, MAX_POSITIONS,
                            MAX_VOCAB, integer, number, token_ids)
from engine.errors import ModelLoadError
from engine.weights.gguf_blocks import BLOCKS
from engine.weights.gguf_header import weights_label
from engine.weights.packed import PackedWeight, dequantize, gguf_weight

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
        from engine.hub.cache import repair_hint

        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise ModelLoadError(
            f"{path} is not a readable GGUF file: {first} (file truncated or corrupt?); {repair_hint(path)}"
        ) from None


def _field(reader, key: str, default=None):
    f = reader.fields.get(key)
    return default if f is None else f.contents()


# Metadata without which no model can be built (`{arch}.` keys are prefixed with the architecture).
_REQUIRED_KEYS = ("{arch}.block_count", "{arch}.embedding_length", "{arch}.feed_forward_length",
                  "{arch}.attention.head_count", "tokenizer.ggml.model", "tokenizer.ggml.tokens")


def hf_config(reader, path: Path) -> dict:
    """A `config.json`-style dict built from the GGUF metadata, every value type- and range-checked."""
    arch = _field(reader, "general.architecture")
    if not isinstance(arch, str) or arch not in _ARCHITECTURES:
        raise ModelLoadError(f"{path.name}: GGUF architecture {arch!r} is not supported "
                             f"(supported: {', '.join(_ARCHITECTURES)})")
    missing = [key.format(arch=arch) for key in _REQUIRED_KEYS if key.format(arch=arch) not in reader.fields]
    if missing:
        raise ModelLoadError(f"{path.name} lacks the GGUF metadata {', '.join(missing)}; it is not a complete "
                             "model file (convert the model again, e.g. with llama.cpp's convert_hf_to_gguf.py)")
    where = path.name

    def num(key: str, default=None, hi: int = MAX_HIDDEN, lo: int = 1) -> int:
        return integer(_field(reader, f"{arch}.{key}", default), f"{arch}.{key}", where, lo=lo, hi=hi)

    def real(key: str, default: float, **bounds) -> float:
        return number(_field(reader, f"{arch}.{key}", default), f"{arch}.{key}", where, **bounds)

    names = {t.name for t in reader.tensors}
    heads = num("attention.head_count", hi=MAX_HEADS)
    hidden = num("embedding_length")
    if f"{arch}.attention.key_length" not in reader.fields and hidden % heads:
        raise ModelLoadError(f"{where}: {arch}.embedding_length {hidden} is not divisible by "
                             f"{arch}.attention.head_count {heads}")
    tokens = reader.fields["tokenizer.ggml.tokens"]
    cfg = {
        "architectures": [_ARCHITECTURES[arch]],
        "vocab_size": num("vocab_size", len(tokens.data), hi=MAX_VOCAB),
        "hidden_size": hidden,
        "intermediate_size": num("feed_forward_length", hi=MAX_INTERMEDIATE),
        "num_hidden_layers": num("block_count", hi=MAX_LAYERS),
        "num_attention_heads": heads,
        "num_key_value_heads": num("attention.head_count_kv", heads, hi=MAX_HEADS),
        "head_dim": num("attention.key_length", hidden // heads, hi=MAX_HEAD_DIM),
        "rms_norm_eps": real("attention.layer_norm_rms_epsilon", 1e-6, hi=1.0),
        "rope_theta": real("rope.freq_base", 10000.0, lo=1.0),
        "max_position_embeddings": num("context_length", 4096, hi=MAX_POSITIONS),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "bos_token_id": _token_id(reader, "tokenizer.ggml.bos_token_id", where),
        "eos_token_id": _token_id(reader, "tokenizer.ggml.eos_token_id", where),
    }
    scaling = _field(reader, f"{arch}.rope.scaling.type")
    if scaling and scaling != "none":
        cfg["rope_scaling"] = {"rope_type": scaling, "factor": real("rope.scaling.factor", 1.0),
                               "original_max_position_embeddings":
                                   num("rope.scaling.original_context_length", 0, lo=0, hi=MAX_POSITIONS) or None}
    return cfg


def _token_id(reader, key: str, where: str) -> int | None:
    ids = token_ids(_field(reader, key), key, where)
    return ids[0] if ids else None


def gguf_shapes(reader) -> dict[str, tuple[int, ...]]:
    """Tensor names (Hugging Face names where we have one) and shapes, from the file's tensor
    list: enough to check the metadata against the weights before anything is allocated."""
    return {hf_name(t.name) or t.name: tuple(int(d) for d in reversed(t.shape)) for t in reader.tensors}


def hf_name(gguf_name: str) -> str | None:
    stem, _, leaf = gguf_name.rpartition(".")
    if stem in _GLOBAL_NAMES:
        return f"{_GLOBAL_NAMES[stem]}.{leaf}"
    parts = stem.split(".")
    if len(parts) == 3 and parts[0] == "blk" and parts[2] in _LAYER_NAMES:
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{leaf}"
    return None


FLOAT_TYPES = ("F32", "F16", "BF16")
SUPPORTED_TYPES = (*FLOAT_TYPES, *BLOCKS)


def _gguf_dequantizes(tensor_type) -> bool:
    """Whether gguf-py can dequantize this type (the IQ, TQ and FP4 types among others). Those load
    as floats through it; the block types above load through our own references, which the GPU
    kernels mirror."""
    import gguf
    import numpy as np

    try:
        gguf.quants.dequantize(np.zeros((1, gguf.GGML_QUANT_SIZES[tensor_type][1]), dtype=np.uint8), tensor_type)
    except Exception:  # NotImplementedError for the types gguf-py cannot read; a KeyError for unknown ones
        return False
    return True


def check_gguf_types(reader, path: Path) -> None:
    """Every tensor is of a type we read, checked before anything is allocated."""
    bad = [t for t in reader.tensors if t.tensor_type.name not in SUPPORTED_TYPES and not _gguf_dequantizes(t.tensor_type)]
    if bad:
        kinds = sorted({t.tensor_type.name for t in bad})
        count = f"{len(bad)} tensors, e.g." if len(bad) > 1 else "tensor"
        raise ModelLoadError(f"{path.name}: GGUF type {', '.join(kinds)} ({count} {bad[0].name}) "
                             f"is not supported (supported: {', '.join(SUPPORTED_TYPES)}); use a Q4_K_M, Q5_K_M, "
                             "Q6_K or Q8_0 file of this model")


def gguf_weights_label(reader) -> str:
    """The weight format to report: "Q4_K_M" from the file type llama.cpp wrote, else the type of most weights."""
    matrices = {}
    for t in reader.tensors:
        if len(t.shape) == 2:
            matrices[t.tensor_type.name] = matrices.get(t.tensor_type.name, 0) + int(t.n_elements)
    return weights_label(_field(reader, "general.file_type"), matrices)


def _unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp stores Llama q/k rows interleaved per head; restore the HF half-split order. Rows
    move whole, so a quantized weight's rows of blocks move the same way."""
    rows = w.shape[0]
    return w.reshape(n_heads, rows // n_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


def _read(t) -> torch.Tensor | PackedWeight:
    """A GGUF tensor in Hugging Face's shape: float types as float32, block types as their blocks."""
    kind = t.tensor_type.name
    shape = tuple(int(d) for d in reversed(t.shape))  # GGUF lists the fastest-varying dimension first
    data = torch.from_numpy(np.array(t.data))  # a copy: the reader's arrays are read-only views of the file
    if kind == "BF16":
        return data.reshape(-1, 2).view(torch.bfloat16).float().reshape(shape)
    if kind in FLOAT_TYPES:
        return data.float().reshape(shape)
    if kind not in BLOCKS:  # a type only gguf-py reads (check_gguf_types): floats through it
        import gguf

        return torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)).float().reshape(shape)
    rows = math.prod(shape[:-1])
    packed = gguf_weight(kind, data.reshape(rows, -1), (rows, shape[-1]))
    return packed if len(shape) == 2 else dequantize(packed).reshape(shape)


def iter_gguf_tensors(reader, cfg: dict) -> Iterator[tuple[str, torch.Tensor | PackedWeight]]:
    """Every tensor under its Hugging Face name: float32 tensors and PackedWeights (check the types
    first: check_gguf_types)."""
    is_llama = _field(reader, "general.architecture") in ("llama", "mistral")
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is None:
            yield t.name, torch.empty(0)  # reported as unexpected by the loader
            continue
        w = _read(t)
        if is_llama and name.endswith(("q_proj.weight", "k_proj.weight", "q_proj.bias", "k_proj.bias")):
            heads = cfg["num_attention_heads"] if ".q_proj." in name else cfg["num_key_value_heads"]
            w = (dataclasses.replace(w, data=_unpermute(w.data, heads)) if isinstance(w, PackedWeight)
                 else _unpermute(w, heads))
        yield name, w
