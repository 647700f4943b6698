"""How much a `localchat bench` run measures; light, so that the command line's help can name it."""

from __future__ import annotations

# The full run, and --quick's first look (a count given explicitly wins).
FULL_BENCH = {"prompts": 4, "new_tokens": 256, "prompt_tokens": 512}
QUICK_BENCH = {"prompts": 1, "new_tokens": 64, "prompt_tokens": 128}


def apply_counts(args) -> None:
    """Fills the counts not given on the command line from --quick's or the full run's."""
    counts = QUICK_BENCH if getattr(args, "quick", False) else FULL_BENCH
    for name, value in counts.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
