"""Helpers for Pilot tests: wait for the app, send a message, read notifications."""

from __future__ import annotations

import time
from typing import Callable

from app.tui import LocalChatApp
from app.widgets.prompt_input import PromptInput


async def wait_for(pilot, condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for the app")
        await pilot.pause(0.02)


async def ready(pilot) -> None:
    """Wait until the model has loaded."""
    await wait_for(pilot, lambda: pilot.app.runner.engine is not None or pilot.app.runner.load_error)
    await pilot.pause()


async def send(pilot, text: str, wait: bool = True) -> None:
    """Put `text` in the message box, press Enter and (by default) wait for the whole answer."""
    pilot.app.screen.query_one(PromptInput).text = text
    await pilot.press("enter")
    if wait:
        await wait_for(pilot, lambda: pilot.app.screen.answer is None)
        await pilot.pause()


def engine_of(app: LocalChatApp):
    """The FakeEngine the app loaded."""
    return app.runner.factory.made[-1]


def notes(app: LocalChatApp) -> list[str]:
    return [str(n.message) for n in app._notifications]

