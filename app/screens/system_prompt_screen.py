"""Edits the system prompt of one chat."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Label, TextArea


class SystemPromptScreen(ModalScreen[str | None]):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("escape", "dismiss(None)", "Cancel"),
    ]

    def __init__(self, system_prompt: str) -> None:
        super().__init__()
        self.system_prompt = system_prompt

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("System prompt for this chat", classes="dialog-title")
            yield TextArea(self.system_prompt, soft_wrap=True, id="system-prompt-text")
            yield Label("Ctrl+S saves · Esc cancels · an empty prompt sends none", classes="dialog-help")

    def action_save(self) -> None:
        self.dismiss(self.query_one(TextArea).text.strip())
