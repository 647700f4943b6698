"""Scheduler: one engine thread decodes one request at a time; the others wait in a bounded queue.

The engine is not thread-safe and decodes at batch 1, so requests take turns. The event loop never
waits on the engine: the engine thread appends each step's event to the job and wakes the loop at most
once per batch of events (a wake-up per token would hold the GIL the engine thread needs after every
step)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import AsyncIterator

from engine.types import SamplingParams, StreamEvent

WAITING, RUNNING, DONE = "waiting", "running", "done"


class QueueFull(Exception):
    """Every place in the queue is taken; `retry_after_s` estimates when one frees."""

    def __init__(self, retry_after_s: int):
        super().__init__(f"the server is busy; retry in {retry_after_s} s")
        self.retry_after_s = retry_after_s


class EngineFailed(Exception):
    """The engine raised while answering; the message is one line for the client."""


@dataclass
class _End:
    error: BaseException | None = None


@dataclass(eq=False)
class Job:
    prompt_ids: list[int]
    params: SamplingParams
    speculative: bool | None
    loop: asyncio.AbstractEventLoop
    job_id: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None
    state: str = WAITING
    stop_event: threading.Event = field(default_factory=threading.Event)
    _events: deque = field(default_factory=deque)  # StreamEvents then an _End: engine thread -> loop
    _wake: asyncio.Event = field(default_factory=asyncio.Event)
    _wake_pending: bool = False

    @property
    def queue_s(self) -> float:
        return (self.started_at or time.perf_counter()) - self.submitted_at

    def push(self, item: StreamEvent | _End) -> None:
        """Engine thread. Appending to a deque is safe under the GIL; the loop is woken once until it runs."""
        self._events.append(item)
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self.loop.call_soon_threadsafe(self._woken)
            except RuntimeError:  # the loop has closed (server shutting down): no one is listening
                pass

    def _woken(self) -> None:
        self._wake_pending = False
        self._wake.set()

    async def updates(self) -> AsyncIterator[list[StreamEvent]]:
        """Event loop: the events so far, in batches, until the answer ends; raises EngineFailed."""
        while True:
            batch, end = [], None
            while self._events:
                item = self._events.popleft()
                if isinstance(item, _End):
                    end = item
                    break
                batch.append(item)
            if batch:
                yield batch
            if end is not None:
                if end.error is not None:
                    raise EngineFailed(_one_line(end.error))
                return
            if not batch:
                await self._wake.wait()
                self._wake.clear()


class Scheduler:
    """Owns the engine thread. `submit` places a job or raises QueueFull; `cancel` stops a job at the
    engine's next step (or drops it from the queue), so the next request starts without delay."""

    def __init__(self, engine, max_waiting: int, log: logging.Logger | None = None,
                 spec_default: bool = True, spec_note: str = "", spec_sampled: tuple[bool, str] | None = None):
        self.engine = engine
        self.max_waiting = max_waiting
        # Whether a request that does not say `speculative` speculates (with a draft loaded): off
        # where speculation is slower on this machine (Engine.speculation_pays), and why; a sampled
        # request by spec_sampled (its own verdict; None: the same).
        self.spec_default, self.spec_note = spec_default, spec_note
        self.spec_sampled = spec_sampled if spec_sampled is not None else (spec_default, spec_note)
        self.log = log or logging.getLogger("uvicorn.error")
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._lock = threading.Lock()
        self._num_waiting = 0
        self._running: Job | None = None
        self._ids = itertools.count(1)
        self._mean_s = 2.0  # a running mean of the seconds an answer takes: the Retry-After estimate
        self._thread = threading.Thread(target=self._run, name="localchat-engine", daemon=True)
        self._thread.start()

    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def is_decoding(self) -> bool:
        return self._running is not None

    def submit(self, job: Job) -> None:
        with self._lock:
            ahead = self._num_waiting + (self._running is not None)
            if ahead >= 1 + self.max_waiting:
                raise QueueFull(max(1, math.ceil(self._mean_s * ahead)))
            job.job_id = next(self._ids)
            self._num_waiting += 1
        if ahead:
            self.log.info("request %d queued: %d request(s) ahead of it", job.job_id, ahead)
        self._jobs.put(job)

    def cancel(self, job: Job) -> None:
        """Any thread; a job already done is left as it is."""
        job.stop_event.set()
        with self._lock:
            if job.state == WAITING:
                job.state = DONE
                self._num_waiting -= 1
                self.log.info("request %d left the queue (client gone)", job.job_id)

    def close(self, timeout_s: float = 10.0) -> None:
        with self._lock:
            running = self._running
        if running is not None:
            running.stop_event.set()
        self._jobs.put(None)
        self._thread.join(timeout_s)

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            with self._lock:
                if job.state != WAITING:  # cancelled while it waited
                    continue
                self._num_waiting -= 1
                job.state, self._running = RUNNING, job
            try:
                self._decode(job)
            finally:
                with self._lock:
                    job.state, self._running = DONE, None

    def _decode(self, job: Job) -> None:
        job.started_at = t0 = time.perf_counter()
        if job.queue_s >= 0.05:
            self.log.info("request %d starts after %.1f s in the queue", job.job_id, job.queue_s)
        last = None
        try:
            default = self.spec_default if job.params.is_greedy else self.spec_sampled[0]
            speculative = default if job.speculative is None else job.speculative
            engine = self.engine
            if not speculative and getattr(engine, "has_draft", False) and hasattr(engine, "without_draft"):
                # plain decoding on the model without its draft where it fits: the faster kernels
                engine = engine.without_draft(if_fits=True) or engine
            for event in engine.stream_ids(job.prompt_ids, job.params, speculative, job.stop_event, t0):
                job.push(event)
                last = event
        except Exception as e:  # the request fails, the server lives on
            self.log.error("request %d failed: %s", job.job_id, _one_line(e))
            job.push(_End(e))
            return
        job.push(_End())
        seconds = time.perf_counter() - t0
        self._mean_s = 0.8 * self._mean_s + 0.2 * seconds
        if last is not None:
            s = last.stats
            spec = f", accepted length {s.accept_len_mean:.2f}" if s.speculative else ""
            self.log.info("request %d: %d tokens, %.1f tok/s%s, %s", job.job_id, s.generated_tokens,
                          s.decode_tok_s, spec, last.finish_reason)


def _one_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
