"""The bar at the bottom: model, draft, speculation switch, live speed, and model-loading progress."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.widgets import ProgressBar, Static

from .stats_line import stats_dict


class StatusBar(Horizontal):
    model: reactive[str] = reactive("loading…")
    draft: reactive[str | None] = reactive(None)
    speculative: reactive[bool] = reactive(True)
    has_draft: reactive[bool] = reactive(True)
    stats: reactive[dict] = reactive(dict, always_update=True)
    load_text: reactive[str] = reactive("")
    model_ok: reactive[bool] = reactive(True)
    unsaved: reactive[int] = reactive(0)  # chat history writes waiting for the database

    def compose(self) -> ComposeResult:
        yield Static(id="status-model")
        yield Static(id="status-spec")
        yield Static(id="status-unsaved")
        yield Static(id="status-speed")
        yield ProgressBar(total=1.0, show_eta=False, show_percentage=True, id="load-progress")

    def on_mount(self) -> None:
        self._render_all()
        self._watch_unsaved()

    def show_progress(self, text: str, fraction: float | None) -> None:
        bar = self.query_one(ProgressBar)
        bar.display = True
        bar.update(total=None if fraction is None else 1.0, progress=fraction or 0.0)
        self.load_text = text

    def hide_progress(self) -> None:
        self.query_one(ProgressBar).display = False
        self.load_text = ""

    def show_stats(self, stats: Any) -> None:
        self.stats = stats_dict(stats)

    def _watch_model(self) -> None:
        self._render_all()

    _watch_draft = _watch_speculative = _watch_has_draft = _watch_load_text = _watch_model_ok = _watch_model

    def _watch_unsaved(self) -> None:
        if self.is_mounted:
            unsaved = self.query_one("#status-unsaved", Static)
            unsaved.display = self.unsaved > 0
            unsaved.update(Text(f" {self.unsaved} not saved yet ", style="bold reverse red"))

    def _watch_stats(self) -> None:
        """Live while an answer streams: only the speed field changes, and its size cannot (1fr wide, one
        line), so a repaint is enough."""
        if self.is_mounted:
            self.query_one("#status-speed", Static).update(self._speed_text(), layout=False)

    def _render_all(self) -> None:
        if not self.is_mounted:
            return
        model = Text.assemble(("● ", "bold green" if self.model_ok else "bold red"), (self.model, "bold"))
        if self.draft:
            model.append(f"  draft {self.draft}", style="dim")
        self.query_one("#status-model", Static).update(model)
        if not self.has_draft:
            spec = Text(" SPEC — no draft ", style="reverse dim")
        elif self.speculative:
            spec = Text(" SPEC ON ", style="bold reverse green")
        else:
            spec = Text(" SPEC OFF ", style="bold reverse yellow")
        self.query_one("#status-spec", Static).update(spec)
        self.query_one("#status-speed", Static).update(self._speed_text())

    def _speed_text(self) -> Text:
        if self.load_text:
            return Text(self.load_text, style="italic")
        s = self.stats
        if not s:
            return Text("— tok/s", style="dim")
        text = Text.assemble((f"{s.get('decode_tok_s', 0.0):.1f}", "bold"), " tok/s   TTFT ",
                             (f"{s.get('ttft_s', 0.0) * 1000:.0f}", "bold"), " ms")
        if s.get("speculative"):
            text.append_text(Text.assemble("   accept len ", (f"{s.get('accept_len_mean', 0.0):.2f}", "bold")))
        return text
