"""Plain data passed across the engine facade: sampling settings, stats, stream events."""

from __future__ import annotations

from dataclasses import dataclass, field, asdict

from engine.errors import UserError

# torch.Generator.manual_seed takes 0 .. 2**64 - 1 (negative seeds alias positive ones).
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy."""

    temperature: float = 0.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1.0: off
    min_p: float = 0.0  # 0.0: off
    repetition_penalty: float = 1.0  # 1.0: off
    seed: int | None = None
    max_tokens: int = 512
    stop: tuple[str, ...] = ()
    # Benchmarks: decode max_tokens whatever the model says, the tokenizer's EOS ids ending nothing
    # (stop strings still end the answer), so that every run times the same number of tokens.
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        if not self.temperature >= 0.0:
            raise UserError(f"--temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise UserError(f"--top-k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise UserError(f"--top-p must be in (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p < 1.0:
            raise UserError(f"--min-p must be in [0, 1), got {self.min_p}")
        if not self.repetition_penalty > 0.0:
            raise UserError(f"--repetition-penalty must be > 0, got {self.repetition_penalty}")
        if self.max_tokens < 1:
            raise UserError(f"--max-tokens must be >= 1, got {self.max_tokens}")
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed <= MAX_SEED):
            raise UserError(f"--seed must be an integer from 0 to 2**64 - 1, got {str(self.seed)[:24]}")

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0.0


ACCEPT_SPAN = 128  # answer tokens per entry of GenerationStats.accept_by_span


@dataclass
class GenerationStats:
    """Measured on the engine thread; times in seconds."""

    prompt_tokens: int = 0
    prefill_tokens: int = 0  # prompt tokens actually run (the rest came from the KV cache)
    generated_tokens: int = 0
    ttft_s: float = 0.0
    decode_s: float = 0.0
    decode_tok_s: float = 0.0
    speculative: bool | None = False  # None: unknown (a remote server that decides it itself)
    # A draft was loaded: its target runs the batch-invariant kernels, slower for plain decoding
    # than those of an engine without one (Engine.without_draft).
    draft_loaded: bool = False
    draft_steps: int = 0
    verify_steps: int = 0
    accept_len_mean: float = 0.0
    # accept_hist[n] = number of verify steps that produced n tokens (accepted drafts + bonus)
    accept_hist: list[int] = field(default_factory=list)
    # accept_by_position[i] = fraction of verify steps that accepted draft i + 1 (drafts are
    # accepted as a prefix, so this falls with i); per-step acceptance of multi-step drafts
    accept_by_position: list[float] = field(default_factory=list)
    # accept_by_span[j] = [verify steps that began in answer tokens [j * ACCEPT_SPAN, (j + 1) *
    # ACCEPT_SPAN), tokens they produced]: whether a draft keeps up deep into long answers
    accept_by_span: list[list[int]] = field(default_factory=list)
    # tokens a verify step runs through the target on average: k + 1 for a chain (with its
    # runners-up, more), the root and the kept nodes for a draft tree
    verify_tokens: float = 0.0
    tree: str | None = None  # the draft tree's shape, TOPK,DEPTH,TOKENS (None: chains of draft_steps)

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StreamEvent:
    """One step of a streamed answer: the text and token ids added since the last event."""

    text: str
    token_ids: list[int]
    stats: GenerationStats
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "cancelled" when finished


@dataclass(frozen=True)
class GenerationResult:
    text: str
    token_ids: list[int]
    stats: GenerationStats
    finish_reason: str

    def to_json(self) -> dict:
        return {
            "text": self.text,
            "token_ids": self.token_ids,
            "finish_reason": self.finish_reason,
            "stats": self.stats.to_json(),
        }
