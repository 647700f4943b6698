"""DownloadPanel: a progress bar with bytes, speed and ETA, and a button to cancel."""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.widgets import Button, Label, ProgressBar

from engine.hub.progress import DownloadProgress
from engine.units import format_bytes, format_eta, format_speed


def progress_text(p: DownloadProgress) -> str:
    return (
        f"{format_bytes(p.done_bytes)} of {format_bytes(p.total_bytes)} · {format_speed(p.speed)}"
        f" · ETA {format_eta(p.eta_s)} · {p.filename}"
    )


class DownloadPanel(Vertical):
    """Shown while a download runs; posts DownloadPanel.CancelRequested when asked to stop."""

    DEFAULT_CSS = """
    DownloadPanel { height: auto; padding: 0 1; border: round $accent; }
    DownloadPanel ProgressBar { width: 1fr; }
    DownloadPanel ProgressBar Bar { width: 1fr; }
    DownloadPanel #progress-text { width: 1fr; color: $text-muted; }
    DownloadPanel Horizontal { height: auto; }
    """

    @dataclass
    class CancelRequested(Message):
        pass

    def compose(self) -> ComposeResult:
        with Horizontal():
            yield ProgressBar(total=100, show_eta=False, id="progress-bar")
            yield Button("Cancel download", id="cancel-download", variant="warning", compact=True)
        yield Label("starting…", id="progress-text")

    def waiting(self, text: str) -> None:
        """No byte counts to show (pip fetching the demo wheel): an animated bar and a line of text."""
        self.query_one(ProgressBar).update(total=None)
        self.query_one("#progress-text", Label).update(text)

    def show(self, p: DownloadProgress) -> None:
        self.query_one(ProgressBar).update(total=max(p.total_bytes, 1), progress=p.done_bytes)
        self.query_one("#progress-text", Label).update(progress_text(p))

    def cancel(self) -> None:
        """Ask to stop: the download ends at the next chunk it receives."""
        self.query_one("#cancel-download", Button).disabled = True
        self.query_one("#progress-text", Label).update("cancelling…")
        self.post_message(self.CancelRequested())

    def on_button_pressed(self, event: Button.Pressed) -> None:
        if event.button.id == "cancel-download":
            event.stop()
            self.cancel()
