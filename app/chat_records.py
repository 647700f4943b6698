"""What the chat history hands out: a chat and one of its messages, as plain frozen records."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ChatRecord:
    id: int  # negative: not in the database yet (see WriteQueue)
    title: str
    system_prompt: str
    updated_at: float
    is_saved: bool = True  # False while this chat or one of its messages waits to be written


@dataclass(frozen=True)
class MessageRecord:
    id: int  # negative: not in the database yet
    chat_id: int
    role: str
    content: str
    stats: dict[str, Any] | None = None
    finish_reason: str | None = None
    model: str | None = None
