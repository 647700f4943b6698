"""GPU: graph replay equals eager, speculation in graph mode equals eager and plain (bf16)."""

import pytest
import torch

from engine.engine import Engine
from engine.types import SamplingParams

pytestmark = pytest.mark.gpu


def _tokens(engine, ids, params, speculative=False):
    engine.reset()
    return [t for ev in engine.stream_ids(ids, params, speculative=speculative) for t in ev.token_ids]


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
@pytest.mark.parametrize("temperature", [0.0, 0.8, "cuts", "penalty", "greedy penalty"])
@pytest.mark.parametrize("gated", [False, True], ids=["silu_mul", "gated"])
@pytest.mark.parametrize("norms", ["fused", "apart"])
def test_graph_decode_equals_eager_200_steps(arch, temperature, gated, norms, tiny_models, monkeypatch):
    """gated: the one-row MLP as gated_gemv + a plain down GEMV (KernelOptions.gated_mlp), or not;
    norms apart: the one-row norms unfused, so that o_proj and down carry them (gemv_add_norm).
    Sampled (0.8, and with top-k / top-p / min-p cuts) or with a repetition penalty (sampled or
    greedy): the graph engine chooses each token on the device, its replays queued ahead of the
    host; the eager one step by step: the same seed, the same tokens."""
    import engine.routing
    from engine.config import ModelConfig
    from engine.options import KernelOptions
    from tests.engine.test_fused_layers import norms_apart
    from tests.tiny import read_config

    options = KernelOptions(gated_mlp=gated)
    if norms == "apart":
        cfg = ModelConfig.from_hf(read_config(tiny_models[arch]))
        monkeypatch.setattr(engine.routing, "FUSED_TILES", {**engine.routing.FUSED_TILES, **norms_apart(cfg)})
    graphs = Engine.load(str(tiny_models[arch]), device="cuda", use_graphs=True, options=options)
    eager = Engine.load(str(tiny_models[arch]), device="cuda", use_graphs=False, options=options)
    assert graphs.runner.uses_graphs and not eager.runner.uses_graphs
    for e in (graphs, eager):
        e.tokenizer.eos_token_ids = frozenset()
    ids = graphs.tokenizer.apply_chat_template([{"role": "user", "content": "The quick brown fox"}])
    kw = {"cuts": dict(temperature=0.8, top_k=40, top_p=0.9, min_p=0.01),
          "penalty": dict(temperature=0.8, repetition_penalty=1.3),
          "greedy penalty": dict(repetition_penalty=1.3)}.get(temperature, dict(temperature=temperature))
    p = SamplingParams(max_tokens=200, seed=123, **kw)
    a, b = _tokens(graphs, ids, p), _tokens(eager, ids, p)
    assert len(a) == 200 and a == b


def _spec_engines(tmp_path, tiny_models, fmt, use_aux, k, max_seq_len=1024, defer_capture=False, options=None):
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_models["llama"])
    t = head_tensors(64, 64, 3, cfg["vocab_size"], 200, use_aux=use_aux)
    head = write_head(tmp_path / fmt, cfg, fmt, t, 64, (0, 1, 2), use_aux=use_aux)
    out = []
    for graphs in (True, False):
        e = Engine.load(str(tiny_models["llama"]), draft=str(head), device="cuda", use_graphs=graphs, draft_steps=k,
                        max_seq_len=max_seq_len, defer_capture=defer_capture and graphs, options=options)
        e.tokenizer.eos_token_ids = frozenset()
        out.append(e)
    return out


@pytest.mark.parametrize("fmt,use_aux", [("sglang", True), ("speculators", False)])
def test_spec_graph_equals_eager_500_tokens(tmp_path, tiny_models, fmt, use_aux):
    g, e = _spec_engines(tmp_path, tiny_models, fmt, use_aux, 4)
    ids = g.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    # greedy, temperature alone, and with the cuts (the two SampledIteration graphs)
    for kw in ({}, {"temperature": 0.9}, {"temperature": 0.9, "top_k": 40, "top_p": 0.9, "min_p": 0.01}):
        p = SamplingParams(max_tokens=500, seed=7, **kw)
        a, b = _tokens(g, ids, p, True), _tokens(e, ids, p, True)
        assert len(a) == 500 and a == b, kw
    plain = _tokens(g, ids, SamplingParams(max_tokens=500), False)
    assert plain == _tokens(g, ids, SamplingParams(max_tokens=500), True)


