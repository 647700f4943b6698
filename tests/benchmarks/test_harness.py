"""benchmarks/harness: a forced-acceptance engine on random weights gets the kernels a real draft
gets and the accepted length it asks for, from the harness and from `localchat bench`."""

from __future__ import annotations

import json

from app.cli import main
from benchmarks.harness.shapes import random_engine
from benchmarks.harness.timing import time_decode
from speculative.build import draft_ops
from speculative.testing import ForcedEagle3Speculator


def test_forced_acceptance_engine_has_a_real_drafts_kernels(tiny_models):
    e = random_engine(str(tiny_models["llama"] / "config.json"), "cpu", 256, force_accept=3, draft_steps=3)
    assert isinstance(e.speculator, ForcedEagle3Speculator) and e.speculator.k == 3
    assert e.runner.model.ops.options.batch_invariant
    assert e.speculator.draft.ops.options == draft_ops(e.runner).options
    run = time_decode(e, list(range(3, 30)), 13, speculative=True)
    assert run["generated_tokens"] == 13 and run["accept_len_mean"] == 3 and run["accept_hist"] == [0, 0, 0, 4]
    plain = random_engine(str(tiny_models["llama"] / "config.json"), "cpu", 256)
    assert plain.speculator is None and not plain.runner.model.ops.options.batch_invariant


def test_bench_force_accept_reports_that_length(tmp_path, tiny_models):
    out = tmp_path / "r.json"
    code = main(["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
                 "--force-accept", "2", "--draft-steps", "3", "--prompts", "1", "--prompt-tokens", "12",
                 "--new-tokens", "9", "--no-peer", "--out", str(out)])
    assert code == 0
    r = json.loads(out.read_text())
    assert r["draft"] == "random EAGLE-3 head (forced acceptance)" and r["spec"]["accept_len_mean"] == 2
    assert r["spec"]["accept_hist"] == [0, 0, 4, 0, 0]


def test_bench_force_accept_past_the_verify_step_is_a_one_line_error(tiny_models, capsys):
    assert main(["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
                 "--force-accept", "5", "--draft-steps", "3"]) == 2
    assert "--force-accept must be between 1 and k + 1 = 4" in capsys.readouterr().err
