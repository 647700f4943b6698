"""Where localchat keeps its files; LOCALCHAT_HOME overrides every platform default."""

from __future__ import annotations

import os
from pathlib import Path


# The user's choices of Hugging Face cache; any of them keeps Hub downloads where the user put them.
HUB_ENV_VARS = ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME")


def localchat_home() -> Path | None:
    """$LOCALCHAT_HOME: one folder for every file localchat writes (None: the platform's folders)."""
    home = os.environ.get("LOCALCHAT_HOME")
    return Path(home).expanduser() if home else None


def hub_cache_chosen() -> bool:
    """Whether the user set a Hugging Face cache location (HF_HUB_CACHE, HF_HOME, ...)."""
    return any(os.environ.get(v) for v in HUB_ENV_VARS)


def _base(kind: str) -> Path:
    home = localchat_home()
    if home is not None:
        return home / kind
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_dir")("localchat"))


def cache_dir() -> Path:
    return _base("cache")


def data_dir() -> Path:
    return _base("data")


def config_dir() -> Path:
    return _base("config")


def read_json_cache(file: Path) -> dict:
    """The JSON object a measurement cached in `file`, or {} where it is missing, unreadable or
    not an object (a damaged cache costs a measurement, nothing else)."""
    import json

    try:
        cached = json.loads(Path(file).read_text())
    except (OSError, ValueError):
        return {}
    return cached if isinstance(cached, dict) else {}


def write_json_cache(file: Path, cached: dict) -> None:
    """Writes `cached` to `file` whole (a temporary file, then renamed over it), or not at all
    where the folder is not writable: that costs a measurement next time, nothing else."""
    import json

    file = Path(file)
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        tmp = file.with_suffix(".tmp")
        tmp.write_text(json.dumps(cached, indent=1))
        tmp.replace(file)
    except OSError:
        pass
