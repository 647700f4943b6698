"""The pieces of a clean shutdown, in process: stop signals as KeyboardInterrupt or as a quit on the app's
loop, and the engine thread stopping mid-load and mid-answer and being joined."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time

import pytest

from app import stop_signals, tui
from app.engine_worker import EngineWorker
from app.settings import Settings
from app.stop_signals import Terminated, exit_status, interrupt_on_stop_signals, quit_on_stop_signals
from tests.app.fake_engine import FakeEngine, answer_for, fake_factory, split_tokens
from tests.app.test_streaming import MESSAGES, Inbox


def _wait_for_signal() -> None:
    """Gives a signal sent to this process the moment it needs to run its handler."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        time.sleep(0.01)
    raise AssertionError("the signal did not arrive")


@pytest.mark.parametrize("signum, kind, status", [(signal.SIGTERM, Terminated, 143),
                                                  (signal.SIGINT, KeyboardInterrupt, 130)])
def test_outside_the_app_a_stop_signal_interrupts_the_main_thread(signum, kind, status):
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    with pytest.raises(kind) as stopped:
        with interrupt_on_stop_signals():
            signal.raise_signal(signum)
            _wait_for_signal()
    assert type(stopped.value) is kind and exit_status(stopped.value) == status
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def test_a_signal_repeated_at_once_is_the_same_stop(monkeypatch):
    """GNU timeout signals the process and then its group: the second must not break off the cleanup."""
    cleaned = False
    with pytest.raises(Terminated):
        with interrupt_on_stop_signals():
            try:
                signal.raise_signal(signal.SIGTERM)
                _wait_for_signal()
            finally:
                signal.raise_signal(signal.SIGTERM)
                time.sleep(0.05)
                cleaned = True
    assert cleaned


def test_a_later_signal_stops_the_cleanup_too(monkeypatch):
    monkeypatch.setattr(stop_signals, "REPEAT_S", 0.0)
    with pytest.raises(Terminated):
        with interrupt_on_stop_signals():
            try:
                signal.raise_signal(signal.SIGTERM)
                _wait_for_signal()
            finally:
                signal.raise_signal(signal.SIGTERM)
                _wait_for_signal()


def test_an_ignored_sigint_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with interrupt_on_stop_signals():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            signal.raise_signal(signal.SIGINT)
            time.sleep(0.05)
    finally:
        signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_in_the_app_a_stop_signal_asks_its_loop_to_quit(signum):
    quit_asked = []

    async def app() -> str:
        loop = asyncio.get_running_loop()
        done = loop.create_future()

        def quit() -> None:
            quit_asked.append(threading.current_thread() is threading.main_thread())
            done.set_result("quit")

        with quit_on_stop_signals(quit):
            signal.raise_signal(signum)
            time.sleep(0.05)  # code the signal interrupts goes on undisturbed
            return await asyncio.wait_for(done, 5)

    assert asyncio.run(app()) == "quit" and quit_asked == [True]


def test_with_no_loop_running_the_app_handler_interrupts():
    with pytest.raises(Terminated):
        with quit_on_stop_signals(lambda: None):
            signal.raise_signal(signal.SIGTERM)
            _wait_for_signal()


def test_shutdown_mid_load_stops_at_the_next_phase_and_the_thread_ends():
    inbox = Inbox()
    runner = EngineWorker(fake_factory(load_delay_s=2.0))  # four phases of 0.5 s
    runner.start(inbox)
    inbox.wait_for(EngineWorker.LoadProgress)
    runner.shutdown()
    assert runner.join(5)
    assert runner.engine is None and not runner.factory.made  # stopped at a phase: no engine was built
    assert not inbox.of(EngineWorker.Loaded) and not inbox.of(EngineWorker.LoadFailed)


def test_shutdown_mid_answer_stops_it_and_the_thread_ends():
    inbox = Inbox()
    runner = EngineWorker(fake_factory(step_delay_s=0.05))
    runner.start(inbox)
    inbox.wait_for(EngineWorker.Loaded)
    runner.generate(inbox, MESSAGES, Settings(), speculative=False)
    started = inbox.wait_for(EngineWorker.Started)
    queued = runner.generate(inbox, MESSAGES, Settings(), speculative=False)
    runner.shutdown()
    assert runner.join(5)
    finished = {m.job_id: m for m in inbox.of(EngineWorker.Finished)}
    assert finished[started.job_id].finish_reason == "cancelled" and finished[queued].finish_reason == "cancelled"
    assert runner.factory.made[-1].calls[-1]["messages"] == MESSAGES and len(runner.factory.made[-1].calls) == 1


def test_join_before_start_is_immediate():
    assert EngineWorker(fake_factory()).join(0)


def test_a_quit_that_waits_for_the_engine_says_so(monkeypatch, capsys):
    monkeypatch.setattr(tui, "STOP_NOTICE_S", 0.05)
    inbox = Inbox()
    runner = EngineWorker(fake_factory(load_delay_s=2.0))
    runner.start(inbox)
    inbox.wait_for(EngineWorker.LoadProgress)
    tui._stop_engine(runner, 0)
    assert runner.join(0)
    assert "localchat: stopping…" in capsys.readouterr().err


def test_an_engine_that_never_stops_is_left_behind_with_a_message(monkeypatch, capsys):
    monkeypatch.setattr(tui, "STOP_NOTICE_S", 0.01)
    monkeypatch.setattr(tui, "STOP_WAIT_S", 0.1)
    exits: list[int] = []
    monkeypatch.setattr(tui, "_exit_now", exits.append)
    stuck = threading.Event()
    runner = EngineWorker(lambda on_progress: stuck.wait(10))  # a load phase that does not end
    runner.start(Inbox())
    try:
        tui._stop_engine(runner, 0)
        assert exits == [0] and "did not stop" in capsys.readouterr().err
    finally:
        stuck.set()
        assert runner.join(5)


class _StoppedMidAnswer(FakeEngine):
    """Streams three events, then the user's Ctrl+C (or SIGTERM) lands."""

    def __init__(self, stop: KeyboardInterrupt) -> None:
        super().__init__(draft_name=None, step_delay_s=0.0)
        self.stop = stop

    def stream(self, *args, **kwargs):
        for i, event in enumerate(super().stream(*args, **kwargs)):
            if i == 3:
                raise self.stop
            yield event


@pytest.mark.parametrize("stop, status, said", [(KeyboardInterrupt(), 130, "interrupted"),
                                                (Terminated(), 143, "terminated")])
@pytest.mark.parametrize("as_json", [False, True])
def test_run_stopped_mid_answer_prints_what_it_has(home, monkeypatch, capsys, stop, status, said, as_json):
    from app import commands
    from app.cli import main

    monkeypatch.setattr(commands, "load_engine", lambda *args, **kwargs: _StoppedMidAnswer(stop))
    assert main(["run", "--model", "fake", *(["--json"] if as_json else []), "hi"]) == status
    out, err = capsys.readouterr()
    assert err.splitlines()[-1] == f"localchat: {said}" and "Traceback" not in err
    expected = "".join(split_tokens(answer_for([{"role": "user", "content": "hi"}]))[:3])
    if as_json:
        result = json.loads(out)
        assert result["text"] == expected and result["finish_reason"] == "interrupted"
        assert result["stats"]["generated_tokens"] == len(result["token_ids"]) == 3
    else:
        assert out == expected + "\n"
        assert err.splitlines()[-2].startswith("[3 tokens") and err.splitlines()[-2].endswith(", interrupted]")
