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
    tokens as the engine decoding with that shape and its own prompt-lookup chain in place
    (lossless: the same answer)."""
    e = engine
    ids = e.tokenizer.apply_chat_template(PROMPT)
    [(seq, growths)] = record_growths(e, shape.topk, 4, [ids], 40, log=lambda text: None)
    e.set_tree(shape)
    e.reset()
    events = list(e.stream_ids(ids, SamplingParams(max_tokens=40), speculative=True))
    assert seq == ids + [t for ev in events for t in ev.token_ids]  # lossless either way
    lookup = e.speculator.tree_step(shape).lookup  # KernelOptions.tree_lookup's, as deep as the shape
    steps, made = walk_steps(seq, growths, shape.depth, shape.tokens, lookup, in_place=True)
    assert steps == events[-1].stats.verify_steps > 0
    # a chain may run past the answer's last token, where the recorded answer has nothing to walk
    stats = events[-1].stats
    assert made == min(round(stats.accept_len_mean * steps), stats.generated_tokens)


def test_lookup_proposes_what_followed_the_latest_earlier_occurrence():
    from benchmarks.tree_acceptance import lookup

    # the last 3 tokens (7, 8, 9) occurred at 1..3 and at 5..7 (the latest: 10, 11 followed)
    ctx = [0, 7, 8, 9, 1, 7, 8, 9, 10, 11, 2, 7, 8, 9]
    assert lookup(ctx, 2) == [10, 11] and lookup(ctx, 9) == [10, 11, 2, 7, 8, 9]
    assert lookup([5, 6, 1, 2, 6], 3) == []  # no earlier (2, 6): a single token's match proposes nothing
    # 4 tokens first: (1, 2, 3, 4) at 0 wins over the later (2, 3, 4) at 6
    assert lookup([1, 2, 3, 4, 9, 5, 2, 3, 4, 8, 1, 2, 3, 4], 2) == [9, 5]
    assert lookup([1, 2, 3], 4) == [] and lookup([4], 4) == []
    # caps: the chain's length by its match's; a match whose cap is 0 proposes nothing
    assert lookup(ctx, 9, {4: 9, 3: 3, 2: 1}) == [10, 11, 2]
    assert lookup([1, 2, 3, 4, 9, 5, 2, 3, 4, 8, 1, 2, 3, 4], 9, {4: 1, 3: 9, 2: 9}) == [9]
    assert lookup([0, 5, 6, 1, 2, 5, 6], 4, {4: 4, 3: 4, 2: 0}) == []
    assert lookup([0, 5, 6, 1, 2, 5, 6], 4, {4: 4, 3: 4, 2: 2}) == [1, 2]


def test_lookup_over_earlier_answers_prefers_the_conversations_own():
    """earlier: other conversations' answers (each after a -1) searched as if before the context,
    the context's own occurrences first; fallback: they only where the context has none."""
    from benchmarks.tree_acceptance import lookup

    earlier = [-1, 3, 4, 5, 6, 7, -1, 8, 4, 5, 9]
    assert lookup([1, 4, 5], 2) == []  # nothing earlier in the conversation
    assert lookup([1, 4, 5], 2, earlier=earlier) == [9]  # the second answer's 4, 5: its chain ends with it
    assert lookup([1, 4, 5], 2, earlier=earlier, fallback=True) == [9]
    assert lookup([1, 4, 5], 3, earlier=earlier[:6]) == [6, 7]  # the latest occurrence, up to its answer's end
    own = [4, 5, 2, 0, 4, 5]  # the conversation's own (4, 5) comes first either way
    assert lookup(own, 2, earlier=earlier) == [2, 0] == lookup(own, 2, earlier=earlier, fallback=True)
    # the context's own (6, 4) against an earlier answer's (5, 6, 4): the longer match wins, unless
    # earlier answers are only the fallback
    ctx = [6, 4, 3, 1, 5, 6, 4]
    assert lookup(ctx, 1, earlier=[-1, 5, 6, 4, 8]) == [8]
    assert lookup(ctx, 1, earlier=[-1, 5, 6, 4, 8], fallback=True) == [3] == lookup(ctx, 1)


def test_lookup_caps_parse_or_fail_in_one_line():
    from benchmarks.tree_acceptance import _caps

    assert _caps("14/12/6") == {4: 14, 3: 12, 2: 6}
    for bad in ("14/12", "a/b/c", "0/0/0", "4/-1/2"):
        with pytest.raises(SystemExit, match="--lookup-caps") as e:
            _caps(bad)
        assert "\n" not in str(e.value)


def test_the_walk_with_lookup_takes_the_longer_path_and_counts_the_rows_it_adds():
    # the answer repeats its first tokens: 1 2 3 4 | 1 2 3 4 5; the tree holds only the next token
    seq = [9, 1, 2, 3, 4, 1, 2, 3, 4, 5]
    growths = [(n, [seq[n + 1] if n + 1 < len(seq) else 0], [-1], [1], [-0.1]) for n in range(0, 9)]
    assert walk_steps(seq, growths, 1, 1) == (5, 10)  # 0 -> 2 -> 4 -> 6 -> 8 -> 10 (the last past the end)
    rows: list[int] = []
    # 0 -> 2 -> 4 -> 6 on the tree's one draft (nothing in the context repeats yet); at 6 the
    # context ends 1 2, seen at 1: lookup proposes 3 4 1 2, accepting 3 4 (then 1 is not 5) -> 9
    steps, made = walk_steps(seq, growths, 1, 1, lookup_len=4, rows=rows)
    assert (steps, made) == (4, 9) and len(rows) == steps
    assert rows[-1] == 4 - 1  # the proposal's first token is the tree's kept node: 3 rows added


def test_lookup_in_place_takes_the_lowest_scored_nodes_places():
    # a tree of 3 kept nodes at the root: 5 (-0.1), 6 (-0.2), 7 (-0.3), and the context 1 2 8 1 2
    # proposing 8 1 (what followed the earlier 1 2): in place, the chain's 2 nodes take 6's and 7's
    growth = (4, [5, 6, 7], [-1, -1, -1], [1, 1, 1], [-0.1, -0.2, -0.3])
    seq = [1, 2, 8, 1, 2, 8, 1]
    rows: list[int] = []
    assert walk_steps(seq, [growth], 2, 3, lookup_len=2, rows=rows, in_place=True) == (1, 3)
    assert rows == [2]
    seq = [1, 2, 8, 1, 2, 6, 1]  # the tree's 6 would have been taken, but its place went to the chain
    assert walk_steps(seq, [growth], 2, 3, lookup_len=2, in_place=True) == (1, 1)
    assert walk_steps(seq, [growth], 2, 3, lookup_len=2) == (1, 2)  # beside the tree: 6 stays
