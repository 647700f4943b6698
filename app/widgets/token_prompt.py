"""TokenPrompt: asks for a Hugging Face token when a gated repository refuses the download."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Input, Label


class TokenPrompt(Vertical):
    """The token goes to huggingface_hub (HF_TOKEN for this session, or its own login store): never kept here."""

    DEFAULT_CSS = """
    TokenPrompt { height: auto; padding: 0 1; border: round $warning; }
    TokenPrompt Horizontal { height: auto; }
    TokenPrompt Input { width: 1fr; }
    TokenPrompt #token-reason { width: 1fr; }
    """

    @dataclass
    class Submitted(Message):
        token: str
        save: bool  # True: huggingface_hub.login (stored in HF_HOME); False: this session only

    def compose(self) -> ComposeResult:
        yield Label("", id="token-reason")
        with Horizontal():
            yield Input(compact=True, placeholder="hf_… (a read token from huggingface.co/settings/tokens)", password=True, id="token")
            yield Button("Use for this session", id="token-session", variant="primary", compact=True)
            yield Button("Save login", id="token-save", compact=True)

    def ask(self, reason: str) -> None:
        self.query_one("#token-reason", Label).update(reason)
        token = self.query_one("#token", Input)
        token.value = ""
        token.focus()

    def _submit(self, save: bool) -> None:
        token = self.query_one("#token", Input)
        if token.value.strip():
            self.post_message(self.Submitted(token.value.strip(), save))
            token.value = ""

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self._submit(save=False)

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id in ("token-session", "token-save"):
            event.stop()
            self._submit(save=event.button.id == "token-save")
