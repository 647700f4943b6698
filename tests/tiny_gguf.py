"""A tiny GGUF file for tests: a tiny Llama from tests/tiny.py written as llama.cpp would (gpt2 tokenizer),
its matrices in F32 or in a GGUF block type."""

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


# The fp16 fields of each block type that carry its scales: (byte offset, typical value). The
# values keep random blocks' weights in the range of a trained model's (|w| mostly under 0.3) and
# centred: a min (Q4_1's m, the k-quants' dmin) offsets the mean of the scaled values.
SCALE_FIELDS = {
    "Q4_0": ((0, 0.02),), "Q4_1": ((0, 0.02), (2, -0.15)), "Q5_0": ((0, 0.01),), "Q5_1": ((0, 0.01), (2, -0.15)),
    "Q8_0": ((0, 0.002),), "Q2_K": ((80, 0.02), (82, 0.03)), "Q3_K": ((108, 0.002),),
    "Q4_K": ((0, 0.0005), (2, 0.00375)), "Q5_K": ((0, 0.0003), (2, 0.00465)), "Q6_K": ((208, 0.00005),),
}


def random_blocks(kind: str, rows: int, cols: int, rng: np.random.Generator, sane: bool = True) -> np.ndarray:
    """(rows, cols / block * block_bytes) uint8: random blocks of GGUF type `kind`, their fp16 scale
    fields set to finite values: near SCALE_FIELDS' (`sane`), or any finite half at all."""
    import gguf

    block, nbytes = gguf.GGML_QUANT_SIZES[gguf.GGMLQuantizationType[kind]]
    blocks = rng.integers(0, 256, size=(rows * cols // block, nbytes), dtype=np.uint8)
    for offset, typical in SCALE_FIELDS[kind]:
        if sane:
            halves = (typical * rng.uniform(0.5, 1.5, size=len(blocks))).astype(np.float16)
        else:  # any sign, subnormals and zero included; no infinity or NaN (exponent all ones)
            bits = rng.integers(0, 1 << 16, size=len(blocks), dtype=np.uint16)
            halves = np.where((bits & 0x7C00) == 0x7C00, bits & 0xBFFF, bits).astype(np.uint16).view(np.float16)
        blocks[:, offset:offset + 2] = halves.view(np.uint8).reshape(-1, 2)
    return blocks.reshape(rows, -1)


def make_tiny_gguf(path: Path, work: Path, qtype: str = "F32", hidden: int = 64, seed: int = 0,
                   tied: bool = False) -> Path:
    """Writes `path`, a GGUF of a random 2-layer Llama with its byte-level BPE tokenizer and chat
    template; `work` is a folder for the HF checkpoint (kept there: a second call with the same
    `work` writes the same model in another type). `qtype`: the type of every matrix:
    F32, one gguf can quantize (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: the model's weights quantized), or a
    k-quant (random blocks: gguf cannot quantize those; `hidden` must then be a multiple of 256).
    tied: lm_head tied to the embeddings (no output.weight in the file; use another `work`)."""
    import gguf
    from safetensors.numpy import load_file

    folder = Path(work) / "hf"
    if not (folder / "model.safetensors").exists():
        make_tiny_model(folder, "llama", hidden=hidden, seed=seed, rope_scaling=None,
                        **({"tie_word_embeddings": True} if tied else {}))
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
    rng = np.random.default_rng(seed)
    for name, arr in load_file(str(folder / "model.safetensors")).items():
        if name.endswith("q_proj.weight"):
            arr = _permute(arr, cfg["num_attention_heads"])
        elif name.endswith("k_proj.weight"):
            arr = _permute(arr, cfg["num_key_value_heads"])
        arr = np.ascontiguousarray(arr, dtype=np.float32)
        if qtype == "F32" or arr.ndim != 2:
            w.add_tensor(_gguf_name(name), arr)
            continue
        kind = gguf.GGMLQuantizationType[qtype]
        try:
            blocks = gguf.quants.quantize(arr, kind)
        except NotImplementedError:
            blocks = random_blocks(qtype, arr.shape[0], arr.shape[1], rng)
        w.add_tensor(_gguf_name(name), blocks, raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
