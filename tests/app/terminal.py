"""A command run in a real terminal (a tmux pane of its own tmux server), as a user runs it: keys go in, the
screen comes out, and the pane stays after the command ends so that its exit and last screen can be read."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable

HAVE_TMUX = shutil.which("tmux") is not None
_DEAD = re.compile(r"Pane is dead \((status|signal) (\d+)")


class Terminal:
    """Runs `argv` in a `columns` x `rows` pane, in `cwd`, with exactly the environment `env`."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path, columns: int = 120, rows: int = 40) -> None:
        self._socket_dir = tempfile.mkdtemp(prefix="localchat-tmux-")  # short: a socket path has ~100 bytes
        self.socket = os.path.join(self._socket_dir, "socket")
        # exec: the pane's process is the command itself, so that its pid is the one to signal.
        self._tmux("-f", "/dev/null", "start-server", ";", "set-option", "-g", "remain-on-exit", "on", ";",
                   "new-session", "-d", "-s", "main", "-x", str(columns), "-y", str(rows), "-c", str(cwd),
                   "exec " + shlex.join(argv), env=env)
        self.pid = int(self._format("#{pane_pid}"))

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        done = subprocess.run(["tmux", "-S", self.socket, *args], env=env, capture_output=True, text=True,
                              timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"tmux {args[0]} failed: {done.stderr.strip()}")
        return done.stdout

    def _format(self, fmt: str) -> str:
        return self._tmux("display-message", "-p", "-t", "main", fmt).strip()

    def screen(self) -> str:
        """What the pane shows now."""
        return self._tmux("capture-pane", "-p", "-t", "main")

    def history(self) -> str:
        """Everything the pane has shown on its normal screen, scrolled-off lines included."""
        return self._tmux("capture-pane", "-p", "-S", "-", "-E", "-", "-t", "main")

    def type_text(self, text: str) -> None:
        self._tmux("send-keys", "-t", "main", "-l", text)

    def press(self, key: str) -> None:
        """A key in tmux's names: Enter, C-q, Escape."""
        self._tmux("send-keys", "-t", "main", key)

    def signal(self, signum: int) -> None:
        os.kill(self.pid, signum)

    @property
    def exit_status(self) -> int | None:
        """None while it runs; its exit status, or minus the signal that killed it (as subprocess does)."""
        if self._format("#{pane_dead}") == "1":
            found = _DEAD.findall(self.history())
            if found:
                kind, number = found[-1]
                return int(number) if kind == "status" else -int(number)
        return self._zombie_status()

    def _zombie_status(self) -> int | None:
        """The status of a command that has ended but that tmux has not reaped yet (under load it can take
        tmux a long while), read from /proc (Linux: the 52nd field of stat is the wait status)."""
        try:
            stat = Path(f"/proc/{self.pid}/stat").read_text()
        except OSError:
            return None
        fields = stat[stat.rindex(")") + 2:].split()  # after "pid (comm) ": the state is field 3
        if fields[0] != "Z" or len(fields) < 50:
            return None
        wait_status = int(fields[49])
        return os.waitstatus_to_exitcode(wait_status)

    @property
    def on_alternate_screen(self) -> bool:
        return self._format("#{alternate_on}") == "1"

    def wait_until(self, condition: Callable[[], bool], timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while not condition():
            if self.exit_status is not None:
                raise AssertionError(f"exited ({self.exit_status}) before {what}:\n{self.history()[-3000:]}")
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}:\n{self.screen()}")
            time.sleep(0.1)

    def wait_exit(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        while (status := self.exit_status) is None:
            if time.monotonic() > deadline:
                raise AssertionError(f"still running {timeout_s} s after being told to stop:\n{self.screen()}")
            time.sleep(0.1)
        return status

    def close(self) -> None:
        """Ends the command if it still runs, and the tmux server."""
        try:
            if self.exit_status is None:
                os.kill(self.pid, signal.SIGKILL)
        except (OSError, RuntimeError):
            pass
        subprocess.run(["tmux", "-S", self.socket, "kill-server"], capture_output=True, timeout=30)
        shutil.rmtree(self._socket_dir, ignore_errors=True)
