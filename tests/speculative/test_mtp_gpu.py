"""GPU: MTP drafting with captured graphs equals eager, token for token and draft for draft."""

import pytest
import torch

from engine.decode import DecodeState
from engine.engine import Engine
from engine.types import SamplingParams
from tests.speculative.mtp_layers import map_layer, markov_target, random_layers, write_localchat_mtp
from tests.tiny import read_config

pytestmark = pytest.mark.gpu

PROMPT = [{"role": "user", "content": "Hello"}]


@pytest.fixture(scope="module")
def markov(tmp_path_factory, tiny_models):
    src = tiny_models["llama"]
    probe = Engine.load(str(src), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    return markov_target(src, tmp_path_factory.mktemp("mtp_gpu") / "markov", last)


def _run(engine, n, temperature):
    """(tokens, accept_lens) of n tokens, driving the speculator directly."""
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    gen = torch.Generator(device="cuda").manual_seed(7) if temperature else None
    state = DecodeState(tokens=list(ids), kv_len=0, params=SamplingParams(max_tokens=n, temperature=temperature),
                        generator=gen)
    it = engine.speculator.tokens(engine.runner, state)
    for _ in it:
        if len(state.tokens) - len(ids) >= n:
            break
    it.close()
    return state.tokens[len(ids):len(ids) + n], state.accept_lens


def _engines(tmp_path, markov, S: int, chain: bool, options=None):
    """(with graphs, without) engines of the markov target and S random MTP layers whose token
    path drafts right; the state, attention and MLP (kept, random) sometimes flip a draft, so
    acceptance lengths vary and depend on everything the window carries."""
    cfg = read_config(markov)
    g = torch.Generator().manual_seed(S)
    layers = [map_layer(t, "id", cfg["hidden_size"], g, state_std=0.6, block=True)
              for t in random_layers(S, cfg, seed=3)]
    draft = write_localchat_mtp(tmp_path / "d", cfg, layers, chain)
    engines = []
    for graphs in (True, False):
        e = Engine.load(str(markov), draft=str(draft), device="cuda", use_graphs=graphs, max_seq_len=1024,
                        options=options)
        e.tokenizer.eos_token_ids = frozenset()
        assert (e.speculator.window.graphs is not None) == graphs
        engines.append(e)
    return engines


def _plain(engine, n: int) -> list[int]:
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    return [t for ev in engine.stream_ids(ids, SamplingParams(max_tokens=n), speculative=False) for t in ev.token_ids]


@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("S", [1, 2, 3])
def test_mtp_graphs_equal_eager_500_tokens(tmp_path, markov, S, chain):
    """LOCALCHAT_MTP_GRAPH=0: the step-by-step loop, its verify and window steps as graphs."""
    from engine.options import KernelOptions

    g_eng, e_eng = _engines(tmp_path, markov, S, chain, KernelOptions(mtp_graph=False))
    for temperature in (0.0, 0.9):
        a, lens_a = _run(g_eng, 500, temperature)
        b, lens_b = _run(e_eng, 500, temperature)
        assert len(a) == 500 and a == b, temperature
        assert lens_a == lens_b, temperature
        assert len(set(lens_a)) >= 2, lens_a  # acceptance varies
    assert _plain(g_eng, 500) == _run(g_eng, 500, 0.0)[0]


@pytest.mark.parametrize("chain", [True, False])
@pytest.mark.parametrize("S", [1, 2, 3])
def test_mtp_whole_iteration_graph_equals_eager_and_plain_decoding(tmp_path, markov, S, chain):
    """The default (LOCALCHAT_MTP_GRAPH=1): greedy answers replay one graph an iteration (greedy_loop.py); the
    same tokens and accepted lengths as the iteration's eager body, and as plain decoding."""
    from engine.options import KernelOptions

    g_eng, e_eng = _engines(tmp_path, markov, S, chain, KernelOptions(mtp_graph=True))
    assert g_eng.speculator.greedy.graph is not None  # captured, and its replay equalled the eager body
    assert e_eng.speculator.greedy.graph is None
    a, lens_a = _run(g_eng, 500, 0.0)
    b, lens_b = _run(e_eng, 500, 0.0)
    assert len(a) == 500 and a == b and lens_a == lens_b
    assert len(set(lens_a)) >= 2, lens_a  # acceptance varies
    assert _plain(g_eng, 500) == a
