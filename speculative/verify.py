"""Acceptance rules for one verify step, as free functions on tensors (no host sync)."""

from __future__ import annotations

import torch


def greedy_accept(draft_tokens: torch.Tensor, target_choice: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """draft_tokens: (k,) proposed ids; target_choice: (k+1,) the target's argmax after
    [bonus, d_1..d_k]. Accepts the longest prefix where d_i equals the target's own choice, so
    the output is exactly what plain greedy decoding would produce.

    Returns (accepted (), 0..k; next_token (): the target's choice after the accepted prefix).
    """
    matches = (draft_tokens == target_choice[:-1]).to(torch.int64)
    accepted = matches.cumprod(0).sum()
    # index_select, not [accepted]: indexing by a tensor syncs, which a CUDA graph cannot hold
    return accepted, target_choice.index_select(0, accepted.view(1))[0]


def rejection_accept(draft_tokens: torch.Tensor, draft_probs: torch.Tensor, target_probs: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Speculative sampling (Leviathan et al., Chen et al.).

    draft_tokens: (k,) sampled from draft_probs (k, V); target_probs: (k+1, V).
    d_i is kept with probability min(1, p(d_i) / q(d_i)); at the first rejection the token is
    drawn from normalize(max(0, p - q)). Together the two cases give exactly p(x) for every x,
    so the output has the target's distribution whatever the draft proposes. If all k are
    kept, the next token is drawn from the target's last row.
    """
    k = draft_tokens.shape[0]
    rows = torch.arange(k, device=draft_tokens.device)
    p = target_probs[rows, draft_tokens]
    q = draft_probs[rows, draft_tokens]
    u = torch.rand(k, device=draft_tokens.device, generator=generator)
    keep = (u * q < p).to(torch.int64)  # u < p/q without dividing by a zero q
    accepted = keep.cumprod(0).sum()
    # Residual distribution at the first rejected row; the target row itself when all were kept.
    padded_q = torch.cat([draft_probs, torch.zeros_like(draft_probs[:1])], dim=0)
    residual = (target_probs[accepted] - padded_q[accepted]).clamp_min(0)
    mass = residual.sum()
    residual = torch.where(mass > 0, residual / mass.clamp_min(1e-30), target_probs[accepted])
    e = torch.empty_like(residual).exponential_(1.0, generator=generator)
    return accepted, (residual / e).argmax()


def accept_drafts(draft_tokens: torch.Tensor, draft_probs: torch.Tensor | None, logits: torch.Tensor,
                  params, seen: torch.Tensor | None, generator: torch.Generator | None):
    """One verify step's rule on the target's (k+1, V) fp32 logits after [bonus, d_1..d_k].

    With a repetition penalty, row i also counts d_1..d_i as seen, which is what plain decoding
    would have seen at that point. Greedy when params.is_greedy (draft_probs unused), else
    rejection sampling against draft_probs (k, V). Returns (accepted (), next_token ()).
    """
    from engine.sampling import apply_repetition_penalty, probabilities

    k = draft_tokens.shape[0]
    if seen is not None:
        hits = torch.zeros(k + 1, logits.shape[-1], dtype=torch.bool, device=logits.device)
        hits[torch.arange(1, k + 1, device=logits.device), draft_tokens] = True
        logits = apply_repetition_penalty(logits, seen | hits.cumsum(0).bool(), params.repetition_penalty)
    if params.is_greedy:
        return greedy_accept(draft_tokens, logits.argmax(-1))
    return rejection_accept(draft_tokens, draft_probs, probabilities(logits, params), generator)
