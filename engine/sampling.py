"""Sampling as tensor functions: logits -> probabilities -> token, on any device, no host sync."""

from __future__ import annotations

import torch

from engine.types import SamplingParams


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


class SamplingTensors:
    """A request's sampling parameters as device tensors, so one captured graph serves every
    value: temperature, top_k (V: off), top_p (2.0: off), min_p (0.0: off)."""

    def __init__(self, device: torch.device):
        self.temperature = torch.ones((), dtype=torch.float32, device=device)
        self.top_k = torch.zeros((), dtype=torch.long, device=device)
        self.top_p = torch.full((), 2.0, dtype=torch.float32, device=device)
        self.min_p = torch.zeros((), dtype=torch.float32, device=device)

    def set(self, p: SamplingParams, vocab: int) -> None:
        self.temperature.fill_(p.temperature)
        self.top_k.fill_(p.top_k if 0 < p.top_k < vocab else vocab)
        self.top_p.fill_(p.top_p if p.top_p < 1.0 else 2.0)
        self.min_p.fill_(p.min_p)


def filtered(p: SamplingParams) -> bool:
    """Whether top-k, top-p or min-p cut the distribution (probabilities_t's sorting pass)."""
    return p.top_k > 0 or p.top_p < 1.0 or p.min_p > 0.0


def probabilities_t(logits: torch.Tensor, t: SamplingTensors, cut: bool) -> torch.Tensor:
    """probabilities() with the parameters in device tensors and no branch on their values
    (graph-safe). cut=False: temperature only (the request has no top-k/top-p/min-p)."""
    logits = logits / t.temperature
    if not cut:
        return torch.softmax(logits, dim=-1)
    vocab = logits.shape[-1]
    kth = torch.sort(logits, dim=-1, descending=True).values.index_select(-1, (t.top_k.clamp(1, vocab) - 1).view(1))
    logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
    drop_sorted = (sorted_probs.cumsum(-1) - sorted_probs) >= t.top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    probs = probs.masked_fill(drop, 0.0)
    probs = probs / probs.sum(-1, keepdim=True)
    probs = probs.masked_fill(probs < t.min_p * probs.amax(-1, keepdim=True), 0.0)
    return probs / probs.sum(-1, keepdim=True)


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
