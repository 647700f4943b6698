"""Tree drafting in the engine (speculative/eagle3/tree_loop.py) is lossless: greedy answers equal
plain decoding, with paths accepted through later siblings (the accepted nodes' K/V moved to their
positions) and whole; sampled answers follow the target; the stats count the tree's rows."""

from types import SimpleNamespace

import pytest
import torch

from engine.engine import Engine
from engine.errors import UserError
from engine.types import SamplingParams
from speculative.tree.shape import TreeShape, parse_tree
from tests.speculative.heads import head_tensors, markov_target, write_head
from tests.tiny import make_tiny_model, read_config

PROMPT = [{"role": "user", "content": "Tell me about the quick brown fox."}]


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tree_target") / "llama", "llama", num_layers=4, seed=3)


def _run(engine, speculative, n=96, **kw):
    engine.reset()
    ids = engine.tokenizer.apply_chat_template(PROMPT)
    events = list(engine.stream_ids(ids, SamplingParams(max_tokens=n, **kw), speculative=speculative))
    return [t for ev in events for t in ev.token_ids], events[-1].stats


def _engine(target, head, k=3):
    e = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=k)
    e.tokenizer.eos_token_ids = frozenset()
    return e


def _ranked_draft(tmp_path, cfg, tokens: list[int], name="ranked"):
    """A head whose logits are all equal: it ranks draft ids 0, 1, 2.. (ties: the lowest first),
    draft id i standing for tokens[i], whatever the context."""
    t = head_tensors(64, 64, 3, cfg["vocab_size"], 16, seed=2)
    t["lm_head.weight"] = torch.zeros_like(t["lm_head.weight"])
    t["d2t"] = torch.zeros(16, dtype=torch.long)
    for i, tok in enumerate(tokens):
        t["d2t"][i] = tok - i
    return write_head(tmp_path / name, cfg, "sglang", t, 64, (1, 2, 3))


# 4,4,20: 21 verify rows, in two forwards (a batch-invariant target verifies 16 rows at most at once)
SHAPES = [TreeShape(3, 3, 12), TreeShape(2, 4, 7), TreeShape(4, 2, 9), TreeShape(1, 4, 4), TreeShape(4, 4, 20)]


def _set_tree(e, shape, on_device: bool) -> None:
    """Trees of `shape`; on_device: the step a GPU captures as a graph (lengths on the device, every
    row reading its ancestors through a slot map; on the CPU, the reference attention reads the
    map), run eagerly; else the CPU's (explicit masks over the host's lengths)."""
    e.speculator.set_tree(shape)
    e.speculator.tree_step(shape).on_device = on_device


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
@pytest.mark.parametrize("shape", SHAPES)
def test_greedy_tree_speculation_with_a_random_head_equals_plain(tmp_path, target, shape, on_device):
    cfg = read_config(target)
    e = _engine(target, write_head(tmp_path / "h0", cfg, "sglang",
                                   head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64, (1, 2, 3)))
    plain, _ = _run(e, False)
    _set_tree(e, shape, on_device)
    spec, stats = _run(e, True)
    assert spec == plain
    assert stats.speculative and stats.verify_steps > 0 and stats.verify_tokens == shape.tokens + 1


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
@pytest.mark.parametrize("fmt,use_aux,hidden,aux_ids", [("speculators", True, 48, (0, 2, 3)),
                                                        ("speculators", False, 32, None)])
