"""A small dialog asking for a chat's new title."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class RenameScreen(ModalScreen[str | None]):
    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, title: str) -> None:
        super().__init__()
        self.old_title = title

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog"):
            yield Label("Rename chat", classes="dialog-title")
            yield Input(self.old_title, placeholder="Chat title", id="title")
            yield Label("Enter saves · Esc cancels", classes="dialog-help")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        title = " ".join(event.value.split())
        self.dismiss(title or None)
