"""Chat history in SQLite: chats, their messages and each answer's stats, with schema migrations."""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Callable, Iterator

from app import chat_lease
from app.chat_lease import LeaseHolder
from app.chat_records import ChatRecord, MessageRecord
from app.write_queue import ChatChange, ChatDeletion, ChatHeld, MessageDeletion, NewChat, NewMessage, Write, \
    WriteQueue, describe

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
    # 3: which window has a chat open (see chat_lease)
    """
    CREATE TABLE chat_leases (
        chat_id INTEGER PRIMARY KEY REFERENCES chats(id) ON DELETE CASCADE,
        token TEXT NOT NULL,
        pid INTEGER NOT NULL,
        host TEXT NOT NULL,
        heartbeat_at REAL NOT NULL
    );
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


__all__ = ["ChatRecord", "ChatStore", "MessageRecord", "MIGRATIONS", "SCHEMA_VERSION"]

# A write waits this long for another process's lock before it is kept in memory for later: long enough
# that a reader or another window's write never costs a message, short enough that the UI thread, which
# does the writing, is not frozen for long.
WRITE_TIMEOUT_S = 5.0
# While writes are pending the database is known to be locked or full: tries are short then, so that
# the retry timer and each new message do not freeze the UI again.
RETRY_TIMEOUT_S = 0.05
# Taking a lease waits for other windows' short transactions (two apps starting together), not for a
# long lock: it is taken later by the renewal, and until then only a holder that can be seen refuses.
LEASE_TIMEOUT_S = 1.0


class ChatStore:
    """One connection, used from the UI thread only. Every write goes through a WriteQueue: written at once
    when the database takes it, else kept in order and written by a later `flush`; reads include pending
    writes. Failures go to `on_error`, never up; `on_pending` hears the number of writes waiting."""

    def __init__(self, conn: sqlite3.Connection, path: Path | None, notes: list[str],
                 timeout_s: float = WRITE_TIMEOUT_S) -> None:
        self.conn = conn
        self.path = path  # None: in memory, nothing is kept
        self.notes = notes  # messages for the user about how opening went
        self.timeout_s = timeout_s
        self.queue = WriteQueue()
        self.me = LeaseHolder.this_process()
        self.on_error: Callable[[str], None] = lambda text: None
        self.on_pending: Callable[[int], None] = lambda count: None
        self._busy_timeout_s = timeout_s  # what _connect gave the connection
        self._stalled = False  # the user was told that writes wait

    @classmethod
    def open(cls, path: Path, timeout_s: float = WRITE_TIMEOUT_S) -> ChatStore:
        """Open or create the database; a corrupt file is moved aside (never deleted), and an unopenable one
        (or one locked while it needs a schema upgrade) leaves this session in memory."""
        notes: list[str] = []
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return cls(_connect_retrying(path, timeout_s, notes), path, notes, timeout_s)
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
                return cls(_connect(path, timeout_s, notes), path, notes, timeout_s)
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
        return cls(_connect(Path(":memory:"), 1.0, notes), None, notes, 1.0)

    def close(self) -> Path | None:
        """Writes what is pending (waiting the full timeout) and gives up this window's leases. Writes that
        still cannot be made go to a JSON file beside the database, whose path is returned."""
        if self.queue:
            self._flush(self.timeout_s)
        with suppress(sqlite3.Error), self._transaction(RETRY_TIMEOUT_S):
            chat_lease.release(self.conn, self.me)
        kept = self._keep_pending() if self.queue else None
        self.conn.close()
        return kept

    @property
    def num_pending(self) -> int:
        return len(self.queue)

    def resolve(self, any_id: int) -> int:
        """The database id of a chat or message, for one handed out before it was saved."""
        return self.queue.resolve(any_id)

    # Chats

    def list_chats(self) -> list[ChatRecord]:
        rows = self._read("SELECT id, title, system_prompt, updated_at FROM chats")
        chats = self.queue.chats_view([ChatRecord(*row) for row in rows])
        return sorted(chats, key=lambda c: (c.updated_at, c.id), reverse=True)

    def get_chat(self, chat_id: int) -> ChatRecord | None:
        chat_id = self.resolve(chat_id)
        rows = self._read("SELECT id, title, system_prompt, updated_at FROM chats WHERE id = ?", (chat_id,))
        return next((c for c in self.queue.chats_view([ChatRecord(*r) for r in rows]) if c.id == chat_id), None)

    def create_chat(self, title: str, system_prompt: str) -> ChatRecord:
        """A new chat, leased to this window; its id is provisional (negative) until it is saved."""
        now = time.time()
        key = self.queue.new_key()
        self._submit(NewChat(key, title, system_prompt, now))
        return self.get_chat(key) or ChatRecord(key, title, system_prompt, now, is_saved=False)

    def rename_chat(self, chat_id: int, title: str) -> None:
        self._submit(ChatChange(chat_id, title=title))

    def set_system_prompt(self, chat_id: int, system_prompt: str) -> None:
        self._submit(ChatChange(chat_id, system_prompt=system_prompt))

    def delete_chat(self, chat_id: int) -> LeaseHolder | None:
        """Deletes the chat and its messages, unless another live window has it open: then nothing is
        deleted and that window is returned (its later messages would have nowhere to go)."""
        other = self.lease_holder(chat_id)
        if other is None:
            self._submit(ChatDeletion(chat_id))
        return other

    # Leases: one window per chat

    def take_lease(self, chat_id: int, timeout_s: float = LEASE_TIMEOUT_S) -> LeaseHolder | None:
        """This window opens `chat_id`: None when it may, else the live window that has it open. When the
        database cannot be written now, only a holder that can be seen refuses."""
        chat_id = self.resolve(chat_id)
        if chat_id < 0:  # not saved yet: saving it takes the lease
            return None
        try:
            with self._transaction(min(timeout_s, self._write_timeout(len(self.queue)))):
                return chat_lease.take(self.conn, chat_id, self.me, time.time())
        except sqlite3.Error:
            return self.lease_holder(chat_id)

    def renew_lease(self, chat_id: int) -> LeaseHolder | None:
        """As take_lease, without waiting on a lock: a renewal missed now is made at the next one."""
        return self.take_lease(chat_id, RETRY_TIMEOUT_S)

    def release_lease(self, chat_id: int) -> None:
        """Best effort: a lease left behind expires (LEASE_TTL_S) once it is no longer renewed."""
        with suppress(sqlite3.Error), self._transaction(RETRY_TIMEOUT_S):
            chat_lease.release(self.conn, self.me, self.resolve(chat_id))

    def lease_holder(self, chat_id: int) -> LeaseHolder | None:
        """The live window other than this one that has `chat_id` open, if any."""
        try:
            return chat_lease.other_live_holder(self.conn, self.resolve(chat_id), self.me, time.time())
        except sqlite3.Error:
            return None

    # Messages

    def messages(self, chat_id: int) -> list[MessageRecord]:
        rows = self._read("SELECT id, chat_id, role, content, stats_json, finish_reason, model "
                          "FROM messages WHERE chat_id = ? ORDER BY id", (self.resolve(chat_id),))
        saved = [MessageRecord(r[0], r[1], r[2], r[3], json.loads(r[4]) if r[4] else None, r[5], r[6])
                 for r in rows]
        return self.queue.messages_view(chat_id, saved)

    def add_message(self, chat_id: int, role: str, content: str, stats: dict[str, Any] | None = None,
                    finish_reason: str | None = None, model: str | None = None) -> int | None:
        """The message's id (provisional while it waits to be saved); None if the database refused it."""
        key = self.queue.new_key()
        self._submit(NewMessage(key, chat_id, role, content, stats, finish_reason, model, time.time()))
        return None if key in self.queue.dropped else self.resolve(key)

    def delete_message(self, message_id: int) -> None:
        self._submit(MessageDeletion(message_id))

    # Writing

    def flush(self) -> None:
        """Tries the pending writes again (the app's timer calls this while any wait)."""
        before = len(self.queue)
        self._flush(RETRY_TIMEOUT_S)
        if len(self.queue) != before:
            self.on_pending(len(self.queue))

    def _submit(self, write: Write) -> None:
        before = len(self.queue)
        self.queue.writes.append(write)
        self._flush(self._write_timeout(before))
        if len(self.queue) != before:
            self.on_pending(len(self.queue))

    def _write_timeout(self, pending: int) -> float:
        """The full timeout when nothing waits; a short one while writes already wait for the database."""
        return self.timeout_s if pending == 0 else RETRY_TIMEOUT_S

    def _flush(self, timeout_s: float) -> None:
        """Writes pending writes in order, each in its own transaction, until one cannot be written yet."""
        while self.queue:
            try:
                with self._transaction(timeout_s):
                    new_id = self.queue.apply_first(self.conn, self.me)
            except sqlite3.OperationalError as e:  # locked, full, I/O: it may go through later
                if not self._stalled:
                    self._stalled = True
                    self.on_error(f"Cannot write the chat history now ({e}). Your messages are kept and "
                                  "saved as soon as it can be written.")
                return
            except (sqlite3.Error, ChatHeld) as e:  # refused for good: trying again would fail the same way
                self.on_error(f"Could not save {describe(self.queue.drop_first())} to the chat history: {e}")
                continue
            self.queue.mark_applied(new_id)
        self._stalled = False

    @contextmanager
    def _transaction(self, timeout_s: float) -> Iterator[None]:
        if timeout_s != self._busy_timeout_s:
            self.conn.execute(f"PRAGMA busy_timeout = {int(timeout_s * 1000)}")
            self._busy_timeout_s = timeout_s
        with _transaction(self.conn):
            yield

    def _read(self, sql: str, params: tuple = ()) -> list[tuple]:
        try:
            return self.conn.execute(sql, params).fetchall()
        except sqlite3.Error as e:
            self.on_error(f"Reading chat history failed: {e}")
            return []

    def _keep_pending(self) -> Path | None:
        if self.path is None:
            return None
        kept = self.path.with_name(f"{self.path.name}.unsaved-{time.strftime('%Y%m%d-%H%M%S')}.json")
        try:
            kept.write_text(self.queue.as_json(), encoding="utf-8")
        except OSError:
            return None
        return kept


