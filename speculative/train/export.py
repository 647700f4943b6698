"""A trained EAGLE-3 head on disk, SGLang/SpecForge format: config.json, model.safetensors
(bf16, unfused projections, d2t and t2d), provenance.json and a README beside them."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from engine.config import ModelConfig
from speculative.train.prompt_sets import requests_note


def default_aux_layers(num_layers: int) -> tuple[int, ...]:
    """Inputs of layers 2, L//2 and L-3 (EAGLE-3's choice); tiny targets get 1, L//2, L-1."""
    if num_layers >= 6:
        return (2, num_layers // 2, num_layers - 3)
    return (1, max(1, num_layers // 2), max(1, num_layers - 1))


def head_config(target: ModelConfig, draft_vocab: int, aux_layer_ids: tuple[int, ...],
                intermediate_size: int | None = None) -> dict:
    """The head's config.json: one decoder layer shaped like the target's (its MLP
    `intermediate_size` wide if given). SGLang names aux states by the layer that outputs them,
    so its ids are our input-of-layer ids minus one."""
    cfg = {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": target.hidden_size,
        "intermediate_size": intermediate_size or target.intermediate_size,
        "num_attention_heads": target.num_heads,
        "num_key_value_heads": target.num_kv_heads,
        "head_dim": target.head_dim,
        "num_hidden_layers": 1,
        "rms_norm_eps": target.rms_norm_eps,
        "rope_theta": target.rope_theta,
        "max_position_embeddings": target.max_position_embeddings,
        "vocab_size": target.vocab_size,
        "draft_vocab_size": draft_vocab,
        "target_hidden_size": target.hidden_size,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux_layer_ids],
            "use_aux_hidden_state": True,
        },
    }
    if target.rope_scaling_dict:
        cfg["rope_scaling"] = dict(target.rope_scaling_dict)
    return cfg


def head_tensors(draft, target_vocab: int, int8_lm_head: bool = False) -> dict[str, torch.Tensor]:
    """Checkpoint names and bf16 tensors; fused qkv / gate_up split back into the Hub's names.
    int8_lm_head: lm_head as int8 rows and their scales instead (engine/weights/int8_rows.py)."""
    sd = {k: v.detach() for k, v in draft.state_dict().items() if k not in ("d2t", "cos_sin")}
    out: dict[str, torch.Tensor] = {}
    layer = draft.midlayer
    for name, t in sd.items():
        if name == "midlayer.self_attn.qkv_proj.weight":
            for proj, (_, off, rows) in layer.packed_shards().items():
                out[f"midlayer.self_attn.{proj}.weight"] = t[off:off + rows]
        elif name == "midlayer.mlp.gate_up_proj.weight":
            for proj, (_, off, rows) in layer.mlp.packed_shards().items():
                out[f"midlayer.mlp.{proj}.weight"] = t[off:off + rows]
        else:
            out[name] = t
    out = {k: v.to(torch.bfloat16).contiguous().cpu() for k, v in out.items()}
    if int8_lm_head:
        from engine.weights.int8_rows import SCALE, quantize_rows

        out["lm_head.weight"], out["lm_head.weight" + SCALE] = (t.cpu() for t in quantize_rows(draft.lm_head.weight))
    d2t = draft.d2t.detach().cpu().long()
    out["d2t"] = d2t.contiguous()
    t2d = torch.zeros(target_vocab, dtype=torch.bool)
    t2d[torch.arange(d2t.shape[0]) + d2t] = True
    out["t2d"] = t2d
    return out


def save_head(folder: Path, config: dict, draft, target_vocab: int, int8_lm_head: bool = False) -> None:
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    save_file(head_tensors(draft, target_vocab, int8_lm_head), str(folder / "model.safetensors"),
              metadata={"format": "pt"})


def write_provenance(folder: Path, prov: dict, readme: str, log) -> None:
    """provenance.json and README.md beside the weights, then one line on what was saved."""
    folder = Path(folder)
    (folder / "provenance.json").write_text(json.dumps(prov, indent=2) + "\n")
    (folder / "README.md").write_text(readme)
    final = prov["final_eval"]
    spec = final.get("speculator")
    if "skipped" in final:
        log(f"saved {folder} in {prov['wall_s']:.0f} s ({final['skipped']}: the final checks were skipped)")
        return
    log(f"saved {folder} in {prov['wall_s']:.0f} s; held-out acc {final.get('step_acc')}, est. accept len "
        f"{final.get('accept_len_estimate')}" + (f"; speculator: accept len {spec['accept_len_mean']:.2f}, "
                                                f"identical {spec['identical']}/{spec['prompts']}" if spec else ""))


def _parts(p: dict) -> str:
    """How a run stopped and continued with --resume was split, if it was."""
    parts = p.get("parts") or []
    if len(parts) < 2:
        return ""
    each = ", ".join(f"{q['steps']} steps in {q['wall_s']:.0f} s" for q in parts)
    return f", in {len(parts)} parts ({each}; each part after the first ran the command again with --resume)"


def head_readme(p: dict) -> str:
    lines = [
        f"# EAGLE-3 draft head for {p['target']}",
        "",
        f"Trained by `localchat train-draft` in {p['wall_s']:.0f} s on {p['device']}{_parts(p)}:",
        "",
        f"    {p['command']}",
        "",
        "SGLang/SpecForge format (`LlamaForCausalLMEagle3`): one decoder layer of the target's width, "
        f"aux states from target layers {p['aux_layer_ids_input']} (inputs of those layers; config.json "
        "stores them as output-of-layer ids, one less), reduced vocabulary of "
        f"{p['draft_vocab_size']} tokens (`d2t`: target = draft + d2t[draft]).",
        *([] if not p["train"].get("int8_lm_head") else [
            "",
            "Its lm_head is stored as int8 rows (`lm_head.weight`) with a float32 scale each "
            "(`lm_head.weight_scale`): localchat widens it on load; tools that read bf16 tensors only "
            "cannot load this head."]),
        "",
        "## Data",
        "",
        f"- Conversations: {p['data']['source']} (file sha256 {p['data']['sha256']}), "
        f"{p['data']['train_conversations']} for training, {p['data']['heldout_conversations']} held out.",
        f"- Held-out split: {p['data']['split']}",
        f"- Self-distillation: labels are the target's own next-token distributions over the draft "
        f"vocabulary; {replies_count(p)} of the target to training prompts were added to the conversations.",
        *requests_note(p["data"]),
        "",
        "## Training",
        "",
        *_init_lines(p),
        f"- {p['train']['steps_done']} steps of {p['train']['batch_tokens']} tokens (rows of "
        f"{p['train']['seq_len']}), training-time test over {p['train']['ttt_steps']} draft steps "
        f"(loss weight {p['train']['decay']}^t), AdamW lr {p['train']['lr']} with warm-up and cosine decay.",
        "",
        *validation_lines(p, "draft step"),
    ]
    return "\n".join(lines) + "\n"


def _init_lines(p: dict) -> list[str]:
    """Where a head trained with --init started: that head's file, and how it was made when the
    provenance keeps that head's own provenance."""
    init = p.get("init")
    if not init:
        return []
    had = init.get("draft_vocab_size", p["draft_vocab_size"])
    kept = ("its draft vocabulary and MLP width were kept." if had == p["draft_vocab_size"] else
            f"its MLP width was kept, and its draft vocabulary of {had} tokens grown to {p['draft_vocab_size']} "
            "(its tokens kept their rows; the new ones started from the target's, at a tenth of the head's norm).")
    lines = [f"- Started from the head in `{init['head']}` (model.safetensors sha256 {init['sha256']}), not a "
             f"fresh one; {kept}"]
    before = init.get("provenance")
    if before:
        lines.append(f"- That head was trained by `{before['command']}` in {before['wall_s']:.0f} s "
                     f"({before['train']['steps_done']} steps); its provenance is under `init.provenance`.")
    return lines


def validation_lines(p: dict, unit: str) -> list[str]:
    """The README's held-out validation section of a trained draft's provenance `p` (unit: what
    the per-step accuracy is counted over, "draft step" or "layer")."""
    ev = p.get("final_eval", {})
    spec = ev.get("speculator", {})
    lines = ["## Held-out validation", "",
             f"- Top-1 agreement with the target's greedy token, per {unit}: {ev.get('step_acc')}",
             f"- Estimated tokens per verify step (k = {ev.get('k')}): {ev.get('accept_len_estimate')}"]
    if p.get("interrupted"):
        how = "when the GPU ran out of memory" if p.get("out_of_memory") else "with Ctrl+C"
        lines.append(f"- Stopped {how} ({ev.get('skipped')}): the final checks were skipped.")
    if spec:
        lines.append(f"- Real speculator, greedy, {spec['prompts']} held-out prompts, k = {spec['k']}: mean "
                     f"accepted length {spec['accept_len_mean']:.2f}; output identical to plain decoding "
                     f"for {spec['identical']}/{spec['prompts']} prompts")
    return lines


def replies_count(p: dict) -> str:
    """The target's replies as the head's README counts them: greedy, and those drawn at a
    temperature (--sampled-replies)."""
    total, drawn = p["data"]["generated_responses"], p["data"].get("drawn_responses", 0)
    if not drawn:
        return f"{total} greedy replies"
    return (f"{total} replies ({total - drawn} greedy, {drawn} drawn at temperature "
            f"{p['train'].get('reply_temperature', 0.7):g})")
