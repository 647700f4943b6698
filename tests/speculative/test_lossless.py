"""Speculation is lossless: greedy output equals plain decoding for every draft format and mode."""

import pytest
import torch

from engine.engine import Engine
from engine.errors import ModelLoadError
from engine.types import SamplingParams
from tests.speculative.heads import head_tensors, markov_target, write_head
from tests.tiny import make_tiny_model, read_config

PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    base = tmp_path_factory.mktemp("spec_targets")
    return {arch: make_tiny_model(base / arch, arch, num_layers=4, seed=3) for arch in ("llama", "qwen3")}


def _run(engine, speculative, n=128, **kw):
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    events = list(engine.stream_ids(ids, SamplingParams(max_tokens=n, **kw), speculative=speculative))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


def _engine(target, head, k):
    e = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=k)
    e.tokenizer.eos_token_ids = frozenset()
    return e


CASES = [  # (format, use_aux, draft hidden, draft vocab, aux input-of-layer ids)
    ("eagle", True, 64, 384, None),
    ("sglang", True, 64, 200, (1, 2, 4)),
    ("sglang", False, 64, 384, None),
    ("speculators", True, 48, 160, (0, 2, 3)),  # narrower than the target: own embeddings
    ("speculators", False, 32, 100, None),
]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("fmt,use_aux,hidden,draft_vocab,aux_ids", CASES)
@pytest.mark.parametrize("alts", ["0", "2", "auto"])
def test_greedy_speculation_equals_plain(tmp_path, targets, monkeypatch, arch, fmt, use_aux, hidden, draft_vocab,
                                         aux_ids, alts):
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", alts)  # the plain chain, and two alternatives a draft
    cfg = read_config(targets[arch])
    t = head_tensors(hidden, cfg["hidden_size"], 3, cfg["vocab_size"], draft_vocab, use_aux=use_aux, seed=1)
    head = write_head(tmp_path / "head", cfg, fmt, t, hidden, aux_ids, use_aux=use_aux)
    plain = None  # plain decoding does not read k: decoded once, by the first engine
    for k in (1, 3, 5):
        e = _engine(targets[arch], head, k)
        if plain is None:
            plain, _ = _run(e, False)
        spec, stats = _run(e, True)
        assert spec == plain, (fmt, k)
        assert stats.speculative and stats.verify_steps > 0 and stats.draft_steps == k
        assert 1.0 <= stats.accept_len_mean <= k + 1


def _constant_draft(tmp_path, cfg, token: int):
    """A head whose logits are all equal, so it always proposes draft id 0 -> `token`."""
    t = head_tensors(64, 64, 3, cfg["vocab_size"], 16, seed=2)
    t["lm_head.weight"] = torch.zeros_like(t["lm_head.weight"])
    t["d2t"] = torch.zeros(16, dtype=torch.long)
    t["d2t"][0] = token
    return write_head(tmp_path / f"const{token}", cfg, "sglang", t, 64, (1, 2, 3))


