"""Temperature sampling with speculation through SampledIteration: the target's distribution,
reproducible with a seed (its acceptance rule against verify.rejection_accept:
test_sampled_pick.py)."""

import importlib.util
import os

import pytest
import torch

import speculative.eagle3.sampled_loop as sampled_loop
from engine.engine import Engine
from engine.options import KernelOptions
from engine.types import SamplingParams
from tests.speculative.heads import head_tensors, markov_target, write_head
from tests.tiny import make_tiny_model, read_config

PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]
# The fused kernels run on the CPU through Triton's interpreter only with LOCALCHAT_TRITON_INTERPRET=1
# (run this file alone then; see tests/engine/test_kernels.py).
INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)


FACES = (40, 41, 42)  # A, B, C


def _coin(base, draft_faces: tuple[int, ...], head_seed: int, options=()):
    """A target that after token A says B or C with equal probability, and A after either (B's
    and C's lm_head rows are the same, so their logits tie exactly in every context), with a
    random head whose draft vocabulary is draft_faces; one engine per KernelOptions in options
    (default options: one engine)."""
    a, b, c = FACES
    src = make_tiny_model(base / "src", "llama", num_layers=4, seed=3)
    probe = Engine.load(str(src), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    dst = markov_target(src, base / "target", {last: a, a: b, b: a, c: a}, ties={c: b})
    cfg = read_config(src)
    t = head_tensors(64, 64, 3, cfg["vocab_size"], len(draft_faces), seed=head_seed)
    t["d2t"] = torch.tensor(draft_faces) - torch.arange(len(draft_faces))  # draft id i -> draft_faces[i]
    head_dir = write_head(base / "head", cfg, "sglang", t, 64, (1, 2, 3))
    engines = []
    for opts in options or (None,):
        eng = Engine.load(str(dst), draft=str(head_dir), device="cpu", draft_steps=4, options=opts)
        eng.tokenizer.eos_token_ids = frozenset()
        engines.append(eng)
    return engines


@pytest.fixture(scope="module")
def coin(tmp_path_factory):
    """The coin with a one-token draft vocabulary: the head always says B."""
    return _coin(tmp_path_factory.mktemp("coin"), FACES[1:2], 2)[0], FACES


def _run(engine, speculative, **kw):
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    events = list(engine.stream_ids(ids, SamplingParams(**kw), speculative=speculative))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


@pytest.mark.parametrize("cut", [{}, {"top_k": 2, "top_p": 0.99}], ids=["temperature", "top-k+top-p"])
def test_a_draft_that_always_says_b_still_gives_b_half_the_time(coin, monkeypatch, cut):
    engine, (a, b, c) = coin
    bodies = []
    real = sampled_loop.SampledIteration._body
    monkeypatch.setattr(sampled_loop.SampledIteration, "_body", lambda self, n=None: bodies.append(n) or real(self, n))
    counts = {}
    for speculative in (False, True):
        picks = []
        for seed in range(6):
            out, stats = _run(engine, speculative, max_tokens=64, temperature=1.0, seed=seed, **cut)
            assert len(out) == 64 and set(out[0::2]) == {a} and set(out[1::2]) <= {b, c}
            picks += out[1::2]
        counts[speculative] = picks.count(b) / len(picks)
    assert bodies, "speculative sampling did not run SampledIteration"
    # 192 coin flips each: 0.5 +- 0.036; a draft-biased rule would give B almost always.
    assert 0.35 < counts[False] < 0.65 and 0.35 < counts[True] < 0.65, counts
    # From A the draft's B is kept half the time (2 tokens), else C comes (1), then A (1): 4/3.
    assert 1.15 < stats.accept_len_mean < 1.55, stats.accept_len_mean


@pytest.fixture(scope="module")
def coin_two(tmp_path_factory):
    """The coin with a head whose vocabulary is B and C, loaded without and with the sampled
    runners-up: a refused draft's runner-up is the other face."""
    runners_up = (False, True)
    engines = _coin(tmp_path_factory.mktemp("coin2"), FACES[1:], 5,
                    [KernelOptions(sampled_runners_up=on) for on in runners_up])
    return dict(zip(runners_up, engines)), FACES


def test_runners_up_keep_the_coin_fair_and_accept_more(coin_two, monkeypatch):
    """With runners-up, B still comes half the time, and where the draft's face is refused the
    other face (its runner-up) is kept: more tokens a verify step than the chain alone."""
    engines, (a, b, c) = coin_two
    assert engines[True].speculator.sampled.runners_up and not engines[False].speculator.sampled.runners_up
    bodies = []
    real = sampled_loop.SampledIteration._body
    monkeypatch.setattr(sampled_loop.SampledIteration, "_body", lambda self, n=None: bodies.append(n) or real(self, n))
    share, accept = {}, {}
    for runners_up, engine in engines.items():
        picks, lengths = [], []
        for seed in range(8):
            out, stats = _run(engine, True, max_tokens=64, temperature=1.0, seed=seed)
            assert len(out) == 64 and set(out[0::2]) == {a} and set(out[1::2]) <= {b, c}
            picks += out[1::2]
            lengths.append(stats.accept_len_mean)
        share[runners_up] = picks.count(b) / len(picks)
        accept[runners_up] = sum(lengths) / len(lengths)
    assert bodies
    assert 0.37 < share[False] < 0.63 and 0.37 < share[True] < 0.63, share  # 256 flips: 0.5 +- 0.031
    assert accept[True] > accept[False] + 0.2, accept
    # reproducible with a seed
    assert _run(engines[True], True, max_tokens=40, temperature=0.8, seed=3)[0] == \
        _run(engines[True], True, max_tokens=40, temperature=0.8, seed=3)[0]


@pytest.fixture(scope="module")
def random_pair(tmp_path_factory):
    base = tmp_path_factory.mktemp("pair")
    target = make_tiny_model(base / "t", "qwen3", num_layers=2, seed=4)
    cfg = read_config(target)
    head = write_head(base / "h", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=4),
                      64, (0, 1, 2))
    e = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=3)
    e.tokenizer.eos_token_ids = frozenset()
    return e


@pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
def test_the_fused_iteration_draws_what_the_reference_draws(random_pair, monkeypatch):
    """A GPU's sampled iteration (the draws and the acceptance in fused kernels, the chain moved on
    by the acceptance's launch, the draft's logits read as they are), run on the CPU through
    Triton's interpreter: from the same seeds, the tokens and accepted lengths of the torch path.
    A random target and head, so that every token depends on the positions and caches the chain's
    move sets up, and some drafts are kept."""
    engine = random_pair
    it = engine.speculator.sampled
    want = [_run(engine, True, max_tokens=40, temperature=0.9, seed=seed) for seed in (1, 2)]
    calls = []
    real = sampled_loop.sampled_accept

    def counted(*args, **kw):
        calls.append(kw.get("chain"))
        return real(*args, **kw)

    monkeypatch.setattr(sampled_loop, "sampled_accept", counted)
    monkeypatch.setattr(it, "fused", True)
    got = [_run(engine, True, max_tokens=40, temperature=0.9, seed=seed) for seed in (1, 2)]
    assert calls and all(chain is it.chain for chain in calls)
    for (a, a_stats), (b, b_stats) in zip(want, got):
        assert a == b and a_stats.accept_len_mean == b_stats.accept_len_mean
    assert max(s.accept_len_mean for _, s in want) > 1.1  # drafts kept: the chain moved by more than one


def test_sampling_is_reproducible_and_takes_the_iteration(random_pair, monkeypatch):
    e = random_pair
    bodies = []
    real = sampled_loop.SampledIteration._body
    monkeypatch.setattr(sampled_loop.SampledIteration, "_body", lambda self, n=None: bodies.append(n) or real(self, n))
    for cut in ({}, {"top_p": 0.9, "top_k": 50, "min_p": 0.02}):
        a, _ = _run(e, True, max_tokens=50, temperature=0.7, seed=5, **cut)
        b, _ = _run(e, True, max_tokens=50, temperature=0.7, seed=5, **cut)
        c, _ = _run(e, True, max_tokens=50, temperature=0.7, seed=6, **cut)
        assert a == b and len(a) == 50 and a != c and len(bodies) > 10
        bodies.clear()
    _run(e, True, max_tokens=20, temperature=0.7, repetition_penalty=1.2, seed=5)  # the step-by-step loop
    assert not bodies


def test_top_k_1_sampling_with_speculation_is_greedy_decoding(random_pair):
    """top-k 1 leaves one token with probability 1: the iteration must reproduce plain greedy
    decoding token for token, whatever its random draws."""
    e = random_pair
    greedy, _ = _run(e, False, max_tokens=80)
    for seed in (1, 2):
        sampled, stats = _run(e, True, max_tokens=80, temperature=0.9, top_k=1, seed=seed)
        assert sampled == greedy
    assert stats.verify_steps > 0


def test_a_graph_is_kept_only_when_its_replay_equals_the_eager_body(random_pair):
    """capture()'s self-check on CPU, with stand-in graphs: one that runs the eager body is kept,
    one whose replay computes something else is refused."""
    e = random_pair
    it = e.speculator.sampled
    it.select(SamplingParams(temperature=0.8, top_p=0.9))
    it.n.fill_(e.runner.max_len - 3 * (it.k + 1))
    it.ids.copy_(torch.tensor([5, 6, 7, 8]))
    it.q.fill_(1.0 / it.q.shape[1])

    class Graph:
        def __init__(self, wrong):
            self.wrong = wrong

        def replay(self):
            it._body(int(it.n))
            if self.wrong:
                it.ids[2] += 1

    try:
        for wrong in (False, True):
            it.graphs[it.cut] = Graph(wrong)
            with torch.inference_mode():
                assert it._replay_equals_eager() is (not wrong)
    finally:
        it.graphs[it.cut] = None
