"""What the Hub says about a repo (commit, file names, sizes, digests), checked before anything acts on it.

These values become paths in the cache (snapshots/<commit>/<name>, blobs/<digest>), so a server that
answers with anything but what the Hub always sends (40 or 64 lowercase hex digits, relative POSIX
names inside the repo) is refused before a byte is written: it is broken, or hostile.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from engine.errors import UserError

HEX40 = re.compile(r"[0-9a-f]{40}")
HEX64 = re.compile(r"[0-9a-f]{64}")
SHOWN_CHARS = 80  # a hostile value can be megabytes long; the message shows its start


class HubAnswerError(UserError):
    """The Hub (or whatever answers at HF_ENDPOINT) sent a value that cannot be right; nothing was written."""


def refuse(what: str, value: object) -> HubAnswerError:
    shown = repr(value)
    shown = shown if len(shown) <= SHOWN_CHARS else shown[:SHOWN_CHARS] + "..."
    return HubAnswerError(
        f"the Hub answered an invalid {what}: {shown}; refusing it, nothing was written "
        "(check HF_ENDPOINT, or try again later)"
    )


def check_commit(value: object, repo_id: str) -> str:
    if not isinstance(value, str) or not HEX40.fullmatch(value):
        raise refuse(f"commit hash for {repo_id}", value)
    return value


def check_repo_path(name: object, repo_id: str) -> str:
    """A file name as the repo lists it: relative, POSIX, no empty, '.' or '..' part, no control characters."""
    is_ok = (
        isinstance(name, str)
        and name != ""
        and not name.startswith("/")
        and "\\" not in name
        and not any(ord(c) < 0x20 or c == "\x7f" for c in name)
        and all(part not in ("", ".", "..") for part in name.split("/"))
    )
    if not is_ok:
        raise refuse(f"file name in {repo_id}", name)
    return name


def check_revision(revision: str) -> str:
    """A branch, tag or commit given by the user; it names a file under refs/, so it must stay there."""
    if not all(part not in ("", ".", "..") for part in revision.split("/")) or "\\" in revision:
        raise UserError(f"--revision {revision!r} is not a branch, tag or commit name (e.g. main, v1.0, or a commit hash)")
    return revision


def normalize_etag(raw: str | None) -> str | None:
    """The ETag without its weak marker and quotes, as the cache names blobs by it."""
    if raw is None:
        return None
    etag = raw.strip()
    if etag.startswith("W/"):
        etag = etag[2:]
    return etag.strip('"')


@dataclass(frozen=True)
class Digest:
    """How the Hub identifies a file's bytes: sha256 for LFS files, git's blob sha1 for the others.

    Either one is also the file's blob name in the cache and the ETag the Hub sends for it.
    """

    hex: str
    is_lfs: bool

    def __post_init__(self) -> None:
        assert (HEX64 if self.is_lfs else HEX40).fullmatch(self.hex), self.hex

    @property
    def kind(self) -> str:
        return "sha256" if self.is_lfs else "git blob sha1"

    def hasher(self, size: int):
        """A hashlib object that, fed the file's `size` bytes, ends at `hex` if they are right."""
        if self.is_lfs:
            return hashlib.sha256()
        h = hashlib.sha1(usedforsecurity=False)
        h.update(b"blob %d\0" % size)
        return h

    def of_file(self, path: Path) -> str:
        size = path.stat().st_size
        h = self.hasher(size)
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                h.update(chunk)
        return h.hexdigest()


def check_etag(raw: str | None, expected: Digest, what: str) -> None:
    """The ETag of a HEAD answer must be a digest of the right kind, and the one the file listing gave."""
    etag = normalize_etag(raw)
    pattern = HEX64 if expected.is_lfs else HEX40
    if etag is None or not pattern.fullmatch(etag):
        raise refuse(f"ETag for {what} (expected a {expected.kind})", raw)
    if etag != expected.hex:
        raise HubAnswerError(
            f"the Hub's ETag for {what} ({etag}) differs from its file listing ({expected.hex}); refusing it, "
            "nothing was written (check HF_ENDPOINT, or try again later)"
        )


@dataclass(frozen=True)
class ListedFile:
    """One file of a repo at a commit, as the Hub's listing describes it."""

    name: str
    size: int
    digest: Digest


def listed_file(sibling, repo_id: str) -> ListedFile:
    """A `huggingface_hub` RepoSibling from `model_info(files_metadata=True)`, checked."""
    name = sibling.rfilename
    what = f"{repo_id}/{name}"
    if sibling.lfs is not None:
        sha, size = getattr(sibling.lfs, "sha256", None), getattr(sibling.lfs, "size", None)
        if not isinstance(sha, str) or not HEX64.fullmatch(sha):
            raise refuse(f"sha256 for {what}", sha)
        digest = Digest(sha, is_lfs=True)
    else:
        size = sibling.size
        if not isinstance(sibling.blob_id, str) or not HEX40.fullmatch(sibling.blob_id):
            raise refuse(f"blob id for {what}", sibling.blob_id)
        digest = Digest(sibling.blob_id, is_lfs=False)
    if not isinstance(size, int) or isinstance(size, bool) or size < 0:
        raise refuse(f"size for {what}", size)
    return ListedFile(name, size, digest)
