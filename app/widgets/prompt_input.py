"""The multi-line message box: Enter sends, Shift+Enter or Ctrl+J starts a new line."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    @dataclass
    class Submitted(Message):
        prompt_input: PromptInput
        text: str

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         compact=True, highlight_cursor_line=False, **kwargs)
        self.placeholder = "Message (Enter sends, Shift+Enter or Ctrl+J adds a line)"

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            start, end = self.selection
            self._replace_via_keyboard("\n", start, end)
            return
        await super()._on_key(event)
