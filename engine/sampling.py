"""Sampling as tensor functions: logits -> probabilities -> token, on any device, no host sync."""

from __future__ import annotations

import torch

from .types import SamplingParams


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """logits: (..., V); seen: (..., V) bool, tokens already in the context (prompt + output).
    CTRL-style: a seen token's positive logit is divided by the penalty, a negative one multiplied."""
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def probabilities(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """(..., V) fp32 logits -> (..., V) probabilities after temperature, top-k, top-p, min-p.

    Temperature must be > 0 here; greedy decoding takes the argmax instead.
    """
    logits = logits / p.temperature
    if p.top_k > 0 and p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if p.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        # Keep the smallest prefix whose mass reaches top_p (the top token always stays).
        drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= p.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    if p.min_p > 0.0:
        probs = probs.masked_fill(probs < p.min_p * probs.amax(-1, keepdim=True), 0.0)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample_from(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """Draws one token per row. Exponential race (argmax p/E, E ~ Exp(1)) equals multinomial
    sampling and needs no host sync."""
    e = torch.empty_like(probs).exponential_(1.0, generator=generator)
    return (probs / e).argmax(dim=-1)


def choose_tokens(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator | None) -> torch.Tensor:
    """(..., V) logits (penalty already applied) -> (...) token ids."""
    if p.is_greedy:
        return logits.argmax(dim=-1)
    return sample_from(probabilities(logits, p), generator)
