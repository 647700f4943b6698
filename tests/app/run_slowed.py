"""Runs `localchat` (the app or a subcommand, through app.cli.main) with the real engine slowed down, so
that a test can stop it mid-load or mid-answer in a real subprocess:

python tests/app/run_slowed.py --marks DIR [--step-delay S] [--phase-delay S] -- LOCALCHAT ARGS...

In the app, each load phase takes --phase-delay longer (the delay sits in the progress report, where a
load may be stopped); each streamed event takes --step-delay longer, in the app and in `run`. The delays are
spent computing in torch, as a real load or decode step would. In DIR, `progress` gets each progress
report's text as a line (before the report's delay), and `streaming` appears at the first answer text."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def busy_in_torch(seconds: float) -> None:
    """Spends `seconds` inside torch calls that release the GIL, where a real engine thread spends its time:
    a sleep would let a thread that is still running at exit end quietly, where torch aborts the process."""
    import torch

    x = torch.ones(192, 192)
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        torch.mm(x, x)


class SlowedEngine:
    """The real engine; each streamed event takes `step_delay_s` longer."""

    def __init__(self, engine, step_delay_s: float, marks: Path) -> None:
        self.engine = engine
        self.step_delay_s = step_delay_s
        self.marks = marks

    def __getattr__(self, name: str):
        return getattr(self.engine, name)

    def stream(self, *args, **kwargs):
        for event in self.engine.stream(*args, **kwargs):
            if event.text:
                (self.marks / "streaming").touch()
            yield event
            busy_in_torch(self.step_delay_s)


def slowed_progress(on_progress, phase_delay_s: float, marks: Path):
    def report(text: str, fraction):
        with open(marks / "progress", "a") as log:
            log.write(text + "\n")
        busy_in_torch(phase_delay_s)
        if on_progress is not None:
            on_progress(text, fraction)

    return report


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marks", required=True)
    parser.add_argument("--step-delay", type=float, default=0.05)
    parser.add_argument("--phase-delay", type=float, default=0.0)
    parser.add_argument("cli_args", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    marks = Path(args.marks)
    marks.mkdir(parents=True, exist_ok=True)

    from app import commands, tui
    from app.cli import main as cli_main

    real_tui_load, real_run_load = tui._load_engine, commands.load_engine

    def tui_load(model: str, **kwargs):
        load = real_tui_load(model, **kwargs)
        return lambda on_progress: SlowedEngine(load(slowed_progress(on_progress, args.phase_delay, marks)),
                                                args.step_delay, marks)

    def run_load(*load_args, **load_kwargs):
        return SlowedEngine(real_run_load(*load_args, **load_kwargs), args.step_delay, marks)

    tui._load_engine, commands.load_engine = tui_load, run_load
    rest = args.cli_args[1:] if args.cli_args[:1] == ["--"] else args.cli_args
    return cli_main(rest)


if __name__ == "__main__":
    raise SystemExit(main())
