"""Streams an answer into a Markdown widget: incrementally, and with its first block mounted beforehand."""

from __future__ import annotations

from textual.widgets import Markdown

PLACEHOLDER = "…"


class MarkdownFeed:
    """Text appended with Markdown.append (only the last block is parsed again), into a Markdown that shows a
    one-line placeholder paragraph until the text starts. Mounted before decoding starts, that paragraph is
    what the first text updates in place (Markdown.append updates the last block when the new text begins
    with a block of its kind), so the first update, made while the engine decodes, mounts nothing and
    needs one layout pass instead of two."""

    def __init__(self, markdown: Markdown) -> None:
        self.markdown = markdown
        self.text = ""
        self._placeholder = False  # still on screen

    async def start(self) -> None:
        markdown = self.markdown
        await markdown.update(PLACEHOLDER)
        # Markdown.append parses `source + text` from the last parsed line: forget the placeholder's source
        # so that the first text replaces its block rather than follows it. These are Markdown's private
        # append state; on a Textual without them, the feed starts from an empty document instead.
        if getattr(markdown, "_markdown", None) == PLACEHOLDER and hasattr(markdown, "_last_parsed_line"):
            markdown._markdown, markdown._last_parsed_line = "", 0
            self._placeholder = True
        else:
            await markdown.update("")

    async def append(self, text: str) -> None:
        self.text += text
        await self.markdown.append(text)
        if self.text.strip():
            self._placeholder = False

    async def finish(self, text: str) -> None:
        """Show `text`, the whole answer: the rest appended when it follows what is shown, else parsed anew."""
        if self._placeholder or not text.startswith(self.text):
            self.text = text
            await self.markdown.update(text)
        elif len(text) > len(self.text):
            await self.append(text[len(self.text):])
