"""Whether speculation is the default (Engine.speculation_pays, engine/spec_pays.py): a GPU or CPU
measures speculation against plain decoding without the draft once per model, draft, device and
settings (a CPU more briefly, and asking for a margin), and reads the verdict from the cache after
that; LOCALCHAT_CPU_SPEC=off keeps a CPU from measuring."""

from __future__ import annotations

import json

import pytest

from engine import spec_pays
from engine.engine import Engine
from engine.options import KernelOptions


class FakeEngine:
    model_name, draft_name, device = "m", "d", "cuda:0"

    def __init__(self):
        self._no_draft = None
        self.dropped = 0

    @property
    def has_twin(self):
        return self._no_draft is not None

    def drop_twin(self):
        self.dropped += 1


def measured(ratio, baseline="no draft", built_twin=False):
    calls = []

    def measurer(engine, prompts=None, tokens=None):
        calls.append((engine, prompts, tokens))
        return {"spec": 100.0 * ratio, "plain": 100.0, "baseline": baseline, "ratio": ratio, "built_twin": built_twin}

    return measurer, calls


def test_a_draft_that_loses_is_off_with_its_figure_and_measured_once(tmp_path):
    cache, engine, logs = tmp_path / "c.json", FakeEngine(), []
    measurer, calls = measured(0.6, built_twin=True)
    got = spec_pays.verdict(engine, "k=2", cache, logs.append, measurer)
    assert got == (False, "slower on this GPU (0.60x of no draft)")
    # the twin built for this stays: plain decoding, the default now, runs on it
    assert len(calls) == 1 and len(logs) == 1 and engine.dropped == 0
    again = spec_pays.verdict(FakeEngine(), "k=2", cache, logs.append, measurer)
    assert again == got and len(calls) == 1 and len(logs) == 1  # read from the cache
    spec_pays.verdict(FakeEngine(), "k=5", cache, None, measurer)  # other settings: measured apart
    assert len(calls) == 2
    entries = json.loads(cache.read_text())
    assert len(entries) == 2 and all("built_twin" not in e for e in entries.values())


def test_a_draft_that_gains_stays_on(tmp_path):
    measurer, _ = measured(1.5, built_twin=True)
    engine = FakeEngine()
    assert spec_pays.verdict(engine, "k=5", tmp_path / "c.json", None, measurer) == (True, "")
    assert engine.dropped == 1  # a twin built only for this goes again
    measurer, _ = measured(0.9, baseline="draft loaded")
    assert spec_pays.verdict(FakeEngine(), "k=7", tmp_path / "c.json", None, measurer) == \
        (False, "slower on this GPU (0.90x of draft loaded)")


@pytest.mark.parametrize("text", ["not json", "[1, 2]", '{"KEY": {"ratio": "fast"}}'])
def test_a_damaged_cache_is_measured_again(tmp_path, text):
    cache = tmp_path / "c.json"
    cache.write_text(text.replace("KEY", spec_pays.cache_key(FakeEngine(), "k=5")))
    measurer, calls = measured(0.5)
    assert spec_pays.verdict(FakeEngine(), "k=5", cache, None, measurer)[0] is False and len(calls) == 1


def test_an_unwritable_cache_or_a_failed_measurement_costs_nothing_else(tmp_path):
    blocked = tmp_path / "file"
    blocked.write_text("")
    measurer, calls = measured(0.5)
    assert spec_pays.verdict(FakeEngine(), "k=5", blocked / "c.json", None, measurer)[0] is False

    def failing(engine):
        raise RuntimeError("CUDA out of memory")

    assert spec_pays.verdict(FakeEngine(), "k=5", tmp_path / "c.json", None, failing) == (True, "")
    assert not (tmp_path / "c.json").exists()  # nothing cached: measured again next time


