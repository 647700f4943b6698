"""Runs the last prompt with speculation off, then on, and shows the two answers side by side."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static

from app.engine_worker import EngineWorker
from app.pacing import LiveAnswer, release_when_drawn
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
        self.job_id = runner.generate(self, self.messages, self.app.settings, speculative, side=side, hold=True)
        release_when_drawn(self, runner, self.job_id)

    def pane(self, side: str) -> ComparePane:
        return self.query_one(f"#pane-{side}", ComparePane)

    async def on_engine_worker_started(self, message: EngineWorker.Started) -> None:
        if message.job_id == self.job_id:
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
        await self.pane(message.side).finish(message.text, message.stats, message.finish_reason)
        await self._next_side(message.side, message.finish_reason)

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
        same = "identical ✓" if off.text == on.text else "differ ✗"
        if off.text != on.text and self.app.settings.temperature > 0:
            same += " (expected when sampling: set temperature 0 for greedy)"
        verdict.update(f"Speed-up {speedup}  ({slow:.1f} → {fast:.1f} tok/s)  ·  texts {same}")
        verdict.add_class("identical" if off.text == on.text else "different")

    def action_close(self) -> None:
        self._stop_live()
        if not (self.pane("off").done and self.pane("on").done):
            self.app.runner.stop()
        self.dismiss(None)
