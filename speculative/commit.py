"""commit: the one place where a verify step's accepted tokens enter the decode state."""

from __future__ import annotations

import torch

from engine.decode import DecodeState


def commit(state: DecodeState, n: int, result: list[int]) -> list[int]:
    """Moves the state past one verify step over the bonus token at n (n tokens cached before it).
    result: [a, next token, d_1..d_k] (at least d_1..d_a), as the whole iterations write it: the a
    accepted drafts and the target's next token are appended, the cache holds the bonus and the
    accepted drafts (n + a + 1), and the step's tokens (a + 1) count towards the accepted length.
    Returns the new tokens."""
    a, next_token, *drafts = result
    out = drafts[:a] + [next_token]
    state.tokens.extend(out)
    state.kv_len = n + a + 1
    state.accept_lens.append(a + 1)
    if state.seen is not None:  # the repetition penalty counts them from the next step on
        state.seen[torch.tensor(out, device=state.seen.device)] = True
    return out