def test_trees_of_heads_of_other_widths_equal_plain(tmp_path, target, fmt, use_aux, hidden, aux_ids, on_device):
    """Heads narrower than the target (their own embeddings) and heads without the aux states:
    their trees' greedy answers are plain decoding's, through masks and through slot maps."""
    cfg = read_config(target)
    t = head_tensors(hidden, cfg["hidden_size"], 3, cfg["vocab_size"], 160, use_aux=use_aux, seed=1)
    e = _engine(target, write_head(tmp_path / "head", cfg, fmt, t, hidden, aux_ids, use_aux=use_aux))
    plain, _ = _run(e, False, n=64)
    _set_tree(e, TreeShape(3, 3, 12), on_device)
    spec, stats = _run(e, True, n=64)
    assert spec == plain and stats.verify_steps > 0


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
@pytest.mark.parametrize("arch", ["mistral", "qwen2", "qwen3"])
def test_trees_on_the_other_architectures_leave_plain_decodings_cache(tmp_path, arch, on_device):
    """Mistral, Qwen2 (q/k/v biases) and Qwen3 (q/k norms, its own head_dim) targets that say a,
    b, a, b, ... (their attention still feeding the stream), a draft ranking c, a, b: each step
    accepts a path of later siblings, 21 rows verified in two forwards, and the answer and the
    target's cache equal plain decoding's (a tree row attending wrongly, or its K/V moved wrongly,
    leaves other rows)."""
    source = make_tiny_model(tmp_path / arch, arch, num_layers=4, seed=7, tie_word_embeddings=False)
    folder = _chained_target(source, tmp_path / "chained")
    e = _engine(folder, _ranked_draft(tmp_path, read_config(source), [C, A, B]))
    plain, _ = _run(e, False, n=40)
    k_plain, v_plain = e.runner.kv.k_all.clone(), e.runner.kv.v_all.clone()
    _set_tree(e, SHAPES[4], on_device)
    spec, stats = _run(e, True, n=40)
    assert spec == plain and plain[:4] == [A, B, A, B]
    assert stats.verify_tokens == 21 and stats.accept_len_mean >= 2.5, stats.accept_hist
    rows = len(e.tokenizer.apply_chat_template(PROMPT)) + len(plain) - 1
    torch.testing.assert_close(e.runner.kv.k_all[:, :rows], k_plain[:, :rows], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e.runner.kv.v_all[:, :rows], v_plain[:, :rows], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("shape", [SHAPES[0], SHAPES[4]])
def test_the_device_step_grows_the_trees_the_masked_step_grows(tmp_path, target, shape, monkeypatch):
    """The draft's rows read their ancestors through a slot map in the step a GPU captures: each
    tree grown that way is the one explicit masks grow (the same tokens, parents and scores)."""
    from speculative.eagle3.tree_loop import TreeDrafting

    cfg = read_config(target)
    e = _engine(target, write_head(tmp_path / "h0", cfg, "sglang",
                                   head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=4), 64, (1, 2, 3)))
    grown: list = []
    grow = TreeDrafting._grow
    monkeypatch.setattr(TreeDrafting, "_grow", lambda self, n: grown.append(grow(self, n)) or grown[-1])
    trees = {}
    for on_device in (False, True):
        grown.clear()
        _set_tree(e, shape, on_device)
        trees[on_device] = (_run(e, True, n=48)[0], list(grown))
    (masked, by_mask), (mapped, by_map) = trees[False], trees[True]
    assert masked == mapped and len(by_mask) == len(by_map) > 5
    for a, b in zip(by_mask, by_map):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
        torch.testing.assert_close(a.scores, b.scores, atol=1e-4, rtol=1e-4)


def _chained_target(source, folder):
    """`source` made to say a, b, a, b, ... after the prompt, its attention still feeding the
    stream (o_proj scaled down, not zeroed: each row's K/V in later layers depend on what it
    attended to), written to `folder`."""
    from safetensors.torch import load_file, save_file

    probe = Engine.load(str(source), device="cpu")
    last = probe.tokenizer.apply_chat_template(PROMPT)[-1]
    folder = markov_target(source, folder, {last: A, A: B, B: A})
    original, sd = load_file(source / "model.safetensors"), load_file(folder / "model.safetensors")
    for name in sd:
        if name.endswith("o_proj.weight"):
            sd[name] = 0.05 * original[name]
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@pytest.fixture(scope="module")
def chained(target, tmp_path_factory):
    return _chained_target(target, tmp_path_factory.mktemp("chained") / "t")


A, B, C = 40, 41, 42


