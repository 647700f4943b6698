"""One side of the compare screen: an answer streamed with speculation off or on, and its speed."""

from __future__ import annotations

from typing import Any

from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.widgets import Label, Markdown

from app.widgets.markdown_feed import MarkdownFeed
from app.widgets.stats_line import StatsLine, stats_dict


class ComparePane(Vertical):
    def __init__(self, title: str, **kwargs) -> None:
        super().__init__(classes="compare-pane", **kwargs)
        self.title = title
        self.text = ""
        self.token_ids: list[int] = []
        self.stats: dict[str, Any] = {}
        self.finish_reason: str | None = None
        self.done = False
        self._feed: MarkdownFeed | None = None
        self._streaming = False

    def compose(self) -> ComposeResult:
        yield Label(self.title, classes="pane-title")
        with VerticalScroll(classes="pane-body"):
            yield Markdown("")
        yield StatsLine("waiting…", classes="stats", compact=True)

    async def on_mount(self) -> None:
        self._feed = MarkdownFeed(self.query_one(Markdown))  # its placeholder is drawn before decoding starts
        await self._feed.start()

    async def append(self, text: str, stats: Any) -> None:
        """More of the answer being written."""
        if not self._streaming:
            self._streaming = True
            self.add_class("streaming")
        self.text += text
        self.stats = stats_dict(stats)
        self.query_one(StatsLine).show_stats(stats)
        if self._feed is not None:
            await self._feed.append(text)

    def retitle(self, title: str) -> None:
        self.title = title
        self.query_one(".pane-title", Label).update(title)

    async def finish(self, text: str, stats: Any, finish_reason: str, error: str | None = None,
                     token_ids: list[int] | None = None) -> None:
        if self._feed is not None:
            await self._feed.finish(self.text if error else text)
            self._feed = None
        self._streaming = False
        self.remove_class("streaming")
        self.done = True
        self.finish_reason = finish_reason
        if error:
            self.add_class("failed")
            self.query_one(StatsLine).update(f"failed: {error}")
            return
        self.stats = stats_dict(stats)
        self.text = text
        self.token_ids = list(token_ids or [])
        self.query_one(StatsLine).show_stats(stats, finish_reason)
