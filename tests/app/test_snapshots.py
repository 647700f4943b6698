"""Snapshots of the main screens on the fake engine with fixed stats (update: pytest --snapshot-update)."""

from __future__ import annotations

from tests.app.pilot_helpers import ready, send, wait_for

from app.widgets.prompt_input import PromptInput

SIZE = (110, 34)


async def settle(pilot) -> None:
    pilot.app.screen.query_one(PromptInput).cursor_blink = False
    await ready(pilot)
    await pilot.pause()


def test_empty_chat(snap_compare, make_app):
    assert snap_compare(make_app(fixed_stats=True), terminal_size=SIZE, run_before=settle)


def test_chat_with_answer(snap_compare, make_app):
    async def run_before(pilot) -> None:
        await settle(pilot)
        await send(pilot, "What is speculative decoding?")
        await pilot.press("ctrl+t")  # status bar shows SPEC OFF for the next answer
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(make_app(fixed_stats=True), terminal_size=SIZE, run_before=run_before)


def test_compare_screen(snap_compare, make_app):
    async def run_before(pilot) -> None:
        await settle(pilot)
        await send(pilot, "Compare me")
        await pilot.press("ctrl+b")
        await pilot.pause()
        verdict = pilot.app.screen.query_one("#compare-verdict")
        await wait_for(pilot, lambda: "Speed-up" in str(verdict.render()))
        await pilot.pause()

    assert snap_compare(make_app(fixed_stats=True), terminal_size=SIZE, run_before=run_before)


def test_settings_screen(snap_compare, make_app):
    async def run_before(pilot) -> None:
        await settle(pilot)
        await pilot.press("f4")
        await pilot.pause()
        focused = pilot.app.focused
        if hasattr(focused, "cursor_blink"):  # a blinking cursor would be on or off by timing
            focused.cursor_blink = False
            await pilot.pause()

    assert snap_compare(make_app(fixed_stats=True), terminal_size=SIZE, run_before=run_before)


def test_chat_with_answer_at_80x24(snap_compare, make_app):
    """The smallest common terminal: no sidebar, the whole status line, footer and placeholder."""
    async def run_before(pilot) -> None:
        await settle(pilot)
        await send(pilot, "What is speculative decoding?")
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(make_app(fixed_stats=True, model_name="SmolLM2-135M-Instruct", draft_name="demo-eagle3"),
                        terminal_size=(80, 24), run_before=run_before)
