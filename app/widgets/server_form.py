"""ServerForm: the wizard's "Connect to a server" tab: an OpenAI-compatible server's address, key and model."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Input, Label

from app.remote import RemoteChoice


class ServerForm(Vertical):
    DEFAULT_CSS = """
    ServerForm { height: auto; padding: 1 0 0 0; }
    ServerForm Horizontal { height: auto; margin: 1 0 0 0; }
    ServerForm Horizontal Label { width: 9; }
    ServerForm Input { width: 1fr; }
    ServerForm #server-note { color: $text-muted; }
    """

    @dataclass
    class Connect(Message):
        choice: RemoteChoice

    def compose(self) -> ComposeResult:
        yield Label("Chat with the model of an OpenAI-compatible server: `localchat serve` on another machine, "
                    "or vLLM, SGLang or llama.cpp running a model too big for one GPU.", id="server-note")
        with Horizontal():
            yield Label("Address")
            yield Input(compact=True, placeholder="http://127.0.0.1:8000 (Enter to connect)", id="server-url")
        with Horizontal():
            yield Label("API key")
            yield Input(compact=True, placeholder="none", password=True, id="server-key")
        with Horizontal():
            yield Label("Model")
            yield Input(compact=True, placeholder="the first the server lists", id="server-model")
        yield Button("Connect", id="server-connect", variant="primary", compact=True)

    def submit(self) -> None:
        url = self.query_one("#server-url", Input).value.strip()
        if not url:
            self.query_one("#server-url", Input).focus()
            self.notify("Type the server's address first, e.g. http://127.0.0.1:8000", timeout=4)
            return
        key = self.query_one("#server-key", Input).value.strip() or None
        model = self.query_one("#server-model", Input).value.strip() or None
        self.post_message(self.Connect(RemoteChoice(url, key, model)))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.submit()

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "server-connect":
            event.stop()
            self.submit()
