"""Which window has a chat open: one lease row per chat, with the holder's pid, host and heartbeat."""

from __future__ import annotations

import os
import secrets
import socket
import sqlite3
import sys
from dataclasses import dataclass

# A holder renews its leases this often; one not renewed for LEASE_TTL_S is taken over even when its
# pid still runs (a pid can be reused, and another host's pid cannot be checked at all).
LEASE_RENEW_S = 15.0
LEASE_TTL_S = 60.0


@dataclass(frozen=True)
class LeaseHolder:
    """A process on a host; the token tells two stores of one process apart."""

    token: str
    pid: int
    host: str
    heartbeat_at: float = 0.0

    @classmethod
    def this_process(cls) -> LeaseHolder:
        return cls(secrets.token_hex(8), os.getpid(), socket.gethostname())

    def describe(self) -> str:
        here = self.host == socket.gethostname()
        return f"pid {self.pid}" + ("" if here else f" on {self.host}")

    def is_live(self, now: float) -> bool:
        if now - self.heartbeat_at > LEASE_TTL_S:
            return False
        return self.host != socket.gethostname() or _pid_running(self.pid)


def holder(conn: sqlite3.Connection, chat_id: int) -> LeaseHolder | None:
    row = conn.execute("SELECT token, pid, host, heartbeat_at FROM chat_leases WHERE chat_id = ?",
                       (chat_id,)).fetchone()
    return LeaseHolder(*row) if row else None


def other_live_holder(conn: sqlite3.Connection, chat_id: int, me: LeaseHolder, now: float) -> LeaseHolder | None:
    """The window that has `chat_id` open now, unless it is `me`; a dead or silent one counts as none."""
    found = holder(conn, chat_id)
    return found if found is not None and found.token != me.token and found.is_live(now) else None


def take(conn: sqlite3.Connection, chat_id: int, me: LeaseHolder, now: float) -> LeaseHolder | None:
    """Inside a write transaction: gives `me` the lease (or renews it) unless another live window holds it;
    returns that window, or None when `me` holds it now."""
    other = other_live_holder(conn, chat_id, me, now)
    if other is not None:
        return other
    conn.execute("INSERT OR REPLACE INTO chat_leases (chat_id, token, pid, host, heartbeat_at) VALUES (?, ?, ?, ?, ?)",
                 (chat_id, me.token, me.pid, me.host, now))
    return None


def release(conn: sqlite3.Connection, me: LeaseHolder, chat_id: int | None = None) -> None:
    """Drops `me`'s lease on `chat_id` (None: on every chat)."""
    if chat_id is None:
        conn.execute("DELETE FROM chat_leases WHERE token = ?", (me.token,))
    else:
        conn.execute("DELETE FROM chat_leases WHERE chat_id = ? AND token = ?", (chat_id, me.token))


def _pid_running(pid: int) -> bool:
    if sys.platform == "win32":  # os.kill(pid, 0) would end the process there: trust the heartbeat
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    except OSError:
        return False
    return True
