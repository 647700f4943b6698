"""MTP drafting on CPU: lossless, constructed acceptance, the chain state, per-layer weights."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.forward_batch import ForwardBatch
from engine.decode import DecodeState
from engine.engine import Engine
from engine.errors import ModelLoadError
from engine.kv_cache import KVCache
from engine.types import SamplingParams
from tests.speculative.mtp_layers import A, B, C, D, map_layer, markov_target, random_layers, write_localchat_mtp
from tests.tiny import make_tiny_model, read_config

PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("mtp_target") / "llama", "llama", num_layers=2, seed=5)


def _engine(target, draft, k=5):
    e = Engine.load(str(target), draft=str(draft), device="cpu", draft_steps=k)
    e.tokenizer.eos_token_ids = frozenset()
    return e


def _prompt(engine):
    return engine.tokenizer.apply_chat_template(PROMPT)


def _plain(engine, n):
    engine.reset()
    return [t for ev in engine.stream_ids(_prompt(engine), SamplingParams(max_tokens=n), speculative=False)
            for t in ev.token_ids]


def _spec(engine, n, **params):
    """Drives the speculator directly: (generated tokens, accept_lens of every verify step)."""
    ids = _prompt(engine)
    state = DecodeState(tokens=list(ids), kv_len=0, params=SamplingParams(max_tokens=n, **params),
                        generator=torch.Generator().manual_seed(1) if params else None)
    gen = engine.speculator.tokens(engine.runner, state)
    for _ in gen:
        if len(state.tokens) - len(ids) >= n:
            break
    gen.close()
    return state.tokens[len(ids):len(ids) + n], state.accept_lens


# --- lossless with random layers -----------------------------------------------------------

@pytest.mark.parametrize("chain", [True, False])
def test_greedy_mtp_equals_plain(tmp_path, target, chain):
    cfg = read_config(target)
    for S in (1, 2, 3):
        draft = write_localchat_mtp(tmp_path / f"d{S}", cfg, random_layers(S, cfg, seed=S), chain)
        e = _engine(target, draft)
        assert e.speculator.k == S
        plain = _plain(e, 128)
        e.reset()
        events = list(e.stream_ids(_prompt(e), SamplingParams(max_tokens=128), speculative=True))
        assert [t for ev in events for t in ev.token_ids] == plain, (S, chain)
        stats = events[-1].stats
        assert stats.speculative and stats.verify_steps > 0 and 1.0 <= stats.accept_len_mean <= S + 1
        by_pos = stats.accept_by_position
        assert len(by_pos) <= S and by_pos == sorted(by_pos, reverse=True)
    # a second turn reuses the caches it can and stays lossless
    again = list(e.stream_ids(_prompt(e), SamplingParams(max_tokens=40), speculative=True))
    assert [t for ev in again for t in ev.token_ids] == plain[:40]


def test_layers_of_another_shape_and_sampling(tmp_path, target):
    """Layers narrower than the target's attention (own head_dim, so their own RoPE table),
    greedy lossless; sampling reproducible for a seed."""
    cfg = read_config(target)
    shape = dict(heads=2, kv_heads=1, head_dim=32, inter=64)
    draft = write_localchat_mtp(tmp_path / "d", cfg, random_layers(2, cfg, seed=4, **shape), True, **shape)
    e = _engine(target, draft)
    assert e.speculator.cos_sin.shape[1] == 32
    plain = _plain(e, 64)
    assert _spec(e, 64)[0] == plain
    a, b = _spec(e, 40, temperature=0.8, top_p=0.9), _spec(e, 40, temperature=0.8, top_p=0.9)
    assert a == b and len(a[0]) == 40


# --- the chain state and the window, against a full recompute --------------------------------

def _reference_drafts(spec, tokens, states, chain: bool):
    """Hand-written MTP over the whole prefix, no reuse: layer s reads token j+s+1 and, in chain
    mode, layer s-1's output at j. tokens: t_0..t_n (t_n the bonus); states: (n, H) target."""
    n = len(tokens) - 1
    ext, x, drafts = list(tokens), states, []
    for s in range(spec.k):
        kv = KVCache(1, spec.runner.max_len, spec.config.num_kv_heads, spec.config.head_dim, torch.float32, "cpu")
        ids = torch.tensor(ext[s + 1:s + 1 + n])
        passed, normed = spec.draft.step(s, ids, x, ForwardBatch.eager(ids, 0), spec.embed, kv, spec.cos_sin)
        d = int(spec.lm_head(normed[-1]).argmax())
        drafts.append(d)
        ext.append(d)
        x = passed if chain else states
    return drafts


