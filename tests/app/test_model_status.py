"""What the chat screen says about the model: load progress, a model switch, a failed load, compare without a
draft (issue 33, items 3-6)."""

from __future__ import annotations

import threading

from textual.widgets import ProgressBar

from app.screens.compare_screen import CompareScreen
from app.screens.confirm_screen import ConfirmScreen
from app.screens.wizard import WizardScreen
from app.tui import LocalChatApp
from tests.app.fake_engine import FakeEngine, fake_factory
from tests.app.pilot_helpers import engine_of, notes, ready, send, wait_for


def status_text(app, part: str) -> str:
    return str(app.screen.query_one(f"#status-{part}").render())


async def test_compare_without_a_draft_runs_nothing_and_offers_the_wizard(make_app, monkeypatch):
    app = make_app(draft_name=None)
    opened = []
    monkeypatch.setattr(app, "action_models", lambda: opened.append(True))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "Compare me")
        calls = len(engine_of(app).calls)
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        assert "No draft model is loaded" in app.screen.question and "F5" in app.screen.question
        await pilot.press("n")
        await pilot.pause()
        assert not isinstance(app.screen, (ConfirmScreen, CompareScreen)) and opened == []
        await pilot.press("ctrl+b")
        await wait_for(pilot, lambda: isinstance(app.screen, ConfirmScreen))
        await pilot.press("y")
        await wait_for(pilot, lambda: opened == [True])
        await pilot.pause(0.2)
        assert len(engine_of(app).calls) == calls  # no answer was spent on a comparison


async def test_loading_shows_the_phase_and_seconds_with_an_indeterminate_bar(home):
    loaded = threading.Event()

    def gated_load(on_progress):
        on_progress("reading weights", 0.1)  # a fraction the bar must not show: it says nothing of the time left
        loaded.wait(10)
        return FakeEngine()

    app = LocalChatApp(gated_load, model="fake-model")
    async with app.run_test(size=(80, 24)) as pilot:
        bar = app.screen.query_one("#load-progress", ProgressBar)
        await wait_for(pilot, lambda: "reading weights" in status_text(app, "speed"))
        assert bar.display and bar.total is None
        await wait_for(pilot, lambda: status_text(app, "speed").rstrip().endswith(("1 s", "2 s")))  # it counts
        loaded.set()
        await ready(pilot)
        await pilot.pause()
        assert not bar.display and "reading" not in status_text(app, "speed")


async def test_switching_model_clears_the_previous_models_figures(make_app, monkeypatch):
    app = make_app()
    loaded = threading.Event()  # the new model loads when the test says so

    def gated_load(on_progress):
        on_progress("Loading weights", 0.1)
        loaded.wait(10)
        return FakeEngine(model_name="other-model", draft_name=None)

    monkeypatch.setattr("app.tui._load_engine", lambda model, **kw: gated_load)
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await send(pilot, "measure me")
        assert "tok/s" in status_text(app, "speed") and "accept" in status_text(app, "speed")
        first = app.runner.engine
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen))
        app.screen.dismiss(("org/other-model", None))
        await pilot.pause()
        assert "org/other-model" in status_text(app, "model") and "fake-draft" not in status_text(app, "model")
        assert "tok/s" not in status_text(app, "speed")  # loading, not the old model's speed
        loaded.set()
        await wait_for(pilot, lambda: app.runner.engine is not None and app.runner.engine is not first)
        await pilot.pause(0.2)
        speed = status_text(app, "speed")
        assert "TTFT" not in speed and "accept" not in speed and "Loading" not in speed
        assert "other-model" in status_text(app, "model") and "no draft" in status_text(app, "spec")


