"""Trained chain-MTP layers on disk, the localchat layout: config.json (LocalchatMTP, MTPConfig.to_hf),
model.safetensors (bf16, `mtp_layers.{i}.*`, unfused projections), provenance.json and a README."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from speculative.mtp.config import MTPConfig
from speculative.train.export import replies_count, validation_lines
from speculative.train.prompt_sets import requests_note


def layer_tensors(draft) -> dict[str, torch.Tensor]:
    """Checkpoint names and bf16 tensors; fused qkv / gate_up split back into the Hub's names."""
    out: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(draft.mtp_layers):
        shards = {**{f"self_attn.{k}": v for k, v in layer.self_attn.packed_shards().items()},
                  **{f"mlp.{k}": v for k, v in layer.mlp.packed_shards().items()}}
        fused = {}
        for name, (fused_name, off, rows) in shards.items():
            fused.setdefault(name.rsplit(".", 1)[0] + "." + fused_name, []).append((name, off, rows))
        for name, t in layer.state_dict().items():
            t = t.detach()
            module, kind = name.rsplit(".", 1)
            if module in fused:
                for part, off, rows in fused[module]:
                    out[f"mtp_layers.{i}.{part}.{kind}"] = t[off:off + rows]
            else:
                out[f"mtp_layers.{i}.{name}"] = t
    return {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}


def save_layers(folder: Path, mc: MTPConfig, draft) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps({**mc.to_hf(), "torch_dtype": "bfloat16"}, indent=2) + "\n")
    save_file(layer_tensors(draft), str(folder / "model.safetensors"), metadata={"format": "pt"})


def layers_readme(p: dict) -> str:
    t = p["train"]
    lines = [
        f"# Chain-MTP layers for {p['target']}",
        "",
        f"Trained by `localchat train-draft --kind mtp` in {p['wall_s']:.0f} s on {p['device']}:",
        "",
        f"    {p['command']}",
        "",
        f"localchat layout (`LocalchatMTP`): {t['mtp_layers']} chained layers of the target's width, "
        "each [token_layernorm(embed(t)), hidden_layernorm(state)] -> input_proj -> one decoder block -> "
        "final_layernorm -> the target's lm_head; layer s + 1 reads layer s's block output.",
        "",
        "## Data",
        "",
        f"- Conversations: {p['data']['source']} (file sha256 {p['data']['sha256']}), "
        f"{p['data']['train_conversations']} for training, {p['data']['heldout_conversations']} held out.",
        f"- Held-out split: {p['data']['split']}",
        f"- Self-distillation: labels are the target's own next-token distributions (top {t['top_k']} "
        f"tokens, renormalised); {replies_count(p)} of the target were added.",
        *requests_note(p["data"]),
        "",
        "## Training",
        "",
        f"- {t['steps_done']} steps of {t['batch_tokens']} tokens (rows of {t['seq_len']}), loss weight "
        f"{t['decay']}^s for layer s, AdamW lr {t['lr']} with warm-up and cosine decay; blocks initialised "
        "from the target's last layer, input_proj near identity on the state half.",
        "",
        *validation_lines(p, "layer"),
    ]
    return "\n".join(lines) + "\n"
