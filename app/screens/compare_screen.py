"""Runs the last prompt with speculation off, then on, and shows the two answers side by side.

The off side runs on the engine without its draft (Engine.without_draft: the same weights, the
kernels of an engine with no draft), so the speed-up is the one a user measures by unloading the
draft. Where that does not fit in GPU memory, the off side keeps the draft loaded (its plain
decoding then runs the slower batch-invariant kernels) and the screen says which one it divided by."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from app.engine_worker import EngineWorker
from app.pacing import LiveAnswer, release_when_drawn
from app.remote import RemoteEngine
from app.widgets.compare_pane import ComparePane


class CompareScreen(ModalScreen[None]):
    """Each side is its own job, queued once the screen has drawn what the previous one left, so that neither
    side's decoding shares the main thread with layout work."""

    BINDINGS = [Binding("escape", "close", "Stop / close")]

    def __init__(self, messages: list[dict]) -> None:
        super().__init__()
        self.messages = messages
        self.job_id: int | None = None
        self.live: LiveAnswer | None = None

    def compose(self) -> ComposeResult:
        prompt = " ".join(self.messages[-1]["content"].split())
        with Vertical(id="compare"):
            yield Label("Compare: speculation off vs on", classes="dialog-title")
            yield Static(prompt if len(prompt) < 160 else prompt[:159] + "…", id="compare-prompt")
            with Horizontal(id="compare-panes"):
                yield ComparePane("Speculation off", id="pane-off")
                yield ComparePane("Speculation on", id="pane-on")
            yield Static("Running with speculation off…", id="compare-verdict")
        yield Footer()

    def on_mount(self) -> None:
        self.run_side("off", speculative=False)

    def run_side(self, side: str, speculative: bool) -> None:
        runner = self.app.runner
        self.job_id = runner.generate(self, self.messages, self.app.settings, speculative, side=side, hold=True,
                                      no_draft=not speculative)
        release_when_drawn(self, runner, self.job_id)

    def pane(self, side: str) -> ComparePane:
        return self.query_one(f"#pane-{side}", ComparePane)

    async def on_engine_worker_started(self, message: EngineWorker.Started) -> None:
        if message.job_id == self.job_id:
            if message.side == "off":
                self._title_off(message.stream.stats())
            self.live = LiveAnswer(self, message.stream, self.pane(message.side).append)
            await self.live.start()

    def _stop_live(self) -> None:
        if self.live is not None:
            self.live.stop()
            self.live = None

    async def on_engine_worker_finished(self, message: EngineWorker.Finished) -> None:
        if message.job_id != self.job_id:
            return
        self._stop_live()
        if message.side == "off" and message.stats is not None:
            self._title_off(message.stats)
        await self.pane(message.side).finish(message.text, message.stats, message.finish_reason,
                                             token_ids=message.token_ids)
        await self._next_side(message.side, message.finish_reason)

    def _title_off(self, stats) -> None:
        """Says which engine the off side runs on, once its stats tell."""
        self.pane("off").retitle("Speculation off · " + ("draft loaded" if stats.draft_loaded else "no draft loaded"))

    async def _next_side(self, side: str, finish_reason: str) -> None:
        if side == "off":
            if finish_reason == "cancelled":
                await self.pane("on").finish("", None, "cancelled")
            else:
                self.query_one("#compare-verdict", Static).update("Running with speculation on…")
                self.run_side("on", speculative=True)
        self._update_verdict()

    async def on_engine_worker_failed(self, message: EngineWorker.Failed) -> None:
        if message.job_id != self.job_id:
            return
        self._stop_live()
        await self.pane(message.side).finish("", None, "failed", error=message.error)
        self.notify(message.error, title="Compare failed", severity="error", timeout=10)
        await self._next_side(message.side, "failed")

    def _update_verdict(self) -> None:
        off, on = self.pane("off"), self.pane("on")
        if not (off.done and on.done):
            return
        verdict = self.query_one("#compare-verdict", Static)
        if "cancelled" in (off.finish_reason, on.finish_reason) or "failed" in (off.finish_reason, on.finish_reason):
            verdict.update("Stopped before both runs finished.")
            return
        slow, fast = off.stats.get("decode_tok_s", 0.0), on.stats.get("decode_tok_s", 0.0)
        speedup = f"{fast / slow:.2f}×" if slow > 0 else "n/a"
        if off.stats.get("draft_loaded") and isinstance(getattr(self.app.runner, "engine", None), RemoteEngine):
            over = "over speculation off on the server (its draft stays loaded there)"
        elif off.stats.get("draft_loaded"):
            over = "over speculation off with the draft loaded (too little GPU memory to compare without it)"
        else:
            over = "over no draft loaded"
        identical = off.token_ids == on.token_ids
        same = "identical ✓" if identical else f"differ from token {first_difference(off.token_ids, on.token_ids) + 1} ✗"
        if not identical and self.app.settings.temperature > 0:
            same += " (expected when sampling: set temperature 0 for greedy)"
        verdict.update(f"Speed-up {speedup} {over}  ({slow:.1f} → {fast:.1f} tok/s)  ·  tokens {same}")
        verdict.add_class("identical" if identical else "different")

    def action_close(self) -> None:
        self._stop_live()
        if not (self.pane("off").done and self.pane("on").done):
            self.app.runner.stop()
        self.dismiss(None)


def first_difference(a: list[int], b: list[int]) -> int:
    """Index of the first token where a and b differ (the shorter one's length where it is a prefix
    of the other)."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