def test_sampled_answers_have_a_verdict_of_their_own(tmp_path):
    """A draft that pays greedily and loses at a temperature: on for greedy answers, off for sampled
    ones with the reason; the twin built for the measurement stays (plain decoding is a default)."""
    def measurer(engine, prompts=None, tokens=None):
        return {"spec": 150.0, "plain": 100.0, "baseline": "no draft", "ratio": 1.5, "built_twin": True,
                "sampled_spec": 90.0, "sampled_plain": 100.0, "sampled_ratio": 0.9}

    engine, cache = FakeEngine(), tmp_path / "c.json"
    assert spec_pays.verdict(engine, "k=5", cache, None, measurer) == (True, "")
    assert engine.dropped == 0  # kept: sampled answers decode on it
    assert spec_pays.verdict(engine, "k=5", cache, None, measurer, sampled=True) == \
        (False, "slower at temperature 0.7 on this GPU (0.90x of no draft)")
    # a measurement without sampled figures (a CPU's): the greedy verdict for both
    cpu_like, _ = measured(0.8)
    assert spec_pays.verdict(FakeEngine(), "k=6", cache, None, cpu_like, sampled=True) == \
        (False, "slower on this GPU (0.80x of no draft)")
    both_pay = lambda e, prompts=None, tokens=None: {**measurer(e), "sampled_ratio": 1.2}  # noqa: E731
    twin_goes = FakeEngine()
    assert spec_pays.verdict(twin_goes, "k=7", cache, None, both_pay, sampled=True) == (True, "")
    assert twin_goes.dropped == 1


def test_measure_alternates_and_divides_by_the_twin():
    engine, twin = FakeEngine(), object()

    def without_draft(if_fits=False):
        assert if_fits
        engine._no_draft = twin
        return twin

    engine.without_draft = without_draft
    order = []

    def timer(eng, prompt, speculative, tokens, temperature=0.0):
        order.append(("spec" if speculative else "plain", eng is twin, tokens, temperature))
        if temperature:  # sampled: speculation slower than plain decoding
            return (tokens - 1, 0.025 if speculative else 0.02)
        return (tokens - 1, 0.01 if speculative else 0.02)  # greedy: speculation twice as fast

    got = spec_pays.measure(engine, prompts=("a", "b", "c"), tokens=33, timer=timer)
    assert got["ratio"] == pytest.approx(2.0) and got["baseline"] == "no draft" and got["built_twin"]
    greedy = [o for o in order if o[3] == 0.0]
    # a GPU's warm-ups: every prompt, as long as the answers (the timed answers meet no new length)
    assert greedy[:6] == [("spec", False, 33, 0.0)] * 3 + [("plain", True, 33, 0.0)] * 3
    assert [o[0] for o in greedy[6:]] == ["spec", "plain", "plain", "spec", "spec", "plain"]
    assert all(o[1] for o in order if o[0] == "plain")  # plain decoding on the twin, never with the draft
    # a GPU times sampled answers the same way, after the greedy ones
    assert order[len(greedy):] == [(o[0], o[1], o[2], spec_pays.SAMPLED_TEMPERATURE) for o in greedy]
    assert got["sampled_ratio"] == pytest.approx(0.8) and got["sampled_plain"] == pytest.approx(1600.0)
    again = spec_pays.measure(engine, prompts=("a",), tokens=9, timer=timer)  # a twin already there stays
    assert again["baseline"] == "no draft" and not again["built_twin"]
    engine.device = "cpu"  # no kernels compiled for longer contexts: short warm-ups; greedy alone
    order.clear()
    got = spec_pays.measure(engine, prompts=("a",), tokens=9, timer=timer)
    assert [o[2] for o in order] == [8, 8, 9, 9] and "sampled_ratio" not in got


def test_without_room_for_a_twin_plain_decoding_keeps_the_draft_loaded():
    engine = FakeEngine()
    engine.without_draft = lambda if_fits=False: None
    seen = []

    def timer(eng, prompt, speculative, tokens):
        seen.append((eng is engine, speculative))
        return (10, 0.1)

    got = spec_pays.measure(engine, prompts=("a",), tokens=11, timer=timer, sampled=False)
    assert got["baseline"] == "draft loaded" and not got["built_twin"] and set(seen) == {(True, True), (True, False)}


