"""benchmarks/harness: a forced-acceptance engine on random weights gets the kernels a real draft
gets and the accepted length it asks for, from the harness and from `localchat bench`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

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


def test_bench_reports_the_kernel_switches_it_ran_under(tmp_path, tiny_models, monkeypatch):
    """The report names the options that differ from the defaults (the LOCALCHAT_* switches), so a
    result file says what it measured; none under the defaults."""
    args = ["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
            "--force-accept", "2", "--draft-steps", "3", "--prompts", "1", "--prompt-tokens", "12",
            "--new-tokens", "5", "--no-peer", "--out"]
    assert main(args + [str(tmp_path / "default.json")]) == 0
    assert json.loads((tmp_path / "default.json").read_text())["kernel_options"] == {}
    monkeypatch.setenv("LOCALCHAT_DRAFT_ROWS", "0")
    monkeypatch.setenv("LOCALCHAT_ROW_STATS", "down")
    assert main(args + [str(tmp_path / "switched.json")]) == 0
    assert json.loads((tmp_path / "switched.json").read_text())["kernel_options"] == {"draft_rows": False,
                                                                                      "row_stats": ["down"]}


def test_bench_force_accept_past_the_verify_step_is_a_one_line_error(tiny_models, capsys):
    assert main(["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
                 "--force-accept", "5", "--draft-steps", "3"]) == 2
    assert "--force-accept must be between 1 and k + 1 = 4" in capsys.readouterr().err


def test_bench_alternates_the_no_draft_twin_with_the_draft_loaded_engine(tiny_models, monkeypatch):
    """bench's baseline is the engine without its draft, built over the same weights
    (Engine.without_draft), and the settings alternate per prompt, the order rotating."""
    import argparse

    import benchmarks.harness.run as run

    e = random_engine(str(tiny_models["llama"] / "config.json"), "cpu", 256, force_accept=2, draft_steps=3)
    settings = run.bench_settings(e, no_spec=False)
    twin = e.without_draft()
    assert [(n, eng, spec) for n, eng, spec in settings] == [("no_draft", twin, False), ("plain", e, False),
                                                              ("spec", e, True)]
    assert twin is not e and twin.speculator is None and not twin.runner.model.ops.options.batch_invariant
    assert twin.runner.model.lm_head.weight.data_ptr() == e.runner.model.lm_head.weight.data_ptr()
    assert [n for n, _, _ in run.bench_settings(e, no_spec=True)] == ["no_draft", "plain"]
    calls = []

    def timed(engine, ids, new_tokens, speculative, temperature=0.0, ignore_eos=True):
        calls.append((engine, speculative, new_tokens, ignore_eos, ids[0]))
        return {"token_ids": []}

    monkeypatch.setattr(run, "time_decode", timed)
    args = argparse.Namespace(new_tokens=9, temperature=0.0, ignore_eos=False)
    runs = run.time_settings(settings, [[0], [1], [2]], args)
    assert {n: len(r) for n, r in runs.items()} == {"no_draft": 3, "plain": 3, "spec": 3}
    warm, timed_runs = calls[0::2], calls[1::2]
    assert all(w[2] == 8 and w[3] for w in warm) and all(t[2] == 9 and not t[3] for t in timed_runs)
    assert [w[:2] for w in warm] == [t[:2] for t in timed_runs]  # each run right after its own warm-up
    nd, off, on = (twin, False), (e, False), (e, True)
    assert [(t[4], t[:2]) for t in timed_runs] == [(0, nd), (0, off), (0, on), (1, off), (1, on), (1, nd),
                                                   (2, on), (2, nd), (2, off)]


def test_summed_tok_s_weighs_answers_by_their_length():
    from benchmarks.harness.timing import summed_tok_s

    runs = [{"generated_tokens": 101, "decode_s": 1.0}, {"generated_tokens": 3, "decode_s": 0.1},
            {"generated_tokens": 1, "decode_s": 0.0}]
    assert summed_tok_s(runs) == 102 / 1.1
    assert summed_tok_s([{"generated_tokens": 1, "decode_s": 0.0}]) == 0.0


def test_force_accept_mean_gives_a_spread_with_that_mean(tmp_path, tiny_models):
    """--force-accept 3.5 (not a whole number): verify steps give 3.5 tokens on average with a real
    head's spread (each draft accepted at one rate while the run lasts), not one length."""
    from speculative.testing import draft_acceptance_rate

    rate = draft_acceptance_rate(3.5, 5)
    assert abs(sum(rate ** i for i in range(6)) - 3.5) < 1e-9 and 0.7 < rate < 0.8
    assert draft_acceptance_rate(6.0, 5) > 0.999 and draft_acceptance_rate(1.0, 5) < 1e-6
    out = tmp_path / "r.json"
    code = main(["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
                 "--force-accept", "3.5", "--draft-steps", "5", "--prompts", "1", "--prompt-tokens", "12",
                 "--new-tokens", "200", "--no-peer", "--out", str(out)])
    assert code == 0
    hist = json.loads(out.read_text())["spec"]["accept_hist"]
    steps = sum(hist)
    assert steps > 40 and sum(1 for n in hist if n) >= 4  # a spread over the lengths, not one of them
    mean = sum(n * c for n, c in enumerate(hist)) / steps
    assert 2.9 < mean < 4.1, (mean, hist)


