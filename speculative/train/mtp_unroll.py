"""Chain-MTP training forward: all S layers over packed rows at once, with the speculator's alignment.

Rows are TTTBatch rows (speculative/train/ttt.py) built with aux = the target's final residual stream,
so entry p holds t_{p+1} (tokens), the stream at p (aux; the target's final norm of it is h_p),
h_{p+1} (label_hidden) and the target's argmax at p+1 (greedy). What speculative/mtp/speculator.py does,
restated per position p: layer s reads t_{p+s+1} = tokens[p+s] and x^s_p (x^0_p = h_p; x^{s+1}_p
is layer s's block output at p, chain mode) and predicts t_{p+s+2}, whose target distribution is
lm_head(h_{p+s+1}) = lm_head(label_hidden[p+s]). Layer s's attention is causal over its own
entries at positions <= p of the same sequence: at inference its K/V at earlier positions were
computed from accepted tokens and those positions' own chained states, which is what this computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.checkpoint import checkpoint

from engine.rope import apply_rope

from speculative.train.ttt import TTTBatch

_MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
TOP_K = 64  # target probabilities kept per position (renormalised); see soft_ce_topk


def shift_left(x: torch.Tensor, s: int, fill=0) -> torch.Tensor:
    """x (B, L, ...) -> row p holds x[p + s]; the last s rows are `fill`."""
    if s == 0:
        return x
    pad = torch.full((x.shape[0], s, *x.shape[2:]), fill, dtype=x.dtype, device=x.device)
    return torch.cat([x[:, s:], pad], dim=1)


def valid(batch: TTTBatch, s: int) -> torch.Tensor:
    """(B, L) entries layer s has a label for: t_{p+s+2} exists in p's sequence."""
    return (batch.doc >= 0) & (shift_left(batch.doc, s, -2) == batch.doc)


def _causal_mask(batch: TTTBatch) -> torch.Tensor:
    """(B, 1, L, L) bool: same sequence and key position <= query position; padding sees itself."""
    doc, pos = batch.doc, batch.positions
    L = doc.shape[1]
    same = (doc[:, :, None] == doc[:, None, :]) & (doc[:, :, None] >= 0)
    mask = same & (pos[:, None, :] <= pos[:, :, None])
    eye = torch.eye(L, dtype=torch.bool, device=doc.device)
    return (mask | (eye & (doc < 0)[:, :, None])).unsqueeze(1)


def _block(layer, x: torch.Tensor, cos_sin: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The layer's decoder block over (B, L, H), causal per sequence; returns out = y + residual."""
    attn = layer.self_attn
    B, L, _ = x.shape
    Hq, Hkv, D = attn.num_heads, attn.num_kv_heads, attn.head_dim
    h = layer.input_layernorm(x)
    q, k, v = attn.qkv_proj(h).split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = apply_rope(q.reshape(B * L, Hq, D), cos_sin).view(B, L, Hq, D).transpose(1, 2)
    k = apply_rope(k.reshape(B * L, Hkv, D), cos_sin).view(B, L, Hkv, D)
    v = v.reshape(B, L, Hkv, D)
    g = Hq // Hkv  # GQA by repeating: keeps SDPA on its masked memory-efficient kernel
    k, v = (t.repeat_interleave(g, dim=2).transpose(1, 2) for t in (k, v))
    with sdpa_kernel(_MASKED_BACKENDS):
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=attn.scale)  # (B, Hq, L, D)
    r = x + attn.o_proj(o.transpose(1, 2).reshape(B, L, Hq * D))
    return r + layer.mlp(layer.post_attention_layernorm(r))


