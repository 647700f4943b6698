"""Tiny MTP layers for tests: random or constructed weights, in the localchat or MiMo layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

A, B, C, D = 40, 41, 42, 43  # the constructed target cycles A -> B -> C -> A; D never comes

LAYER_KEYS = ("token_layernorm.weight", "hidden_layernorm.weight", "input_proj.weight", "input_layernorm.weight",
              "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight",
              "self_attn.o_proj.weight", "post_attention_layernorm.weight", "mlp.gate_proj.weight",
              "mlp.up_proj.weight", "mlp.down_proj.weight", "final_layernorm.weight")


def layer_tensors(hidden: int, heads: int, kv_heads: int, head_dim: int, inter: int, bias: bool = False,
                  seed: int = 0, std: float = 0.2) -> dict[str, torch.Tensor]:
    """One layer's tensors under their names inside `mtp_layers.{i}.` (MiMo's names)."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(*shape, generator=g) * std

    t = {
        "token_layernorm.weight": 1 + r(hidden), "hidden_layernorm.weight": 1 + r(hidden),
        "input_proj.weight": r(hidden, 2 * hidden), "input_layernorm.weight": 1 + r(hidden),
        "self_attn.q_proj.weight": r(heads * head_dim, hidden),
        "self_attn.k_proj.weight": r(kv_heads * head_dim, hidden),
        "self_attn.v_proj.weight": r(kv_heads * head_dim, hidden),
        "self_attn.o_proj.weight": r(hidden, heads * head_dim),
        "post_attention_layernorm.weight": 1 + r(hidden), "mlp.gate_proj.weight": r(inter, hidden),
        "mlp.up_proj.weight": r(inter, hidden), "mlp.down_proj.weight": r(hidden, inter),
        "final_layernorm.weight": 1 + r(hidden),
    }
    if bias:
        for p in ("q", "k", "v"):
            t[f"self_attn.{p}_proj.bias"] = r(t[f"self_attn.{p}_proj.weight"].shape[0])
    return t


def write_localchat_mtp(folder: Path, target_cfg: dict, layers: list[dict[str, torch.Tensor]], chain: bool,
                        heads: int = 4, kv_heads: int = 2, head_dim: int = 16, inter: int = 96) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["LocalchatMTP"], "num_nextn_predict_layers": len(layers), "mtp_chain": chain,
           "hidden_size": target_cfg["hidden_size"], "intermediate_size": inter, "num_attention_heads": heads,
           "num_key_value_heads": kv_heads, "head_dim": head_dim, "vocab_size": target_cfg["vocab_size"],
           "rms_norm_eps": 1e-6, "attention_bias": False}
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    flat = {f"mtp_layers.{i}.{k}": v.contiguous() for i, t in enumerate(layers) for k, v in t.items()}
    save_file(flat, str(folder / "model.safetensors"))
    return folder


def random_layers(num: int, target_cfg: dict, seed: int = 0, std: float = 0.2, **shape) -> list[dict[str, torch.Tensor]]:
    s = dict(heads=4, kv_heads=2, head_dim=16, inter=96)
    s.update(shape)
    return [layer_tensors(target_cfg["hidden_size"], s["heads"], s["kv_heads"], s["head_dim"], s["inter"],
                          seed=seed + 17 * i, std=std) for i in range(num)]


def make_mimo(folder: Path, num_layers: int = 1, seed: int = 0) -> Path:
    """Turns a tiny Qwen2 folder into the MiMo-7B Hub layout: architectures MiMoForCausalLM,
    num_nextn_predict_layers, and `model.mtp_layers.{i}.*` tensors (Qwen2 blocks, q/k/v bias)
    in a second shard named by a safetensors index."""
    folder = Path(folder)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(architectures=["MiMoForCausalLM"], model_type="mimo", num_nextn_predict_layers=num_layers)
    (folder / "config.json").write_text(json.dumps(cfg, indent=1))
    H, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = H // heads
    mtp = {}
    for i in range(num_layers):
        t = layer_tensors(H, heads, kv, hd, cfg["intermediate_size"], bias=True, seed=seed + i)
        mtp.update({f"model.mtp_layers.{i}.{k}": v.contiguous() for k, v in t.items()})
    base = load_file(str(folder / "model.safetensors"))
    (folder / "model.safetensors").unlink()
    save_file(base, str(folder / "model-00001-of-00002.safetensors"))
    save_file(mtp, str(folder / "model-00002-of-00002.safetensors"))
    weight_map = {k: "model-00001-of-00002.safetensors" for k in base}
    weight_map.update({k: "model-00002-of-00002.safetensors" for k in mtp})
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return folder


def markov_target(src: Path, dst: Path, last: int) -> Path:
    """A copy of `src` whose next token depends only on the current one: attention and MLP
    outputs are zero, so the final state is the normed embedding. A..D get orthogonal
    embeddings (axes 0..3, which no other token uses); lm_head sends `last` (the prompt's last
    token) to A and cycles A -> B -> C -> A; every other token, D too, repeats itself."""
    src, dst = Path(src), Path(dst)
    shutil.copytree(src, dst)
    sd = load_file(str(dst / "model.safetensors"))
    for name in list(sd):
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            sd[name] = torch.zeros_like(sd[name])
    emb = sd["model.embed_tokens.weight"].clone()
    H = emb.shape[1]
    emb[:, :4] = 0
    for i, t in enumerate((A, B, C, D)):
        emb[t] = 0
        emb[t, i] = H ** 0.5
    sd["model.embed_tokens.weight"] = emb
    e = emb / emb.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    head = 0.5 * e.clone()
    for t, nxt in {last: A, A: B, B: C, C: A}.items():
        head[nxt] += 2 * e[t]
    sd["lm_head.weight"] = head
    sd["model.norm.weight"] = torch.ones_like(sd["model.norm.weight"])
    save_file(sd, str(dst / "model.safetensors"))
    return dst


def map_layer(t: dict, kind: str, H: int, g: torch.Generator, state_std: float = 0.01,
              block: bool = False) -> dict:
    """A layer (localchat layout) whose draft is F(G(input token)) on the Markov target: input_proj
    maps the token's embedding by G ("id"; "swap": C <-> D; "to_d": everything to D) and adds
    state_std-scaled noise from the incoming state. block=False zeroes attention and MLP outputs,
    so only the token decides; block=True keeps them, so the state and the K/V nudge drafts."""
    t = dict(t)
    if not block:
        for name in ("self_attn.o_proj.weight", "mlp.down_proj.weight"):
            t[name] = torch.zeros_like(t[name])
    for name in ("token_layernorm.weight", "hidden_layernorm.weight", "final_layernorm.weight"):
        t[name] = torch.ones(H)
    M = torch.eye(H)
    if kind == "swap":
        M[[2, 3]] = M[[3, 2]]
    elif kind == "to_d":
        M = torch.zeros(H, H)
        M[3, :4] = 1
    t["input_proj.weight"] = torch.cat([M, state_std * torch.randn(H, H, generator=g)], dim=1)  # [embed | state]
    return t
