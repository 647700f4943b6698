"""The engine thread: loads the model, runs one generation at a time, and reports by posting messages."""

from __future__ import annotations

import dataclasses
import itertools
import queue
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Protocol

from engine.errors import UserError  # torch-free, like engine.types
from textual.message import Message
from textual.message_pump import MessagePump

if TYPE_CHECKING:
    from engine.types import GenerationStats, SamplingParams, StreamEvent

    from .settings import Settings

ProgressCallback = Callable[[str, "float | None"], None]


class ChatEngine(Protocol):
    """What the UI needs of `engine.Engine` (tests pass a fake with the same shape)."""

    model_name: str
    draft_name: str | None
    device: str
    has_draft: bool

    def stream(self, messages: list[dict], params: SamplingParams, speculative: bool | None = None,
               stop_event: threading.Event | None = None) -> Iterator[StreamEvent]: ...


EngineFactory = Callable[[ProgressCallback], ChatEngine]


@dataclass
class _Job:
    job_id: int
    target: MessagePump
    messages: list[dict]
    settings: Settings
    sides: tuple[tuple[str, bool], ...]  # (side name, speculative) run one after the other
    stop_event: threading.Event


@dataclass
class _Reload:
    factory: "EngineFactory"


def _release_gpu_memory() -> None:
    import gc

    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class EngineRunner:
    """Owns the only thread that touches the engine. Never blocks on the UI: it only posts messages."""

    UPDATE_INTERVAL_S = 1 / 25  # text deltas are coalesced: the UI refreshes at most 25 times a second

    @dataclass
    class LoadProgress(Message):
        text: str
        fraction: float | None

    @dataclass
    class Loaded(Message):
        model_name: str
        draft_name: str | None
        device: str
        has_draft: bool

    @dataclass
    class LoadFailed(Message):
        error: str

    @dataclass
    class Delta(Message):
        job_id: int
        side: str
        text: str  # added since the previous Delta of this job and side
        stats: GenerationStats

    @dataclass
    class Finished(Message):
        job_id: int
        side: str
        text: str  # the whole answer
        stats: GenerationStats | None
        finish_reason: str

    @dataclass
    class Failed(Message):
        job_id: int
        side: str
        error: str

    def __init__(self, factory: EngineFactory) -> None:
        self.factory = factory
        self.engine: ChatEngine | None = None
        self.load_error: str | None = None
        self._jobs: queue.Queue[_Job | _Reload | None] = queue.Queue()
        self._job_ids = itertools.count(1)
        self._pending: dict[int, threading.Event] = {}
        self._thread = threading.Thread(target=self._run, name="localchat-engine", daemon=True)
        self._load_target: MessagePump | None = None

    def start(self, target: MessagePump) -> None:
        """Load the model in the background; progress and the outcome go to `target`."""
        self._load_target = target
        self._thread.start()

    def generate(self, target: MessagePump, messages: list[dict], settings: Settings,
                 speculative: bool, side: str = "answer") -> int:
        return self._submit(target, messages, settings, ((side, speculative),))

    def compare(self, target: MessagePump, messages: list[dict], settings: Settings) -> int:
        """The same prompt with speculation off, then on (never both at once: they would share the GPU)."""
        return self._submit(target, messages, settings, (("off", False), ("on", True)))

    def reload(self, factory: EngineFactory) -> None:
        """Swap in another model: the current engine is released first, on the engine thread."""
        self.stop()
        self._jobs.put(_Reload(factory))

    def stop(self) -> None:
        """Stop the running answer at once and drop the queued ones."""
        for event in list(self._pending.values()):
            event.set()

    def shutdown(self) -> None:
        self.stop()
        self._jobs.put(None)

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    def _submit(self, target: MessagePump, messages: list[dict], settings: Settings,
                sides: tuple[tuple[str, bool], ...]) -> int:
        job = _Job(next(self._job_ids), target, [dict(m) for m in messages], settings, sides, threading.Event())
        self._pending[job.job_id] = job.stop_event
        self._jobs.put(job)
        return job.job_id

    # Everything below runs on the engine thread.

    def _run(self) -> None:
        self._load()
        while (job := self._jobs.get()) is not None:
            if isinstance(job, _Reload):
                self.engine, self.factory = None, job.factory
                _release_gpu_memory()
                self._load()
                continue
            try:
                for side, speculative in job.sides:
                    if job.stop_event.is_set():
                        job.target.post_message(self.Finished(job.job_id, side, "", None, "cancelled"))
                        continue
                    self._generate(job, side, speculative)
            finally:
                self._pending.pop(job.job_id, None)

    def _load(self) -> None:
        target = self._load_target
        assert target is not None

        def on_progress(text: str, fraction: float | None) -> None:
            target.post_message(self.LoadProgress(text, fraction))

        try:
            engine = self.factory(on_progress)
        except Exception as e:  # any failure, OOM included, becomes a message; the app keeps running
            self.load_error = _describe(e)
            target.post_message(self.LoadFailed(self.load_error))
            return
        self.engine = engine
        target.post_message(self.Loaded(engine.model_name, engine.draft_name, engine.device, engine.has_draft))

    def _generate(self, job: _Job, side: str, speculative: bool) -> None:
        target = job.target
        if self.engine is None:
            target.post_message(self.Failed(job.job_id, side, f"No model is loaded: {self.load_error}"))
            return
        pieces: list[str] = []
        unsent: list[str] = []
        stats: Any = None
        finish_reason = "stop"
        last_post = 0.0  # the first token goes out at once: time to first token is what the user sees
        try:
            from engine.types import SamplingParams

            params = SamplingParams(**job.settings.sampling_kwargs())
            for event in self.engine.stream(job.messages, params, speculative=speculative,
                                            stop_event=job.stop_event):
                pieces.append(event.text)
                unsent.append(event.text)
                stats = event.stats
                if event.finished:
                    finish_reason = event.finish_reason or "stop"
                    break
                now = time.monotonic()
                if now - last_post >= self.UPDATE_INTERVAL_S:
                    target.post_message(self.Delta(job.job_id, side, "".join(unsent), _snapshot(stats)))
                    unsent.clear()
                    last_post = now
        except Exception as e:
            target.post_message(self.Failed(job.job_id, side, _describe(e)))
            return
        if job.stop_event.is_set():
            finish_reason = "cancelled"
        target.post_message(self.Finished(job.job_id, side, "".join(pieces), _snapshot(stats), finish_reason))


def _snapshot(stats: Any) -> Any:
    """A copy the UI may read while the engine keeps updating its own."""
    if stats is None:
        return None
    return dataclasses.replace(stats, accept_hist=list(stats.accept_hist))


def _describe(error: BaseException) -> str:
    text = str(error).strip() or "no details"
    if isinstance(error, MemoryError) or "out of memory" in text.lower():
        return f"Out of memory: {text}"
    if isinstance(error, UserError):  # already written for the user
        return text
    return f"{type(error).__name__}: {text}"
