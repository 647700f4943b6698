"""Speculator: what the engine facade calls on a speculative decoder (EAGLE-3 or MTP)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, Protocol, runtime_checkable

if TYPE_CHECKING:
    from engine.decode import DecodeState
    from engine.runner import ModelRunner


@runtime_checkable
class Speculator(Protocol):
    """Eagle3Speculator (eagle3/speculator.py) and MTPSpeculator (mtp/speculator.py); the engine
    gets one from build.build_speculator and reaches speculation through nothing else."""

    k: int  # draft tokens per verify step: the target's verify forward takes k + 1 rows

    def reusable_prefix(self, target_cached: list[int], prompt: list[int]) -> int:
        """How many leading tokens of `prompt` keep both their target K/V (target_cached: the
        tokens the target cache holds) and the draft's own cache entries; the next answer
        prefills from there. Forgets what the draft's cache held: call once per answer."""
        ...

    def capture(self, defer: bool = False) -> None:
        """Captures the speculator's CUDA graphs (nothing on a CPU). defer: where the speculator
        can, at its first answer instead."""
        ...

    def tokens(self, runner: ModelRunner, state: DecodeState) -> Iterator[list[int]]:
        """Prefills state.tokens[state.kv_len:], then yields each step's new tokens: the first
        token alone, then each verify step's accepted drafts and the target's next token (through
        commit.commit), and plain steps once a verify step no longer fits in the context. At
        each yield only the last token is missing from the target cache (len(state.tokens) ==
        state.kv_len + 1). The caller stops it on EOS or max_tokens."""
        ...
