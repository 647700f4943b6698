"""The model wizard driven with Textual's Pilot against the fake Hub."""

from __future__ import annotations

import asyncio
import os

from textual.app import App
from textual.widgets import Button, DataTable, Input, Label, TabbedContent

from app.screens.wizard import WizardScreen
from engine.hub.local_models import cached_snapshot
from engine.hub.download import plan_download, run_download
from tests.hub_fixtures import cache_files, fake_hub, hub_env  # noqa: F401

NOT_DONE = object()


class WizardApp(App):
    def __init__(self) -> None:
        super().__init__()
        self.result = NOT_DONE

    def on_mount(self) -> None:
        self.push_screen(WizardScreen(), self.done)

    def done(self, result) -> None:
        self.result = result


async def until(pilot, condition, timeout: float = 15.0) -> None:
    """Let workers run and messages land until `condition()` holds."""
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout
    while not condition():
        assert loop.time() < end, "timed out waiting for the wizard"
        await pilot.pause(0.02)


def text_of(screen, selector: str) -> str:
    return str(screen.query_one(selector, Label).render())


async def search(pilot, screen, text: str) -> DataTable:
    screen.query_one("#tabs", TabbedContent).active = "search-pane"
    box = screen.query_one("#search-text", Input)
    box.focus()
    box.value = text
    await pilot.press("enter")
    table = screen.query_one("#search-results", DataTable)
    await until(pilot, lambda: table.row_count > 0)
    return table


async def test_search_pick_model_and_draft_then_download(hub_env, fake_hub):
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.env is not None)  # GPU/disk probe done
        table = await search(pilot, screen, "eagle3")
        assert table.get_row_at(0)[0] == "tiny/llama-eagle3"
        await pilot.click("#pick-draft")
        assert screen.query_one("#draft", Input).value == "tiny/llama-eagle3"
        table = await search(pilot, screen, "tiny/llama")
        table.focus()
        await pilot.press("enter")  # the first hit, tiny/llama, as the model
        await until(pilot, lambda: screen.choice is not None)
        summary = text_of(screen, "#summary")
        assert "tiny/llama + tiny/llama-eagle3" in summary and "to download" in summary and "free on disk" in summary
        assert str(screen.query_one("#start", Button).label) == "Download"
        await pilot.click("#start")
        await until(pilot, lambda: app.result is not NOT_DONE)
    assert app.result == ("tiny/llama", "tiny/llama-eagle3")
    assert cached_snapshot("tiny/llama") is not None and cached_snapshot("tiny/llama-eagle3") is not None


async def test_gated_repo_asks_for_a_token_and_uses_it(hub_env, fake_hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        table = await search(pilot, screen, "gated")
        table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: screen.choice is not None)
        await pilot.click("#start")
        prompt = screen.query_one("#token")
        await until(pilot, lambda: not prompt.has_class("hidden"))
        reason = text_of(screen, "#token-reason")
        assert "tiny/gated-llama is gated: accept its licence at" in reason and "paste a read token" in reason
        token = screen.query_one("#token Input", Input)
        assert token.password
        await pilot.click("#token Input")
        await pilot.press(*fake_hub.token)
        await pilot.press("enter")  # this session only
        await until(pilot, lambda: app.result is not NOT_DONE)
        assert os.environ["HF_TOKEN"] == fake_hub.token
    assert app.result == ("tiny/gated-llama", None)
    assert not (hub_env.parent / "token").exists()  # nothing stored for a session token


async def test_gated_repo_save_login_goes_through_huggingface_hub(hub_env, fake_hub, monkeypatch):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        table = await search(pilot, screen, "gated")
        table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: screen.choice is not None)
        await pilot.click("#start")
        await until(pilot, lambda: not screen.query_one("#token").has_class("hidden"))
        screen.query_one("#token Input", Input).value = fake_hub.token
        await pilot.click("#token-save")
        await until(pilot, lambda: app.result is not NOT_DONE)
    assert app.result == ("tiny/gated-llama", None)
    assert (hub_env.parent / "token").read_text().strip() == fake_hub.token  # huggingface_hub's own store
    assert "HF_TOKEN" not in os.environ


async def test_cancel_keeps_finished_files_only(hub_env, fake_hub, monkeypatch):
    monkeypatch.setattr(fake_hub, "rate_bytes_per_s", 200_000.0)
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        table = await search(pilot, screen, "tiny/llama")
        table.focus()
        await pilot.press("enter")
        await until(pilot, lambda: screen.choice is not None)
        await pilot.click("#start")
        progress = screen.query_one("#progress-text", Label)
        await until(pilot, lambda: "ETA" in str(progress.render()))
        await pilot.press("escape")
        await until(pilot, lambda: "cancelled" in text_of(screen, "#message"))
        assert app.result is NOT_DONE
        await until(pilot, lambda: "to download" in text_of(screen, "#summary"))
    assert not any(f.endswith(".incomplete") for f in cache_files(hub_env))
    assert cached_snapshot("tiny/llama") is None


async def test_catalog_entry_missing_on_the_hub_shows_one_line(hub_env):
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        catalog = screen.query_one("#catalog", DataTable)
        await until(pilot, lambda: "no GPU" in str(catalog.get_row("qwen3-8b")[-1]) or screen.env is not None)
        catalog.focus()
        catalog.move_cursor(row=catalog.get_row_index("qwen3-8b"))
        await pilot.press("enter")
        assert screen.query_one("#draft", Input).value == "AngelSlim/Qwen3-8B_eagle3"
        await until(pilot, lambda: text_of(screen, "#message") != "")
        assert "no model repository 'Qwen/Qwen3-8B'" in text_of(screen, "#message")
        assert screen.query_one("#start", Button).disabled


async def test_offline_uses_downloaded_models_and_refuses_others(hub_env, fake_hub, monkeypatch):
    from huggingface_hub import constants

    run_download(plan_download("tiny/llama"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    fake_hub.requests.clear()
    app = WizardApp()
    async with app.run_test(size=(140, 45)) as pilot:
        screen = app.screen
        await until(pilot, lambda: screen.env is not None)
        assert "offline" in text_of(screen, "#env")
        await until(pilot, lambda: screen.query_one("#tabs", TabbedContent).active == "downloaded-pane")
        draft = screen.query_one("#draft", Input)
        draft.value = "tiny/llama-eagle3"  # not downloaded
        draft.focus()
        await pilot.press("enter")
        downloaded = screen.query_one("#downloaded", DataTable)
        downloaded.focus()
        await pilot.press("enter")
        await until(pilot, lambda: text_of(screen, "#message") != "")
        assert "tiny/llama-eagle3 not in the cache and HF_HUB_OFFLINE is set" in text_of(screen, "#message")
        draft.value = ""
        draft.focus()
        await pilot.press("enter")
        await until(pilot, lambda: screen.choice is not None and screen.choice.draft is None)
        assert str(screen.query_one("#start", Button).label) == "Use"
        await pilot.click("#start")
        await until(pilot, lambda: app.result is not NOT_DONE)
    assert app.result == ("tiny/llama", None)
    assert fake_hub.requests == []
