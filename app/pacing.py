"""When the UI shows an answer that is streaming in: at once at first, then as often as the engine can afford.

The engine thread gives the GIL up around every GPU sync and torch call and needs it back at once; whenever
the main thread is busy (Textual's layout and repaint) it has to wait. So the engine thread only appends to
an AnswerStream, and the UI reads it at its own pace: it keeps the main thread's CPU time, measured, under a
small share of the wall time while an answer streams. Cheap updates come often (up to MAX_FPS); costly ones
(a long chat, a big screen, a slow machine) come less often, but at least MIN_FPS.

Layout work is kept out of decoding too: an answer's widgets are mounted and drawn before its decoding
starts (release_when_drawn), and the pieces that change while it streams are sized so that an update does
not lay the screen out again where it can help it (StatsLine, the status bar's speed).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from textual.message_pump import MessagePump
from textual.timer import Timer

from app.engine_worker import AnswerStream, EngineWorker

ShowCallback = Callable[[str, Any], Awaitable[None]]


def release_when_drawn(owner: MessagePump, runner: EngineWorker, job_id: int) -> None:
    """Let a held job (EngineWorker.generate(hold=True)) decode once the screen has been refreshed twice:
    the first refresh lays out and paints the widgets just mounted, the second what mounting them started
    (a Markdown parses its text once mounted)."""
    owner.call_after_refresh(owner.call_after_refresh, runner.release, job_id)


class UpdatePacer:
    """A budget of main-thread CPU time: it earns BUDGET seconds a second, and each update spends what the
    main thread measurably used since the previous look (the update, the layout and repaint it caused, and
    anything else). An update may run while the budget is not overdrawn."""

    MAX_FPS = 15
    MIN_FPS = 1  # however costly updates are, show progress about once a second
    BUDGET = 0.03  # the share of the wall time the main thread may use while an answer streams
    BURST_S = 0.004  # the most the budget saves up while nothing new is shown

    def __init__(self) -> None:
        self._wall = time.perf_counter()
        self._cpu = time.thread_time()
        self._credit = 0.0
        self._last_update = self._wall

    def wait_s(self) -> float:
        """Main thread: how long until the next update may run (0: now)."""
        wall, cpu = time.perf_counter(), time.thread_time()
        self._credit = min(self.BURST_S, self._credit + (wall - self._wall) * self.BUDGET - (cpu - self._cpu))
        self._wall, self._cpu = wall, cpu
        overdue = self._last_update + 1 / self.MIN_FPS - wall
        if self._credit >= 0 or overdue <= 0:
            return 0.0
        return min(-self._credit / self.BUDGET, overdue)

    def updated(self) -> None:
        self._last_update = time.perf_counter()


class LiveAnswer:
    """Shows an AnswerStream as the engine writes it: the first text at once, then what is new, paced, goes
    to `show(text, stats)`. Timers and callbacks run on `owner` (the screen)."""

    def __init__(self, owner: MessagePump, stream: AnswerStream, show: ShowCallback) -> None:
        self.owner = owner
        self.stream = stream
        self.show = show
        self._pacer = UpdatePacer()
        self._timer: Timer | None = None
        self._stopped = False

    async def start(self) -> None:
        await self._update(first=True)

    def stop(self) -> None:
        """No more updates (the answer has finished: the rest comes with EngineWorker.Finished)."""
        self._stopped = True
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    async def _update(self, first: bool = False) -> None:
        self._timer = None
        if self._stopped:
            return
        wait = self._pacer.wait_s()
        text = self.stream.take() if wait <= 0 or first else ""
        if not text:
            self._schedule(wait)
            return
        await self.show(text, self.stream.stats())
        self._pacer.updated()
        # The update's cost is known once the screen has been laid out and painted: look then.
        self.owner.call_after_refresh(self._after_refresh)

    def _after_refresh(self) -> None:
        self._schedule(self._pacer.wait_s())

    def _schedule(self, wait: float) -> None:
        if not self._stopped:
            self._timer = self.owner.set_timer(max(wait, 1 / UpdatePacer.MAX_FPS), self._update, name="live-answer")
