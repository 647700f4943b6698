"""Runs `localchat bench` on the demo model at a temperature with every sampled verify step's
acceptance passing through an observer first (the reference rule, speculative/kernels/sampled_pick's
sampled_accept_ref, which the CPU runs; a GPU takes it only for the cuts).

observe(p, drafts, q, to_draft, targets) gets the target's probabilities p (rows, V) and the draft
distributions q (k, Dv) over the draft's vocabulary (draft id i is target id targets[i]).
"""

from __future__ import annotations

import sys
from typing import Callable


def bench_observing_acceptance(observe: Callable, temperature: float, prompts_file: str, prompts: int,
                               new_tokens: int, device: str = "cpu") -> None:
    from speculative.eagle3 import sampled_loop

    accept = sampled_loop.sampled_accept_ref

    def observed(p, drafts, q, to_draft, targets, *rest, **kw):
        observe(p, drafts, q, to_draft, targets)
        return accept(p, drafts, q, to_draft, targets, *rest, **kw)

    sampled_loop.sampled_accept_ref = observed
    from app.cli import main as cli

    argv = sys.argv
    sys.argv = ["localchat", "bench", "--model", "demo", "--device", device, "--temperature", str(temperature),
                "--prompts-file", prompts_file, "--prompts", str(prompts), "--new-tokens", str(new_tokens),
                "--no-peer", "--json"]
    try:
        cli()
    except SystemExit:
        pass
    finally:
        sampled_loop.sampled_accept_ref = accept
        sys.argv = argv
