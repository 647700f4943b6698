"""F5 opens the model wizard; a choice reloads the engine on the engine thread."""

from app.screens.wizard import WizardScreen
from tests.app.fake_engine import fake_factory
from tests.app.pilot_helpers import ready, wait_for


async def test_f5_opens_the_wizard_and_a_choice_reloads(make_app, monkeypatch):
    app = make_app()
    loads = []
    monkeypatch.setattr("app.tui._load_engine", lambda model, **kw: (loads.append((model, kw.get("draft"))),
                                                                       fake_factory())[1])
    async with app.run_test(size=(120, 36)) as pilot:
        await ready(pilot)
        first = app.runner.engine
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen))
        app.screen.dismiss(("org/other-model", "org/other-draft"))
        await wait_for(pilot, lambda: app.runner.engine is not None and app.runner.engine is not first, 10)
        assert loads == [("org/other-model", "org/other-draft")]
        assert app.model_label == "org/other-model"


async def test_backing_out_of_the_wizard_keeps_the_model(make_app):
    app = make_app()
    async with app.run_test(size=(120, 36)) as pilot:
        await ready(pilot)
        first = app.runner.engine
        await pilot.press("f5")
        await wait_for(pilot, lambda: isinstance(app.screen, WizardScreen))
        app.screen.dismiss(None)
        await pilot.pause(0.2)
        assert app.runner.engine is first