@pytest.mark.parametrize("whole", [True, False], ids=["whole iterations", "step by step"])
@pytest.mark.parametrize("chain", [True, False])
def test_every_draft_equals_a_full_recompute(tmp_path, target, chain, whole):
    """Every verified draft, through the whole-iteration body (greedy_loop.py) and through the
    step-by-step loop (which a GPU keeps where the iteration's graph does not capture)."""
    cfg = read_config(target)
    draft = write_localchat_mtp(tmp_path / "d", cfg, random_layers(3, cfg, seed=7, std=0.5), chain)
    e = _engine(target, draft)
    spec, verifies = e.speculator, []
    if whole:
        body = spec.greedy._body

        def recording(n=None):  # each whole iteration's verify: [bonus, d_1..d_S] at n
            verifies.append((spec.greedy.ids.clone(), int(spec.greedy.n)))
            return body(n)

        spec.greedy._body = recording
    else:
        spec.whole_iterations = False
        forward = e.runner.forward

        def recording(input_ids, start_pos, *a, **kw):
            if input_ids.shape[0] == spec.k + 1:
                verifies.append((input_ids.clone(), start_pos))
            return forward(input_ids, start_pos, *a, **kw)

        e.runner.forward = recording
    out, lens = _spec(e, 60)
    tokens = _prompt(e) + out
    with torch.inference_mode():
        kv = KVCache(cfg["num_hidden_layers"], 512, 2, 16, torch.float32, "cpu")
        full = e.runner.model(ForwardBatch.eager(torch.tensor(tokens), 0), kv).hidden
    assert len(verifies) == len(lens) >= 10
    differs = 0
    with torch.inference_mode():
        for ids, n in verifies:
            ref = _reference_drafts(spec, tokens[:n + 1], full[:n], chain)
            assert ids[1:].tolist() == ref, n
            differs += ref != _reference_drafts(spec, tokens[:n + 1], full[:n], not chain)
    assert differs > 0  # the chain state changes drafts: the test would see it dropped


# --- constructed drafts: accepted fully, partly, never ----------------------------------------

F = {A: B, B: C, C: A, D: D}
G = {"id": {A: A, B: B, C: C, D: D}, "swap": {A: A, B: B, C: D, D: C}, "to_d": {A: D, B: D, C: D, D: D}}
MODES = {"full": ["id", "id", "id"], "partial": ["swap", "to_d", "to_d"], "never": ["to_d", "to_d", "to_d"]}


def _expected_lens(maps, steps):
    bonus, lens = A, []
    for _ in range(steps):
        drafts, x = [], bonus
        for m in maps:
            x = F[G[m][x]]
            drafts.append(x)
        truth = [F[bonus]]
        while len(truth) < len(maps) + 1:
            truth.append(F[truth[-1]])
        a = 0
        while a < len(drafts) and drafts[a] == truth[a]:
            a += 1
        lens.append(a + 1)
        bonus = truth[a]
    return lens


@pytest.mark.parametrize("mode", list(MODES))
def test_constructed_drafts_accept_as_predicted(tmp_path, target, mode):
    cfg = read_config(target)
    probe = Engine.load(str(target), device="cpu")
    last = _prompt(probe)[-1]
    dst = markov_target(target, tmp_path / "markov", last)
    H, g = cfg["hidden_size"], torch.Generator().manual_seed(0)
    for S in (1, 2, 3):
        maps = MODES[mode][:S]
        layers = [map_layer(t, m, H, g) for t, m in zip(random_layers(S, cfg, seed=3), maps)]
        for chain in (True, False):
            eng = _engine(dst, write_localchat_mtp(tmp_path / f"{S}{chain}", cfg, layers, chain))
            plain = _plain(eng, 128)
            assert plain[:4] == [A, B, C, A]
            out, lens = _spec(eng, 128)
            assert out == plain
            assert lens[:20] == _expected_lens(maps, 20), (mode, S, chain)
    if mode == "full":
        assert set(lens[:20]) == {S + 1}
    elif mode == "never":
        assert set(lens) == {1}
    else:
        assert set(lens[:20]) == {1, 2}


# --- weights: each physical layer its own ----------------------------------------------------

def test_each_layer_gets_its_own_weights(tmp_path, target):
    cfg = read_config(target)
    layers = random_layers(3, cfg, seed=11)
    e = _engine(target, write_localchat_mtp(tmp_path / "d", cfg, layers, True))
    mtp = e.speculator.draft.mtp_layers
    for i, layer in enumerate(mtp):
        assert torch.equal(layer.input_proj.weight, layers[i]["input_proj.weight"])
        assert torch.equal(layer.final_layernorm.weight, layers[i]["final_layernorm.weight"])
        q = layers[i]["self_attn.q_proj.weight"]
        assert torch.equal(layer.self_attn.qkv_proj.weight[:q.shape[0]], q)
        assert torch.equal(layer.mlp.gate_up_proj.weight[96:], layers[i]["mlp.up_proj.weight"])
    ptrs = [p.data_ptr() for layer in mtp for p in layer.parameters()]
    assert len(ptrs) == len(set(ptrs))
    kv_ptrs = {kv.k_all.data_ptr() for kv in e.speculator.kvs}
    assert len(kv_ptrs) == 3


def test_bad_mtp_folders_are_refused(tmp_path, target):
    cfg = read_config(target)
    d = write_localchat_mtp(tmp_path / "d", cfg, random_layers(2, cfg), True)
    sd = load_file(d / "model.safetensors")
    sd["mtp_layers.2.input_proj.weight"] = sd["mtp_layers.1.input_proj.weight"].clone()
    save_file(sd, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match="unexpected tensors: mtp_layers.2.input_proj.weight"):
        _engine(target, d)
    del sd["mtp_layers.2.input_proj.weight"], sd["mtp_layers.1.final_layernorm.weight"]
    save_file(sd, d / "model.safetensors")
    with pytest.raises(ModelLoadError, match="missing tensors: mtp_layers.1.final_layernorm.weight"):
        _engine(target, d)
    wrong = dict(cfg, hidden_size=96)
    d2 = write_localchat_mtp(tmp_path / "d2", wrong, random_layers(1, wrong), True)
    with pytest.raises(ModelLoadError, match="hidden size 96"):
        _engine(target, d2)
