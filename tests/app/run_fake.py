"""Runs the chat UI against the fake engine, for smoke runs in a real terminal:
python tests/app/run_fake.py [--home DIR] [--fixed-stats] [--load-delay S] [--fail-load]."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from app.tui import LocalChatApp  # noqa: E402
from tests.app.fake_engine import fake_factory  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--home", default=None)
    parser.add_argument("--fixed-stats", action="store_true")
    parser.add_argument("--load-delay", type=float, default=1.5)
    parser.add_argument("--step-delay", type=float, default=0.03)
    parser.add_argument("--fail-load", action="store_true", help="make loading fail, to see the message")
    args = parser.parse_args()
    fail = RuntimeError("CUDA out of memory. Tried to allocate 16.00 GiB") if args.fail_load else None
    factory = fake_factory(load_delay_s=args.load_delay, fixed_stats=args.fixed_stats,
                           step_delay_s=args.step_delay, fail_load=fail)
    app = LocalChatApp(factory, model="fake-model", home=args.home)
    app.run()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
