"""Fixtures for the UI tests: a LocalChatApp on a fake engine, in a fresh LOCALCHAT_HOME."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest

from app.settings import Settings, save_settings
from app.tui import LocalChatApp
from tests.app.fake_engine import fake_factory


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A LOCALCHAT_HOME with a config folder already there (so no first-run notice)."""
    root = tmp_path / "home"
    save_settings(root / "config" / "settings.toml", Settings())
    monkeypatch.setenv("LOCALCHAT_HOME", str(root))
    return root


@pytest.fixture
def make_app(home: Path) -> Callable[..., LocalChatApp]:
    def make(**engine_kwargs) -> LocalChatApp:
        factory_keys = {"load_delay_s", "fail_load"}
        factory_kwargs = {k: engine_kwargs.pop(k) for k in list(engine_kwargs) if k in factory_keys}
        return LocalChatApp(fake_factory(**factory_kwargs, **engine_kwargs), model="fake-model")

    return make
