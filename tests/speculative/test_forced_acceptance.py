"""speculative/testing.py: the random EAGLE-3 head is built as a loaded head is (the draft's kernels,
on a batch-invariant target, the same dtypes), and forced acceptance gives each verify step the
accepted length it names, with either speculator."""

import pytest
import torch

from engine.engine import Engine
from engine.loader import load_folder
from engine.options import KernelOptions
from engine.runner import ModelRunner
from engine.types import SamplingParams
from speculative.build import build_speculator, draft_ops
from speculative.mtp.speculator import MTPSpeculator
from speculative.testing import ForcedEagle3Speculator, forced_acceptance, random_eagle3
from tests.speculative.heads import head_tensors, write_head
from tests.speculative.mtp_layers import random_layers, write_localchat_mtp
from tests.tiny import read_config

PROMPT = list(range(3, 20))


def _target(folder, dtype=torch.float32, batch_invariant=True, spec_alts=None):
    loaded = load_folder(folder, torch.device("cpu"), dtype, 256,
                         KernelOptions(batch_invariant=batch_invariant, spec_alts=spec_alts))
    return ModelRunner(loaded.model, 256), loaded


def test_the_random_head_is_built_as_a_loaded_one(tmp_path, tiny_models):
    """bf16, where building the head in fp32 and casting it would also cast its fp32 RoPE table."""
    runner, loaded = _target(tiny_models["llama"], torch.bfloat16)
    cfg = read_config(tiny_models["llama"])
    head = write_head(tmp_path / "head", cfg, "sglang", head_tensors(64, 64, 3, cfg["vocab_size"], 200), 64,
                      (1, 2, 2))
    real = build_speculator(head, runner, loaded.config, 3).draft
    forced = random_eagle3(runner, 3, 2)
    assert isinstance(forced, ForcedEagle3Speculator)
    assert forced.draft.ops.options == draft_ops(runner).options and not forced.draft.ops.options.batch_invariant
    assert runner.model.ops.options.batch_invariant
    assert {n: b.dtype for n, b in forced.draft.named_buffers()} == {n: b.dtype for n, b in real.named_buffers()}
    assert forced.draft.cos_sin.dtype == torch.float32
    assert {p.dtype for p in forced.draft.parameters()} == {torch.bfloat16}


def test_a_draft_needs_a_batch_invariant_target(tiny_models):
    runner, _ = _target(tiny_models["llama"], batch_invariant=False)
    with pytest.raises(AssertionError, match="batch_invariant"):
        random_eagle3(runner, 3, 2)


@pytest.mark.parametrize("params", [dict(), dict(temperature=0.8, seed=3), dict(repetition_penalty=1.3)],
                         ids=["greedy", "sampled", "penalty"])
def test_every_verify_step_gives_the_forced_length(tiny_models, params):
    runner, loaded = _target(tiny_models["llama"])
    spec = random_eagle3(runner, 3, 3)
    engine = Engine(runner, loaded.tokenizer, "tiny", spec, "random head")
    stats = list(engine.stream_ids(PROMPT, SamplingParams(max_tokens=13, ignore_eos=True, **params)))[-1].stats
    assert stats.generated_tokens == 13 and stats.verify_steps == 4  # the first token, then 4 steps of 3
    assert stats.accept_len_mean == 3 and stats.accept_hist == [0, 0, 0, 4]
    # greedy answers run the whole iteration a real head's run (forced inside it), the others the loop
    assert int(spec.greedy.force.counter) == (4 if not params else 0)


