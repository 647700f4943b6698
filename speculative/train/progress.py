"""train-draft's terminal output: its log lines, and a one-line progress bar.

The bar is redrawn in place (at most a few times a second) on stderr; log lines print above it.
When stderr is not a terminal (a log file, CI) the bar stays silent and the periodic log lines
alone tell the progress.
"""

from __future__ import annotations

import sys
import time


def log(msg: str) -> None:
    """One line of train-draft's log, on stderr."""
    print(f"train-draft: {msg}", file=sys.stderr, flush=True)


class ProgressBar:
    def __init__(self, stream=None, width: int = 24, min_interval: float = 0.25):
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", None)
        self.enabled = bool(isatty and isatty())
        self.width = width
        self.min_interval = min_interval
        self._line = ""
        self._last = 0.0

    def update(self, fraction: float, text: str, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return
        self._last = now
        fraction = min(max(fraction, 0.0), 1.0)
        filled = round(fraction * self.width)
        self._line = f"[{'#' * filled}{'-' * (self.width - filled)}] {fraction * 100:3.0f}%  {text}"
        self.stream.write("\r\x1b[2K" + self._line)
        self.stream.flush()

    def log(self, write, msg: str) -> None:
        """Prints a log line with `write(msg)` above the bar."""
        if self.enabled and self._line:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        write(msg)
        if self.enabled and self._line:
            self.stream.write(self._line)
            self.stream.flush()

    def close(self) -> None:
        if self.enabled and self._line:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
        self._line = ""


def remaining(seconds: float) -> str:
    seconds = max(0, int(seconds))
    return f"{seconds // 60}:{seconds % 60:02d} left"
