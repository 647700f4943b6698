"""The Hub cache on disk: where it is, its layout (blobs, snapshots, refs), and which cached files are known good.

The layout is huggingface_hub's own (models--OWNER--NAME/{blobs,snapshots,refs}), so `hf cache` and
other tools see what localchat downloads and the other way round.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.hub.metadata import Digest, ListedFile
from engine.paths import cache_dir as localchat_cache_dir, hub_cache_chosen, localchat_home

def cache_dir() -> Path:
    """The Hub cache: the user's HF_HUB_CACHE/HF_HOME when set, else under LOCALCHAT_HOME when that is set,
    else huggingface_hub's default. Every read and write of the cache takes it from here (and passes it
    explicitly), so it does not matter when huggingface_hub read its environment."""
    from huggingface_hub import constants

    if localchat_home() is not None and not hub_cache_chosen():
        return localchat_cache_dir() / "huggingface" / "hub"
    return Path(constants.HF_HUB_CACHE)


def repo_folder(root: Path, repo_id: str) -> Path:
    return root / ("models--" + repo_id.replace("/", "--"))


def blob_path(root: Path, repo_id: str, digest: Digest) -> Path:
    return repo_folder(root, repo_id) / "blobs" / digest.hex


def snapshot_file(root: Path, repo_id: str, commit: str, name: str) -> Path:
    return repo_folder(root, repo_id) / "snapshots" / commit / name


def lock_path(root: Path, repo_id: str, digest: Digest) -> Path:
    return root / ".locks" / repo_folder(root, repo_id).name / f"{digest.hex}.lock"


def is_inside(root: Path, path: Path) -> bool:
    """Whether `path` stays under `root` once '..' and links in its parents are resolved."""
    return path.parent.resolve().is_relative_to(root.resolve())


def repo_of(path: Path) -> str | None:
    """The repo id of a file inside a cache snapshot (…/models--OWNER--NAME/snapshots/COMMIT/…), else None."""
    parts = Path(os.path.abspath(path)).parts
    for i, part in enumerate(parts[:-2]):
        if part.startswith("models--") and parts[i + 1] == "snapshots" and "--" in part[len("models--"):]:
            return part[len("models--"):].replace("--", "/", 1)
    return None


def repair_hint(path: Path) -> str:
    """What repairs a model file that cannot be read: re-downloading the repo (or the demo) it came from."""
    from engine.hub.demo import demo_gguf_path

    repo = repo_of(path)
    if repo is not None:
        return f"run `localchat download {repo}` to check and repair it"
    if Path(os.path.abspath(path)) == Path(os.path.abspath(demo_gguf_path())):
        return "run `localchat download demo` to check and repair it"
    return "download or copy it again"


# --- files known good ------------------------------------------------------------------------------------
# Hashing a 16 GB checkpoint takes a while, so a file found good is remembered by (path, size, mtime):
# the next plan trusts it until it is rewritten. Markers live in localchat's own cache, not in the Hub
# cache, so huggingface_hub's tools never see an entry they do not know.


def _marker(path: Path) -> Path:
    key = hashlib.sha256(os.fsencode(os.path.abspath(path))).hexdigest()[:32]
    return localchat_cache_dir() / "hub-verified" / key


def _stamp(path: Path, digest: Digest) -> str:
    st = path.stat()
    return f"{digest.hex} {st.st_size} {st.st_mtime_ns}"


def mark_verified(path: Path, digest: Digest) -> None:
    marker = _marker(path)
    try:
        marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = marker.with_name(f"{marker.name}.{os.getpid()}.tmp")
        tmp.write_text(_stamp(path, digest))
        os.replace(tmp, marker)
    except OSError:  # a read-only cache only costs a rehash next time
        pass


def is_verified(path: Path, digest: Digest) -> bool:
    try:
        return _marker(path).read_text() == _stamp(path, digest)
    except OSError:
        return False


def cached_file_state(root: Path, repo_id: str, commit: str, file: ListedFile, on_hash=None) -> str:
    """"ok", "missing" or "corrupt" for a listed file in the snapshot of `commit`.

    A file of the wrong size, or whose bytes do not hash to the listed digest, is corrupt; the
    hash is computed once per file and remembered (see above), after calling `on_hash()` if given.
    """
    entry = snapshot_file(root, repo_id, commit, file.name)
    if not entry.is_file():
        return "missing"
    blob = entry.resolve()
    if blob.stat().st_size != file.size:
        return "corrupt"
    if is_verified(blob, file.digest):
        return "ok"
    if on_hash is not None:
        on_hash()
    if file.digest.of_file(blob) != file.digest.hex:
        return "corrupt"
    mark_verified(blob, file.digest)
    return "ok"


def remove_cached(root: Path, repo_id: str, commit: str, file: ListedFile) -> None:
    """Delete a file's snapshot entry and its blob, so that nothing counts it as present."""
    entry = snapshot_file(root, repo_id, commit, file.name)
    for path in (entry, blob_path(root, repo_id, file.digest)):
        if is_inside(root, path):
            path.unlink(missing_ok=True)


def remove_stale_parts(root: Path, repo_id: str) -> None:
    """Delete temporary downloads that no running download holds (what a killed process leaves behind).

    A download holds the blob's lock (huggingface_hub's own downloads use the same lock file), so a
    part whose lock can be taken at once belongs to nobody.
    """
    from filelock import FileLock, Timeout

    blobs = repo_folder(root, repo_id) / "blobs"
    for part in blobs.glob("*.incomplete") if blobs.is_dir() else ():
        lock = root / ".locks" / blobs.parent.name / (part.name.removesuffix(".incomplete") + ".lock")
        try:
            lock.parent.mkdir(parents=True, exist_ok=True)
            with FileLock(str(lock), timeout=0):
                part.unlink(missing_ok=True)
        except (Timeout, OSError):
            continue
