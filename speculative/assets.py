"""Locates the draft heads shipped in `assets/` for the demo model."""

from __future__ import annotations

from pathlib import Path


def demo_draft_path(kind: str = "eagle3") -> Path | None:
    folder = Path(__file__).resolve().parent.parent / "assets" / f"demo-{kind}"
    return folder if (folder / "config.json").exists() else None
