"""The app as the client of an OpenAI-compatible server: Pilot against `localchat serve` on 127.0.0.1 (a tiny
random model with a random EAGLE-3 head on the CPU), and the wizard's "Connect to a server"."""

from __future__ import annotations

import pytest
from textual.app import App
from textual.widgets import Input, Static, TabbedContent

from app.remote import RemoteChoice
from app.screens.wizard import WizardScreen
from app.settings import Settings, save_settings
from app.tui import LocalChatApp
from engine.types import SamplingParams
from tests.app.pilot_helpers import notes, ready, send, wait_for
from tests.server.serving import serving, tiny_engine, tiny_head
from tests.tiny import make_tiny_model


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    base = tmp_path_factory.mktemp("remote")
    model = make_tiny_model(base / "llama", "llama")
    return tiny_engine(model, tiny_head(model, base / "head"))


async def answer(pilot, text: str) -> None:
    """Send `text` and wait for the whole answer, with room for a busy 2-core machine."""
    await send(pilot, text, wait=False)
    await wait_for(pilot, lambda: pilot.app.screen.answer is None, timeout_s=30)
    await pilot.pause()


def status_text(app, part: str) -> str:
    return str(app.screen.query_one(f"#status-{part}", Static).render())


async def test_app_chats_with_localchat_serve(home, engine):
    save_settings(home / "config" / "settings.toml", Settings(max_tokens=12))
    with serving(engine) as served:
        app = LocalChatApp(remote=RemoteChoice(served.url))
        async with app.run_test(size=(140, 40)) as pilot:
            await ready(pilot)
            assert app.runner.engine is not None, notes(app)
            await wait_for(pilot, lambda: "remote:" in status_text(app, "model"))
            assert f"remote: {served.url} · {engine.model_name}" in status_text(app, "model")
            assert "SPEC ON" in status_text(app, "spec")

            await answer(pilot, "Paris is the capital of")
            saved = app.store.messages(app.screen.chat.id)[-1]
            messages = [{"role": "system", "content": Settings().system_prompt},
                        {"role": "user", "content": "Paris is the capital of"}]
            expected = engine.generate(messages, SamplingParams(max_tokens=12))
            assert saved.role == "assistant" and saved.content == expected.text
            assert app.screen.conversation.views[-1].content == expected.text
            stats = saved.stats
            assert stats["speculative"] is True and stats["accept_len_mean"] >= 1  # the server's figures
            assert stats["generated_tokens"] == len(expected.token_ids) and stats["ttft_s"] > 0  # the client's
            assert "accept" in status_text(app, "speed")

            await pilot.press("ctrl+t")  # the switch is a per-request field for our server
            await answer(pilot, "Again")
            again = app.store.messages(app.screen.chat.id)[-1]
            assert again.stats["speculative"] is False and again.content
            assert not [n for n in notes(app) if "failed" in n.lower()]


async def test_an_unreachable_server_is_a_notification(home):
    app = LocalChatApp(remote=RemoteChoice("http://127.0.0.1:9"))
    async with app.run_test() as pilot:
        await ready(pilot)
        assert app.runner.engine is None and "cannot reach http://127.0.0.1:9" in app.runner.load_error
        await wait_for(pilot, lambda: any("cannot reach" in n for n in notes(app)))
        assert app.is_running


def test_remote_choice_addresses():
    assert RemoteChoice("127.0.0.1:8000").base_url == "http://127.0.0.1:8000/v1"
    assert RemoteChoice("https://gpu-box:30000/v1/").base_url == "https://gpu-box:30000/v1"
    assert RemoteChoice("http://h:8000/v1").label == "http://h:8000"


class WizardApp(App):
    result = None

    def on_mount(self) -> None:
        self.push_screen(WizardScreen(), lambda result: setattr(self, "result", result))


async def test_the_wizard_connects_to_a_server(home):
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        app.screen.query_one("#tabs", TabbedContent).active = "server-pane"
        await pilot.pause()
        app.screen.query_one("#server-key", Input).value = "k"
        url = app.screen.query_one("#server-url", Input)
        url.focus()
        url.value = "http://gpu-box:8000"
        await pilot.press("enter")
        await wait_for(pilot, lambda: app.result is not None)
        assert app.result == RemoteChoice("http://gpu-box:8000", "k", None)
