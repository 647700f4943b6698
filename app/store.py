"""Chat history in SQLite: chats, their messages and each answer's stats, with schema migrations."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

# Each entry moves the schema from version i to i + 1. Append only: never edit a shipped one.
MIGRATIONS: tuple[str, ...] = (
    # 1: chats and messages
    """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        system_prompt TEXT NOT NULL DEFAULT '',
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        role TEXT NOT NULL CHECK (role IN ('system', 'user', 'assistant')),
        content TEXT NOT NULL,
        stats_json TEXT,
        finish_reason TEXT,
        created_at REAL NOT NULL
    );
    CREATE INDEX messages_by_chat ON messages(chat_id, id);
    """,
    # 2: which model wrote an answer (stats alone do not say)
    """
    ALTER TABLE messages ADD COLUMN model TEXT;
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


@dataclass(frozen=True)
class ChatRecord:
    id: int
    title: str
    system_prompt: str
    updated_at: float


@dataclass(frozen=True)
class MessageRecord:
    id: int
    chat_id: int
    role: str
    content: str
    stats: dict[str, Any] | None = None
    finish_reason: str | None = None
    model: str | None = None


class ChatStore:
    """One connection, used from the UI thread only. Write failures go to `on_error`, never up."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, notes: list[str]) -> None:
        self.conn = conn
        self.path = path  # None: in memory, nothing is kept
        self.notes = notes  # messages for the user about how opening went
        self.on_error: Callable[[str], None] = lambda text: None

    @classmethod
    def open(cls, path: Path, timeout_s: float = 1.0) -> ChatStore:
        """Open or create the database; a corrupt file is moved aside (never deleted), and a locked or
        unopenable one leaves this session in memory."""
        notes: list[str] = []
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return cls(_connect(path, timeout_s, notes), path, notes)
        except sqlite3.DatabaseError as e:
            if _is_locked(e):
                notes.append(f"Chat history {path} is locked by another program (is localchat already "
                             "running?). This session's chats will not be saved.")
                return cls.in_memory(notes)
            if not _is_corrupt(e):
                notes.append(f"Cannot open chat history {path} ({e}). This session's chats will not be saved.")
                return cls.in_memory(notes)
            try:
                aside = _move_aside(path)
                notes.append(f"Chat history {path} could not be read ({e}). It was moved to {aside} "
                             "and a new, empty history was started.")
                return cls(_connect(path, timeout_s, notes), path, notes)
            except (OSError, sqlite3.Error) as e2:
                notes.append(f"Chat history {path} could not be read ({e}) nor moved aside ({e2}). "
                             "This session's chats will not be saved.")
                return cls.in_memory(notes)
        except OSError as e:
            notes.append(f"Cannot open chat history {path} ({e}). This session's chats will not be saved.")
            return cls.in_memory(notes)

    @classmethod
    def in_memory(cls, notes: list[str] | None = None) -> ChatStore:
        notes = [] if notes is None else notes
        return cls(_connect(Path(":memory:"), 1.0, notes), None, notes)

    def close(self) -> None:
        self.conn.close()

    # Chats

    def list_chats(self) -> list[ChatRecord]:
        rows = self._read("SELECT id, title, system_prompt, updated_at FROM chats ORDER BY updated_at DESC, id DESC")
        return [ChatRecord(*row) for row in rows]

    def get_chat(self, chat_id: int) -> ChatRecord | None:
        rows = self._read("SELECT id, title, system_prompt, updated_at FROM chats WHERE id = ?", (chat_id,))
        return ChatRecord(*rows[0]) if rows else None

    def create_chat(self, title: str, system_prompt: str) -> ChatRecord:
        now = time.time()
        cur = self._write("INSERT INTO chats (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
                          (title, system_prompt, now, now))
        if cur is None:  # not saved: hand back a record so the session goes on
            return ChatRecord(-int(now * 1000), title, system_prompt, now)
        return ChatRecord(cur.lastrowid, title, system_prompt, now)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._write("UPDATE chats SET title = ?, updated_at = ? WHERE id = ?", (title, time.time(), chat_id))

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None:
        self._write("UPDATE chats SET system_prompt = ? WHERE id = ?", (system_prompt, chat_id))

    def delete_chat(self, chat_id: int) -> None:
        self._write("DELETE FROM chats WHERE id = ?", (chat_id,))

    # Messages

    def messages(self, chat_id: int) -> list[MessageRecord]:
        rows = self._read("SELECT id, chat_id, role, content, stats_json, finish_reason, model "
                          "FROM messages WHERE chat_id = ? ORDER BY id", (chat_id,))
        return [MessageRecord(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None, r[5], r[6])
                for r in rows]

    def add_message(self, chat_id: int, role: str, content: str, stats: dict[str, Any] | None = None,
                    finish_reason: str | None = None, model: str | None = None) -> int | None:
        now = time.time()
        cur = self._write(
            "INSERT INTO messages (chat_id, role, content, stats_json, finish_reason, model, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (chat_id, role, content, json.dumps(stats) if stats else None, finish_reason, model, now),
            touch_chat=chat_id,
        )
        return None if cur is None else cur.lastrowid

    def delete_message(self, message_id: int) -> None:
        self._write("DELETE FROM messages WHERE id = ?", (message_id,))

    # Plumbing

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            self.on_error(f"Reading chat history failed: {e}")
            return []

    def _write(self, sql: str, params: tuple, touch_chat: int | None = None) -> sqlite3.Cursor | None:
        """One statement in its own transaction (committed when it returns: every message is kept as it completes)."""
        try:
            with _transaction(self.conn):
                cur = self.conn.execute(sql, params)
                if touch_chat is not None:
                    self.conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), touch_chat))
            return cur
        except sqlite3.Error as e:
            self.on_error(f"Saving to chat history failed: {e}")
            return None


def _connect(path: Path, timeout_s: float, notes: list[str]) -> sqlite3.Connection:
    # Autocommit mode: transactions are opened explicitly by _transaction, DDL included.
    conn = sqlite3.connect(str(path), timeout=timeout_s, isolation_level=None)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        if str(path) != ":memory:":
            conn.execute("PRAGMA journal_mode = WAL")  # readers never wait for the writer
            check = conn.execute("PRAGMA quick_check").fetchone()[0]
            if check != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {check}")
        _migrate(conn, notes)
        # Fail now, not at the first answer, if another process holds the write lock.
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("ROLLBACK")
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, notes: list[str]) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    version = row[0] if row else 0
    if version > SCHEMA_VERSION:
        notes.append(f"Chat history has schema version {version}, newer than this localchat "
                     f"({SCHEMA_VERSION}): it may not show everything.")
        return
    for target in range(version + 1, SCHEMA_VERSION + 1):
        with _transaction(conn):  # a migration applies whole or not at all
            for statement in _statements(MIGRATIONS[target - 1]):
                conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (target,))


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _statements(script: str) -> list[str]:
    return [s.strip() for s in script.split(";") if s.strip()]


def _move_aside(path: Path) -> Path:
    """Rename the database and its WAL files to <name>.corrupt-<time>; returns the new name."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists():
            part.rename(aside.with_name(aside.name + suffix))
    return aside


def _is_corrupt(error: sqlite3.Error) -> bool:
    text = str(error).lower()
    return any(sign in text for sign in ("not a database", "malformed", "integrity check", "disk image"))


def _is_locked(error: sqlite3.Error) -> bool:
    text = str(error).lower()
    return "locked" in text or "busy" in text
