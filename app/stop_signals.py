"""Stop signals: SIGINT and SIGTERM turned into each command's own way of stopping cleanly.

Commands without the UI (`run`, `download`, `serve`, ...) stop through KeyboardInterrupt in the main thread,
so that the same `except`/`finally` blocks that clean up after Ctrl+C run after SIGTERM too. The UI quits
instead, as Ctrl+Q does: Textual then leaves the alternate screen and the app saves what it has."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

# A second signal this soon after the first is the same stop delivered twice (GNU `timeout` signals the
# process and then its process group; Ctrl+C reaches every process of a pipeline): it is ignored, so that it
# cannot break off the cleanup the first one started. A later one stops the cleanup too.
REPEAT_S = 2.0


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread where Ctrl+C raises KeyboardInterrupt."""


def exit_status(stop: KeyboardInterrupt) -> int:
    """The shell's convention: 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""
    return 128 + (signal.SIGTERM if isinstance(stop, Terminated) else signal.SIGINT)


def describe(stop: KeyboardInterrupt) -> str:
    return "terminated" if isinstance(stop, Terminated) else "interrupted"


@contextmanager
def interrupt_on_stop_signals() -> Iterator[None]:
    """Inside: SIGTERM raises Terminated and SIGINT KeyboardInterrupt, in the main thread."""
    def interrupt(signum: int, frame) -> None:
        raise _stop_for(signum)

    with _handling(interrupt):
        yield


@contextmanager
def quit_on_stop_signals(quit: Callable[[], None]) -> Iterator[None]:
    """Inside, while an asyncio loop runs in the main thread (the app's): SIGINT and SIGTERM call `quit` on that
    loop, never in the middle of whatever code the signal interrupted. Before the loop starts and after it
    ends they raise, as interrupt_on_stop_signals does."""
    import asyncio  # here: the commands without the UI do not pay for it

    def ask_to_quit(signum: int, frame) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop: nothing would run the callback
            raise _stop_for(signum) from None
        loop.call_soon_threadsafe(quit)

    with _handling(ask_to_quit):
        yield


def _stop_for(signum: int) -> KeyboardInterrupt:
    return Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


@contextmanager
def _handling(handler: Callable[[int, object], None]) -> Iterator[None]:
    """Installs `handler` for SIGINT and SIGTERM, except for one that is ignored (as SIGINT is for a background
    job of a non-interactive shell), then puts the previous handlers back. Python runs signal handlers in the
    main thread only: elsewhere, nothing is installed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    last: list[float] = []

    def once(signum: int, frame) -> None:
        now = time.monotonic()
        if last and now - last[0] < REPEAT_S:
            return
        last[:] = [now]
        handler(signum, frame)

    previous = {signum: signal.signal(signum, once) for signum in (signal.SIGINT, signal.SIGTERM)
                if signal.getsignal(signum) is not signal.SIG_IGN}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
