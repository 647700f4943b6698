"""Fetches one listed file into the Hub cache: checked HEAD, resumable GET, hash check, atomic placement.

Why not huggingface_hub's `hf_hub_download`: it names the blob, its lock and its temporary file after
the ETag of its own HEAD request, so a server answering `../` there makes it write outside the cache,
and it never checks the bytes against the sha256 the Hub lists. Checking an answer first and then
calling it would not help: its own HEAD can answer differently. Owning the transfer means every path
written is built from values checked in `hub_metadata`, and the bytes are hashed as they arrive, so
nothing unverified is ever placed in the cache. The cost: no hf_xet acceleration, as the Hub serves
every file over plain HTTPS too. The public pieces of huggingface_hub still do the HTTP (its session,
headers with the user's token, error types), so proxies, tokens and endpoints work as they do there.
"""

from __future__ import annotations

import os
import shutil
import time
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from engine.hub.progress import ProgressMeter
from engine.hub.cache import blob_path, is_inside, is_verified, lock_path, mark_verified, remove_cached, snapshot_file
from engine.hub.errors import DownloadCorrupt, DownloadInterrupted, http_module
from engine.hub.metadata import HubAnswerError, ListedFile, check_commit, check_etag, refuse

RETRY_DELAYS_S = (1.0, 2.0, 4.0, 8.0)  # waits before resuming a dropped body; after the last, the download fails


class _Retry(Exception):
    """The body ended before the listed size, or resumed at the wrong offset: ask again."""


def fetch(root: Path, repo_id: str, commit: str, file: ListedFile, meter: ProgressMeter) -> Path:
    """Downloads `file` of `repo_id` at `commit` into the cache under `root`; returns its snapshot path.

    The bytes go to blobs/<digest>.incomplete, are hashed on the way, and are renamed to the blob only
    when they match; the temporary file is removed on every way out (errors, cancel, Ctrl+C, SIGTERM
    turned into KeyboardInterrupt). A mismatch also removes any older copy of the file.
    """
    from filelock import FileLock

    what = f"{repo_id}/{file.name}"
    url = _head(repo_id, commit, file, what)
    blob = blob_path(root, repo_id, file.digest)
    entry = snapshot_file(root, repo_id, commit, file.name)
    lock = lock_path(root, repo_id, file.digest)
    if not all(is_inside(root, p) for p in (blob, entry, lock)):  # the checks above make this unreachable
        raise refuse(f"file name in {repo_id}", file.name)
    lock.parent.mkdir(parents=True, exist_ok=True)
    blob.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock)):  # another localchat, or huggingface_hub itself, may be fetching the same blob
        if blob.is_file() and is_verified(blob, file.digest):
            meter.add(file.size)
        else:
            try:
                _download_blob(url, blob, file, meter, what)
            except DownloadCorrupt:
                remove_cached(root, repo_id, commit, file)
                raise
    _link(entry, blob)
    return entry


def _head(repo_id: str, commit: str, file: ListedFile, what: str) -> str:
    """The URL to GET the file from, once the HEAD answer agrees with the listing."""
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    url = hf_hub_url(repo_id, file.name, revision=commit)
    meta = get_hf_file_metadata(url)
    if check_commit(meta.commit_hash, repo_id) != commit:
        raise HubAnswerError(
            f"the Hub answered commit {meta.commit_hash} for {what}, asked for {commit}; refusing it, nothing was "
            "written (check HF_ENDPOINT, or try again later)"
        )
    check_etag(meta.etag, file.digest, what)
    if meta.size is not None and meta.size != file.size:
        raise refuse(f"size for {what} (listed {file.size})", meta.size)
    return urljoin(url, meta.location)


def _download_blob(url: str, blob: Path, file: ListedFile, meter: ProgressMeter, what: str) -> None:
    part = blob.with_name(blob.name + ".incomplete")
    try:
        with open(part, "wb") as out:  # truncates what a killed process may have left
            digest = _transfer(url, out, file, meter, what)
        if digest != file.digest.hex:
            raise DownloadCorrupt(
                f"{what} does not match the {file.digest.kind} the Hub lists (got {digest[:12]}..., listed "
                f"{file.digest.hex[:12]}...): deleted it; run the same command again, and if this repeats, "
                "something between you and the Hub alters the file"
            )
        os.replace(part, blob)
    finally:
        part.unlink(missing_ok=True)
    mark_verified(blob, file.digest)


def _transfer(url: str, out, file: ListedFile, meter: ProgressMeter, what: str) -> str:
    """Streams the body into `out`, resuming dropped connections with a Range request; returns the digest."""
    httpx = http_module()
    hasher = file.digest.hasher(file.size)
    done = 0
    for delay in (*RETRY_DELAYS_S, None):
        try:
            with _get(url, done) as response:
                if done and _resume_offset(response) != done:  # the server sent something else than the rest
                    out.seek(0)
                    out.truncate()
                    meter.add(-done)
                    hasher, done = file.digest.hasher(file.size), 0
                    if response.status_code != 200:
                        raise _Retry()
                for chunk in response.iter_bytes():  # as the network hands them over: progress and cancel keep up
                    if done + len(chunk) > file.size:  # never let a server fill the disk
                        raise DownloadCorrupt(f"the Hub sent more than the listed {file.size} bytes of {what}: "
                                              "deleted it; try again later")
                    out.write(chunk)
                    hasher.update(chunk)
                    done += len(chunk)
                    meter.add(len(chunk))
            if done == file.size:
                return hasher.hexdigest()
            raise _Retry()
        except (httpx.TransportError, _Retry):
            if delay is None:
                raise DownloadInterrupted(
                    f"the connection dropped while downloading {what}: run the same command again to continue "
                    "(finished files are kept)"
                ) from None
            time.sleep(delay)
    raise AssertionError("unreachable")


def _resume_offset(response) -> int:
    """Where the body of an answer to a Range request starts: 0 unless it is a 206 with a Content-Range."""
    if response.status_code != 206:
        return 0
    spec = response.headers.get("Content-Range", "")  # "bytes START-END/TOTAL"
    try:
        return int(spec.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return -1


@contextmanager
def _get(url: str, start: int):
    """A streamed GET of `url` from byte `start`; a failed status raises huggingface_hub's error types."""
    from huggingface_hub import constants, get_session
    from huggingface_hub.utils import build_hf_headers, hf_raise_for_status

    headers = build_hf_headers()
    headers["Accept-Encoding"] = "identity"  # sizes and ranges count the file's bytes, not a compressed body
    if urlsplit(url)[:2] != urlsplit(constants.ENDPOINT)[:2]:  # a CDN link is signed; it gets no token
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
    if start:
        headers["Range"] = f"bytes={start}-"
    with get_session().stream("GET", url, headers=headers, follow_redirects=True,
                              timeout=constants.HF_HUB_DOWNLOAD_TIMEOUT) as response:
        hf_raise_for_status(response)
        yield response


def _link(entry: Path, blob: Path) -> None:
    """Points the snapshot entry at the blob (relative link, replaced atomically)."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = entry.with_name(f".{entry.name}.{os.getpid()}.link")
    try:
        tmp.unlink(missing_ok=True)
        try:
            os.symlink(os.path.relpath(blob, entry.parent), tmp)
        except OSError:  # a file system without links (Windows without developer mode): a copy
            shutil.copyfile(blob, tmp)
        os.replace(tmp, entry)
    finally:
        tmp.unlink(missing_ok=True)
