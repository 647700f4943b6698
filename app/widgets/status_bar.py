"""The bar at the bottom: model, draft, speculation switch, live speed, and model-loading progress."""

from __future__ import annotations

import time
from typing import Any

from rich.cells import cell_len
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Horizontal
from textual.reactive import reactive
from textual.timer import Timer
from textual.widgets import ProgressBar, Static

from app.widgets.stats_line import stats_dict

GAP = 2  # cells after the model and the speculation fields (margin-right in the stylesheet)
# The short speed text, with and without an accepted length ("1234 tok/s · TTFT 999 ms · accept 3.13").
SPEED_ROOM, PLAIN_SPEED_ROOM = 38, 24


class StatusBar(Horizontal):
    model: reactive[str] = reactive("loading…")
    draft: reactive[str | None] = reactive(None)
    weights: reactive[str] = reactive("")  # what the projections run in ("Q4_1", "Q4_1 as bf16"), where there is room
    speculative: reactive[bool] = reactive(True)
    has_draft: reactive[bool] = reactive(True)
    stats: reactive[dict] = reactive(dict, always_update=True)
    load_text: reactive[str] = reactive("")
    model_ok: reactive[bool] = reactive(True)
    remote: reactive[str | None] = reactive(None)  # the server's address, when the app is its client
    spec_by_server: reactive[bool] = reactive(False)  # the server decides speculation, not the switch
    spec_note: reactive[str] = reactive("")  # why speculation was turned off by default (e.g. on a CPU)
    unsaved: reactive[int] = reactive(0)  # chat history writes waiting for the database

    def __init__(self, **kwargs) -> None:
        super().__init__(**kwargs)
        self._load_started = 0.0
        self._load_timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="status-model")
        yield Static(id="status-spec")
        yield Static(id="status-unsaved")
        yield Static(id="status-speed")
        yield ProgressBar(total=None, show_eta=False, show_percentage=False, id="load-progress")

    def on_mount(self) -> None:
        self._render_all()
        self._watch_unsaved()

    def on_resize(self) -> None:
        self._render_all()

    def show_progress(self, text: str) -> None:
        """A loading phase: its text, the seconds it has been loading, and a bar that moves without claiming a
        fraction (the phases take very different times: one file read can be most of a load)."""
        if not self.load_text:
            self._load_started = time.monotonic()
            self._load_timer = self.set_interval(1.0, self._tick)
        self.query_one(ProgressBar).display = True
        self.load_text = text

    def hide_progress(self) -> None:
        self.query_one(ProgressBar).display = False
        if self._load_timer is not None:
            self._load_timer.stop()
            self._load_timer = None
        self.load_text = ""

    def _tick(self) -> None:
        self.query_one("#status-speed", Static).update(self._speed_text(), layout=False)

    def show_stats(self, stats: Any) -> None:
        self.stats = stats_dict(stats)

    def _watch_model(self) -> None:
        self._render_all()

    _watch_draft = _watch_speculative = _watch_has_draft = _watch_load_text = _watch_model_ok = _watch_model
    _watch_weights = _watch_model
    _watch_spec_note = _watch_model
    _watch_remote = _watch_spec_by_server = _watch_model

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
        spec = self._spec_text()
        self.query_one("#status-spec", Static).update(spec)
        speed_room = SPEED_ROOM if self.has_draft else PLAIN_SPEED_ROOM
        room = self.content_region.width - spec.cell_len - 2 * GAP - speed_room
        self.query_one("#status-model", Static).update(self._model_text(room))
        self.query_one("#status-speed", Static).update(self._speed_text())

    def _model_text(self, room: int) -> Text:
        """The model, and its draft where there is room; a long name loses its middle."""
        if self.remote:
            text = Text.assemble(("● ", "bold green" if self.model_ok else "bold red"), f"remote: {self.remote} · ",
                                 (self.model, "bold"))
            if room > 12:
                text.truncate(room, overflow="ellipsis")
            return text
        text = Text.assemble(("● ", "bold green" if self.model_ok else "bold red"), (self.model, "bold"))
        if self.weights and text.cell_len + cell_len(f" · {self.weights}") <= room:
            text.append(f" · {self.weights}", style="dim")
        if self.draft and text.cell_len + cell_len(f"  draft {self.draft}") <= room:
            text.append(f"  draft {self.draft}", style="dim")
        elif text.cell_len > room > 12:
            keep = room - 3  # the dot and the ellipsis
            text = Text.assemble(("● ", "bold green" if self.model_ok else "bold red"),
                                 (self.model[: keep - keep // 2] + "…" + self.model[-(keep // 2):], "bold"))
        return text

    def _spec_text(self) -> Text:
        if self.spec_by_server:
            return Text(" SPEC — server's ", style="reverse dim")
        if not self.has_draft:
            return Text(" SPEC — no draft ", style="reverse dim")
        if self.speculative:
            return Text(" SPEC ON ", style="bold reverse green")
        if self.spec_note:
            return Text(f" SPEC OFF: {self.spec_note} ", style="bold reverse yellow")
        return Text(" SPEC OFF ", style="bold reverse yellow")

    def _speed_text(self) -> Text:
        if self.load_text:  # the seconds always show: they tell a slow load from a stuck one
            seconds = f"  {time.monotonic() - self._load_started:.0f} s"
            width = self.query_one("#status-speed", Static).content_region.width
            phase = self.load_text
            if width and cell_len(phase + seconds) > width:
                phase = phase[: max(0, width - cell_len(seconds) - 1)] + "…"
            return Text.assemble((phase, "italic"), (seconds, "dim"))
        s = self.stats
        if not s:
            return Text("— tok/s", style="dim")
        tok_s, ttft_s = s.get("decode_tok_s", 0.0), s.get("ttft_s", 0.0)
        speed = f"{tok_s:.1f}"
        ttft, unit = (f"{ttft_s * 1000:.0f}", " ms") if ttft_s < 1 else (f"{ttft_s:.1f}", " s")  # a slow CPU's
        accept = f"{s.get('accept_len_mean', 0.0):.2f}" if s.get("speculative") else None
        full = Text.assemble((speed, "bold"), " tok/s   TTFT ", (ttft, "bold"), unit)
        if accept:
            full.append_text(Text.assemble("   accept len ", (accept, "bold")))
        short_speed = f"{tok_s:.0f}" if tok_s >= 100 else speed
        short = Text.assemble((short_speed, "bold"), " tok/s · TTFT ", (ttft, "bold"), unit)
        if accept:
            short.append_text(Text.assemble(" · accept ", (accept, "bold")))
        least = Text.assemble((short_speed, "bold"), " tok/s", *((" · accept ", (accept, "bold")) if accept else ()))
        width = self.query_one("#status-speed", Static).content_region.width
        return next((t for t in (full, short) if not width or t.cell_len <= width), least)
