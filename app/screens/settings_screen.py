"""Edits the saved settings: sampling, draft steps, speculation default and the default system prompt."""

from __future__ import annotations

import dataclasses

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Switch

from app.settings import Settings

NUMBER_FIELDS = (
    ("temperature", "Temperature", "0 = greedy"),
    ("top_p", "Top-p", "1 = off"),
    ("top_k", "Top-k", "0 = off"),
    ("min_p", "Min-p", "0 = off"),
    ("repetition_penalty", "Repetition penalty", "1 = off"),
    ("max_tokens", "Max tokens", "per answer"),
    ("draft_steps", "Draft steps", "applies at next start"),
)


class SettingsScreen(ModalScreen[Settings | None]):
    BINDINGS = [
        Binding("ctrl+s", "save", "Save", priority=True),
        Binding("escape", "dismiss(None)", "Cancel"),
    ]

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings

    def compose(self) -> ComposeResult:
        with Vertical(classes="dialog wide"):
            yield Label("Settings", classes="dialog-title")
            with Grid(id="settings-grid"):
                for name, label, hint in NUMBER_FIELDS:
                    yield Label(label)
                    yield Input(str(getattr(self.settings, name)), id=f"set-{name}", compact=True)
                    yield Label(hint, classes="hint")
                yield Label("Speculation")
                yield Switch(self.settings.speculative, id="set-speculative")
                yield Label("default (off on a CPU)", classes="hint")
            yield Label("Default system prompt (for new chats)")
            yield Input(self.settings.system_prompt, id="set-system_prompt", compact=True,
                        placeholder="empty: the model's own default")
            yield Label("", id="settings-error")
            yield Label("Ctrl+S saves · Esc cancels · theme: Ctrl+P → Theme", classes="dialog-help")

    def action_save(self) -> None:
        values: dict = {}
        try:
            for name, label, _ in NUMBER_FIELDS:
                raw = self.query_one(f"#set-{name}", Input).value.strip()
                kind = float if isinstance(getattr(self.settings, name), float) else int
                try:
                    values[name] = kind(raw)
                except ValueError:
                    raise ValueError(f"{label} must be a{'n integer' if kind is int else ' number'}, got {raw!r}")
            values["speculative"] = self.query_one("#set-speculative", Switch).value
            values["system_prompt"] = self.query_one("#set-system_prompt", Input).value.strip()
            new = dataclasses.replace(self.settings, **values)
        except ValueError as e:
            self.query_one("#settings-error", Label).update(str(e))
            return
        self.dismiss(new)
