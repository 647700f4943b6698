"""Byte counting, speed and ETA for a download, and the cancel switch checked as bytes arrive."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass


class DownloadCancelled(Exception):
    """Raised inside the download thread when the cancel event is set; nothing partial is kept."""


@dataclass(frozen=True)
class DownloadProgress:
    """A snapshot of one download; every field is safe to read from another thread."""

    done_bytes: int
    total_bytes: int
    speed: float  # bytes/s over the last few seconds
    filename: str
    finished: bool = False

    @property
    def fraction(self) -> float:
        return min(1.0, self.done_bytes / self.total_bytes) if self.total_bytes > 0 else 1.0

    @property
    def eta_s(self) -> float | None:
        left = self.total_bytes - self.done_bytes
        if left <= 0:
            return 0.0
        return left / self.speed if self.speed > 0 else None


ProgressCallback = Callable[[DownloadProgress], None]


class ProgressMeter:
    """Counts bytes across all files of one download and reports at most every `interval` seconds.

    The download calls `add` as bytes arrive (the lock lets several threads share one meter).
    Setting `cancel` makes the next `add` raise DownloadCancelled, which aborts the file being
    fetched; the download then deletes its temporary file, so nothing half-written reaches the cache.
    """

    WINDOW_S = 5.0  # speed is measured over this window so it follows changes without jitter

    def __init__(
        self,
        total_bytes: int,
        callback: ProgressCallback | None = None,
        cancel: threading.Event | None = None,
        interval: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total_bytes = total_bytes
        self.callback = callback
        self.cancel = cancel or threading.Event()
        self.interval = interval
        self.clock = clock
        self.done_bytes = 0
        self.filename = ""
        self._lock = threading.Lock()
        self._samples: deque[tuple[float, int]] = deque([(clock(), 0)])
        self._last_report = float("-inf")

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise DownloadCancelled("download cancelled")

    def start_file(self, filename: str) -> None:
        self.check_cancel()
        self.filename = filename
        self._report(force=True)

    def add(self, n: int) -> None:
        """Count n more bytes (negative when a restarted file drops what it had)."""
        with self._lock:
            self.done_bytes += n
        self.check_cancel()
        self._report()

    def finish(self) -> None:
        self._report(force=True, finished=True)

    def snapshot(self, finished: bool = False) -> DownloadProgress:
        now = self.clock()
        with self._lock:
            samples = self._samples
            samples.append((now, self.done_bytes))
            while len(samples) > 2 and now - samples[1][0] >= self.WINDOW_S:
                samples.popleft()
            (t0, b0), (t1, b1) = samples[0], samples[-1]
            speed = (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0
            return DownloadProgress(self.done_bytes, self.total_bytes, max(speed, 0.0), self.filename, finished)

    def _report(self, force: bool = False, finished: bool = False) -> None:
        if self.callback is None:
            return
        now = self.clock()
        if not force and now - self._last_report < self.interval:
            return
        self._last_report = now
        self.callback(self.snapshot(finished))