def test_bench_chooses_runners_up_as_told_or_by_measuring(tmp_path, tiny_models, monkeypatch, capsys):
    """--runners-up on|off sets the greedy verify rows; auto (the default) times both and keeps the
    faster; on a device without the choice (the CPU's chain alone) there is nothing to report."""
    args = ["bench", "--random-weights", str(tiny_models["llama"] / "config.json"), "--device", "cpu",
            "--force-accept", "3", "--draft-steps", "3", "--prompts", "2", "--prompt-tokens", "12",
            "--new-tokens", "10", "--no-peer", "--out"]
    out = tmp_path / "r.json"
    assert main(args + [str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["runners_up"] is None and r["draft_alternatives"] is None
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", "auto")  # the GPU's shaped runners-up, and the choice, on the CPU
    for choice in ("off", "on", "auto"):
        assert main(args + [str(out), "--runners-up", choice]) == 0
        r = json.loads(out.read_text())
        kept = r["runners_up"]["kept"]
        assert kept == {"on": True, "off": False}.get(choice, kept)
        assert (r["draft_alternatives"] is not None) == kept
        assert r["spec"]["accept_len_mean"] == 3  # forced either way
        if choice == "auto":
            assert r["runners_up"]["by"] == "measured on 2 of the prompts"
            faster = r["runners_up"]["spec_runners_up_tok_s"] >= r["runners_up"]["spec_chain_tok_s"]
            assert kept == faster
        table = capsys.readouterr().out
        assert ("runners-up verified         none, the chain alone" in table) != kept


def test_bench_runners_up_takes_auto_on_or_off_in_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--runners-up", "maybe"])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--runners-up" in err and "'auto', 'on', 'off'" in err and "Traceback" not in err


def test_each_timed_answer_is_warmed_up_at_its_own_temperature(monkeypatch):
    """The uncounted warm-up runs the timed answer's setting at the same temperature: a sampled
    speculative answer captures its graph on first use, which must not fall in a timed answer."""
    from argparse import Namespace

    import benchmarks.harness.run as run

    calls = []
    monkeypatch.setattr(run, "time_decode", lambda engine, ids, n, spec, temperature=0.0, ignore_eos=True:
                        calls.append((engine, n, spec, temperature)) or {"n": n})
    settings = [("no_draft", "twin", False), ("spec", "engine", True)]
    args = Namespace(new_tokens=50, temperature=0.7, ignore_eos=False)
    runs = run.time_settings(settings, [[1, 2], [3, 4]], args)
    assert calls == [("twin", 8, False, 0.7), ("twin", 50, False, 0.7), ("engine", 8, True, 0.7),
                     ("engine", 50, True, 0.7), ("engine", 8, True, 0.7), ("engine", 50, True, 0.7),
                     ("twin", 8, False, 0.7), ("twin", 50, False, 0.7)]
    assert runs == {"no_draft": [{"n": 50}] * 2, "spec": [{"n": 50}] * 2}


@pytest.mark.parametrize("tied", [False, True])
def test_the_bandwidth_limit_counts_what_a_decode_step_reads(tmp_path, tied):
    """An untied embedding table gives a decode step one row of itself, so the limit counts that
    row, not the table (which would lower the limit by the table's size); a tied one is the
    lm_head's weight, read whole. Packed tables the same: an untied one a row, a tied one whole."""
    import torch

    from benchmarks.harness.random_packed import random_gguf
    from benchmarks.harness.limits import decode_bytes
    from engine.packed_linear import PackedEmbedding, PackedLinear
    from engine.weights.grouped import grouped_blocks

    config = json.loads((Path(__file__).parents[2] / "benchmarks/configs/smollm2-135m.json").read_text())
    config.update(num_hidden_layers=2, vocab_size=1024, tie_word_embeddings=tied)
    (tmp_path / "config.json").write_text(json.dumps(config))
    model = random_engine(str(tmp_path / "config.json"), "cpu", 64, use_graphs=False).runner.model
    every = sum(p.numel() * p.element_size() for p in model.parameters())
    table = model.model.embed_tokens.weight
    row = table.shape[1] * table.element_size()
    assert decode_bytes(model) == (every if tied else every - table.numel() * table.element_size() + row)

    gen = torch.Generator().manual_seed(0)
    packed = PackedEmbedding(grouped_blocks([random_gguf("Q8_0", 1024, 576, "cpu", gen)])[0], torch.float32)
    model.model.embed_tokens = packed
    if tied:
        model.lm_head = packed.as_linear()
    others = sum(p.numel() * p.element_size() for p in model.parameters())
    lm_head = model.lm_head.nbytes if tied else 0
    assert decode_bytes(model) == others + (lm_head if tied else packed.nbytes // 1024)
    assert isinstance(model.lm_head, PackedLinear) == tied


def test_older_reports_limits_leave_out_the_table_they_counted():
    """Reports written before decode_bytes: a bf16, AWQ or FP8 8B counted its bf16 embedding table
    (1.05 GB), a GGUF layout its packed table not at all; a report with decode_bytes is taken as
    it is, and one of an unknown model is refused."""
    from benchmarks.harness.limits import step_bytes, step_limit_tok_s

    table = 128256 * 4096 * 2
    old = {"model": "random llama-8b", "weight_bytes": 16_060_522_496, "copy_bandwidth_GBps": 4233.648819953465}
    assert step_bytes(old) == 16_060_522_496 - table + 4096 * 2
    assert step_limit_tok_s(old) == pytest.approx(282.06, abs=0.01)  # not the 263.6 the report held
    assert step_bytes(dict(old, model="random llama-8b AWQ")) == step_bytes(old)
    assert step_bytes(dict(old, model="random llama-8b Q4_K_M")) == 16_060_522_496
    assert step_bytes(dict(old, decode_bytes=123)) == 123
    with pytest.raises(ValueError, match="no decode_bytes"):
        step_bytes(dict(old, model="random Qwen2ForCausalLM"))


def test_step_limits_prints_each_files_corrected_fraction(tmp_path):
    """benchmarks/step_limits.py: a stored bf16 8B report's 94.6% becomes 88.4% of the limit from
    the bytes a step reads; a file it cannot read is one line and status 1."""
    import subprocess
    import sys

    root = Path(__file__).parents[2]
    script, stored = root / "benchmarks/step_limits.py", root / "benchmarks/results/h200_8b_plain_final_session17.json"
    run = subprocess.run([sys.executable, str(script), str(stored)], capture_output=True, text=True)
    assert run.returncode == 0 and "| 263.6 | 282.1 (15.010 GB) | 88.4% |" in run.stdout
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "none.json")], capture_output=True, text=True)
    assert bad.returncode == 1 and len(bad.stderr.strip().splitlines()) == 1


def test_split_programs_without_its_counts_is_one_line():
    """benchmarks/split_programs.py needs F and W before tree_shapes.py's arguments."""
    import subprocess
    import sys

    script = Path(__file__).parents[2] / "benchmarks/split_programs.py"
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True)
    assert run.returncode == 1 and run.stderr.strip() == "usage: python benchmarks/split_programs.py F W TREE_SHAPES_ARGS..."
