"""The engine thread: loads the model, runs one generation at a time, and reports by posting messages.

While an answer streams, the engine thread only appends its text to an `AnswerStream`; the UI reads it
at its own pace (see app/pacing.py). Nothing is posted per token: the engine thread needs the GIL back after
every GPU sync, and each message it posts wakes the UI, whose work then holds the GIL."""

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

from app.remote import RemoteEngine

if TYPE_CHECKING:
    from engine.types import GenerationStats, SamplingParams, StreamEvent

    from app.settings import Settings

ProgressCallback = Callable[[str, "float | None"], None]


class ChatEngine(Protocol):
    """What the UI needs of `engine.Engine` (tests pass a fake with the same shape)."""

    model_name: str
    draft_name: str | None
    device: str
    has_draft: bool

    def stream(self, messages: list[dict], params: SamplingParams, speculative: bool | None = None,
               stop_event: threading.Event | None = None, t0: float | None = None) -> Iterator[StreamEvent]: ...

    def without_draft(self, if_fits: bool = False) -> ChatEngine | None: ...


EngineFactory = Callable[[ProgressCallback], ChatEngine]


class AnswerStream:
    """One answer as the engine thread writes it. The engine thread appends; the UI thread takes what is new
    whenever it chooses to show it (appending to and reading a list is safe under the GIL)."""

    def __init__(self) -> None:
        self._pieces: list[str] = []
        self._taken = 0
        self._stats: Any = None  # the engine's live GenerationStats: copy before reading (snapshot)

    def write(self, text: str, stats: Any) -> None:
        """Engine thread."""
        if text:
            self._pieces.append(text)
        self._stats = stats

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def take(self) -> str:
        """UI thread: the text written since the previous take."""
        end = len(self._pieces)
        new = "".join(self._pieces[self._taken:end])
        self._taken = end
        return new

    def stats(self) -> Any:
        """UI thread: a copy of the latest stats."""
        return _snapshot(self._stats)


@dataclass
class _Job:
    job_id: int
    target: MessagePump
    messages: list[dict]
    settings: Settings
    side: str
    speculative: bool
    stop_event: threading.Event
    asked_at: float  # time.perf_counter() when the UI asked: time to first token counts from here (or the load)
    go: threading.Event  # set by release(): the UI has drawn the answer's place, decoding may start
    no_draft: bool = False  # on the engine without its draft (compare's baseline), where it fits


@dataclass
class _Reload:
    factory: "EngineFactory"


class _LoadStopped(Exception):
    """Raised from the load's own progress report once the app is shutting down."""


def _release_gpu_memory() -> None:
    import gc

    gc.unfreeze()  # the old model may have been frozen out of collections after its load
    gc.collect()
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def weights_text(engine) -> str:
    """What a loaded model's projections run in, for the status bar: its format where a GPU
    decodes it in place, "Q4_1 as bf16" where it was dequantized, "" where unknown (a server)."""
    weights, runs_as = getattr(engine, "weights", ""), getattr(engine, "runs_as", "")
    if not weights or not runs_as or weights == runs_as:
        return runs_as or weights or ""
    if weights in ("bf16", "fp16", "fp32"):  # a float checkpoint in the dtype of this device
        return runs_as
    return f"{weights} as {runs_as}"


