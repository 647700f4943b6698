"""Where localchat keeps its files; LOCALCHAT_HOME overrides every platform default."""

from __future__ import annotations

import os
from pathlib import Path


def _base(kind: str) -> Path:
    home = os.environ.get("LOCALCHAT_HOME")
    if home:
        return Path(home).expanduser() / kind
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")("localchat"))


def cache_dir() -> Path:
    return _base("cache")


def data_dir() -> Path:
    return _base("data")


def config_dir() -> Path:
    return _base("config")