def test_the_whole_iteration_draws_a_heads_spread(tiny_models):
    """A mean that is not a whole number, inside the greedy whole iteration: verify steps of every
    length, 3.5 tokens on average (each draft accepted at one rate while the run lasts), the same
    draws in a second engine (seeded), and runners-up never taken in place of the forced choice."""
    from speculative.testing import draft_acceptance_rate

    hists = []
    for _ in range(2):
        runner, loaded = _target(tiny_models["llama"])
        spec = random_eagle3(runner, 5, 3.5)
        assert spec.greedy.num_alts == 0  # CPU: the chain alone
        engine = Engine(runner, loaded.tokenizer, "tiny", spec, "random head")
        stats = list(engine.stream_ids(PROMPT, SamplingParams(max_tokens=220, ignore_eos=True)))[-1].stats
        hists.append(stats.accept_hist)
        assert int(spec.greedy.force.counter) == stats.verify_steps
    assert hists[0] == hists[1]
    hist, steps = hists[0], sum(hists[0])
    assert steps > 45 and all(hist[n] for n in range(1, 7)), hist
    mean = sum(n * c for n, c in enumerate(hist)) / steps
    assert 3.0 < mean < 4.0, (mean, hist)
    rate = draft_acceptance_rate(3.5, 5)
    assert hist[1] / steps == pytest.approx(1 - rate, abs=0.15)  # the first draft rejected


def test_forced_drafts_skip_the_runners_up():
    """With runners-up rows, none of them equals the target's next token, so the forced count stands."""
    from speculative.testing import ForcedDrafts

    k, vocab = 3, 10
    ids = torch.zeros(k + 1 + 2, dtype=torch.long)
    force = ForcedDrafts(ids, k, 3, vocab)  # 2 drafts accepted
    logits = torch.full((k + 1 + 2, vocab), -1.0)
    for row, tok in enumerate([4, 9, 2, 7, 0, 0]):
        logits[row, tok] = 1.0
    force(logits)
    assert ids[1:k + 1].tolist() == [4, 9, 3]  # the target's first two choices, then not its third
    assert ids[k + 1:].tolist() == [3, 3]  # not the target's choice after the two (2)


def test_mtp_takes_the_forced_rule(tmp_path, tiny_models):
    runner, loaded = _target(tiny_models["llama"])
    cfg = read_config(tiny_models["llama"])
    layers = write_localchat_mtp(tmp_path / "mtp", cfg, random_layers(2, cfg, seed=2), chain=True)
    draft = build_speculator(layers, runner, loaded.config, 2).draft
    engine = Engine(runner, loaded.tokenizer, "tiny", MTPSpeculator(draft, runner, 2, accept=forced_acceptance(2)))
    stats = list(engine.stream_ids(PROMPT, SamplingParams(max_tokens=9, ignore_eos=True)))[-1].stats
    assert stats.verify_steps == 4 and stats.accept_hist == [0, 0, 4]


def test_forced_length_is_within_the_verify_step():
    with pytest.raises(ValueError, match="k \\+ 1 = 4"):
        ForcedEagle3Speculator(None, None, 3, 5)


def test_the_chain_alone_is_forced_as_well(tiny_models):
    """use_runners_up(False) swaps in a greedy iteration without runners-up rows; a forced head
    forces that one too (its own draws), and back with them the first iteration is reused."""
    runner, loaded = _target(tiny_models["llama"], spec_alts="auto")  # the GPU's shaped runners-up, on the CPU
    spec = random_eagle3(runner, 3, 3)
    assert spec.runners_up_choice and spec.runners_up and spec.greedy.num_alts > 0
    shaped = spec.greedy
    engine = Engine(runner, loaded.tokenizer, "tiny", spec, "random head")
    params = SamplingParams(max_tokens=13, ignore_eos=True)
    with_alts = list(engine.stream_ids(PROMPT, params))[-1].stats
    spec.use_runners_up(False)
    assert not spec.runners_up and spec.greedy is not shaped and spec.greedy.width == 4
    assert spec.greedy.force is not shaped.force and spec.greedy.force.ids is spec.greedy.ids
    engine.reset()
    alone = list(engine.stream_ids(PROMPT, params))[-1].stats
    assert alone.accept_hist == with_alts.accept_hist == [0, 0, 0, 4]
    assert int(spec.greedy.force.counter) == 4 and int(shaped.force.counter) == 4
    spec.use_runners_up(True)
    assert spec.greedy is shaped
