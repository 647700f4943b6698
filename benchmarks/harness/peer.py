"""time_transformers: transformers `generate` on the engine's weights, the peer `localchat bench` reports."""

from __future__ import annotations

import time

import torch

from benchmarks.harness.timing import sync


def time_transformers(engine, prompt_ids, new_tokens) -> dict:
    """transformers `generate` on the same weights (copied into its own model), greedy, exactly
    new_tokens tokens."""
    import transformers

    cfg = engine.runner.config
    model = engine.runner.model
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim, rms_norm_eps=cfg.rms_norm_eps, rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=cfg.tie_word_embeddings)
    with torch.device(engine.runner.device):
        hf = transformers.LlamaForCausalLM(hf_cfg).to(engine.runner.dtype).eval()
    sd = {}
    for name, p in model.state_dict().items():
        if ".qkv_proj." in name:
            q, k, v = p.split([cfg.q_size, cfg.kv_size, cfg.kv_size])
            for n, t in zip(("q_proj", "k_proj", "v_proj"), (q, k, v)):
                sd[name.replace("qkv_proj", n)] = t
        elif ".gate_up_proj." in name:
            g, u = p.chunk(2)
            sd[name.replace("gate_up_proj", "gate_proj")], sd[name.replace("gate_up_proj", "up_proj")] = g, u
        else:
            sd[name] = p
    hf.load_state_dict(sd, strict=False)
    x = torch.tensor([prompt_ids], device=engine.runner.device)
    kw = dict(do_sample=False, eos_token_id=None, pad_token_id=0, attention_mask=torch.ones_like(x))
    with torch.no_grad():
        hf.generate(x, max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        sync()
        t = time.perf_counter()
        hf.generate(x, max_new_tokens=1, min_new_tokens=1, **kw)
        sync()
        ttft = time.perf_counter() - t
        t = time.perf_counter()
        out = hf.generate(x, max_new_tokens=new_tokens, min_new_tokens=new_tokens, **kw)
        sync()
        total = time.perf_counter() - t
    del hf
    n = out.shape[1] - x.shape[1]
    return {"decode_tok_s": (n - 1) / max(total - ttft, 1e-9), "ttft_s": ttft, "generated_tokens": n,
            "version": transformers.__version__}