@pytest.mark.parametrize("mode", ["full", "partial", "never"])
def test_accepted_lengths_for_constructed_drafts(tmp_path, targets, mode):
    src = targets["llama"]
    cfg = read_config(src)
    probe = Engine.load(str(src), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    a, b, c = 40, 41, 42
    if mode == "full":  # the prompt leads to a, and a repeats forever; the draft says a
        edges, draft_token = {last: a, a: a}, a
    elif mode == "partial":  # a, b, a, b, ...; the draft always says a
        edges, draft_token = {last: a, a: b, b: a}, a
    else:  # a, b, a, b, ...; the draft says c, which never comes
        edges, draft_token = {last: a, a: b, b: a}, c
    target = markov_target(src, tmp_path / "target", edges)
    k = 4
    e = _engine(target, _constant_draft(tmp_path, cfg, draft_token), k)
    plain, _ = _run(e, False, n=64)
    spec, stats = _run(e, True, n=64)
    assert spec == plain
    assert plain[:4] == ([a, a, a, a] if mode == "full" else [a, b, a, b])
    hist = stats.accept_hist
    if mode == "full":
        assert stats.accept_len_mean > k  # every verify step keeps all k drafts plus the bonus
        assert hist[k + 1] >= stats.verify_steps - 1
    elif mode == "partial":
        assert hist[2] >= stats.verify_steps - 2 and 1.5 < stats.accept_len_mean < 2.5
    else:
        assert stats.accept_len_mean == 1.0


def _ranked_draft(tmp_path, cfg, tokens: list[int]):
    """A head whose logits are all equal, so it ranks its draft ids 0, 1, 2.. (ties: the lowest
    first) and proposes tokens[0], with tokens[1:] as the alternatives."""
    t = head_tensors(64, 64, 3, cfg["vocab_size"], 16, seed=2)
    t["lm_head.weight"] = torch.zeros_like(t["lm_head.weight"])
    t["d2t"] = torch.zeros(16, dtype=torch.long)
    for i, tok in enumerate(tokens):
        t["d2t"][i] = tok - i
    return write_head(tmp_path / "ranked", cfg, "sglang", t, 64, (1, 2, 3))


@pytest.mark.parametrize("alts", [0, 1, 2])
def test_alternatives_the_target_takes_are_accepted_losslessly(tmp_path, targets, monkeypatch, alts):
    """The target alternates a, b; the draft always proposes c, with a and b as its runners-up.
    The chain is rejected every time; with two alternatives one of them is always the target's
    choice (two tokens per verify step); with one (a), once a step has ended on b; with none,
    never."""
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", str(alts))
    src = targets["llama"]
    cfg = read_config(src)
    probe = Engine.load(str(src), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    a, b, c = 40, 41, 42
    target = markov_target(src, tmp_path / "target", {last: a, a: b, b: a})
    e = _engine(target, _ranked_draft(tmp_path, cfg, [c, a, b]), 4)
    assert e.speculator.alts == (alts,) * 4
    plain, _ = _run(e, False, n=64)
    spec, stats = _run(e, True, n=64)
    assert spec == plain and plain[:4] == [a, b, a, b]
    if alts == 2:
        assert stats.accept_len_mean == 2.0
    elif alts == 1:  # a is taken after b, and then the step ends on b again: one miss at most
        assert stats.accept_hist[1] <= 1 and stats.accept_hist[2] >= stats.verify_steps - 1
    else:
        assert stats.accept_len_mean == 1.0


def test_shaped_alternatives():
    from speculative.eagle3.speculator import default_alternatives, shaped_alternatives

    assert shaped_alternatives(5, 10) == (3, 3, 2, 1, 1)
    assert shaped_alternatives(5, 0) == (0,) * 5 and shaped_alternatives(3, 3) == (2, 1, 0)
    assert shaped_alternatives(1, 14) == (3,)  # draft_pick's limit
    for k in range(1, 16):  # a verify step stays within the 16 rows of the batch-invariant kernels
        assert k + 1 + sum(default_alternatives(k, torch.device("cuda"))) <= 16
    assert default_alternatives(5, torch.device("cpu")) == (0,) * 5


def test_alternatives_from_the_environment():
    from engine.errors import UserError
    from engine.options import KernelOptions
    from speculative.eagle3.speculator import default_alternatives

    cpu = torch.device("cpu")
    for env, want in [("0", (0,) * 5), ("2", (2,) * 5), ("9", (2,) * 5), ("auto", (3, 3, 2, 1, 1)),
                      ("2,1", (2, 1, 0, 0, 0)), ("3,3,3,3,3", (3, 3, 3, 1, 0)), ("", (0,) * 5)]:
        spec_alts = KernelOptions.from_env({"LOCALCHAT_SPEC_ALTS": env}).spec_alts
        assert default_alternatives(5, cpu, spec_alts) == want, env  # 10 rows at most next to the chain's 6
    with pytest.raises(UserError, match="LOCALCHAT_SPEC_ALTS='x,1'"):
        KernelOptions.from_env({"LOCALCHAT_SPEC_ALTS": "x,1"})


def test_sampling_with_speculation_is_reproducible_and_well_formed(tmp_path, targets):
    cfg = read_config(targets["llama"])
    head = write_head(tmp_path / "h", cfg, "sglang",
                      head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=4), 64, (1, 2, 3))
    e = _engine(targets["llama"], head, 3)
    a, _ = _run(e, True, n=40, temperature=0.8, top_p=0.9, seed=11)
    b, _ = _run(e, True, n=40, temperature=0.8, top_p=0.9, seed=11)
    assert a == b and len(a) == 40


def test_repetition_penalty_speculation_equals_plain(tmp_path, targets):
    cfg = read_config(targets["qwen3"])
    head = write_head(tmp_path / "h", cfg, "sglang",
                      head_tensors(64, 64, 3, cfg["vocab_size"], 384, seed=5), 64, (1, 2, 3))
    e = _engine(targets["qwen3"], head, 4)
    plain, _ = _run(e, False, n=64, repetition_penalty=1.3)
    spec, _ = _run(e, True, n=64, repetition_penalty=1.3)
    assert spec == plain


def test_draft_for_another_target_is_refused(tmp_path, targets):
    cfg = read_config(targets["llama"])
    wrong = dict(cfg, vocab_size=500)
    t = head_tensors(64, 64, 3, 500, 200)
    head = write_head(tmp_path / "h", wrong, "sglang", t, 64, (1, 2, 3))
    with pytest.raises(ModelLoadError, match="vocabulary 500.*384"):
        Engine.load(str(targets["llama"]), draft=str(head), device="cpu")
    wrong = dict(cfg, hidden_size=96)
    t = head_tensors(64, 96, 3, 384, 200)
    head = write_head(tmp_path / "h2", wrong, "sglang", t, 64, (1, 2, 3))
    with pytest.raises(ModelLoadError, match="hidden size 96.*64"):
        Engine.load(str(targets["llama"]), draft=str(head), device="cpu")


@pytest.mark.parametrize("mode", ["full", "partial"])
@pytest.mark.parametrize("alts", [0, 2])
def test_speculation_runs_to_the_end_of_the_context_like_plain(tmp_path, targets, monkeypatch, mode, alts):
    """The greedy loop drafts past the context's end inside its iteration; the host must switch
    to plain steps in time and stop where plain decoding stops, token for token."""
    src = targets["llama"]
    cfg = read_config(src)
    probe = Engine.load(str(src), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    a, b = 40, 41
    edges = {last: a, a: a} if mode == "full" else {last: a, a: b, b: a}
    target = markov_target(src, tmp_path / "target", edges)
    head = _constant_draft(tmp_path, cfg, a)
    n_prompt = len(probe.tokenizer.apply_chat_template(PROMPT))
    monkeypatch.setenv("LOCALCHAT_SPEC_ALTS", str(alts))
    width = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=4).speculator.greedy.width
    assert width == 4 + 1 + 4 * alts  # the chain and its alternatives
    for room in range(width, width + 4):  # tokens left in the context after the prompt: room for a verify or two
        e = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=4, max_seq_len=n_prompt + room)
        e.tokenizer.eos_token_ids = frozenset()
        plain, _ = _run(e, False, n=64)
        spec, stats = _run(e, True, n=64)
        assert spec == plain and len(plain) == room + 1, (mode, room)  # the last needs no K/V
        assert stats.verify_steps > 0
