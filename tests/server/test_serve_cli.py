"""`localchat serve` and `--remote` on the command line: one line and status 2 for what the user can fix."""

from __future__ import annotations

import socket

from app.cli import main


def test_a_port_in_use_is_said_before_the_model_loads(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        assert main(["serve", "--port", str(port), "--model", str(tmp_path / "never-loaded")]) == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is in use" in err and "--port" in err and len(err.splitlines()) == 1


def test_listening_beyond_loopback_without_a_key_warns(tmp_path, capsys):
    assert main(["serve", "--host", "0.0.0.0", "--port", "0", "--model", str(tmp_path / "no-model")]) == 2
    err = capsys.readouterr().err
    assert "warning: listening on 0.0.0.0 without --api-key" in err and "Traceback" not in err
    assert main(["serve", "--host", "127.0.0.1", "--port", "0", "--model", str(tmp_path / "no-model")]) == 2
    assert "warning" not in capsys.readouterr().err


def test_bad_serve_and_remote_flags(capsys):
    assert main(["serve", "--port", "70000"]) == 2
    assert "--port must be from 0 to 65535" in capsys.readouterr().err
    assert main(["serve", "--api-key", " "]) == 2
    assert "--api-key is empty" in capsys.readouterr().err
    assert main(["--remote", "http://127.0.0.1:8000", "run", "hi"]) == 2
    assert "--remote is for the chat app" in capsys.readouterr().err
    assert main(["--api-key", "k"]) == 2
    assert "go with --remote URL" in capsys.readouterr().err
