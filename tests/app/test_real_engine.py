"""Pilot tests driving the app with the real engine on a tiny random-weight model on CPU."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from app.settings import Settings, save_settings
from app.tui import LocalChatApp
from app.widgets.stats_line import StatsLine
from tests.app.pilot_helpers import notes, ready, send, wait_for
from tests.tiny import make_tiny_model


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


def real_app(home: Path, model: Path, max_tokens: int, draft: Path | None = None) -> LocalChatApp:
    save_settings(home / "config" / "settings.toml", Settings(max_tokens=max_tokens))
    # the real Engine.load path, on the engine thread
    return LocalChatApp(model=str(model), device="cpu", draft=str(draft) if draft else None)


async def test_real_engine_streams_and_saves_an_answer(home, tiny_model):
    app = real_app(home, tiny_model, max_tokens=24)
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.runner.engine is not None, notes(app)
        assert app.runner.engine.device == "cpu"
        await send(pilot, "Hello, how are you?")
        view = app.screen.conversation.views[-1]
        saved = app.store.messages(app.screen.chat.id)[-1]
        assert saved.role == "assistant" and saved.content == view.content
        assert 0 < saved.stats["generated_tokens"] <= 24 and saved.stats["ttft_s"] > 0
        assert saved.model == app.runner.engine.model_name
        assert "tok/s" in str(view.query_one(StatsLine).render())
        assert not [n for n in notes(app) if "failed" in n.lower()]


class SlowedEngine:
    """The real engine, slowed to 50 tokens/s so that a key press lands mid-answer (Pilot's pauses wait
    up to a second each while the process is busy)."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream(self, *args, **kwargs):
        for event in self.engine.stream(*args, **kwargs):
            time.sleep(0.02)
            yield event


async def test_real_engine_stops_on_escape(home, tiny_model):
    from engine import Engine

    save_settings(home / "config" / "settings.toml", Settings(max_tokens=400))
    app = LocalChatApp(lambda on_progress: SlowedEngine(Engine.load(str(tiny_model), device="cpu",
                                                                     on_progress=on_progress)))
    async with app.run_test() as pilot:
        await ready(pilot)
        await send(pilot, "Numbers: 0 1 2 3", wait=False)  # greedy runs to max_tokens, no EOS
        await wait_for(pilot, lambda: app.screen.conversation.views[-1].content != "")
        await pilot.press("escape")
        await wait_for(pilot, lambda: app.screen.answer is None, timeout_s=10)
        saved = app.store.messages(app.screen.chat.id)[-1]
        assert saved.finish_reason == "cancelled" and saved.stats["generated_tokens"] < 400


async def test_real_engine_compare_is_identical_with_greedy_decoding(home, tiny_model, tmp_path):
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_model)  # a random EAGLE-3 head: compare needs a draft (without one it offers F5)
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
    app = real_app(home, tiny_model, max_tokens=16, draft=head)
    async with app.run_test(size=(120, 40)) as pilot:
        await ready(pilot)
        assert app.runner.engine is not None and app.runner.engine.has_draft, notes(app)
        await send(pilot, "Paris is the capital of", wait=False)
        await wait_for(pilot, lambda: app.screen.answer is None, timeout_s=30)
        await pilot.pause()
        await pilot.press("ctrl+b")
        await pilot.pause()
        verdict = app.screen.query_one("#compare-verdict")
        await wait_for(pilot, lambda: "Speed-up" in str(verdict.render()), timeout_s=40)
        assert "over no draft loaded" in str(verdict.render()), (str(verdict.render()), notes(app))
        assert "tokens identical" in str(verdict.render()), (str(verdict.render()), notes(app))
        off, on = app.screen.query_one("#pane-off"), app.screen.query_one("#pane-on")
        assert off.text == on.text != "" and off.token_ids == on.token_ids != []
        assert off.stats["draft_loaded"] is False and on.stats["draft_loaded"] is True
        # the off side ran on the engine without its draft, over the same weights
        twin = app.runner.engine.without_draft()
        assert twin is not app.runner.engine and twin.runner.model.lm_head.weight.data_ptr() == \
            app.runner.engine.runner.model.lm_head.weight.data_ptr()


async def test_missing_model_is_a_notification(home):
    app = LocalChatApp(model=str(home / "no-such-model"), device="cpu")
    async with app.run_test() as pilot:
        await ready(pilot)
        await pilot.pause()
        assert app.runner.engine is None and app.runner.load_error
        assert any("no-such-model" in n for n in notes(app)), notes(app)
        assert app.is_running
