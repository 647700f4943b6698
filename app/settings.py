"""User settings: a frozen dataclass read from and written to a small TOML file."""

from __future__ import annotations

import dataclasses
import math
import os
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Settings:
    # Greedy by default: speculation is then exactly lossless, so "compare" shows identical texts.
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0: off
    min_p: float = 0.0  # 0: off
    repetition_penalty: float = 1.0  # 1: off
    max_tokens: int = 512
    # Draft tokens proposed per verify step; the EAGLE-3 papers find 5-7 best for chat.
    draft_steps: int = 5
    speculative: bool = True
    theme: str = "textual-dark"
    # Empty would send no system message, so the model's chat template supplies its own. For the
    # demo model that answered worse: greedy, on the CPU, "Give me three tips for learning to
    # cook." gave "1. **1011111111..." under its own default and three tips under this one.
    system_prompt: str = "You are a helpful assistant."

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            problem = _problem(field.name, getattr(self, field.name))
            if problem:
                raise ValueError(problem)

    def sampling_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for `engine.types.SamplingParams` (built on the engine thread)."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "min_p": self.min_p,
            "repetition_penalty": self.repetition_penalty,
            "max_tokens": self.max_tokens,
        }


_TYPES: dict[str, type] = {
    "temperature": float, "top_p": float, "top_k": int, "min_p": float, "repetition_penalty": float, "max_tokens": int,
    "draft_steps": int, "speculative": bool, "theme": str, "system_prompt": str,
}
_LIMITS = {
    "temperature": (lambda v: v >= 0, "must be >= 0"),
    "top_p": (lambda v: 0 < v <= 1, "must be in (0, 1]"),
    "top_k": (lambda v: v >= 0, "must be >= 0 (0 turns it off)"),
    "min_p": (lambda v: 0 <= v < 1, "must be in [0, 1) (0 turns it off)"),
    "repetition_penalty": (lambda v: v > 0, "must be > 0 (1 turns it off)"),
    "max_tokens": (lambda v: v >= 1, "must be >= 1"),
    "draft_steps": (lambda v: 1 <= v <= 15, "must be between 1 and 15"),
}


def _problem(name: str, value: Any) -> str | None:
    """Why `value` is not acceptable for setting `name`, or None."""
    kind = _TYPES[name]
    if kind is float:
        ok_type = isinstance(value, (int, float)) and not isinstance(value, bool)
    elif kind is int:
        ok_type = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok_type = isinstance(value, kind)
    if not ok_type:
        wanted = {float: "a number", int: "an integer", bool: "true or false", str: "a string"}[kind]
        return f"{name} must be {wanted}, got {value!r}"
    if kind is float and not math.isfinite(value):
        return f"{name} must be a finite number, got {value!r}"
    if name in _LIMITS and not _LIMITS[name][0](value):
        return f"{name} {_LIMITS[name][1]}, got {value!r}"
    return None


def load_settings(path: Path) -> tuple[Settings, list[str]]:
    """Read settings; every problem becomes a message for the user and the defaults fill in."""
    notes: list[str] = []
    if not path.parent.is_dir():
        try:
            save_settings(path, Settings())
            notes.append(f"Config folder {path.parent} did not exist: created it with default settings.")
        except OSError as e:
            notes.append(f"Config folder {path.parent} is missing and cannot be created ({e}): "
                         "using default settings for this session.")
        return Settings(), notes
    if not path.exists():
        try:
            save_settings(path, Settings())
        except OSError as e:
            notes.append(f"Cannot write {path} ({e}): using default settings.")
        return Settings(), notes
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as e:
        notes.append(f"Cannot read settings {path} ({e}): using defaults. Fix or delete the file.")
        return Settings(), notes
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in _TYPES:
            known = ", ".join(_TYPES)
            notes.append(f"Unknown setting '{key}' in {path} ignored. Known settings: {known}.")
            continue
        problem = _problem(key, value)
        if problem:
            notes.append(f"Setting in {path}: {problem}; using the default.")
            continue
        values[key] = float(value) if _TYPES[key] is float else value
    return Settings(**values), notes


def save_settings(path: Path, settings: Settings) -> None:
    """Write atomically: a crash mid-write leaves the old file, never half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(dumps_toml(dataclasses.asdict(settings)), encoding="utf-8")
    os.replace(tmp, path)


def dumps_toml(values: dict[str, Any]) -> str:
    """TOML for a flat table of str, bool, int and float values (all that settings hold)."""
    lines = ["# localchat settings; unknown keys are reported at start-up.", ""]
    for key, value in values.items():
        lines.append(f"{key} = {_toml_value(value)}")
    return "\n".join(lines) + "\n"


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"TOML cannot hold {value!r} here")
        return repr(value)  # repr keeps the decimal point and round-trips exactly
    if isinstance(value, str):
        return _toml_string(value)
    raise TypeError(f"no TOML form for {type(value).__name__}")


def _toml_string(text: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
    out = []
    for ch in text:
        if ch in escapes:
            out.append(escapes[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