def unroll(draft, embed: torch.nn.Embedding, final_norm, batch: TTTBatch, cos_sin_table: torch.Tensor) -> list[torch.Tensor]:
    """Returns each layer's normed output (B, L, H), what the shared lm_head reads, in order.
    final_norm: the target's final norm (turns the captured stream into h_p)."""
    B, L = batch.tokens.shape
    cos_sin = cos_sin_table.index_select(0, batch.positions.reshape(-1))  # (B*L, D)
    mask = _causal_mask(batch)
    with torch.no_grad():
        state = final_norm(batch.aux)  # h_p: the target's post-norm state, frozen
    normed = []
    for s, layer in enumerate(draft.mtp_layers):
        with torch.no_grad():
            e = embed(shift_left(batch.tokens, s))  # t_{p+s+1}
        e, h = layer.token_layernorm(e), layer.hidden_layernorm(state)
        x = layer.input_proj(torch.cat([h, e] if layer.hidden_first else [e, h], dim=-1))
        out = _block(layer, x, cos_sin, mask)
        normed.append(layer.final_layernorm(out))
        state = out  # chain: layer s + 1 at p consumes layer s's block output at p
    return normed


@torch.no_grad()
def target_topk(lm_head: torch.nn.Linear, label_hidden: torch.Tensor, k: int = TOP_K):
    """(B, L, Ht) -> (probabilities (B, L, k) fp32 renormalised over the k most likely, their ids)."""
    logits = lm_head(label_hidden.to(lm_head.weight.dtype)).float()
    top, ids = logits.topk(min(k, logits.shape[-1]), dim=-1)
    return torch.softmax(top, dim=-1), ids


def soft_ce_topk(lm_head_weight: torch.Tensor, normed: torch.Tensor, probs: torch.Tensor,
                 ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """-sum_i p_i log q_i over the target's top-k tokens, q the draft's full-vocabulary softmax.
    The top-k (k = 64) keeps the target's side at B*L*k instead of B*L*V; the draft's logits are
    recomputed in backward (checkpoint), so no (B, L, V) tensor outlives a step. Returns (ce (B, L),
    the draft's argmax (B, L))."""
    def f(normed, w):
        logp = torch.log_softmax(F.linear(normed, w).float(), dim=-1)
        return -(probs * logp.gather(-1, ids)).sum(-1), logp.argmax(-1)

    if normed.requires_grad:
        return checkpoint(f, normed, lm_head_weight, use_reentrant=False)
    return f(normed, lm_head_weight)


@dataclass
class MTPStats:
    loss: torch.Tensor  # scalar, weighted over layers, with grad
    step_loss: list[float]
    step_acc: list[float]  # top-1 agreement with the target's greedy token, per layer
    correct: list[torch.Tensor]  # (B, L) bool per layer


def mtp_loss(normed: list[torch.Tensor], batch: TTTBatch, lm_head: torch.nn.Linear, decay: float) -> MTPStats:
    total, weight_sum = 0.0, 0.0
    losses, accs, corrects = [], [], []
    for s, n_s in enumerate(normed):
        ok = valid(batch, s)
        probs, ids = target_topk(lm_head, shift_left(batch.label_hidden, s))
        ce, pred = soft_ce_topk(lm_head.weight, n_s, probs, ids)
        n = ok.sum().clamp(min=1)
        loss_s = (ce * ok).sum() / n
        total = total + decay ** s * loss_s
        weight_sum += decay ** s
        correct = (pred == shift_left(batch.greedy, s)) & ok
        corrects.append(correct)
        losses.append(float(loss_s.detach()))
        accs.append(float(correct.sum() / n))
    return MTPStats(total / weight_sum, losses, accs, corrects)


def chain_accept_len(batch: TTTBatch, correct: list[torch.Tensor]) -> tuple[float, int]:
    """Estimated tokens per verify step with k = S: every chain step drafts at the same position,
    so from start p drafts are accepted while layer s is right at p. Exact on greedy replies of the
    target; starts are the response entries when there are any. Returns (estimate, starts)."""
    starts = batch.is_response if bool(batch.is_response.any()) else valid(batch, 0)
    alive, total = starts.clone(), 0
    for c in correct:
        alive = alive & c
        total += int(alive.sum())
    n = int(starts.sum())
    return 1.0 + total / max(n, 1), n