def test_greedy_speculation_equals_plain_on_a_wide_random_model(tmp_path):
    """Random weights give many near-tied logits: a verify row whose bits differ from the decode
    step it stands for shows up within a few hundred tokens (it did, before batch invariance)."""
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import make_tiny_model, read_config

    target = make_tiny_model(tmp_path / "wide", "llama", num_layers=6, hidden=576, seed=5,
                             num_attention_heads=9, num_key_value_heads=3)
    cfg = read_config(target)
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(576, 576, 3, cfg["vocab_size"], 200),
                      576, (1, 3, 5))
    e = Engine.load(str(target), draft=str(head), device="cuda", draft_steps=5)
    e.tokenizer.eos_token_ids = frozenset()
    for text in ("The quick brown fox", "Once upon a time", "hello"):
        ids = e.tokenizer.apply_chat_template([{"role": "user", "content": text}])
        p = SamplingParams(max_tokens=300)
        assert _tokens(e, ids, p, False) == _tokens(e, ids, p, True), text


def test_read_ahead_stops_cleanly_and_keeps_the_conversation(tmp_path, tiny_models):
    """Graph loops queue the next replay before reading a result: answers cut short by
    max_tokens, answers that fill the context, and a second turn on the same cache must all
    equal the eager engine's, for plain and speculative greedy decoding."""
    g, e = _spec_engines(tmp_path, tiny_models, "sglang", True, 4, max_seq_len=160)
    first = [{"role": "user", "content": "Hello"}]
    ids = g.tokenizer.apply_chat_template(first)
    for spec in (False, True):
        for n in (1, 2, 3, 7, 40, 1000):  # 1000: until the context is full
            p = SamplingParams(max_tokens=n)
            a, b = _tokens(g, ids, p, spec), _tokens(e, ids, p, spec)
            # The last token comes from the forward at position 159: its own K/V is never needed.
            assert len(a) == min(n, 160 - len(ids) + 1), (spec, n, len(a))
            assert a == b, (spec, n)
        turns = []
        for engine in (g, e):
            engine.reset()
            p = SamplingParams(max_tokens=9)
            one = [t for ev in engine.stream_ids(ids, p, speculative=spec) for t in ev.token_ids]
            more = ids + one + ids[-3:]  # the next prompt extends the cached conversation
            two = [t for ev in engine.stream_ids(more, SamplingParams(max_tokens=30), speculative=spec)
                   for t in ev.token_ids]
            turns.append((one, two))
        assert turns[0] == turns[1], spec


def test_deferred_graphs_are_captured_mid_conversation(tmp_path, tiny_models):
    """`localchat run` defers the target's decode and verify graphs (defer_capture): greedy
    speculation never replays them, and the first plain or penalised answer captures them in
    the middle of a conversation, whose cache their warm-ups must leave alone."""
    g, e = _spec_engines(tmp_path, tiny_models, "sglang", True, 4, defer_capture=True)
    assert g.runner.uses_graphs and not g.runner.graphs
    assert g.speculator.graphs is None and g.speculator.greedy.graph is None  # not before the first answer
    ids = g.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])
    turns = []
    for engine in (g, e):
        engine.reset()
        one = [t for ev in engine.stream_ids(ids, SamplingParams(max_tokens=40), speculative=True)
               for t in ev.token_ids]
        if engine is g:
            assert not g.runner.graphs  # the whole-iteration graph served it
            assert g.speculator.graphs is not None and g.speculator.greedy.graph is not None
            assert g.speculator.greedy.first_graph is not None  # the first chain's, with it
        more = ids + one + ids[-3:]
        two = [t for ev in engine.stream_ids(more, SamplingParams(max_tokens=60), speculative=False)
               for t in ev.token_ids]
        more2 = more + two + ids[-3:]
        p = SamplingParams(max_tokens=50, temperature=0.8, seed=3, repetition_penalty=1.2)
        three = [t for ev in engine.stream_ids(more2, p, speculative=True) for t in ev.token_ids]
        turns.append((one, two, three))
    assert sorted(g.runner.graphs) == [1, 5]
    assert turns[0] == turns[1]