def test_a_cpu_measures_briefly_and_asks_for_a_margin(tmp_path, monkeypatch):
    engine = FakeEngine()
    engine.device = "cpu"
    logs = []
    measurer, calls = measured(1.05)
    got = spec_pays.verdict(engine, "k=5", tmp_path / "c.json", logs.append, measurer)
    assert got == (False, "not clearly faster on this CPU (1.05x of no draft)")
    assert calls[0][1:] == (spec_pays.CPU_PROMPTS, spec_pays.CPU_TOKENS) and "on this CPU" in logs[0]
    measurer, _ = measured(0.8)
    assert spec_pays.verdict(engine, "k=6", tmp_path / "c.json", None, measurer) == \
        (False, "slower on this CPU (0.80x of no draft)")
    measurer, _ = measured(spec_pays.CPU_PAYS_FROM)
    assert spec_pays.verdict(engine, "k=7", tmp_path / "c.json", None, measurer) == (True, "")

    def fails(*a):
        raise RuntimeError("out of memory")

    assert spec_pays.verdict(engine, "k=8", tmp_path / "c.json", None, fails) == (False, "not measured on this CPU")
    # the verdict is this processor's at this thread count: another count measures again
    key = spec_pays.cache_key(engine, "k=7")
    assert spec_pays.cpu_name() in key and "x" in key.split("|")[2]
    import torch

    monkeypatch.setattr(torch, "get_num_threads", lambda: 97)
    assert spec_pays.cache_key(engine, "k=7") != key and "x97" in spec_pays.cache_key(engine, "k=7")


def test_the_cpu_setting_is_checked(monkeypatch):
    from engine.options import cpu_spec_setting
    from engine.errors import UserError

    for value, want in (("", "measure"), ("Measure", "measure"), (" off ", "off")):
        monkeypatch.setenv("LOCALCHAT_CPU_SPEC", value)
        assert cpu_spec_setting() == want
    monkeypatch.setenv("LOCALCHAT_CPU_SPEC", "sometimes")
    with pytest.raises(UserError, match="LOCALCHAT_CPU_SPEC='sometimes': use measure or off"):
        cpu_spec_setting()


def test_a_bad_cpu_setting_stops_the_load_in_one_line(tiny_models):
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "app.cli", "run", "--model", str(tiny_models["llama"]), "--device",
                          "cpu", "--max-tokens", "4", "hello"], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "LOCALCHAT_CPU_SPEC": "sometimes"})
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.strip().splitlines()[-1].endswith("LOCALCHAT_CPU_SPEC='sometimes': use measure or off")
    assert "Traceback" not in out.stderr


def test_a_cpu_engine_measures_unless_told_not_to_and_a_real_measurement_runs(tiny_models, tmp_path, monkeypatch):
    """LOCALCHAT_CPU_SPEC=off: the rule, not a measurement; otherwise a CPU engine measures at
    its first question (here a stand-in measurer); measure() itself runs a tiny engine's real
    answers and lets a twin it built go."""
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
    def load():
        return Engine.load(str(tiny_models["llama"]), draft=str(head), device="cpu", options=KernelOptions(spec_alts=1))

    monkeypatch.setattr(spec_pays, "measure", lambda *a: pytest.fail("measured on a CPU"))
    monkeypatch.setenv("LOCALCHAT_CPU_SPEC", "off")
    assert load().speculation_pays() == (False, Engine.CPU_SPEC_REASON)
    monkeypatch.setenv("LOCALCHAT_CPU_SPEC", "measure")
    monkeypatch.setenv("LOCALCHAT_HOME", str(tmp_path / "home"))  # an empty cache
    engine = load()
    seen = []
    monkeypatch.setattr(spec_pays, "measure", lambda e, prompts, tokens: seen.append(tokens) or
                        {"spec": 50.0, "plain": 40.0, "baseline": "no draft", "ratio": 1.25})
    assert engine.speculation_pays() == (True, "") and seen == [spec_pays.CPU_TOKENS]
    assert engine.speculation_pays() == (True, "") and len(seen) == 1  # kept on the engine
    monkeypatch.undo()
    got = spec_pays.measure(engine, prompts=("Paris is", "Numbers: 1 2 3"), tokens=12)
    assert got["spec"] > 0 and got["plain"] > 0 and got["baseline"] == "no draft" and got["built_twin"]
    engine.drop_twin()
    assert not engine.has_twin