def _connect_retrying(path: Path, timeout_s: float, notes: list[str]) -> sqlite3.Connection:
    """_connect, tried again while the database is locked, up to timeout_s. Two apps opening a
    history at once can get SQLITE_BUSY at once, without SQLite's busy handler: switching a new file
    to WAL, or a read that must become a write after the other committed, never waits."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return _connect(path, timeout_s, notes)
        except sqlite3.OperationalError as e:
            if not _is_locked(e) or time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


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
    except BaseException:
        conn.close()
        raise
    return conn


def _migrate(conn: sqlite3.Connection, notes: list[str]) -> None:
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'schema_version'").fetchone():
        with _transaction(conn):  # IMMEDIATE: waits for another app's write rather than failing at once
            conn.execute("CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
    version = _version(conn)
    if version > SCHEMA_VERSION:
        notes.append(f"Chat history has schema version {version}, newer than this localchat "
                     f"({SCHEMA_VERSION}): it may not show everything.")
        return
    while version < SCHEMA_VERSION:
        with _transaction(conn):  # a migration applies whole or not at all
            version = _version(conn)  # read under the write lock: another app may have just migrated
            if version >= SCHEMA_VERSION:
                break
            for statement in _statements(MIGRATIONS[version]):
                conn.execute(statement)
            conn.execute("DELETE FROM schema_version")
            conn.execute("INSERT INTO schema_version (version) VALUES (?)", (version + 1,))
        version += 1


def _version(conn: sqlite3.Connection) -> int:
    row = conn.execute("SELECT version FROM schema_version").fetchone()
    return row[0] if row else 0


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed COMMIT (busy, full) leaves the transaction open
            with suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
        raise


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
