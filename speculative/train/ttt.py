"""Training-time test: the EAGLE-3 head unrolled over several draft steps on packed rows.

What the speculator does at inference (speculative/eagle3/speculator.py), restated per position:
draft entry p pairs token x_{p+1} with a hidden state and predicts x_{p+2}. Step 0 is the
draft-extend pass: its hidden state is the target's state f_p. Step t > 0 is the t-th decode
step: its hidden state is the pre-norm output of step t-1 at position p-1, and its attention
reads the step-0 keys at positions <= p-t (written by the extend pass) plus the keys that steps
1..t wrote at positions p-t+1..p, one per step. `unroll` computes exactly that for every
position at once: the keys of step t are [step 0 | step 1 shifted by t-1 | ... | step t], under
a mask that is causal-minus-t on the first block and diagonal on the others. Every step of an
entry is labelled with the same target distribution (the target's next-token logits at p+1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from torch.nn.attention import SDPBackend, sdpa_kernel

from engine.rope import apply_rope

# Arbitrary boolean masks: the memory-efficient kernel on CUDA (never materialises the scores),
# the math kernel elsewhere. Flash cannot take a mask; cuDNN's masked path is avoided on purpose.
_MASKED_BACKENDS = [SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class DocFeatures:
    """Draft entries of one sequence of n tokens (m = n - 1 entries), on the training device."""

    tokens: torch.Tensor  # (m,) x_{p+1}
    aux: torch.Tensor  # (m, A) target state f_p (extend width)
    label_hidden: torch.Tensor  # (m, Ht) target's final (post-norm) state at p+1
    greedy: torch.Tensor  # (m,) the target's argmax at p+1 (full vocabulary): x_{p+2} when greedy
    is_response: torch.Tensor  # (m,) bool: x_{p+2} is a token the target generated itself

    @property
    def num_entries(self) -> int:
        return self.tokens.shape[0]


@dataclass
class TTTBatch:
    tokens: torch.Tensor  # (B, L)
    positions: torch.Tensor  # (B, L) position inside its own sequence (0 on padding)
    doc: torch.Tensor  # (B, L) sequence index inside the row, -1 on padding
    aux: torch.Tensor  # (B, L, A)
    label_hidden: torch.Tensor  # (B, L, Ht)
    greedy: torch.Tensor  # (B, L)
    is_response: torch.Tensor  # (B, L) bool

    @classmethod
    def from_rows(cls, rows: list[list[DocFeatures]], seq_len: int) -> "TTTBatch":
        """Packs rows of sequences into (B, seq_len) tensors; every row's entries fit in seq_len.
        One concatenation and one scatter per field (not one copy per sequence and field)."""
        first = rows[0][0]
        dev = first.tokens.device
        B = len(rows)
        flat_at, positions, docs = [], [], []
        for b, row in enumerate(rows):
            at = 0
            for d, f in enumerate(row):
                m = f.num_entries
                flat_at.append(torch.arange(b * seq_len + at, b * seq_len + at + m))
                positions.append(torch.arange(m))
                docs.append(torch.full((m,), d, dtype=torch.long))
                at += m
            assert at <= seq_len, "a packed row is longer than seq_len"
        idx = torch.cat(flat_at).to(dev, non_blocking=True)
        feats = [f for row in rows for f in row]
        index_like = torch.empty(0, dtype=torch.long)

        def place(name: str, fill, like: torch.Tensor, cpu_values: list[torch.Tensor] | None = None):
            out = torch.full((B * seq_len, *like.shape[1:]), fill, dtype=like.dtype, device=dev)
            values = torch.cat(cpu_values).to(dev, non_blocking=True) if cpu_values is not None \
                else torch.cat([getattr(f, name) for f in feats])
            out[idx] = values
            return out.view(B, seq_len, *like.shape[1:])

        return cls(
            tokens=place("tokens", 0, first.tokens),
            positions=place("", 0, index_like, positions),
            doc=place("", -1, index_like, docs),
            aux=place("aux", 0, first.aux),
            label_hidden=place("label_hidden", 0, first.label_hidden),
            greedy=place("greedy", 0, first.greedy),
            is_response=place("is_response", False, first.is_response),
        )

    def valid(self, t: int) -> torch.Tensor:
        """(B, L) entries that exist at step t: step t at p needs step t-1 at p-1 in the same sequence."""
        return (self.doc >= 0) & (self.positions >= t)


def _shift_right(x: torch.Tensor, s: int) -> torch.Tensor:
    """x (B, L, ...) -> row p holds x[p - s]; the first s rows are zeros."""
    if s == 0:
        return x
    return torch.cat([x.new_zeros(x.shape[0], s, *x.shape[2:]), x[:, :x.shape[1] - s]], dim=1)


def _step_mask(batch: TTTBatch, t: int, a: int = 0, b: int | None = None) -> torch.Tensor:
    """(B, 1, b-a, b + t(b-a)) bool: which keys the step-t queries of rows a..b-1 see (see the
    module docstring): step 0's keys of rows 0..b-1, then each later step's keys of rows a..b-1
    (a query sees only its own row there). a = 0, b = L: every query and key."""
    B, L = batch.tokens.shape
    b = L if b is None else b
    pos, doc = batch.positions, batch.doc
    valid = batch.valid(t)[:, a:b]
    same = (doc[:, a:b, None] == doc[:, None, :b]) & (doc[:, a:b, None] >= 0)
    first = same & (pos[:, None, :b] <= pos[:, a:b, None] - t)
    rows = torch.arange(a, b, device=pos.device)
    own = rows[:, None] == torch.arange(b, device=pos.device)[None, :]  # (b-a, b): the query's own row
    first = first | (own & ~valid[:, :, None])  # rows that do not exist see themselves: no NaN
    eye = torch.eye(b - a, dtype=torch.bool, device=pos.device).expand(B, b - a, b - a)
    return torch.cat([first] + [eye] * t, dim=-1).unsqueeze(1)


# Queries per SDPA call in the training-time test. A query of rows a..b-1 needs step 0's keys of
# rows 0..b-1 and the later steps' keys of its own rows only, so chunks skip most of the keys
# one call over every row would compute and mask (at L = 1024 and 5 steps, 2.7x fewer).
Q_CHUNK = 256


def _masked_attention(q, key_blocks, value_blocks, batch: TTTBatch, t: int, scale: float) -> torch.Tensor:
    """Step t's attention: q (B, L, Hq, D); key/value blocks, one (B, L, Hkv, D) per step 0..t,
    block i > 0 already shifted so that row p holds the key the query at p sees. Returns
    (B, Hq, L, D). Runs in chunks of Q_CHUNK queries."""
    B, L, Hq, D = q.shape
    g = Hq // key_blocks[0].shape[2]  # GQA by repeating: keeps SDPA on its masked memory-efficient kernel
    outs = []
    for a in range(0, L, Q_CHUNK):
        b = min(L, a + Q_CHUNK)
        k = torch.cat([key_blocks[0][:, :b]] + [kb[:, a:b] for kb in key_blocks[1:]], dim=1)
        v = torch.cat([value_blocks[0][:, :b]] + [vb[:, a:b] for vb in value_blocks[1:]], dim=1)
        k = k.repeat_interleave(g, dim=2).transpose(1, 2)  # (B, Hq, S, D)
        v = v.repeat_interleave(g, dim=2).transpose(1, 2)
        with sdpa_kernel(_MASKED_BACKENDS):
            outs.append(F.scaled_dot_product_attention(q[:, a:b].transpose(1, 2), k, v,
                                                       attn_mask=_step_mask(batch, t, a, b), scale=scale))
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)


def unroll(draft, embed: torch.nn.Embedding, batch: TTTBatch, ttt_steps: int) -> list[torch.Tensor]:
    """Returns the draft's logits (B, L, Vd) fp32 for steps 0..ttt_steps-1."""
    layer = draft.midlayer
    dc = draft.config
    B, L = batch.tokens.shape
    Hq, Hkv, D = layer.num_heads, layer.num_kv_heads, layer.head_dim
    with torch.no_grad():
        embeds = embed(batch.tokens)  # (B, L, H) the target's embeddings, frozen
    hidden = draft.fc(batch.aux) if dc.needs_fc else batch.aux
    cos_sin = draft.cos_sin.index_select(0, batch.positions.reshape(-1))  # (B*L, D)
    keys, values, logits = [], [], []
    out = hidden  # the previous step's output, set at the end of each step
    for t in range(ttt_steps):
        if t > 0:
            hidden = _shift_right(out, 1)  # step t at p consumes step t-1's output at p-1
        normed_h = layer.hidden_norm(hidden)
        residual = normed_h if layer.norm_before_residual else hidden
        x = torch.cat([layer.input_layernorm(embeds), normed_h], dim=-1)  # (B, L, 2H)
        q, k, v = layer.self_attn.qkv_proj(x).split([layer.q_size, layer.kv_size, layer.kv_size], dim=-1)
        q = apply_rope(q.reshape(B * L, Hq, D), cos_sin).view(B, L, Hq, D)
        k = apply_rope(k.reshape(B * L, Hkv, D), cos_sin).view(B, L, Hkv, D)
        keys.append(k)
        values.append(v.reshape(B, L, Hkv, D))
        # Keys of step t: step 0 as is, step i (1..t) shifted so that row p holds position p-t+i.
        key_blocks = [keys[0]] + [_shift_right(keys[i], t - i) for i in range(1, t + 1)]
        value_blocks = [values[0]] + [_shift_right(values[i], t - i) for i in range(1, t + 1)]
        o = _masked_attention(q, key_blocks, value_blocks, batch, t, layer.scale)  # (B, Hq, L, D)
        h = residual + layer.self_attn.o_proj(o.transpose(1, 2).reshape(B, L, Hq * D))
        out = h + layer.mlp(layer.post_attention_layernorm(h))
        logits.append(draft.lm_head(draft.norm(out)).float())
    return logits