# the accepted length each shape reaches here: (3, 3, 12) keeps a -> b under the root (all of depth 2
# is kept); (2, 4, 7) never holds b (top-2: c, a); (4, 2, 9) keeps only c's children and a's first at depth 2
@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
@pytest.mark.parametrize("shape,least", [(SHAPES[0], 2.5), (SHAPES[1], 1.9), (SHAPES[2], 1.9)])
def test_paths_through_later_siblings_leave_plain_decodings_cache(tmp_path, target, chained, shape, least, on_device):
    """The draft ranks c, a, b at every node, the target takes a then b: each verify step accepts a
    path of later siblings, whose K/V move from their rows to their positions. The answer equals
    plain greedy decoding and so does the target's cache, row for row (to fp32 rounding: a wrong
    row, or a row computed with the wrong ancestors, differs by far more)."""
    cfg = read_config(target)
    e = _engine(chained, _ranked_draft(tmp_path, cfg, [C, A, B]))
    plain, _ = _run(e, False, n=40)
    k_plain, v_plain = e.runner.kv.k_all.clone(), e.runner.kv.v_all.clone()
    _set_tree(e, shape, on_device)
    spec, stats = _run(e, True, n=40)
    assert spec == plain and plain[:4] == [A, B, A, B]
    assert stats.accept_len_mean >= least, stats.accept_hist
    rows = len(e.tokenizer.apply_chat_template(PROMPT)) + len(plain) - 1  # every token cached but the last
    torch.testing.assert_close(e.runner.kv.k_all[:, :rows], k_plain[:, :rows], atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(e.runner.kv.v_all[:, :rows], v_plain[:, :rows], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
def test_sampled_tree_speculation_follows_the_target(tmp_path, target, chained, on_device):
    """A target sure of its next token (a, b, a, b, ...) and a draft ranking c, a, b: sampled tree
    decoding gives the target's sequence, accepting a path of a later sibling at every depth."""
    cfg = read_config(target)
    e = _engine(chained, _ranked_draft(tmp_path, cfg, [C, A, B]))
    plain, _ = _run(e, False, n=48)
    _set_tree(e, TreeShape(3, 3, 12), on_device)
    for seed in (1, 2):
        spec, stats = _run(e, True, n=48, temperature=0.7, seed=seed)
        assert spec == plain and plain[:4] == [A, B, A, B]
        assert stats.accept_len_mean >= 2.5  # depth 1 and 2 are whole (a then b); depth 3 under c only


def test_chains_stay_the_default_and_trees_are_checked():
    assert parse_tree("off") is None and parse_tree("8,6,48") == TreeShape(8, 6, 48)
    with pytest.raises(UserError, match="TOPK 1-16"):
        parse_tree("0,4,4")
    with pytest.raises(UserError, match="lower TOKENS"):
        parse_tree("2,2,9")


def test_a_tree_answer_runs_to_the_end_of_the_context(tmp_path, target):
    """Near the end of the context, where a tree's rows no longer fit past the cache, plain steps
    finish the answer: the same tokens as plain decoding, up to the last position."""
    cfg = read_config(target)
    head = write_head(tmp_path / "h", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64,
                      (1, 2, 3))
    e = Engine.load(str(target), draft=str(head), device="cpu", draft_steps=3, max_seq_len=80,
                    tree=TreeShape(3, 3, 12))
    e.tokenizer.eos_token_ids = frozenset()
    plain, _ = _run(e, False, n=200)
    spec, stats = _run(e, True, n=200)
    assert spec == plain
    assert len(plain) == 80 - len(e.tokenizer.apply_chat_template(PROMPT)) + 1  # the last one needs no cache row
    assert stats.verify_steps > 0 and stats.verify_tokens == 13


def test_trees_need_an_eagle3_head(target):
    e = Engine.load(str(target), device="cpu")
    with pytest.raises(UserError, match="needs an EAGLE-3 draft head: no draft is loaded"):
        e.set_tree(TreeShape(2, 2, 4))


def test_auto_picks_the_fastest_shape_and_remembers_it(tmp_path):
    """--tree auto: chains on a CPU without timing anything; elsewhere the fastest of chains and
    the candidate trees by the calibration's tokens/s, cached under the model, draft and device
    (a second engine reads it without calibrating), and a corrupt cache file costs a calibration."""
    from speculative.tree import calibrate as cal
    from speculative.tree.shape import TreeShape

    timed = []

    def timer(engine, shape, prompts, tokens):
        timed.append(str(shape))
        return {None: 100.0, "3,5,8": 140.0, "6,8,15": 120.0}.get(None if shape is None else str(shape), 50.0)

    class Stub:
        device, model_name, draft_name = "cuda", "m", "d"
        shape = "unset"

        def __init__(self, tree_level=True, packed=False, **switches):
            options = SimpleNamespace(tree_level=tree_level, fuse=True, fuse_invariant=True, each_row=False,
                                      **{"tree_one_forward": False, **switches})
            self.runner = SimpleNamespace(model=SimpleNamespace(ops=SimpleNamespace(options=options),
                                                                any_packed_layer=lambda: packed))

        def set_tree(self, shape):
            self.shape = shape

    stub = Stub()
    best, speeds = cal.calibrate(stub, timer=timer)
    assert best == TreeShape(3, 5, 8) and stub.shape == best and speeds["off"] == 100.0
    assert timed[:len(cal.CANDIDATES) + 1] == ["None"] + [str(c) for c in cal.CANDIDATES]  # warm-ups first

    cache = tmp_path / "calibration.json"
    calls = []
    real = cal.calibrate
    try:
        cal.calibrate = lambda engine, candidates: (calls.append(1), real(engine, candidates, timer=timer))[1]
        assert cal.auto_tree(stub, cache) == TreeShape(3, 5, 8) and calls == [1]
        assert cal.auto_tree(Stub(), cache) == TreeShape(3, 5, 8) and calls == [1]  # from the cache
        other = Stub()
        other.draft_name = "another head"
        cal.auto_tree(other, cache)
        assert calls == [1, 1]  # another draft: calibrated anew
        cal.auto_tree(Stub(tree_level=False), cache)
        assert calls == [1, 1, 1]  # the tree step's torch ops, not its kernels: timed anew
        for n, switch in enumerate(cal.TREE_SWITCHES, start=4):  # each switch that changes a step's cost
            cal.auto_tree(Stub(**{switch: True}), cache)
            assert calls == [1] * n, switch
        cal.auto_tree(Stub(**{switch: False for switch in cal.TREE_SWITCHES}), cache)
        assert len(calls) == 3 + len(cal.TREE_SWITCHES)  # switched off: the default's key
        cal.auto_tree(Stub(tree_lookup=4), cache)
        assert len(calls) == 4 + len(cal.TREE_SWITCHES)  # another lookup chain's length: timed anew
        cal.auto_tree(Stub(tree_lookup=4), cache)
        assert len(calls) == 4 + len(cal.TREE_SWITCHES)
        cache.write_text("{not json")
        calls.clear()
        assert cal.auto_tree(Stub(), cache) == TreeShape(3, 5, 8) and calls == [1]
        cpu = Stub()
        cpu.device = "cpu"
        assert cal.auto_tree(cpu, cache) is None and calls == [1]  # chains, nothing timed
    finally:
        cal.calibrate = real
    # trees of more than 15 nodes are candidates only where one forward verifies them
    assert cal.candidates_for(Stub()) == cal.CANDIDATES
    assert cal.candidates_for(Stub(tree_one_forward=True)) == cal.CANDIDATES + (TreeShape(4, 5, 24),)
    assert cal.candidates_for(Stub(tree_one_forward=True, packed=True)) == cal.CANDIDATES
    timed.clear()
    cal.calibrate(Stub(tree_one_forward=True), cal.candidates_for(Stub(tree_one_forward=True)), timer=timer)
    assert "4,5,24" in timed


@pytest.mark.parametrize("shape", [None, TreeShape(3, 3, 12)], ids=["chain", "tree"])
def test_speculation_over_a_packed_quantized_target_equals_plain(tmp_path, monkeypatch, shape):
    """A quantized target whose projections stay packed (forced here on the CPU, as a GPU does
    where the dense model does not fit): greedy speculation, chains and trees, gives plain
    decoding's tokens, and the projections are PackedLinears."""
    import engine.loader as loader
    from engine.packed_linear import PackedLinear
    from tests.tiny_quant import awq_target_with_head

    target, head = awq_target_with_head(tmp_path)
    monkeypatch.setattr(loader, "packs_weights", lambda device, dtype, options, *rest: True)
    e = _engine(target, head)
    assert isinstance(e.runner.model.model.layers[0].mlp.down_proj, PackedLinear)
    plain, _ = _run(e, False, n=48)
    e.speculator.set_tree(shape)
    spec, stats = _run(e, True, n=48)
    assert spec == plain and stats.verify_steps > 0


def test_auto_trees_serve_greedy_answers_and_sampled_ones_keep_the_chain(tmp_path, target, monkeypatch):
    """--tree auto's shape is timed greedily, and a sampled tree step is slower than the chain: under
    auto, greedy answers draft trees and sampled ones chains; a shape the user names drafts trees
    for both."""
    from speculative.eagle3.speculator import Eagle3Speculator

    cfg = read_config(target)
    e = _engine(target, write_head(tmp_path / "h0", cfg, "sglang",
                                   head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=1), 64, (1, 2, 3)))
    shape = TreeShape(3, 3, 12)
    monkeypatch.setattr(Eagle3Speculator, "auto_tree", lambda self, engine, log=None: shape)
    e.set_tree("auto")
    assert e.speculator.tree == shape
    _, greedy = _run(e, True, n=32)
    _, sampled = _run(e, True, n=32, temperature=0.8, seed=3)
    assert greedy.verify_tokens == shape.tokens + 1
    assert sampled.verify_steps > 0 and sampled.verify_tokens == e.speculator.k + 1
    e.set_tree(shape)
    _, sampled = _run(e, True, n=32, temperature=0.8, seed=3)
    assert sampled.verify_tokens == shape.tokens + 1