class Choosing:
    """A speculator whose greedy chains may verify runners-up or not (an EAGLE-3 head on a GPU)."""
    runners_up_choice, tree = True, None

    def __init__(self):
        self.runners_up = True

    def use_runners_up(self, on):
        self.runners_up = on


@pytest.mark.parametrize("chain_faster", [True, False])
def test_measure_times_the_chain_alone_too_and_keeps_the_faster(tmp_path, chain_faster):
    engine, twin = FakeEngine(), object()
    engine.speculator = Choosing()
    engine.without_draft = lambda if_fits=False: twin
    order = []

    def timer(eng, prompt, speculative, tokens):
        name = "plain" if not speculative else "runners-up" if engine.speculator.runners_up else "chain"
        order.append(name)
        fast = "chain" if chain_faster else "runners-up"
        return tokens - 1, {"plain": 0.04, fast: 0.01}.get(name, 0.02)

    got = spec_pays.measure(engine, prompts=("a", "b", "c"), tokens=33, timer=timer, sampled=False)
    assert order[:9] == ["runners-up"] * 3 + ["plain"] * 3 + ["chain"] * 3  # warm-ups, every prompt
    assert order[9:] == ["runners-up", "plain", "chain", "plain", "chain", "runners-up",
                         "chain", "runners-up", "plain"]
    assert got["runners_up"] is not chain_faster and engine.speculator.runners_up is not chain_faster
    assert got["spec"] == pytest.approx(3200.0) and got["ratio"] == pytest.approx(4.0)
    assert sorted([got["spec_chain"], got["spec_runners_up"]]) == pytest.approx([1600.0, 3200.0])
    # the verdict keeps the choice, and a later load reads it from the cache
    measurer = lambda e, prompts=None, tokens=None: dict(got)  # noqa: E731
    cache = tmp_path / "c.json"
    first = FakeEngine()
    first.speculator = Choosing()
    assert spec_pays.verdict(first, "k=5", cache, None, measurer) == (True, "")
    later = FakeEngine()
    later.speculator = Choosing()
    assert spec_pays.verdict(later, "k=5", cache, None, lambda *a: pytest.fail("measured again")) == (True, "")
    assert later.speculator.runners_up is not chain_faster


def test_a_tree_or_counts_set_by_hand_leave_no_choice():
    engine = FakeEngine()
    assert not spec_pays.chooses_runners_up(engine)  # no draft
    engine.speculator = Choosing()
    assert spec_pays.chooses_runners_up(engine)
    engine.speculator.tree = "3,3,12"
    assert not spec_pays.chooses_runners_up(engine)
    engine.speculator.tree, engine.speculator.runners_up_choice = None, False
    assert not spec_pays.chooses_runners_up(engine)


def test_a_real_measurement_chooses_and_either_choice_answers_as_plain_decoding(tiny_models, tmp_path):
    """An EAGLE-3 head with the shaped runners-up (a GPU's default; LOCALCHAT_SPEC_ALTS=auto here):
    measure() times it with and without them and leaves the faster in use; greedy answers are
    plain decoding's tokens either way."""
    from engine.types import SamplingParams
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
    engine = Engine.load(str(tiny_models["llama"]), draft=str(head), device="cpu", options=KernelOptions(spec_alts="auto"))
    assert spec_pays.chooses_runners_up(engine)
    got = spec_pays.measure(engine, prompts=("Paris is", "Numbers: 1 2 3"), tokens=12)
    assert got["runners_up"] is engine.speculator.runners_up
    assert got["spec"] == max(got["spec_chain"], got["spec_runners_up"]) > 0
    ids = list(range(3, 30))
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    answers = []
    for on in (True, False, None):
        if on is not None:
            engine.speculator.use_runners_up(on)
        engine.reset()
        answers.append([t for ev in engine.stream_ids(ids, params, speculative=on is not None) for t in ev.token_ids])
    assert answers[0] == answers[1] == answers[2] and len(answers[0]) == 40