@dataclass
class StepStats:
    loss: torch.Tensor  # scalar, weighted over steps, with grad
    step_loss: list[float]
    step_acc: list[float]  # top-1 agreement with the target's greedy token, per step
    correct: list[torch.Tensor]  # (B, L) bool per step


def greedy_in_draft(greedy: torch.Tensor, draft_ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The target's greedy tokens as draft-vocabulary indices; -1 where the draft lacks the token."""
    t2d = torch.full((vocab_size,), -1, dtype=torch.long, device=draft_ids.device)
    t2d[draft_ids] = torch.arange(draft_ids.numel(), device=draft_ids.device)
    return t2d[greedy]


def ttt_loss(step_logits: list[torch.Tensor], batch: TTTBatch, target_logits: torch.Tensor,
             d2t: torch.Tensor, decay: float, greedy_draft: torch.Tensor | None = None,
             greedy_weight: float = 0.0, soft_temperature: float = 1.0) -> StepStats:
    """Soft cross-entropy against the target's distribution over the draft vocabulary (both at
    soft_temperature), plus greedy_weight times the hard cross-entropy on the target's greedy
    token (greedy_draft: its draft index, -1 where the draft vocabulary lacks it), which is what
    greedy verification accepts. target_logits: (B, L, Vd) the target's logits at p+1 restricted
    to the draft vocabulary. The per-step figures reach the host in one transfer."""
    inv_t = 1.0 / soft_temperature
    target_p = torch.softmax(target_logits.float() * inv_t, dim=-1)
    total, weight_sum = 0.0, 0.0
    loss_t_all, acc_all, corrects = [], [], []
    use_hard = greedy_weight > 0 and greedy_draft is not None
    for t, logits in enumerate(step_logits):
        valid = batch.valid(t)
        logp = torch.log_softmax(logits, dim=-1)
        soft_logp = logp if soft_temperature == 1.0 else torch.log_softmax(logits * inv_t, dim=-1)
        ce = -(target_p * soft_logp).sum(-1)  # (B, L)
        n = valid.sum().clamp(min=1)
        loss_t = (ce * valid).sum() / n
        if use_hard:
            has = valid & (greedy_draft >= 0)
            hard = -logp.gather(-1, greedy_draft.clamp(min=0).unsqueeze(-1)).squeeze(-1)
            loss_t = loss_t + greedy_weight * (hard * has).sum() / has.sum().clamp(min=1)
        w = decay ** t
        total = total + w * loss_t
        weight_sum += w
        with torch.no_grad():
            pred = logits.argmax(-1)
            correct = ((pred + d2t[pred]) == batch.greedy) & valid
            corrects.append(correct)
            loss_t_all.append(loss_t.detach())
            acc_all.append(correct.sum() / n)
    figures = torch.stack(loss_t_all + acc_all).float().tolist()
    k = len(step_logits)
    return StepStats(total / weight_sum, figures[:k], figures[k:], corrects)


def chain_accept_len(batch: TTTBatch, correct: list[torch.Tensor]) -> tuple[float, int]:
    """Estimated mean tokens per verify step (accepted drafts + bonus) with k = len(correct)
    drafts: from each starting entry p, drafts are accepted while step t is right at p + t in the
    same sequence. Exact for text the target generated greedily; starts are the response entries
    when there are any, else every entry. Returns (estimate, number of starts)."""
    B, L = batch.tokens.shape
    starts = batch.is_response if bool(batch.is_response.any()) else batch.valid(0)
    alive = starts.clone()
    total = torch.zeros((), device=alive.device)
    for t, c in enumerate(correct):
        at = torch.zeros_like(c)
        at[:, :L - t] = c[:, t:] & (batch.doc[:, t:] == batch.doc[:, :L - t])
        alive = alive & at
        total = total + alive.sum()
    n = int(starts.sum())
    return 1.0 + float(total) / max(n, 1), n
