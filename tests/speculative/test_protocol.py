"""The Speculator protocol both speculators implement, and commit, the one place where a verify
step's accepted tokens enter the decode state."""

import ast
import inspect
import typing
from pathlib import Path

import pytest
import torch

import speculative.mtp.speculator as mtp_speculator
import speculative.eagle3.speculator as eagle3_speculator
from engine.decode import DecodeState
from engine.engine import Engine
from engine.types import SamplingParams
from speculative.build import build_speculator
from speculative.commit import commit
from speculative.mtp.speculator import MTPSpeculator
from speculative.protocol import Speculator
from speculative.eagle3.speculator import Eagle3Speculator
from tests.speculative.heads import head_tensors, write_head
from tests.speculative.mtp_layers import random_layers, write_localchat_mtp
from tests.tiny import make_tiny_model, read_config

ROOT = Path(__file__).resolve().parents[2]
PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """One tiny target with an EAGLE-3 head, and with chained MTP layers (CPU)."""
    base = tmp_path_factory.mktemp("protocol")
    target = make_tiny_model(base / "llama", "llama", num_layers=2, seed=4)
    cfg = read_config(target)
    head = write_head(base / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64,
                      (1, 2, 2))
    mtp = write_localchat_mtp(base / "mtp", cfg, random_layers(2, cfg, seed=2), chain=True)
    out = {}
    for name, draft in (("eagle3", head), ("mtp", mtp)):
        e = Engine.load(str(target), draft=str(draft), device="cpu", draft_steps=3)
        e.tokenizer.eos_token_ids = frozenset()
        out[name] = e
    return out


def test_both_speculators_implement_the_protocol(engines):
    assert isinstance(engines["eagle3"].speculator, Eagle3Speculator)
    assert isinstance(engines["mtp"].speculator, MTPSpeculator)
    for e in engines.values():
        assert isinstance(e.speculator, Speculator)
    # isinstance checks names only: the methods also take what the protocol says they take
    for cls in (Eagle3Speculator, MTPSpeculator):
        for name in ("reusable_prefix", "capture", "tokens"):
            want = inspect.signature(getattr(Speculator, name))
            got = inspect.signature(getattr(cls, name))
            assert list(got.parameters) == list(want.parameters), (cls.__name__, name)
            assert [p.default for p in got.parameters.values()] == [p.default for p in want.parameters.values()]
    assert typing.get_type_hints(build_speculator)["return"] is Speculator
    assert not isinstance(object(), Speculator)


def _commit_counts(monkeypatch) -> list[int]:
    """Counts the calls of commit from either speculator."""
    calls = []

    def counted(state, n, result):
        calls.append(n)
        return commit(state, n, result)

    monkeypatch.setattr(eagle3_speculator, "commit", counted)
    monkeypatch.setattr(mtp_speculator, "commit", counted)
    return calls


# greedy (EAGLE-3: the whole-iteration loop), sampling (EAGLE-3: SampledIteration) and a
# repetition penalty (EAGLE-3: the step-by-step loop); MTP has one loop for all three
@pytest.mark.parametrize("name", ["eagle3", "mtp"])
@pytest.mark.parametrize("params", [dict(), dict(temperature=0.8, seed=3), dict(repetition_penalty=1.3)],
                         ids=["greedy", "sampled", "penalty"])
def test_every_verify_step_goes_through_commit(engines, monkeypatch, name, params):
    e = engines[name]
    calls = _commit_counts(monkeypatch)
    prompt = e.tokenizer.apply_chat_template(PROMPT)
    gen = torch.Generator().manual_seed(3) if params else None
    state = DecodeState(tokens=list(prompt), kv_len=0, params=SamplingParams(max_tokens=30, **params), generator=gen)
    if "repetition_penalty" in params:
        state.seen = torch.zeros(e.runner.config.vocab_size, dtype=torch.bool)
        state.seen[torch.tensor(prompt)] = True
    e.speculator.reusable_prefix([], prompt)
    tokens = e.speculator.tokens(e.runner, state)
    produced = []
    for new in tokens:
        produced += new
        # only the last token is missing from the target cache, whichever step produced it
        assert len(state.tokens) == state.kv_len + 1 and state.tokens[len(prompt):] == produced
        if len(produced) >= 30:
            break
    tokens.close()
    assert len(calls) == len(state.accept_lens) > 0
    assert sum(state.accept_lens) == len(produced) - 1  # all but the prompt's own next token
    if state.seen is not None:
        assert bool(state.seen[torch.tensor(produced)].all())


def _state(tokens, kv_len, vocab=None):
    seen = None if vocab is None else torch.zeros(vocab, dtype=torch.bool)
    return DecodeState(tokens=list(tokens), kv_len=kv_len, params=SamplingParams(), generator=None, seen=seen)


def test_commit_moves_the_state_past_a_verify_step():
    # the bonus token 13 at n = 3 (the cache holds 10, 11, 12); drafts 20, 21, 22; the target took
    # 20 and 21 and chose 99 where 22 stood
    state = _state([10, 11, 12, 13], 3, vocab=128)
    assert commit(state, 3, [2, 99, 20, 21, 22]) == [20, 21, 99]
    assert state.tokens == [10, 11, 12, 13, 20, 21, 99]
    assert state.kv_len == 6  # the bonus and both accepted drafts; 99 is the next step's bonus
    assert state.accept_lens == [3]
    assert state.seen.nonzero().flatten().tolist() == [20, 21, 99]  # not 22: it was rejected

    # the next step rejects every draft; the one after takes them all (k = 3)
    assert commit(state, 6, [0, 7, 30, 31, 32]) == [7]
    assert state.tokens[-2:] == [99, 7] and state.kv_len == 7
    assert commit(state, 7, [3, 8, 40, 41, 42]) == [40, 41, 42, 8]
    assert state.tokens[-5:] == [7, 40, 41, 42, 8] and state.kv_len == 11 == len(state.tokens) - 1
    assert state.accept_lens == [3, 1, 4]
    assert state.seen.nonzero().flatten().tolist() == [7, 8, 20, 21, 40, 41, 42, 99]


def test_commit_takes_only_the_accepted_drafts_and_leaves_seen_alone_without_a_penalty():
    state = _state([5, 6], 1)
    assert commit(state, 1, [1, 4, 3]) == [3, 4]  # MTP passes d_1..d_a alone
    assert state.tokens == [5, 6, 3, 4] and state.kv_len == 3 and state.accept_lens == [2] and state.seen is None


def test_engine_imports_speculative_only_where_it_builds_a_speculator():
    importers = set()
    for path in sorted((ROOT / "engine").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else [])
            if any(n == "speculative" or n.startswith("speculative.") for n in names):
                importers.add(path.relative_to(ROOT).as_posix())
    assert importers == {"engine/build.py"}
