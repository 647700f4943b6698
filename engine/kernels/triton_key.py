"""Remembers Triton's installation hash between processes.

Triton keys its on-disk kernel cache with a hash of its own installation: its compiler,
backend and language sources and the whole libtriton library (hundreds of MB), read once per
process at the first kernel launch. On an H200 host that took 0.39 s of the 0.72 s between
Engine.load and the first token (docs/performance.md, start-up). The
hash changes only when those files do, so it is stored under the cache folder, named by their
sizes and modification times, and later processes hand Triton the stored value, as Triton's
own compile warm-up pool does in its workers. On any surprise Triton computes it as usual.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

# What triton.runtime.cache.triton_key reads, relative to the triton package.
_SOURCES = ("runtime/cache.py", "compiler", "backends", "language", "_C")


def _fingerprint(root: Path, version: str) -> str:
    """sha256 over the version and the size and mtime of every file the key is made from."""
    lines = [version]
    for name in _SOURCES:
        path = root / name
        if path.is_file():
            files = [path]
        elif name == "_C":
            files = sorted(path.glob("libtriton.*"))
        else:
            files = sorted(f for f in path.rglob("*") if f.suffix in (".py", ".so") and f.is_file())
        for f in files:
            st = f.stat()
            lines.append(f"{f.relative_to(root)} {st.st_size} {st.st_mtime_ns}")
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:32]


def remember_triton_key(folder: Path | None = None) -> bool:
    """Hands Triton its stored installation hash, computing and storing it on first use.
    Returns whether Triton now uses a stored value."""
    try:
        import triton
        import triton.runtime.cache as tc

        if getattr(tc.triton_key, "localchat_stored", False):
            return True
        compute = tc.triton_key
        if not hasattr(compute, "cache_clear"):  # not the lru_cache'd function this was written against
            return False
        if folder is None:
            from engine.paths import cache_dir

            folder = cache_dir() / "triton-key"
        path = folder / _fingerprint(Path(triton.__file__).parent, triton.__version__)
        try:
            key = path.read_text()
        except OSError:
            key = compute()
            folder.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(key)
            os.replace(tmp, path)
        if not key.startswith(triton.__version__):
            return False

        def stored() -> str:
            return key

        stored.localchat_stored = True
        tc.triton_key = stored
        return True
    except Exception:  # an unexpected Triton layout or an unwritable cache: Triton's own way
        return False
