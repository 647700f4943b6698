"""Greedy speculation gives exactly the tokens of plain decoding, on the GPU, as a user meets it:
the demo model and its shipped drafts, 40 varied instruction-style requests the drafts were never
trained on, under the app's default system prompt, answers ending at EOS (up to 512 tokens).

On a GPU the verify step's rows must carry the bits of the decode steps they stand for (batch
invariance); a row whose rounding differs flips a near-tied token sooner or later, and the
answer parts from plain decoding there. benchmarks/find_difference.py locates such a difference.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

PROMPTS = Path(__file__).resolve().parents[2] / "benchmarks" / "prompts" / "identity_requests.txt"

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


@pytest.mark.parametrize("draft,tree,variant", [("demo-eagle3", None, ""), ("demo-eagle3", None, "chain alone"),
                                               ("demo-mtp", None, ""), ("demo-mtp", None, "mtp graph"),
                                               ("demo-eagle3", "3,3,12", ""), ("demo-eagle3", "4,5,24", ""),
                                               ("demo-eagle3", "4,8,15", ""), ("demo-eagle3", "4,8,24", ""),
                                               ("demo-eagle3", "4,8,24", "two forwards"),
                                               ("demo-eagle3", "4,8,15", "no lookup"),
                                               ("demo-eagle3", "4,4,15", "")])
def test_greedy_speculation_is_plain_decoding_token_for_token(draft, tree, variant, demo_gguf):
    """Chains of the EAGLE-3 head (with its runners-up, and the chain alone) and of the MTP layers
    (step by step, and one graph an iteration), and the head's draft trees (13, 16 and 25 verify
    rows a step; 25 in one forward, the invariant tiles over 16-row blocks, and with
    tree_one_forward off in two), each with the default prompt-lookup chain of 8 in the tree's last
    places, and 4,8,15 without one."""
    from app.settings import Settings
    from engine.engine import Engine
    from engine.options import KernelOptions
    from engine.types import SamplingParams
    from speculative.tree.shape import parse_tree

    requests = [line for line in PROMPTS.read_text().splitlines() if line.strip()]
    assert len(requests) >= 32
    # the LOCALCHAT_* switches of the environment (a variant timed before it becomes the default)
    options = dataclasses.replace(KernelOptions.from_env(), mtp_graph=variant == "mtp graph",
                                  **({"tree_one_forward": False} if variant == "two forwards" else {}),
                                  **({"tree_lookup": 0} if variant == "no lookup" else {}))
    engine = Engine.load("demo", draft=draft, device="cuda", options=options)
    if variant == "mtp graph":
        assert engine.speculator.greedy.graph is not None
    if variant == "chain alone":
        assert engine.speculator.runners_up
        engine.speculator.use_runners_up(False)
        assert not engine.speculator.runners_up
    if tree is not None:
        engine.set_tree(parse_tree(tree))
        step = engine.speculator.tree_step(parse_tree(tree))
        assert step.lookup == min(options.tree_lookup, step._kept)  # a chain may go deeper than the tree
        assert step.depth == max(step.tree_depth, step.lookup)
    params = SamplingParams(max_tokens=512)
    system = [{"role": "system", "content": Settings().system_prompt}]
    differing, spec_steps = [], 0
    for text in requests:
        ids = engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": text}])
        engine.reset()
        plain = [t for e in engine.stream_ids(ids, params, speculative=False) for t in e.token_ids]
        engine.reset()
        events = list(engine.stream_ids(ids, params, speculative=True))
        spec = [t for e in events for t in e.token_ids]
        spec_steps += sum(events[-1].stats.accept_hist)
        if spec != plain:
            first = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), min(len(plain), len(spec)))
            differing.append((text[:40], first, len(plain), len(spec)))
    assert spec_steps > 0, "speculation never ran a verify step"
    if variant == "chain alone":  # captured on its first answer
        assert engine.speculator.greedy.graph is not None and not any(engine.speculator.greedy.alts)
    assert not differing, f"{len(differing)} of {len(requests)} answers differ (request, first token, lengths): {differing}"


@pytest.mark.parametrize("top_p", [1.0, 0.9], ids=["temperature", "top_p"])
def test_a_sampled_tree_steps_graph_draws_what_its_eager_step_draws(top_p, demo_gguf):
    """Sampling through a draft tree: the captured step (one for temperature alone, one with the
    cuts) gives, from the same seed, the tokens the same step run eagerly gives, and stops
    where plain sampling would (both read the draws from the request's generator)."""
    from app.settings import Settings
    from engine.engine import Engine
    from engine.types import SamplingParams
    from speculative.tree.shape import parse_tree

    requests = [line for line in PROMPTS.read_text().splitlines() if line.strip()][:6]
    system = [{"role": "system", "content": Settings().system_prompt}]
    answers = {}
    for graphs in (True, False):
        engine = Engine.load("demo", draft="demo-eagle3", device="cuda", use_graphs=graphs)
        engine.set_tree(parse_tree("3,3,12"))
        got = []
        for seed, text in enumerate(requests):
            ids = engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": text}])
            engine.reset()
            params = SamplingParams(max_tokens=256, temperature=0.7, top_p=top_p, seed=seed)
            events = list(engine.stream_ids(ids, params, speculative=True))
            assert events[-1].stats.verify_steps > 0
            got.append([t for e in events for t in e.token_ids])
        tree = engine.speculator.tree_step(parse_tree("3,3,12"))
        assert (tree.graphs.get(top_p < 1.0) is not None) == graphs
        answers[graphs] = got
        del engine
    assert answers[True] == answers[False]


def test_runners_up_switched_back_and_forth_answer_as_plain_decoding(demo_gguf):
    """The first-load measurement switches an EAGLE-3 head between its runners-up and the chain
    alone (Eagle3Speculator.use_runners_up): each greedy iteration's graph is captured once, on its
    first answer, and either, in any order, gives plain decoding's tokens."""
    from app.settings import Settings
    from engine.engine import Engine
    from engine.types import SamplingParams

    requests = [line for line in PROMPTS.read_text().splitlines() if line.strip()][:4]
    engine = Engine.load("demo", draft="demo-eagle3", device="cuda")
    spec = engine.speculator
    assert spec.runners_up_choice and spec.runners_up
    params = SamplingParams(max_tokens=256)
    system = [{"role": "system", "content": Settings().system_prompt}]
    for text in requests:
        ids = engine.tokenizer.apply_chat_template(system + [{"role": "user", "content": text}])
        engine.reset()
        plain = [t for e in engine.stream_ids(ids, params, speculative=False) for t in e.token_ids]
        for on in (True, False, True, False):
            spec.use_runners_up(on)
            engine.reset()
            events = list(engine.stream_ids(ids, params, speculative=True))
            assert [t for e in events for t in e.token_ids] == plain, (text[:40], on)
            assert events[-1].stats.verify_steps > 0 and spec.greedy.graph is not None
