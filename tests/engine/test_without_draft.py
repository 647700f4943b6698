"""Engine.without_draft: the engine a user gets by unloading the draft, built over the same weight
tensors (no second copy) with the kernels of a target without a draft, a KV cache of its own, and
the same greedy tokens as an engine loaded with no draft."""

from __future__ import annotations

import pytest

from engine.engine import Engine, twin_fits
from engine.options import KernelOptions
from engine.types import SamplingParams

PROMPTS = ([{"role": "user", "content": "Paris is the capital of"}],
           [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Numbers: 0 1 2 3"}])


@pytest.fixture(scope="module")
def with_draft(tiny_models, tmp_path_factory):
    from tests.speculative.heads import head_tensors, write_head
    from tests.tiny import read_config

    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path_factory.mktemp("head"), cfg, "sglang",
                      head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64, (0, 1, 2))
    return Engine.load(str(tiny_models["llama"]), draft=str(head), device="cpu", options=KernelOptions(spec_alts=1))


def test_the_twin_shares_every_weight_and_nothing_else(with_draft):
    twin = with_draft.without_draft()
    assert twin is with_draft.without_draft() and twin.speculator is None and not twin.has_draft
    mine = dict(with_draft.runner.model.named_parameters())
    theirs = dict(twin.runner.model.named_parameters())
    assert mine.keys() == theirs.keys()
    for name, p in mine.items():
        assert theirs[name].data_ptr() == p.data_ptr() and theirs[name].shape == p.shape, name
    assert twin.runner.model.cos_sin.data_ptr() == with_draft.runner.model.cos_sin.data_ptr()
    assert twin.runner.kv.k_all.data_ptr() != with_draft.runner.kv.k_all.data_ptr()
    assert twin.runner.max_len == with_draft.runner.max_len
    # the kernels of a target without a draft; the other switches as they were
    assert twin.runner.model.ops.options == KernelOptions(spec_alts=1)
    assert with_draft.runner.model.ops.options == KernelOptions(spec_alts=1, batch_invariant=True)


def test_the_twin_decodes_what_an_engine_without_a_draft_decodes(with_draft, tiny_models):
    plain = Engine.load(str(tiny_models["llama"]), device="cpu")
    assert plain.without_draft() is plain
    twin = with_draft.without_draft()
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    for messages in PROMPTS:
        want = plain.generate(messages, params)
        got = twin.generate(messages, params)
        assert got.token_ids == want.token_ids and len(got.token_ids) == 24
        assert not got.stats.draft_loaded and not got.stats.speculative
        spec = with_draft.generate(messages, params, speculative=True)
        assert spec.token_ids == want.token_ids and spec.stats.draft_loaded


def test_a_twin_is_built_only_where_it_leaves_memory_free():
    gib = 1 << 30
    assert twin_fits(10 * gib, None, None)  # the CPU: not counted
    assert twin_fits(1 * gib, 4 * gib, 40 * gib)
    assert not twin_fits(1 * gib, 2 * gib, 40 * gib)  # 1 GiB left: under 5% of 40
    assert not twin_fits(3 * gib, 3.5 * gib, 8 * gib)  # under the 1 GiB floor
