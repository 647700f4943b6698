"""Stopping localchat in a real subprocess, with a tiny real model on CPU: Ctrl+Q, SIGINT and SIGTERM while
the model loads or an answer streams, in the app (in a tmux pane) and in `run`. Each test starts a process
that imports torch and loads a model: seconds each, hence `slow` (tests/app/test_stop_signals.py covers the
same pieces in process, fast)."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.settings import Settings, save_settings
from tests.app.terminal import HAVE_TMUX, Terminal
from tests.tiny import make_tiny_model

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = ROOT / "tests" / "app" / "run_slowed.py"
PROMPT = "Numbers: 0 1 2 3"  # the tiny model answers it greedily up to max_tokens, with no EOS
MAX_TOKENS = 400
DRAWN = "Enter sends"  # in the message box's placeholder: the app is on screen


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "llama", "llama")


@pytest.fixture
def home(tmp_path: Path) -> Path:
    root = tmp_path / "home"
    save_settings(root / "config" / "settings.toml", Settings(max_tokens=MAX_TOKENS))
    return root


def _env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEXTUAL", "PYTEST"))}
    env.update(LOCALCHAT_HOME=str(home), TOKENIZERS_PARALLELISM="false", PYTHONPATH=str(ROOT))
    return env


def _launch(marks: Path, *cli_args: str, phase_delay: float = 0.0) -> list[str]:
    return [sys.executable, str(LAUNCHER), "--marks", str(marks), "--step-delay", "0.05",
            "--phase-delay", str(phase_delay), "--", *cli_args]


needs_tmux = pytest.mark.skipif(not HAVE_TMUX, reason="needs tmux")


def _start_app(home: Path, marks: Path, model: Path, phase_delay: float = 0.0) -> Terminal:
    term = Terminal(_launch(marks, "--model", str(model), "--device", "cpu", phase_delay=phase_delay),
                    _env(home), ROOT)
    term.wait_until(lambda: DRAWN in term.screen(), 60, "the app to draw its message box")
    return term


def _ask_and_wait_for_text(term: Terminal, marks: Path) -> None:
    term.type_text(PROMPT)
    term.wait_until(lambda: PROMPT in term.screen(), 30, "the prompt to show in the message box")
    term.press("Enter")
    term.wait_until((marks / "streaming").exists, 60, "the answer to start")


def _assert_clean_exit(term: Terminal) -> None:
    code = term.wait_exit(30)
    shown = term.history()
    assert "terminate called" not in shown and "Traceback" not in shown, shown[-3000:]
    assert code == 0, shown[-3000:]
    assert not term.on_alternate_screen, "the terminal was left on the app's screen"
    assert DRAWN not in term.screen()


def _saved_answer(home: Path):
    with sqlite3.connect(home / "data" / "chats.db") as db:
        rows = db.execute("SELECT role, content, finish_reason, stats_json FROM messages ORDER BY id").fetchall()
    assert [r[0] for r in rows] == ["user", "assistant"], rows
    assert rows[0][1] == PROMPT
    return rows[1]


def _assert_partial_answer_saved(home: Path) -> None:
    _, content, finish_reason, stats_json = _saved_answer(home)
    assert content and finish_reason == "cancelled"
    assert 0 < json.loads(stats_json)["generated_tokens"] < MAX_TOKENS


@needs_tmux
@pytest.mark.parametrize("stop", ["ctrl+q", "sigint", "sigterm"])
def test_app_stops_mid_answer_and_saves_it(home, tiny_model, tmp_path, stop):
    marks = tmp_path / "marks"
    term = _start_app(home, marks, tiny_model)
    try:
        _ask_and_wait_for_text(term, marks)
        if stop == "ctrl+q":
            term.press("C-q")
        else:
            term.signal(signal.SIGINT if stop == "sigint" else signal.SIGTERM)
        _assert_clean_exit(term)
    finally:
        term.close()
    _assert_partial_answer_saved(home)


@needs_tmux
def test_app_quits_mid_load_at_the_next_load_phase(home, tiny_model, tmp_path):
    marks = tmp_path / "marks"
    term = _start_app(home, marks, tiny_model, phase_delay=1.5)
    try:
        term.wait_until((marks / "progress").exists, 30, "the load to begin")
        term.press("C-q")
        _assert_clean_exit(term)
    finally:
        term.close()
    phases = (marks / "progress").read_text().splitlines()
    assert phases and "ready" not in phases, phases  # stopped between phases, not loaded to the end


@needs_tmux
def test_app_quits_while_torch_is_imported(home, tiny_model, tmp_path):
    """The quit that used to abort most often: the engine thread still inside its first torch calls."""
    term = _start_app(home, tmp_path / "marks", tiny_model)
    try:
        term.press("C-q")
        _assert_clean_exit(term)
    finally:
        term.close()


def _start_run(home: Path, marks: Path, model: Path, *extra: str) -> subprocess.Popen:
    argv = _launch(marks, "run", "--model", str(model), "--device", "cpu", "--max-tokens", str(MAX_TOKENS),
                   *extra, PROMPT)
    return subprocess.Popen(argv, env=_env(home), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _stop_run_mid_answer(proc: subprocess.Popen, marks: Path, signum: int) -> tuple[int, str, str]:
    try:
        deadline = time.monotonic() + 60
        while not (marks / "streaming").exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline, "the answer did not start"
            time.sleep(0.05)
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=30)
        return proc.returncode, out, err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


@pytest.mark.parametrize("signum, status, said", [(signal.SIGINT, 130, "interrupted"),
                                                  (signal.SIGTERM, 143, "terminated")])
def test_run_prints_the_partial_answer_when_stopped(home, tiny_model, tmp_path, signum, status, said):
    marks = tmp_path / "marks"
    code, out, err = _stop_run_mid_answer(_start_run(home, marks, tiny_model), marks, signum)
    assert code == status, err
    assert "Traceback" not in err and "terminate called" not in err, err
    assert out.strip() and out.endswith("\n")  # the text so far, and the shell prompt on a line of its own
    *_, stats_line, last_line = err.rstrip().splitlines()
    assert last_line == f"localchat: {said}", err
    assert stats_line.startswith("[") and " tokens, " in stats_line and stats_line.endswith(", interrupted]"), err


def test_run_json_reports_the_partial_answer_when_stopped(home, tiny_model, tmp_path):
    marks = tmp_path / "marks"
    code, out, err = _stop_run_mid_answer(_start_run(home, marks, tiny_model, "--json"), marks, signal.SIGTERM)
    assert code == 143, err
    result = json.loads(out)
    assert result["finish_reason"] == "interrupted" and result["text"]
    assert 0 < result["stats"]["generated_tokens"] == len(result["token_ids"]) < MAX_TOKENS