async def test_a_failed_load_points_to_f5_and_f5_recovers(make_app, monkeypatch):
    app = make_app(fail_load=RuntimeError("CUDA out of memory"))
    monkeypatch.setattr("app.tui._load_engine", lambda model, **kw: fake_factory(model_name="good-model"))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        assert any("Press F5 to load another model" in n for n in notes(app))
        await send(pilot, "hello", wait=False)
        await pilot.pause()
        hint = notes(app)[-1]
        assert "Press F5 to load another model" in hint and "Restart" not in hint
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen))
        app.screen.dismiss(("org/good-model", None))
        await wait_for(pilot, lambda: app.runner.engine is not None)
        assert app.runner.load_error is None
        await send(pilot, "hello again")
        assert app.screen.conversation.views[-1].content.startswith("You said: **hello again**")


async def test_the_speculation_default_is_decided_again_for_each_model(make_app, monkeypatch):
    """Settings say on: a model where speculation is slower (a CPU) starts with it off and says why;
    the next model, where it pays, starts with it on again; once the user toggles, the choice stays."""
    app = make_app(spec_pays=(False, "slower on a CPU"))
    monkeypatch.setattr("app.tui._load_engine", lambda model, **kw: fake_factory(model_name="gpu-model"))
    async with app.run_test(size=(100, 24)) as pilot:
        await ready(pilot)
        assert "SPEC OFF: slower on a CPU" in status_text(app, "spec")
        first = app.runner.engine
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen))
        app.screen.dismiss(("org/gpu-model", "org/gpu-draft"))
        await wait_for(pilot, lambda: app.runner.engine is not None and app.runner.engine is not first)
        await pilot.pause(0.2)
        assert "SPEC ON" in status_text(app, "spec")
        await send(pilot, "fast")
        assert engine_of(app).calls[-1]["speculative"] is True
        await pilot.press("ctrl+t")  # the user's choice from now on
        assert status_text(app, "spec").strip() == "SPEC OFF"


async def test_a_gpu_where_the_draft_loses_starts_with_speculation_off_and_says_by_how_much(make_app):
    """The first load of a model and draft on a GPU measures (the load's progress says so); where
    speculation lost, the app starts with it off and the status bar gives the figure."""
    reason = "slower on this GPU (0.39x of no draft)"
    app = make_app(spec_pays=(False, reason), measures=True)
    async with app.run_test(size=(120, 24)) as pilot:
        await ready(pilot)
        assert engine_of(app).logged and "measuring whether speculation pays" in engine_of(app).logged[0]
        assert f"SPEC OFF: {reason}" in status_text(app, "spec")
        await send(pilot, "hello")
        assert engine_of(app).calls[-1]["speculative"] is False
        await pilot.press("ctrl+t")  # still the user's to turn on
        await send(pilot, "again")
        assert engine_of(app).calls[-1]["speculative"] is True


async def test_a_draft_that_pays_only_greedily_is_off_for_sampled_answers(make_app):
    """The first-load measurement gives greedy and sampled answers a verdict each: at a temperature
    where the draft loses, the next answer decodes plainly and the status bar says why; back at
    greedy, speculation is on again; a toggle by the user overrides both."""
    import dataclasses

    reason = "slower at temperature 0.7 on this GPU (0.90x of no draft)"
    app = make_app(sampled_spec_pays=(False, reason))
    async with app.run_test(size=(120, 24)) as pilot:
        await ready(pilot)
        assert "SPEC ON" in status_text(app, "spec")
        await send(pilot, "greedy")
        assert engine_of(app).calls[-1]["speculative"] is True
        app.settings = dataclasses.replace(app.settings, temperature=0.7)
        await send(pilot, "sampled")
        assert engine_of(app).calls[-1]["speculative"] is False
        assert f"SPEC OFF: {reason}" in status_text(app, "spec")
        app.settings = dataclasses.replace(app.settings, temperature=0.0)
        await send(pilot, "greedy again")
        assert engine_of(app).calls[-1]["speculative"] is True
        assert "SPEC ON" in status_text(app, "spec")
        app.settings = dataclasses.replace(app.settings, temperature=0.7)
        await pilot.press("ctrl+t")  # off now; twice: the user's choice, on
        await pilot.press("ctrl+t")
        await send(pilot, "sampled, by choice")
        assert engine_of(app).calls[-1]["speculative"] is True
