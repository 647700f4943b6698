"""Batched decoding over the target's own modules, for generating training replies: greedy, or
drawn at a temperature (the contexts a sampled answer meets, which greedy replies never show).

Many prompts run at once, left padded to a common length: every row's newest token then sits
in the same column, so a step writes one column of a dense per-batch KV cache (B, Hkv, S, D).
Each row keeps its own positions (column - padding) and its attention sees only its own
columns. The engine's batch-1 forwards (static cache, captured graphs) are not used or
changed; the weights are the model's own modules.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.model import Attention, CausalLM
from engine.rope import apply_rope


KEY_BUCKET = 128
# Masked attention without the cuDNN backend, which plans per shape (train-draft generated only
# ~1,200 tokens/s on an H200 with the key length growing every step).
_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
PREFILL_TOKENS = 32768  # prompt tokens (padding included) per prefill forward
SYNC_EVERY = 8  # decode steps queued between two reads of the new tokens by the host


def kv_bytes_per_token(model: CausalLM) -> int:
    """Bytes of K and V, all layers, for one token of one row."""
    cfg = model.config
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * model.lm_head.weight.element_size()


@torch.inference_mode()
def reply_batch(model: CausalLM, prompts: list[list[int]], limits: list[int], eos_ids,
                on_step: Callable[[int], None] | None = None, temperatures: list[float] | None = None,
                seed: int = 0) -> list[list[int]]:
    """Replies to `prompts` in one batch: row b greedy, or drawn from the target's distribution
    at temperatures[b] when that is above 0 (seeded: the same call gives the same replies). Row
    b stops after an EOS token (included) or after limits[b] tokens (each >= 1). on_step(n) is
    called after each step with the number of tokens it added. Positions must stay inside
    model.cos_sin (prompt + limit <= its rows)."""
    if not prompts:
        return []
    assert all(p for p in prompts) and min(limits) >= 1
    dev = model.lm_head.weight.device
    pick = _Picker(temperatures, seed, dev)
    cfg = model.config
    eos = frozenset(eos_ids)
    B = len(prompts)
    P = max(len(p) for p in prompts)
    S = P + max(limits) - 1  # the last reply token is never fed back
    ids = torch.zeros(B, P, dtype=torch.long)
    for b, p in enumerate(prompts):
        ids[b, P - len(p):] = torch.tensor(p, dtype=torch.long)
    ids = ids.to(dev)
    pad = torch.tensor([P - len(p) for p in prompts], dtype=torch.long, device=dev)
    dtype = model.lm_head.weight.dtype
    kv = [(torch.zeros(B, cfg.num_kv_heads, S, cfg.head_dim, dtype=dtype, device=dev),
           torch.zeros(B, cfg.num_kv_heads, S, cfg.head_dim, dtype=dtype, device=dev))
          for _ in range(cfg.num_layers)]
    max_pos = model.cos_sin.shape[0] - 1

    # Prefill: query column i of row b sees keys pad_b..i; a padding query sees only itself
    # (its output is never used, but a row of all-masked keys would give NaN K/V downstream).
    cols = torch.arange(P, device=dev)
    positions = (cols[None, :] - pad[:, None]).clamp(min=0)
    causal = cols[None, :] <= cols[:, None]  # (query, key)
    mask = (causal[None] & (cols[None, None, :] >= pad[:, None, None])) | torch.eye(P, dtype=torch.bool, device=dev)
    step = max(1, PREFILL_TOKENS // P)  # rows per prefill forward: bounds its activations
    tok = torch.cat([_next_tokens(model, ids[r:r + step], positions[r:r + step],
                                  [(k[r:r + step], v[r:r + step]) for k, v in kv], 0, mask[r:r + step],
                                  lambda logits, r=r: pick(logits, slice(r, r + step)))
                     for r in range(0, B, step)])

    replies: list[list[int]] = [[] for _ in range(B)]
    rows = list(range(B))  # batch row -> prompt index; finished rows are dropped now and then
    col = P
    queued = [tok]  # each step's new tokens, not read by the host yet
    while True:
        # One read for up to SYNC_EVERY steps: the host queues the next steps while the GPU runs
        # these, instead of waiting for every step's tokens. A row that ends inside a run of
        # steps computes a few more that are dropped here.
        live, added = [], 0
        for i, new in enumerate(torch.stack(queued, 1).tolist()):
            r = rows[i]
            if r < 0:
                continue
            for t in new:
                replies[r].append(t)
                added += 1
                if t in eos or len(replies[r]) >= limits[r]:
                    rows[i] = -1
                    break
            if rows[i] >= 0:
                live.append(i)
        queued = []
        if on_step is not None:
            on_step(added)
        if not live:
            break
        if len(live) <= len(rows) // 2:  # drop finished rows: at most log2(B) copies of the cache
            keep = torch.tensor(live, device=dev)
            for layer in range(len(kv)):
                kv[layer] = (kv[layer][0].index_select(0, keep), kv[layer][1].index_select(0, keep))
            pad, tok = pad.index_select(0, keep), tok.index_select(0, keep)
            pick.keep(keep)
            rows = [rows[i] for i in live]
        # no row needs more steps than its own limit leaves (so K/V stays inside S columns)
        steps = min(SYNC_EVERY, max(limits[r] - len(replies[r]) for r in rows if r >= 0))
        for _ in range(steps):
            keys = torch.arange(col + 1, device=dev)
            positions = (col - pad).clamp(max=max_pos)[:, None]  # finished rows may run past the table
            mask = (keys[None, :] >= pad[:, None])[:, None, :]  # (B, 1, col + 1)
            tok = _next_tokens(model, tok[:, None], positions, kv, col, mask, pick)
            queued.append(tok)
            col += 1
    return replies


class _Picker:
    """logits (B, V) -> the next tokens (B,): each row's argmax, or for a row with a temperature T
    a draw by the exponential race (argmax of z / T - log E, E ~ Exp(1) from a generator seeded
    once). keep(rows) follows the batch as finished rows are dropped."""

    def __init__(self, temperatures: list[float] | None, seed: int, dev: torch.device):
        self.inv = None
        if temperatures and any(t > 0 for t in temperatures):
            if any(not math.isfinite(t) or t < 0 for t in temperatures):
                raise ValueError(f"temperatures must be finite and >= 0, got {temperatures}")
            self.inv = torch.tensor([1.0 / t if t > 0 else 0.0 for t in temperatures], device=dev)
            self.mixed = any(t == 0 for t in temperatures)  # greedy rows beside drawn ones
            self.gen = torch.Generator(device=dev)
            self.gen.manual_seed(seed)

    def keep(self, rows: torch.Tensor) -> None:
        if self.inv is not None:
            self.inv = self.inv.index_select(0, rows)

    def __call__(self, logits: torch.Tensor, rows: slice = slice(None)) -> torch.Tensor:
        """rows: the batch rows `logits` belong to (a prefill runs them a slice at a time)."""
        if self.inv is None:
            return logits.argmax(-1)
        inv = self.inv[rows]
        e = torch.empty(logits.shape, dtype=torch.float32, device=logits.device).exponential_(generator=self.gen)
        drawn = (logits.float() * inv[:, None] - e.log()).argmax(-1)
        # the teacher batches drawn replies apart from greedy ones: an argmax only where both sit
        return torch.where(inv > 0, drawn, logits.argmax(-1)) if self.mixed else drawn


def _next_tokens(model: CausalLM, ids: torch.Tensor, positions: torch.Tensor, kv: list,
                 start: int, mask: torch.Tensor, pick=None) -> torch.Tensor:
    """Runs (B, T) tokens in columns start..start+T-1 (K/V written there) and returns the
    next token after each row's last column, (B,): pick(logits) (default the argmax). mask:
    (B, T, start + T) bool, True = visible."""
    B, T = ids.shape
    cos_sin = model.cos_sin.index_select(0, positions.reshape(-1))
    x, residual = model.model.embed_tokens(ids.reshape(-1)), None
    for layer, (k_cache, v_cache) in zip(model.model.layers, kv):
        h, residual = layer.input_layernorm.add_forward(x, residual)
        x = _attention(layer.self_attn, h, B, T, cos_sin, k_cache, v_cache, start, mask)
        h, residual = layer.post_attention_layernorm.add_forward(x, residual)
        x = layer.mlp(h)
    last = slice(T - 1, None, T)  # every row's last column
    hidden, _ = model.model.norm.add_forward(x[last].contiguous(), residual[last].contiguous())
    logits = model.logits(hidden)
    return logits.argmax(-1) if pick is None else pick(logits)


def _attention(attn: Attention, x: torch.Tensor, B: int, T: int, cos_sin: torch.Tensor,
               k_cache: torch.Tensor, v_cache: torch.Tensor, start: int, mask: torch.Tensor) -> torch.Tensor:
    N = B * T
    Hq, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    q, k, v = attn.qkv_proj(x).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q, k, v = q.view(N, Hq, D), k.view(N, Hkv, D), v.view(N, Hkv, D)
    if attn.qk_norm:
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
    end = start + T
    k_cache[:, :, start:end] = k.view(B, T, Hkv, D).transpose(1, 2)
    v_cache[:, :, start:end] = v.view(B, T, Hkv, D).transpose(1, 2)
    # Query head h reads kv head h // G (as HF's repeat_kv): the G query heads of a kv head
    # become G * T query rows against that head, so no backend needs GQA support.
    G = Hq // Hkv
    qh = q.view(B, T, Hkv, G, D).permute(0, 2, 3, 1, 4).reshape(B, Hkv, G * T, D)
    # Keys in buckets of KEY_BUCKET columns (masked past `end`): the attention's shapes change
    # once per bucket instead of every step, so no backend re-plans per step.
    span = min(k_cache.shape[2], -(-end // KEY_BUCKET) * KEY_BUCKET)
    m = F.pad(mask, (0, span - end), value=False)
    m = m[:, None, None].expand(B, 1, G, T, span).reshape(B, 1, G * T, span)
    with sdpa_kernel(_BACKENDS):
        o = F.scaled_dot_product_attention(qh, k_cache[:, :, :span], v_cache[:, :, :span], attn_mask=m,
                                           scale=attn.scale)
    o = o.view(B, Hkv, G, T, D).permute(0, 3, 1, 2, 4).reshape(N, attn.q_size)
    return attn.o_proj(o)
