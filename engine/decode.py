"""DecodeState and the plain decoding steps shared by the facade and every speculator."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator

import torch

from engine.sampling import apply_repetition_penalty, choose_tokens
from engine.types import SamplingParams


@dataclass
class DecodeState:
    """What a token generator shares with the facade while it runs."""

    tokens: list[int]  # prompt + every token produced so far
    kv_len: int  # leading tokens of `tokens` whose K/V are in the target cache
    params: SamplingParams
    generator: torch.Generator | None
    seen: torch.Tensor | None = None  # (V,) bool, for the repetition penalty
    accept_lens: list[int] = field(default_factory=list)  # per verify step (speculation)
    verify_rows: list[int] = field(default_factory=list)  # tokens each verify step ran through the target
    tree: str | None = None  # the draft tree's shape when the speculator drafts trees for this answer


def choose_token(row: torch.Tensor, state: DecodeState) -> torch.Tensor:
    """The token after `row` (V,) logits as a (1,) tensor on the device: the request's penalty over
    the tokens seen, its pick or draw (from its generator), the token marked seen. No host sync."""
    if state.seen is not None:
        row = apply_repetition_penalty(row, state.seen, state.params.repetition_penalty)
    tok = choose_tokens(row, state.params, state.generator).view(1)
    if state.seen is not None:
        state.seen.index_fill_(0, tok, True)
    return tok


def choose_next(row: torch.Tensor, state: DecodeState) -> int:
    """Picks the token after `row` (V,) logits, appends it to the state and returns it (syncs)."""
    t = int(choose_token(row, state))
    state.tokens.append(t)
    return t


def plain_steps(runner, state: DecodeState) -> Iterator[list[int]]:
    """One token a step from a state whose last token is not in the cache yet, until the
    context is full (the caller stops earlier on EOS or max_tokens)."""
    while state.kv_len < runner.max_len:
        n = state.kv_len
        tok = torch.tensor([state.tokens[n]], dtype=torch.long, device=runner.device)
        logits, _, _ = runner.forward(tok, n)
        state.kv_len = n + 1
        yield [choose_next(logits[-1], state)]
