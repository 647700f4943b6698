"""Tiny EAGLE-3 heads written in each Hub format, with random or constructed weights."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file


def head_tensors(hidden: int, target_hidden: int, num_aux: int, vocab: int, draft_vocab: int,
                 heads: int = 4, kv_heads: int = 2, head_dim: int = 16, inter: int = 96,
                 use_aux: bool = True, seed: int = 0, std: float = 0.2) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * std

    t = {
        "midlayer.input_layernorm.weight": 1 + r(hidden),
        "midlayer.hidden_norm.weight": 1 + r(hidden),
        "midlayer.post_attention_layernorm.weight": 1 + r(hidden),
        "midlayer.self_attn.q_proj.weight": r(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": r(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": r(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": r(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": r(inter, hidden),
        "midlayer.mlp.up_proj.weight": r(inter, hidden),
        "midlayer.mlp.down_proj.weight": r(hidden, inter),
        "norm.weight": 1 + r(hidden),
        "lm_head.weight": r(draft_vocab, hidden),
    }
    if hidden != target_hidden:
        t["embed_tokens.weight"] = r(vocab, hidden) * 5
    width = (num_aux if use_aux else 1) * target_hidden
    if width != hidden:
        t["fc.weight"] = r(hidden, width)
    # A reduced vocabulary: draft id i -> target id perm[i] (non-trivial offsets).
    perm = torch.randperm(vocab, generator=g)[:draft_vocab].sort().values
    t["d2t"] = perm - torch.arange(draft_vocab)
    return t


def write_head(folder: Path, target_cfg: dict, fmt: str, tensors: dict[str, torch.Tensor], hidden: int,
               aux_input_ids: tuple[int, ...] | None, use_aux: bool = True, heads: int = 4, kv_heads: int = 2,
               head_dim: int = 16, inter: int = 96, norm_before_residual: bool = False) -> Path:
    """aux_input_ids are in the input-of-layer convention; each format writes its own."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = target_cfg["vocab_size"]
    draft_vocab = tensors["lm_head.weight"].shape[0]
    layer = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
             "head_dim": head_dim, "intermediate_size": inter, "rms_norm_eps": 1e-6, "vocab_size": vocab,
             "max_position_embeddings": 512, "rope_theta": 10000.0}
    if fmt == "eagle":
        cfg = dict(layer, architectures=["LlamaForCausalLM"], draft_vocab_size=draft_vocab,
                   target_hidden_size=target_cfg["hidden_size"])
        names = tensors
    elif fmt == "sglang":
        eagle = {"use_aux_hidden_state": use_aux}
        if aux_input_ids is not None:
            eagle["eagle_aux_hidden_state_layer_ids"] = [i - 1 for i in aux_input_ids]
        cfg = dict(layer, architectures=["LlamaForCausalLMEagle3"], draft_vocab_size=draft_vocab,
                   target_hidden_size=target_cfg["hidden_size"], eagle_config=eagle)
        names = tensors
    elif fmt == "speculators":
        cfg = {"architectures": ["Eagle3Speculator"], "speculators_model_type": "eagle3",
               "transformer_layer_config": dict(layer, model_type="llama"), "draft_vocab_size": draft_vocab,
               "norm_before_residual": norm_before_residual, "target_hidden_size": target_cfg["hidden_size"],
               "use_aux_hidden_state": use_aux}
        if aux_input_ids is not None:
            cfg["eagle_aux_hidden_state_layer_ids"] = list(aux_input_ids)
        names = {k.replace("midlayer.", "layers.0."): v for k, v in tensors.items()}
    else:
        raise ValueError(fmt)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    save_file({k: v.contiguous() for k, v in names.items()}, str(folder / "model.safetensors"))
    return folder


def markov_target(src, dst, edges: dict[int, int], ties: dict[int, int] | None = None):
    """A target whose next token depends only on the current one: attention and MLP outputs are
    zeroed, so lm_head reads the (normed) embedding; rows of lm_head encode `edges`, and every
    other token repeats itself with a lower score. ties {t: u}: token t's row becomes u's, so the
    two score exactly alike in every context."""
    shutil.copytree(src, dst)
    sd = load_file(dst / "model.safetensors")
    for name in list(sd):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            sd[name] = torch.zeros_like(sd[name])
    emb = sd["model.embed_tokens.weight"]
    e = emb / emb.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    head = 0.5 * e.clone()
    for t, nxt in edges.items():
        head[nxt] = head[nxt] + e[t] * 2
    for t, u in (ties or {}).items():
        head[t] = head[u]
    sd["lm_head.weight"] = head
    sd["model.norm.weight"] = torch.ones_like(sd["model.norm.weight"])
    save_file(sd, dst / "model.safetensors")
    return dst