@pytest.mark.parametrize("first", ["greedy", "sampled"])
def test_deferred_draft_capture_never_touches_a_long_conversation(tmp_path, tiny_models, first):
    """With defer_capture the draft's graphs are captured after the first request's first token,
    their warm-ups writing in the caches' last 3 (k + 1) positions. A first request whose prompt
    already reaches there (150 tokens of a 160-token context, k = 5) runs eagerly and captures
    nothing; the next, shorter one captures. Every answer equals the eager engine's."""
    g, e = _spec_engines(tmp_path, tiny_models, "sglang", True, 5, max_seq_len=160, defer_capture=True)
    base = g.tokenizer.apply_chat_template([{"role": "user", "content": "Hello " * 200}])
    long_ids, short_ids = base[:150], base[:20]
    sampled = SamplingParams(max_tokens=9, temperature=0.9, seed=5)
    p_long = SamplingParams(max_tokens=9) if first == "greedy" else sampled
    assert _tokens(g, long_ids, p_long, True) == _tokens(e, long_ids, p_long, True)
    assert g.speculator.graphs is None and g.speculator.greedy.graph is None
    for p in (SamplingParams(max_tokens=120), sampled, SamplingParams(max_tokens=120, temperature=0.9, seed=6)):
        assert _tokens(g, short_ids, p, True) == _tokens(e, short_ids, p, True), p
        assert g.speculator.graphs is not None and g.speculator.greedy.graph is not None
    # and a long conversation again, now with the graphs captured
    assert _tokens(g, long_ids, p_long, True) == _tokens(e, long_ids, p_long, True)


@pytest.mark.parametrize("defer", [False, True])
def test_a_context_too_short_to_capture_in_runs_eagerly(tmp_path, tiny_models, defer):
    """A capture's warm-ups need the caches' last 3 (k + 1) positions: with a 40-token context
    and k = 15 there is no room, so the draft's graphs are never captured (their warm-ups would
    write past the cache) and the answers equal the eager engine's."""
    g, e = _spec_engines(tmp_path, tiny_models, "sglang", True, 15, max_seq_len=40, defer_capture=defer)
    ids = g.tokenizer.apply_chat_template([{"role": "user", "content": "Hello"}])[:8]
    for p in (SamplingParams(max_tokens=30), SamplingParams(max_tokens=30, temperature=0.9, seed=4)):
        assert _tokens(g, ids, p, True) == _tokens(e, ids, p, True), p
    assert g.speculator.graphs is None and g.speculator.greedy.graph is None


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
                    reason="PDL needs Hopper")
def test_pdl_graphs_equal_plain_launches(tmp_path, tiny_models):
    """Programmatic dependent launch (on by default; LOCALCHAT_PDL=0 off) changes when kernels start, never what
    they compute: graph decode (greedy and seeded sampling) and greedy speculation give the
    same tokens with it as without, and every kernel of the set ran with USE_PDL on."""
    from engine import kernels
    from engine.options import KernelOptions

    ids_msg = [{"role": "user", "content": "The quick brown fox"}]
    runs = {}
    for on in (False, True):
        assert kernels.pdl_args(torch.device("cuda"), on)["USE_PDL"] is on
        options = KernelOptions(pdl=on)
        e = Engine.load(str(tiny_models["llama"]), device="cuda", use_graphs=True, options=options)
        assert e.runner.model.ops.options.pdl is on
        e.tokenizer.eos_token_ids = frozenset()
        ids = e.tokenizer.apply_chat_template(ids_msg)
        runs[on] = [_tokens(e, ids, SamplingParams(max_tokens=200, temperature=t, seed=7)) for t in (0.0, 0.8)]
        spec, _ = _spec_engines(tmp_path / str(on), tiny_models, "sglang", True, 5, options=options)
        runs[on].append(_tokens(spec, ids, SamplingParams(max_tokens=200), speculative=True))
    assert all(len(r) == 200 for r in runs[True]) and runs[True] == runs[False]
