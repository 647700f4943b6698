"""One message of the conversation: who wrote it, its Markdown (streamed while it arrives), its stats."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import Label, Markdown

from app.widgets.markdown_feed import MarkdownFeed
from app.widgets.stats_line import StatsLine

ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class MessageView(Vertical, can_focus=True):
    BINDINGS = [Binding("c", "copy", "Copy message")]

    def __init__(self, role: str, content: str = "", *, message_id: int | None = None,
                 stats: Any = None, finish_reason: str | None = None, model: str | None = None) -> None:
        super().__init__(classes=f"message {role}")
        self.role = role
        self.content = content
        self.message_id = message_id
        self.model = model
        self._initial = (stats, finish_reason)
        self._feed: MarkdownFeed | None = None  # while the answer streams

    def compose(self) -> ComposeResult:
        yield Label(ROLE_TITLES.get(self.role, self.role), classes="role")
        yield Markdown(self.content, classes="body")
        if self.role == "assistant":
            stats_line = StatsLine(classes="stats")
            stats_line.show_stats(*self._initial, model=self.model)
            yield stats_line

    @property
    def is_streaming(self) -> bool:
        return self._feed is not None

    async def start_stream(self, waiting_text: str) -> None:
        self._feed = MarkdownFeed(self.query_one(Markdown))
        await self._feed.start()
        self.add_class("streaming")
        self.set_waiting(waiting_text)

    def set_waiting(self, text: str) -> None:
        if self.is_streaming and not self.content:
            for line in self.query(StatsLine):
                line.update(text)

    async def append(self, text: str, stats: Any) -> None:
        """More of the answer being written."""
        if self._feed is None:
            return
        self.content += text
        for line in self.query(StatsLine):  # none while the view is being removed (its chat closed)
            line.show_stats(stats)
        await self._feed.append(text)

    async def finish(self, text: str, stats: Any, finish_reason: str | None, model: str | None) -> None:
        """Show the final text and stats; `text` is the whole answer as the engine produced it."""
        if self._feed is not None:
            await self._feed.finish(text)
            self._feed = None
        elif text != self.content:
            for markdown in self.query(Markdown):
                await markdown.update(text)
        self.content = text
        self.remove_class("streaming")
        self.model = model
        for line in self.query(StatsLine):  # none when the chat was closed during the awaits above
            line.show_stats(stats, finish_reason, model)

    async def fail(self, error: str) -> None:
        if self._feed is not None:
            await self._feed.finish(self.content)
            self._feed = None
        self.remove_class("streaming")
        self.add_class("failed")
        for markdown in self.query(Markdown):
            markdown.display = bool(self.content)
        for line in self.query(StatsLine):
            line.update(f"failed: {error}")

    def action_copy(self) -> None:
        self.app.copy_to_clipboard(self.content)
        self.notify(f"Copied the message ({len(self.content)} characters).", timeout=2)
