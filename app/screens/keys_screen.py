"""KeysScreen: the keys of the screen it was opened from, in words; Esc closes it."""

from __future__ import annotations

from typing import Iterable, Sequence

from rich.table import Table
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Label, Static

KeyRow = tuple[str, str]  # (key as the user types it, what it does)

_KEY_NAMES = {"escape": "Esc", "enter": "Enter", "tab": "Tab", "up": "Up", "down": "Down", "delete": "Del"}


def key_name(key: str) -> str:
    """Textual's key spelling -> the one people type: 'ctrl+q' -> 'Ctrl+Q', 'f5' -> 'F5', 'escape' -> 'Esc'."""
    parts = key.split("+")
    words = [p.capitalize() for p in parts[:-1]]
    last = parts[-1]
    words.append(_KEY_NAMES.get(last, last.upper() if len(last) == 1 or last[0] == "f" else last.capitalize()))
    return "+".join(words)


def key_rows(screen: Screen, app: App, extra: Iterable[KeyRow] = ()) -> list[KeyRow]:
    """`extra` (keys a widget handles itself), then the keys the app and `screen` bind (not those of the
    focused widget, such as a text box's cursor keys) with their tooltip or description; the focus keys
    every Textual screen has come last."""
    textual_keys = {key for b in Screen.BINDINGS if isinstance(b, Binding) for key in b.key.split(",")}
    rows, last = list(extra), []
    for key, active in screen.active_bindings.items():
        binding = active.binding
        if active.node not in (screen, app) or not binding.description:
            continue
        (last if key in textual_keys else rows).append((key_name(key), binding.tooltip or binding.description))
    return rows + last


class KeysScreen(ModalScreen[None]):
    BINDINGS = [Binding("escape,f1,q", "dismiss", "Close")]

    def __init__(self, rows: Sequence[KeyRow]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold", no_wrap=True)
        table.add_column()
        for key, text in self.rows:
            table.add_row(key, text)
        with Vertical(classes="dialog wide", id="keys"):
            yield Label("Keys", classes="dialog-title")
            with VerticalScroll(id="keys-list"):
                yield Static(table)
            yield Label("Esc closes this list · Ctrl+P lists every command", classes="dialog-help")