class EngineWorker:
    """Owns the only thread that touches the engine. Never blocks on the UI while decoding: it posts messages
    and appends to an AnswerStream. Only before a held job starts does it wait for the UI (release)."""

    HOLD_MAX_S = 1.0  # the longest a held job waits for release() before it starts anyway

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
        remote: str | None = None  # the server's address when the engine is a RemoteEngine
        spec_by_server: bool = False  # a server that takes no per-request speculation switch
        spec_pays: bool = True  # speculation is the faster default on this engine (Engine.speculation_pays)
        spec_reason: str = ""  # why not, in a few words
        weights: str = ""  # what the model's projections run in: "Q4_1" (decoded in place), "Q4_1 as bf16", "bf16"
        # the same for answers drawn at a temperature (Engine.speculation_pays(sampled=True))
        sampled_spec_pays: bool = True
        sampled_spec_reason: str = ""

    @dataclass
    class LoadFailed(Message):
        error: str

    @dataclass
    class Started(Message):
        """The answer's first text is in `stream`: show it now, then read the rest from `stream` at the UI's pace."""
        job_id: int
        side: str
        stream: AnswerStream

    @dataclass
    class Finished(Message):
        job_id: int
        side: str
        text: str  # the whole answer
        stats: GenerationStats | None
        finish_reason: str
        token_ids: list[int] = dataclasses.field(default_factory=list)  # the whole answer's

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
        self._pending: dict[int, _Job] = {}
        # Daemon: a thread stuck in a long torch call cannot keep the process alive. Exit must still wait for it
        # (join): torch aborts the process when the interpreter ends while a thread is inside it.
        self._thread = threading.Thread(target=self._run, name="localchat-engine", daemon=True)
        self._closing = threading.Event()  # set once by shutdown(): no load, job or reload runs after it
        self._load_target: MessagePump | None = None
        self._loaded_at = 0.0

    def start(self, target: MessagePump) -> None:
        """Load the model in the background; progress and the outcome go to `target`."""
        self._load_target = target
        self._thread.start()

    def generate(self, target: MessagePump, messages: list[dict], settings: Settings,
                 speculative: bool, side: str = "answer", hold: bool = False, no_draft: bool = False) -> int:
        """Queue an answer; reports go to `target`. With `hold`, decoding waits for release(job_id) (at most
        HOLD_MAX_S): the UI calls it once the answer's widgets are mounted and drawn, so that layout work does
        not run alongside decoding. Time to first token still counts from now (or, asked while the model
        loads, from the end of the load). no_draft: decode on Engine.without_draft() (where it fits in
        memory; the answer's stats say which engine ran: draft_loaded)."""
        job = _Job(next(self._job_ids), target, [dict(m) for m in messages], settings, side, speculative,
                   threading.Event(), time.perf_counter(), threading.Event(), no_draft)
        if not hold:
            job.go.set()
        self._pending[job.job_id] = job
        self._jobs.put(job)
        return job.job_id

    def release(self, job_id: int) -> None:
        """Let a held job start decoding."""
        job = self._pending.get(job_id)
        if job is not None:
            job.go.set()

    def reload(self, factory: EngineFactory) -> None:
        """Swap in another model: the current engine is released first, on the engine thread."""
        self.stop()
        self._jobs.put(_Reload(factory))

    def stop(self) -> None:
        """Stop the running answer at once and drop the queued ones."""
        for job in list(self._pending.values()):
            job.stop_event.set()
            job.go.set()

    def shutdown(self) -> None:
        """Stop everything: the answer at its next step, a load at its next phase; then the thread ends."""
        self._closing.set()
        self.stop()
        self._jobs.put(None)

    def join(self, timeout_s: float | None = None) -> bool:
        """Wait (at most timeout_s) for the engine thread to end after shutdown(); True once it has ended."""
        if self._thread.ident is None:  # never started
            return True
        self._thread.join(timeout_s)
        return not self._thread.is_alive()

    @property
    def busy(self) -> bool:
        return bool(self._pending)

    # Everything below runs on the engine thread.

    def _run(self) -> None:
        self._load()
        while (job := self._jobs.get()) is not None:
            if isinstance(job, _Reload):
                if self._closing.is_set():
                    continue
                self.engine, self.factory = None, job.factory
                _release_gpu_memory()
                self._load()
                continue
            try:
                job.go.wait(self.HOLD_MAX_S)
                if job.stop_event.is_set():
                    job.target.post_message(self.Finished(job.job_id, job.side, "", None, "cancelled"))
                else:
                    self._generate(job)
            finally:
                self._pending.pop(job.job_id, None)

    def _load(self) -> None:
        target = self._load_target
        assert target is not None

        def on_progress(text: str, fraction: float | None) -> None:
            # A load reports progress between its phases (and during a download), never inside a torch call,
            # which nothing can interrupt: the points where a quit during a load takes effect (Engine.load).
            if self._closing.is_set():
                raise _LoadStopped
            target.post_message(self.LoadProgress(text, fraction))

        self.load_error = None  # a failed load is forgotten once another one starts (F5)
        try:
            engine = self.factory(on_progress)
        except Exception as e:  # any failure, OOM included, becomes a message; the app keeps running
            if self._closing.is_set():  # stopped on quit (or failed meanwhile): no one is left to tell
                return
            self.load_error = _describe(e)
            target.post_message(self.LoadFailed(self.load_error))
            return
        if self._closing.is_set():
            return
        self.engine = engine
        self._loaded_at = time.perf_counter()
        is_remote = isinstance(engine, RemoteEngine)
        try:  # on a GPU, the first load of a model and draft measures whether speculation pays
            pays, reason = engine.speculation_pays(lambda text: on_progress(text, None))
            sampled_pays, sampled_reason = engine.speculation_pays(sampled=True)  # from the same measurement
        except _LoadStopped:
            return
        target.post_message(self.Loaded(engine.model_name, engine.draft_name, engine.device, engine.has_draft,
                                        engine.url if is_remote else None, is_remote and not engine.is_localchat,
                                        pays, reason, weights_text(engine), sampled_pays, sampled_reason))

    def _generate(self, job: _Job) -> None:
        target, side = job.target, job.side
        if self.engine is None:
            target.post_message(self.Failed(job.job_id, side, f"No model is loaded: {self.load_error}"))
            return
        stream = AnswerStream()
        stats: Any = None
        finish_reason = "stop"
        started = False
        ids: list[int] = []
        try:
            from engine.types import SamplingParams

            params = SamplingParams(**job.settings.sampling_kwargs())
            engine = (self.engine.without_draft(if_fits=True) if job.no_draft else None) or self.engine
            for event in engine.stream(job.messages, params, speculative=job.speculative,
                                       stop_event=job.stop_event, t0=max(job.asked_at, self._loaded_at)):
                stream.write(event.text, event.stats)
                ids.extend(event.token_ids)
                stats = event.stats
                if event.finished:
                    finish_reason = event.finish_reason or "stop"
                    break
                if not started and event.text:  # the first text goes out at once: time to first token
                    started = True
                    target.post_message(self.Started(job.job_id, side, stream))
        except Exception as e:
            target.post_message(self.Failed(job.job_id, side, _describe(e)))
            return
        if job.stop_event.is_set():
            finish_reason = "cancelled"
        target.post_message(self.Finished(job.job_id, side, stream.text, _snapshot(stats), finish_reason, ids))


def _snapshot(stats: Any) -> Any:
    """A copy the UI may read while the engine keeps updating its own."""
    if stats is None:
        return None
    return dataclasses.replace(stats, accept_hist=list(stats.accept_hist),
                               accept_by_span=[list(span) for span in stats.accept_by_span])


def _describe(error: BaseException) -> str:
    text = str(error).strip() or "no details"
    if isinstance(error, MemoryError) or "out of memory" in text.lower():
        return f"Out of memory: {text}"
    if isinstance(error, UserError):  # already written for the user
        return text
    return f"{type(error).__name__}: {text}"
