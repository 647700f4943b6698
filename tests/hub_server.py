"""A local stand-in for the Hugging Face Hub: the HTTP routes huggingface_hub uses, on 127.0.0.1.

Large (LFS) files are redirected to a second port, like the Hub's CDN: huggingface_hub reads
their metadata from the redirect and fetches them without following it on HEAD.

Switches make it behave like a broken or hostile server: `drops` (the connection closes mid-body),
`tampers` (per file: the ETag, commit, listed name or body it sends, or a slow body) and
`info_commits` (the commit hash a repo's model info reports).
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pth")


def git_blob_sha(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class FakeRepo:
    repo_id: str
    files: dict[str, bytes]
    gated: bool = False
    commit: str = ""  # fixed at creation: editing files in a test does not move the revision

    def __post_init__(self) -> None:
        if not self.commit:
            h = hashlib.sha1(self.repo_id.encode())
            for name in sorted(self.files):
                h.update(name.encode() + hashlib.sha256(self.files[name]).digest())
            self.commit = h.hexdigest()

    def is_lfs(self, name: str) -> bool:
        return name.endswith(LFS_SUFFIXES)

    def sibling(self, name: str) -> dict:
        data = self.files[name]
        entry = {"rfilename": name, "size": len(data), "blobId": git_blob_sha(data)}
        if self.is_lfs(name):
            entry["lfs"] = {"size": len(data), "sha256": hashlib.sha256(data).hexdigest(), "pointerSize": 134}
        return entry


@dataclass
class Drop:
    """Close the connection after `after_bytes` of the body, for the next `times` GETs of a file."""

    after_bytes: int
    times: int


@dataclass
class Tamper:
    """What the server gets wrong about one file; fields left at None are served truthfully."""

    etag: str | None = None  # sent as the ETag (and X-Linked-Etag for LFS files), verbatim
    commit: str | None = None  # sent as X-Repo-Commit
    listed_name: str | None = None  # the name the model info lists instead of the file's own
    body: bytes | None = None  # served instead of the file's bytes; the listing keeps the real size and sha256
    rate_bytes_per_s: float = 0.0  # > 0: stream this file's body this slowly
    ignore_range: bool = False  # answer a Range request with the whole body (200), as some proxies do


@dataclass
class FakeHub:
    repos: dict[str, FakeRepo] = field(default_factory=dict)
    token: str = "hf_test_token_123"
    drops: dict[tuple[str, str], Drop] = field(default_factory=dict)
    tampers: dict[tuple[str, str], Tamper] = field(default_factory=dict)
    info_commits: dict[str, str] = field(default_factory=dict)  # repo id -> the commit its model info reports
    requests: list[tuple[str, str]] = field(default_factory=list)
    url: str = ""
    cdn_url: str = ""
    rate_bytes_per_s: float = 0.0  # > 0: stream file bodies at this rate (to watch or cancel a download)

    def add(self, repo: FakeRepo) -> None:
        self.repos[repo.repo_id] = repo

    def reset(self) -> None:
        self.drops.clear()
        self.tampers.clear()
        self.info_commits.clear()
        self.requests.clear()

    def tamper(self, repo_id: str, name: str) -> Tamper:
        return self.tampers.get((repo_id, name)) or Tamper()

    def file_gets(self) -> list[str]:
        """Paths of file bodies served (resolve and CDN GETs)."""
        return [p for m, p in self.requests if m == "GET" and ("/resolve/" in p or p.startswith("/cdn/"))]

    def start(self) -> FakeHub:
        handler = _handler_for(self)
        self._servers = [ThreadingHTTPServer(("127.0.0.1", 0), handler) for _ in range(2)]
        for s in self._servers:
            s.daemon_threads = True
            threading.Thread(target=s.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self._servers[0].server_port}"
        self.cdn_url = f"http://127.0.0.1:{self._servers[1].server_port}"
        return self

    def stop(self) -> None:
        for s in self._servers:
            s.shutdown()
            s.server_close()


RESOLVE_RE = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
INFO_RE = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/]+))?$")
TREE_RE = re.compile(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?$")
CDN_RE = re.compile(r"^/cdn/([0-9a-f]{64})$")


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.0"  # one request per connection: a dropped body is a closed socket

        def log_message(self, *args) -> None:
            return None

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        # --- helpers -------------------------------------------------------------------------
        def _send(self, status: int, headers: dict | None = None, body: bytes = b"", head: bool = False) -> None:
            self.send_response(status)
            for k, v in (headers or {}).items():
                self.send_header(k, str(v))
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head and body:
                self.wfile.write(body)

        def _json(self, status: int, obj, headers: dict | None = None) -> None:
            body = json.dumps(obj).encode()
            self._send(status, {"Content-Type": "application/json", **(headers or {})}, body)

        def _error(self, status: int, code: str, message: str, head: bool, extra: dict | None = None) -> None:
            headers = {"X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
            if head:
                self._send(status, headers, head=True)
            else:
                self._json(status, {"error": message}, headers)

        def _authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {hub.token}"

        def _repo_or_error(self, repo_id: str, rev: str, head: bool) -> FakeRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return None
            if rev not in ("main", repo.commit):
                self._error(404, "RevisionNotFound", "Invalid rev id: " + rev, head)
                return None
            return repo

        # --- routes --------------------------------------------------------------------------
        def _route(self, head: bool) -> None:
            parts = urlsplit(self.path)
            path, query = unquote(parts.path), parse_qs(parts.query)
            hub.requests.append((self.command, path))
            if path == "/api/whoami-v2":
                if not self._authorized():
                    return self._error(401, "Unauthorized", "Invalid credentials in Authorization header", head)
                return self._json(200, {"name": "tester", "type": "user",
                                        "auth": {"accessToken": {"displayName": "test-token", "role": "read"}}})
            if path == "/api/models":
                return self._search(query)
            if m := TREE_RE.match(path):
                return self._tree(m.group(1), m.group(2))
            if m := INFO_RE.match(path):
                return self._info(m.group(1), m.group(2) or "main", query)
            if m := RESOLVE_RE.match(path):
                return self._resolve(m.group(1), m.group(2), m.group(3), head)
            if m := CDN_RE.match(path):
                return self._cdn(m.group(1), head)
            self._error(404, "NotFound", "no such route " + path, head)

        def _search(self, query: dict) -> None:
            text = (query.get("search") or [""])[0].lower()
            limit = int((query.get("limit") or ["50"])[0])
            found = [r for r in hub.repos.values() if text in r.repo_id.lower()][:limit]
            self._json(200, [{"id": r.repo_id, "modelId": r.repo_id, "private": False, "gated": "manual" if r.gated else False,
                              "downloads": 1000 - i, "likes": 10, "tags": ["safetensors"], "pipeline_tag": "text-generation"}
                             for i, r in enumerate(found)])

        def _info(self, repo_id: str, rev: str, query: dict) -> None:
            repo = self._repo_or_error(repo_id, rev, head=False)
            if repo is None:
                return
            blobs = query.get("blobs") == ["True"] or query.get("blobs") == ["true"]
            siblings = []
            for n in sorted(repo.files):
                entry = repo.sibling(n) if blobs else {"rfilename": n}
                entry["rfilename"] = hub.tamper(repo_id, n).listed_name or n
                siblings.append(entry)
            commit = hub.info_commits.get(repo_id, repo.commit)
            self._json(200, {"id": repo.repo_id, "modelId": repo.repo_id, "sha": commit, "private": False,
                             "gated": "manual" if repo.gated else False, "disabled": False, "siblings": siblings,
                             "tags": ["safetensors"], "pipeline_tag": "text-generation"})

        def _tree(self, repo_id: str, rev: str) -> None:
            repo = self._repo_or_error(repo_id, rev, head=False)
            if repo is None:
                return
            entries = []
            for name in sorted(repo.files):
                s = repo.sibling(name)
                entry = {"type": "file", "oid": s["blobId"], "size": s["size"], "path": name}
                if "lfs" in s:
                    entry["lfs"] = {"oid": s["lfs"]["sha256"], "size": s["size"], "pointerSize": 134}
                entries.append(entry)
            self._json(200, entries)

        def _resolve(self, repo_id: str, rev: str, filename: str, head: bool) -> None:
            repo = self._repo_or_error(repo_id, rev, head)
            if repo is None:
                return
            if repo.gated and not self._authorized():
                return self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must be authenticated.", head)
            tamper = hub.tamper(repo_id, filename)
            common = {"X-Repo-Commit": tamper.commit or repo.commit}
            if filename not in repo.files:
                return self._error(404, "EntryNotFound", f"{filename} does not exist on \"{rev}\"", head, common)
            data = repo.files[filename]
            etag = tamper.etag or f'"{git_blob_sha(data)}"'
            if repo.is_lfs(filename):
                sha = hashlib.sha256(data).hexdigest()
                location = f"{hub.cdn_url}/cdn/{sha}"
                return self._send(302, {**common, "Location": location, "X-Linked-Etag": tamper.etag or f'"{sha}"',
                                        "X-Linked-Size": len(data), "ETag": etag}, head=True)
            self._body(data, {**common, "ETag": etag}, (repo_id, filename), head)

        def _cdn(self, sha: str, head: bool) -> None:
            found = [(r, n) for r in hub.repos.values() for n, d in r.files.items() if hashlib.sha256(d).hexdigest() == sha]
            if not found:
                return self._send(404, head=head)
            repo, name = found[0]
            self._body(repo.files[name], {"ETag": f'"{sha}"'}, (repo.repo_id, name), head)

        def _body(self, data: bytes, headers: dict, key: tuple[str, str], head: bool) -> None:
            tamper = hub.tamper(*key)
            data = data if tamper.body is None else tamper.body
            rate = tamper.rate_bytes_per_s or hub.rate_bytes_per_s
            start = 0
            status = 200
            if not tamper.ignore_range and (m := re.match(r"bytes=(\d+)-$", self.headers.get("Range", ""))):
                start = int(m.group(1))
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
            body = data[start:]
            headers = {**headers, "Content-Length": len(body), "Accept-Ranges": "bytes"}
            drop = hub.drops.get(key)
            if head or drop is None or drop.times <= 0:
                if head or rate <= 0:
                    return self._send(status, headers, body, head)
                return self._send_slowly(status, headers, body, rate)
            drop.times -= 1
            self._send(status, headers, body[: drop.after_bytes], head=False)
            self.wfile.flush()
            self.close_connection = True

        def _send_slowly(self, status: int, headers: dict, body: bytes, rate: float) -> None:
            self._send(status, headers, head=True)  # headers only (Content-Length is the full body)
            step = int(min(64 * 1024, max(1024, rate / 10)))  # about ten writes a second
            try:
                for i in range(0, len(body), step):
                    self.wfile.write(body[i : i + step])
                    self.wfile.flush()
                    time.sleep(step / rate)
            except (BrokenPipeError, ConnectionResetError):  # the client went away (a cancel, a Ctrl+C)
                self.close_connection = True

    return Handler
