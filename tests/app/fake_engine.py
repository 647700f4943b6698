"""A stand-in for engine.Engine: streams a deterministic Markdown answer, word by word, with small sleeps."""

from __future__ import annotations

import threading
import time
import zlib
from typing import Callable, Iterator

from engine.types import GenerationStats, SamplingParams, StreamEvent

# Tokens produced per verify step with speculation: what a draft that is often right looks like.
ACCEPT_PATTERN = (3, 4, 2, 4, 3)


def answer_for(messages: list[dict]) -> str:
    """The same answer with and without speculation (speculation is lossless), different per prompt."""
    prompt = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    turn = sum(1 for m in messages if m["role"] == "user")
    return (
        f"You said: **{prompt.strip()}** (turn {turn}).\n\n"
        "Speculative decoding drafts a few tokens and verifies them in one pass:\n\n"
        "- the draft proposes\n- the target verifies\n- accepted tokens are kept\n\n"
        "```python\nprint('hello from the fake engine')\n```\n\n"
        "That is all for now."
    )


def split_tokens(text: str) -> list[str]:
    """Word-sized pieces that join back to `text` exactly."""
    tokens, current = [], ""
    for ch in text:
        current += ch
        if ch in " \n":
            tokens.append(current)
            current = ""
    if current:
        tokens.append(current)
    return tokens


class FakeEngine:
    def __init__(self, model_name: str = "fake-model", draft_name: str | None = "fake-draft",
                 step_delay_s: float = 0.004, fixed_stats: bool = False,
                 fail_stream: Exception | None = None, twin_fits: bool = True,
                 spec_pays: tuple[bool, str] = (True, ""), measures: bool = False,
                 sampled_spec_pays: tuple[bool, str] | None = None) -> None:
        self.model_name = model_name
        self.draft_name = draft_name
        self.weights = "bf16"
        self.device = "cpu"
        self.has_draft = draft_name is not None
        self.step_delay_s = step_delay_s
        self.fixed_stats = fixed_stats  # stats that never vary, for snapshots
        self.fail_stream = fail_stream
        self.twin_fits = twin_fits  # whether without_draft(if_fits=True) builds the twin
        self.spec_pays = spec_pays  # what speculation_pays() answers (a CPU engine's: (False, reason))
        self.sampled_spec_pays = sampled_spec_pays  # what speculation_pays(sampled=True) answers (None: the same)
        self.measures = measures  # speculation_pays() first measures, as a GPU engine's first load does
        self.logged: list[str] = []
        self.calls: list[dict] = []
        self._lock = threading.Lock()  # the real engine is not thread-safe either: catch misuse
        self._twin: FakeEngine | None = None

    def speculation_pays(self, log=None, sampled: bool = False) -> tuple[bool, str]:
        if sampled and self.sampled_spec_pays is not None:
            return self.sampled_spec_pays if self.has_draft else (False, "no draft")
        if self.measures and self.has_draft:
            text = "measuring whether speculation pays on this GPU (once for this model and draft)"
            self.logged.append(text)
            if log:
                log(text)
            time.sleep(0.05)
        return self.spec_pays if self.has_draft else (False, "no draft")

    def without_draft(self, if_fits: bool = False) -> "FakeEngine | None":
        """Engine.without_draft: a twin with no draft that shares this one's calls and lock."""
        if not self.has_draft:
            return self
        if if_fits and not self.twin_fits:
            return None
        if self._twin is None:
            self._twin = FakeEngine(self.model_name, None, self.step_delay_s, self.fixed_stats, self.fail_stream)
            self._twin.calls, self._twin._lock = self.calls, self._lock
        return self._twin

    def stream(self, messages: list[dict], params: SamplingParams, speculative: bool | None = None,
               stop_event: threading.Event | None = None, t0: float | None = None) -> Iterator[StreamEvent]:
        if not self._lock.acquire(blocking=False):
            raise RuntimeError("FakeEngine.stream called from two threads at once")
        try:
            yield from self._stream(messages, params, speculative, stop_event, t0)
        finally:
            self._lock.release()

    def _stream(self, messages, params, speculative, stop_event, t0) -> Iterator[StreamEvent]:
        is_spec = self.has_draft and (True if speculative is None else speculative)
        self.calls.append({"messages": messages, "speculative": is_spec, "thread": threading.get_ident(),
                           "params": params, "draft_loaded": self.has_draft})
        if self.fail_stream is not None:
            raise self.fail_stream
        tokens = split_tokens(answer_for(messages))[: params.max_tokens]
        stats = GenerationStats(prompt_tokens=sum(len(m["content"].split()) for m in messages),
                                speculative=is_spec, draft_steps=5 if is_spec else 0, draft_loaded=self.has_draft)
        start = time.perf_counter() if t0 is None else t0  # time to first token counts from t0, as in Engine
        time.sleep(self.step_delay_s)  # prefill
        stats.ttft_s = 0.05 if self.fixed_stats else time.perf_counter() - start
        pos, step = 0, 0
        while pos < len(tokens):
            if stop_event is not None and stop_event.is_set():
                yield StreamEvent("", [], stats, finished=True, finish_reason="cancelled")
                return
            n = ACCEPT_PATTERN[step % len(ACCEPT_PATTERN)] if is_spec else 1
            chunk = tokens[pos: pos + n]
            pos += len(chunk)
            step += 1
            if step > 1:
                time.sleep(self.step_delay_s)
            stats.generated_tokens = pos
            stats.decode_s = time.perf_counter() - start - stats.ttft_s
            if is_spec:
                stats.verify_steps = step
                stats.accept_len_mean = pos / step
            if self.fixed_stats:
                stats.decode_tok_s = 120.0 if is_spec else 40.0
                stats.accept_len_mean = 3.2 if is_spec else 0.0
            else:
                stats.decode_tok_s = (pos - 1) / stats.decode_s if stats.decode_s > 0 and pos > 1 else 0.0
            done = pos >= len(tokens)
            reason = ("length" if len(tokens) == params.max_tokens else "stop") if done else None
            yield StreamEvent("".join(chunk), [zlib.crc32(t.encode()) for t in chunk], stats,
                              finished=done, finish_reason=reason)


def fake_factory(load_delay_s: float = 0.0, fail_load: Exception | None = None,
                 **engine_kwargs) -> Callable:
    """An EngineFactory: reports load progress like the real one, then returns a FakeEngine."""
    made: list[FakeEngine] = []

    def factory(on_progress: Callable[[str, float | None], None]) -> FakeEngine:
        for i in range(4):
            on_progress(f"Loading weights {i + 1}/4", i / 4)
            time.sleep(load_delay_s / 4)
        if fail_load is not None:
            raise fail_load
        on_progress("Ready", 1.0)
        engine = FakeEngine(**engine_kwargs)
        made.append(engine)
        return engine

    factory.made = made  # type: ignore[attr-defined]
    return factory
