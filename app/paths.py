"""Where localchat keeps chat history and settings: platformdirs, or $LOCALCHAT_HOME."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import platformdirs

from engine.paths import localchat_home

APP_NAME = "localchat"


@dataclass(frozen=True)
class AppPaths:
    data_dir: Path
    config_dir: Path
    export_dir: Path  # where Ctrl+S writes a chat as Markdown

    @classmethod
    def resolve(cls, home: str | os.PathLike | None = None) -> AppPaths:
        """`home` (or $LOCALCHAT_HOME) puts both folders under one root, for tests and portable installs."""
        home = home if home is not None else localchat_home()
        if home is not None:
            root = Path(home).expanduser()
            return cls(data_dir=root / "data", config_dir=root / "config", export_dir=root / "exports")
        return cls(
            data_dir=Path(platformdirs.user_data_dir(APP_NAME, appauthor=False)),
            config_dir=Path(platformdirs.user_config_dir(APP_NAME, appauthor=False)),
            export_dir=Path(platformdirs.user_documents_dir()) / APP_NAME,
        )

    @property
    def db_path(self) -> Path:
        return self.data_dir / "chats.db"

    @property
    def settings_path(self) -> Path:
        return self.config_dir / "settings.toml"
