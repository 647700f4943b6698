"""Writes to the chat history in order, kept in memory until the database takes them, with provisional ids."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from app import chat_lease
from app.chat_lease import LeaseHolder
from app.chat_records import ChatRecord, MessageRecord


@dataclass(frozen=True)
class NewChat:
    key: int  # provisional id, negative
    title: str
    system_prompt: str
    at: float


@dataclass(frozen=True)
class ChatChange:
    chat_id: int
    title: str | None = None  # None: unchanged
    system_prompt: str | None = None


@dataclass(frozen=True)
class ChatDeletion:
    chat_id: int


@dataclass(frozen=True)
class NewMessage:
    key: int  # provisional id, negative
    chat_id: int
    role: str
    content: str
    stats: dict[str, Any] | None
    finish_reason: str | None
    model: str | None
    at: float


@dataclass(frozen=True)
class MessageDeletion:
    message_id: int


Write = NewChat | ChatChange | ChatDeletion | NewMessage | MessageDeletion


class ChatHeld(Exception):
    """A deletion refused because another live window has the chat open."""

    def __init__(self, holder: LeaseHolder) -> None:
        super().__init__(f"it is open in another localchat window ({holder.describe()})")
        self.holder = holder


class WriteQueue:
    """Writes not in the database yet, oldest first. A new chat or message gets a negative provisional id
    at once, so the UI can go on with it (add messages, delete it) before it is saved; `resolve` maps it
    to the database's id once it is, and a write that names it is applied only after it."""

    def __init__(self) -> None:
        self.writes: deque[Write] = deque()
        self.ids: dict[int, int] = {}  # provisional id -> database id
        self.dropped: set[int] = set()  # provisional ids the database refused for good
        self._last_key = 0

    def __len__(self) -> int:
        return len(self.writes)

    def new_key(self) -> int:
        self._last_key -= 1
        return self._last_key

    def resolve(self, any_id: int) -> int:
        return self.ids.get(any_id, any_id)

    def apply_first(self, conn: sqlite3.Connection, me: LeaseHolder) -> int | None:
        """Writes the oldest pending write inside the caller's transaction; returns the id a new chat or
        message got, for `mark_applied` once the transaction has committed."""
        w = self.writes[0]
        if isinstance(w, NewChat):
            cur = conn.execute("INSERT INTO chats (title, system_prompt, created_at, updated_at) VALUES (?, ?, ?, ?)",
                               (w.title, w.system_prompt, w.at, w.at))
            chat_lease.take(conn, cur.lastrowid, me, time.time())  # a new chat is this window's from the start
            return cur.lastrowid
        elif isinstance(w, ChatChange):
            conn.execute("UPDATE chats SET title = COALESCE(?, title), system_prompt = COALESCE(?, system_prompt) "
                         "WHERE id = ?", (w.title, w.system_prompt, self.resolve(w.chat_id)))
            if w.title is not None:
                conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (time.time(), self.resolve(w.chat_id)))
        elif isinstance(w, ChatDeletion):
            other = chat_lease.other_live_holder(conn, self.resolve(w.chat_id), me, time.time())
            if other is not None:
                raise ChatHeld(other)
            conn.execute("DELETE FROM chats WHERE id = ?", (self.resolve(w.chat_id),))
        elif isinstance(w, NewMessage):
            chat_id = self.resolve(w.chat_id)
            cur = conn.execute(
                "INSERT INTO messages (chat_id, role, content, stats_json, finish_reason, model, created_at) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (chat_id, w.role, w.content, json.dumps(w.stats) if w.stats else None, w.finish_reason, w.model,
                 w.at))
            conn.execute("UPDATE chats SET updated_at = ? WHERE id = ?", (w.at, chat_id))
            return cur.lastrowid
        else:
            conn.execute("DELETE FROM messages WHERE id = ?", (self.resolve(w.message_id),))
        return None

    def mark_applied(self, new_id: int | None) -> None:
        w = self.writes.popleft()
        if isinstance(w, (NewChat, NewMessage)):
            self.ids[w.key] = new_id

    def drop_first(self) -> Write:
        w = self.writes.popleft()
        if isinstance(w, (NewChat, NewMessage)):
            self.dropped.add(w.key)
        return w

    # How pending writes show in reads

    def chats_view(self, rows: list[ChatRecord]) -> list[ChatRecord]:
        """`rows` from the database as they will be once every pending write is in."""
        chats = {c.id: c for c in rows}
        for w in self.writes:
            if isinstance(w, NewChat):
                chats[w.key] = ChatRecord(w.key, w.title, w.system_prompt, w.at, is_saved=False)
                continue
            chat = None if isinstance(w, MessageDeletion) else chats.get(self.resolve(w.chat_id))
            if chat is None:
                continue
            if isinstance(w, ChatDeletion):
                del chats[chat.id]
            elif isinstance(w, ChatChange):
                chats[chat.id] = dataclasses.replace(
                    chat, title=chat.title if w.title is None else w.title, is_saved=False,
                    system_prompt=chat.system_prompt if w.system_prompt is None else w.system_prompt)
            else:
                chats[chat.id] = dataclasses.replace(chat, updated_at=w.at, is_saved=False)
        return list(chats.values())

    def messages_view(self, chat_id: int, rows: list[MessageRecord]) -> list[MessageRecord]:
        chat_id = self.resolve(chat_id)
        messages = list(rows)
        for w in self.writes:
            if isinstance(w, NewMessage) and self.resolve(w.chat_id) == chat_id:
                messages.append(MessageRecord(w.key, chat_id, w.role, w.content, w.stats, w.finish_reason, w.model))
            elif isinstance(w, MessageDeletion):
                messages = [m for m in messages if m.id != self.resolve(w.message_id)]
            elif isinstance(w, ChatDeletion) and self.resolve(w.chat_id) == chat_id:
                messages = []
        return messages

    def as_json(self) -> str:
        """The pending writes, ids resolved where they can be, for a file that keeps them past exit."""
        rows = []
        for w in self.writes:
            row = {"write": type(w).__name__, **dataclasses.asdict(w)}
            for name in ("chat_id", "message_id"):
                if name in row:
                    row[name] = self.resolve(row[name])
            rows.append(row)
        return json.dumps(rows, indent=1, ensure_ascii=False)


def describe(w: Write) -> str:
    """A write in a user's words, for a message saying it was not saved."""
    if isinstance(w, NewChat):
        return f"the new chat “{w.title}”"
    if isinstance(w, NewMessage):
        return f"a message ({w.content[:40]!r})"
    if isinstance(w, ChatChange):
        return "a change to a chat's title or system prompt"
    if isinstance(w, ChatDeletion):
        return "the deletion of a chat"
    return "the deletion of a message"
