"""benchmarks/tree_acceptance.py: the accepted lengths it derives for each tree shape from one
recorded growth a position are those the engine's own runs of that shape have."""

import pytest

from benchmarks.tree_acceptance import accepted, record_growths, walk_steps
from engine.types import SamplingParams
from speculative.tree.shape import TreeShape
# the tree tests' fixtures: their tiny target, and the same target saying a, b, a, b, ...
from tests.speculative.test_tree_engine import A, B, C, PROMPT, _engine, _ranked_draft, chained, target  # noqa: F401
from tests.tiny import read_config


def test_a_step_accepts_the_deepest_kept_node_on_the_answers_path():
    # root's children: 5 (score -0.1), 6 (-0.5); 5's children 7 (-0.3), 8 (-0.9); 6's child 9 (-0.6)
    growth = (10, [5, 6, 7, 8, 9], [-1, -1, 0, 0, 1], [1, 1, 2, 2, 2], [-0.1, -0.5, -0.3, -0.9, -0.6])
    assert accepted(growth, [5, 7, 1], 2, 5) == 2
    assert accepted(growth, [5, 7, 1], 1, 5) == 1  # depth 1 only
    assert accepted(growth, [5, 8], 2, 3) == 1  # 8 is not among the best 3 (-0.1, -0.3, -0.5)
    assert accepted(growth, [6, 9], 2, 5) == 2 and accepted(growth, [6, 9], 2, 3) == 1
    assert accepted(growth, [4, 7], 2, 5) == 0 and accepted(growth, [], 2, 5) == 0


def test_the_walk_moves_by_each_steps_accepted_length():
    # a sequence 0..9; at every position the tree holds the next two tokens as a chain
    seq = list(range(10))
    growths = [(n, [n + 1, n + 2], [-1, 0], [1, 2], [-0.1, -0.2]) for n in range(3, 9)]
    # from 3: accepts 4, 5 (+ the target's 6) -> 6: 7, 8 (+ 9) -> 9: the end
    assert walk_steps(seq, growths, 2, 2) == (2, 6)
    assert walk_steps(seq, growths, 1, 1) == (3, 6)  # 3 -> 5 -> 7 -> 9


@pytest.fixture(scope="module")
def engine(target, chained, tmp_path_factory):
    """The tree tests' target that says a, b, a, b, ... and a draft ranking c, a, b at every node
    (all its scores tied): each step accepts a path of later siblings, as deep as the shape's
    kept nodes allow."""
    return _engine(chained, _ranked_draft(tmp_path_factory.mktemp("ranked"), read_config(target), [C, A, B]))


# accepted lengths from 1 (c's children alone kept at depth 2) to 4
@pytest.mark.parametrize("shape", [TreeShape(3, 3, 12), TreeShape(2, 4, 7), TreeShape(4, 2, 9), TreeShape(3, 4, 30),
                                   TreeShape(1, 4, 4), TreeShape(3, 2, 5)])
def test_the_shapes_steps_equal_the_engines_run_of_that_shape(engine, shape):
    """Recorded once with topk = the shape's and depth 4, then walked: the same verify steps and
    tokens as the engine decoding with that shape (lossless: the same answer)."""
    e = engine
    ids = e.tokenizer.apply_chat_template(PROMPT)
    [(seq, growths)] = record_growths(e, shape.topk, 4, [ids], 40, log=lambda text: None)
    e.set_tree(shape)
    e.reset()
    events = list(e.stream_ids(ids, SamplingParams(max_tokens=40), speculative=True))
    assert seq == ids + [t for ev in events for t in ev.token_ids]  # lossless either way
    steps, made = walk_steps(seq, growths, shape.depth, shape.tokens)
    assert steps == events[-1].stats.verify_steps > 0
    assert made == round(events[-1].stats.accept_len_mean * steps)
