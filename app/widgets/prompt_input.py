"""The multi-line message box: Enter sends, Shift+Enter or Ctrl+J starts a new line, Up in an
empty box edits the last message sent."""

from __future__ import annotations

from dataclasses import dataclass

from textual import events
from textual.message import Message
from textual.widgets import TextArea


class PromptInput(TextArea):
    """Up in an empty box asks to edit the last message you sent (EditLast); while editing, Esc
    gives up the edit (CancelEdit) and the box says what Enter will do."""

    PLACEHOLDER = "Message (Enter sends, Shift+Enter or Ctrl+J adds a line)"
    SHORT_PLACEHOLDER = "Message (Enter sends, Ctrl+J new line)"
    KEY_HELP = (("Enter", "Send the message"), ("Shift+Enter, Ctrl+J", "Start a new line"),
                ("Up", "In an empty box: edit your last message (Enter resends it, Esc gives up)"))

    @dataclass
    class Submitted(Message):
        prompt_input: PromptInput
        text: str

        @property
        def control(self) -> PromptInput:
            return self.prompt_input

    class EditLast(Message):
        pass

    class CancelEdit(Message):
        pass

    def __init__(self, **kwargs) -> None:
        super().__init__(soft_wrap=True, show_line_numbers=False, tab_behavior="focus",
                         compact=True, highlight_cursor_line=False, **kwargs)
        self.placeholder = self.PLACEHOLDER
        self.editing = False

    def on_resize(self) -> None:
        """The long hint where it fits on the box's one line, else the short one."""
        fits = len(self.PLACEHOLDER) < self.content_region.width
        self.placeholder = self.PLACEHOLDER if fits else self.SHORT_PLACEHOLDER

    def start_editing(self, text: str) -> None:
        self.editing = True
        self.add_class("editing")
        self.border_title = "Editing · Enter resends · Esc cancels"
        self.text = text
        self.move_cursor(self.document.end)

    def stop_editing(self) -> None:
        self.editing = False
        self.remove_class("editing")
        self.border_title = None

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "up" and not self.editing and not self.text:
            event.stop()
            event.prevent_default()
            self.post_message(self.EditLast())
            return
        if event.key == "escape" and self.editing:
            event.stop()
            event.prevent_default()
            self.post_message(self.CancelEdit())
            return
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
