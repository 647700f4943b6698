"""Prompt-lookup chains in greedy draft trees (speculative/tree/lookup.py): the proposal is the
benchmark's rule, the merged tree keeps the best nodes and the chain in as many rows, and the
engine with it stays lossless, accepting what the benchmark's walk says it would."""

import random

import pytest
import torch

from benchmarks.tree_acceptance import lookup, walk_steps
from speculative.tree.accept import greedy_tree_path
from speculative.tree.grow import DraftTree, tree_slot_map, verify_rows
from speculative.tree.lookup import lookup_proposal, merge_lookup, record_step
from speculative.tree.shape import TreeShape
from tests.speculative.test_tree_engine import A, B, C, _engine, _ranked_draft, _run, _set_tree, chained, target  # noqa: F401
from tests.speculative.test_tree_level import DEVICES, INTERPRET
from tests.tiny import read_config


def test_the_proposal_is_the_benchmarks_lookup():
    rng = random.Random(0)
    for _ in range(300):
        seq = [rng.randrange(4) for _ in range(rng.randrange(1, 30))]
        history = torch.tensor(seq + [rng.randrange(4) for _ in range(8)])  # tokens past n: never read
        n, length = rng.randrange(len(seq)), rng.randrange(1, 9)
        want = lookup(seq[:n + 1], length)
        proposal, count = lookup_proposal(history, torch.tensor(n), length)
        assert int(count) == len(want) and proposal[:len(want)].tolist() == want, (seq, n, length)


def test_no_earlier_occurrence_proposes_nothing():
    proposal, count = lookup_proposal(torch.tensor([5, 6, 7, 8, 0, 0]), torch.tensor(3), 4)
    assert int(count) == 0 and proposal.shape == (4,)


def _tree(rng, nodes, vocab):
    """A random kept tree in verify order (by depth, scores falling along each path, siblings
    distinct), its target ids the draft ids."""
    parents, depths, scores, tokens = [], [], [], []
    for i in range(nodes):
        free = {p: [t for t in range(vocab) if t not in {tokens[j] for j in range(i) if parents[j] == p}]
                for p in range(-1, i)}
        p = rng.choice([q for q, ts in free.items() if ts])  # a node (or the root) with a token to spare
        free = free[p]
        parents.append(p)
        depths.append(1 if p < 0 else depths[p] + 1)
        scores.append((0.0 if p < 0 else scores[p]) - rng.random())
        tokens.append(rng.choice(free))
    order = sorted(range(nodes), key=lambda i: (depths[i], i))
    where = {old: new for new, old in enumerate(order)}
    tree = DraftTree(torch.tensor([tokens[i] for i in order]),
                     torch.tensor([where[parents[i]] if parents[i] >= 0 else -1 for i in order]),
                     torch.tensor([depths[i] for i in order]), torch.tensor([scores[i] for i in order]))
    return tree


def _kept_best(tree, m):
    rank = sorted(range(len(tree)), key=lambda i: (-float(tree.scores[i]), i))
    return set(rank[:m])


@pytest.mark.parametrize("seed", range(40))
def test_the_merged_tree_holds_the_best_nodes_and_the_chain_in_as_many_rows(seed):
    rng = random.Random(seed)
    nodes, vocab = rng.randrange(3, 20), rng.randrange(2, 6)
    tree = _tree(rng, nodes, vocab)
    n = torch.tensor(50)
    verify = verify_rows(tree, torch.zeros(vocab, dtype=torch.long), n, torch.tensor([9]), 12)
    length = rng.randrange(1, min(8, nodes) + 1)
    proposal = torch.tensor([rng.randrange(vocab) for _ in range(length)])
    count = torch.tensor(rng.randrange(length + 1))
    merged = merge_lookup(verify, proposal, count, n)
    N = len(tree)
    assert merged.parents.shape == (N,) and merged.ids.shape == (N + 1,)
    parents, depths, ids = merged.parents.tolist(), merged.depths.tolist(), merged.ids[1:].tolist()
    for i, p in enumerate(parents):  # a tree in depth order: parents first, siblings distinct
        assert p < i and depths[i] == (1 if p < 0 else depths[p] + 1)
        assert [ids[j] for j, q in enumerate(parents) if q == p].count(ids[i]) == 1
    assert merged.positions.tolist() == [50] + [50 + d for d in depths]
    slot_map, base = tree_slot_map(merged.parents, merged.depths, n, 13)
    assert torch.equal(merged.slot_map, slot_map) and torch.equal(merged.map_base, base)

    def spelled(tokens_ids, parents_, cont):  # how many of cont a path spells
        at, c = -1, 0
        while c < len(cont):
            nxt = [i for i, q in enumerate(parents_) if q == at and tokens_ids[i] == cont[c]]
            if not nxt:
                break
            at, c = nxt[0], c + 1
        return c

    chain = proposal[:int(count)].tolist()
    assert spelled(ids, parents, chain) == len(chain)  # the whole chain is there
    # the rest are the best nodes of the tree: as many as the chain leaves room for, their paths whole
    paths = {tuple(ids[j] for j in _path(parents, i)) for i in range(N)}
    old_ids, old_parents = tree.tokens.tolist(), tree.parents.tolist()
    for m in range(N, -1, -1):
        best = _kept_best(tree, m)
        kept_paths = {tuple(old_ids[j] for j in _path(old_parents, i)) for i in best}
        chain_paths = {tuple(chain[:c + 1]) for c in range(len(chain))}
        if len(kept_paths | chain_paths) <= N:
            assert paths == kept_paths | chain_paths, (m, paths, kept_paths, chain_paths)
            break
    # and a greedy walk over it accepts the longer of the two
    for _ in range(10):
        cont = [rng.randrange(vocab) for _ in range(8)]
        choice = torch.tensor([cont[min(depths[i] if i >= 0 else 0, 7)] for i in [-1] + list(range(N))])
        _, accepted, _ = greedy_tree_path(DraftTree(merged.ids[1:], merged.parents, merged.depths, merged.scores),
                                          choice, 12)
        assert int(accepted) == spelled(ids, parents, cont)


def _path(parents, i):
    out = []
    while i >= 0:
        out.append(i)
        i = parents[i]
    return out[::-1]


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
def test_lookup_accepts_the_repeats_the_tree_misses_and_stays_lossless(tmp_path, target, chained, on_device,
                                                                        monkeypatch):
    """The target says a, b, a, b, ...; the draft ranks c, a, b at every node, so 2,4,7 trees never
    hold b (accepted length under 2). With a lookup chain the repeats are proposed: longer
    steps, the answer and the target's cache still plain decoding's, and the steps those that
    benchmarks/tree_acceptance.py's walk derives for the chain in place."""
    from benchmarks.tree_acceptance import record_growths

    cfg = read_config(target)
    shape = TreeShape(2, 4, 7)
    runs = {}
    for lookup_len in (0, 4, 6):  # 6: a chain deeper than the tree's 4 levels
        monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", str(lookup_len))
        e = _engine(chained, _ranked_draft(tmp_path / str(lookup_len), cfg, [C, A, B]))
        plain, _ = _run(e, False, n=40)
        k_plain, v_plain = e.runner.kv.k_all.clone(), e.runner.kv.v_all.clone()
        _set_tree(e, shape, on_device)
        assert e.speculator.tree_step(shape).lookup == lookup_len
        assert e.speculator.tree_step(shape).depth == max(shape.depth, lookup_len)
        spec, stats = _run(e, True, n=40)
        assert spec == plain and plain[:4] == [A, B, A, B]
        rows = len(e.tokenizer.apply_chat_template(_prompt())) + len(plain) - 1
        torch.testing.assert_close(e.runner.kv.k_all[:, :rows], k_plain[:, :rows], atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(e.runner.kv.v_all[:, :rows], v_plain[:, :rows], atol=1e-5, rtol=1e-4)
        runs[lookup_len] = stats
        if lookup_len:
            # the benchmark's walk over the growths of this shape, the chain in place
            monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", "0")
            probe = _engine(chained, _ranked_draft(tmp_path / "probe", cfg, [C, A, B]))
            _set_tree(probe, shape, False)
            ids = probe.tokenizer.apply_chat_template(_prompt())
            [(seq, growths)] = record_growths(probe, shape.topk, shape.depth, [ids], 40, log=lambda text: None)
            steps, made = walk_steps(seq, growths, shape.depth, shape.tokens, lookup_len, in_place=True)
            assert steps == stats.verify_steps
            assert made == round(stats.accept_len_mean * steps)
    # the latest earlier b, a, b is two tokens back: a proposal of two (what followed it up to the root)
    assert runs[0].accept_len_mean < 2 and runs[4].accept_len_mean > 2.5, (runs[0].accept_hist, runs[4].accept_hist)
    # a walk of 6 under a tree of 4 levels (its chains here two long: the pattern's period)
    assert runs[6].accept_hist == runs[4].accept_hist


@pytest.mark.parametrize("on_device", [False, True], ids=["masks", "slot_maps"])
def test_a_chain_deeper_than_the_tree_is_accepted_whole(tmp_path, target, chained, on_device, monkeypatch):
    """A tree one level deep (2,1,2) with chains of 2: steps accept two drafts, more than the tree
    holds, the answer and the cache plain decoding's, the steps the benchmark's walk's."""
    from benchmarks.tree_acceptance import record_growths

    cfg = read_config(target)
    shape = TreeShape(2, 1, 2)
    monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", "2")
    e = _engine(chained, _ranked_draft(tmp_path / "e", cfg, [C, A, B]))
    plain, _ = _run(e, False, n=40)
    k_plain = e.runner.kv.k_all.clone()
    _set_tree(e, shape, on_device)
    step = e.speculator.tree_step(shape)
    assert (step.lookup, step.depth, step.tree_depth) == (2, 2, 1)
    spec, stats = _run(e, True, n=40)
    assert spec == plain
    rows = len(e.tokenizer.apply_chat_template(_prompt())) + len(plain) - 1
    torch.testing.assert_close(e.runner.kv.k_all[:, :rows], k_plain[:, :rows], atol=1e-5, rtol=1e-4)
    assert len(stats.accept_hist) == 4 and stats.accept_hist[3] > stats.verify_steps // 2, stats.accept_hist
    monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", "0")
    probe = _engine(chained, _ranked_draft(tmp_path / "probe", cfg, [C, A, B]))
    _set_tree(probe, shape, False)
    [(seq, growths)] = record_growths(probe, shape.topk, shape.depth, [probe.tokenizer.apply_chat_template(_prompt())],
                                      40, log=lambda text: None)
    steps, made = walk_steps(seq, growths, shape.depth, shape.tokens, 2, in_place=True)
    assert steps == stats.verify_steps and made == min(round(stats.accept_len_mean * steps), stats.generated_tokens)


def _prompt():
    from tests.speculative.test_tree_engine import PROMPT
    return PROMPT


@pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
@pytest.mark.parametrize("lookup_len", [4, 6])
def test_lookup_after_the_tree_kernels_stays_lossless(tmp_path, target, chained, monkeypatch, lookup_len):
    """The step a GPU captures, with the tree kernels (tree_select's kept nodes, tree_lookup's
    chain, tree_accept's walk): plain decoding's answer, and the accepted lengths of the torch ops'
    step."""
    import speculative.eagle3.tree_loop as tree_loop

    launches = []
    real = tree_loop.tree_lookup
    monkeypatch.setattr(tree_loop, "tree_lookup", lambda *a, **kw: launches.append(1) or real(*a, **kw))
    cfg = read_config(target)
    shape = TreeShape(2, 4, 7)
    monkeypatch.setenv("LOCALCHAT_TREE_LOOKUP", str(lookup_len))  # 6: deeper than the tree's 4 levels
    e = _engine(chained, _ranked_draft(tmp_path, cfg, [C, A, B]))
    plain, _ = _run(e, False, n=40)
    runs = []
    for fused in (False, True):
        _set_tree(e, shape, True)
        e.speculator.tree_step(shape).fused_level = fused
        runs.append(_run(e, True, n=40))
    (ops, ops_stats), (kernels, kernel_stats) = runs
    assert ops == kernels == plain
    assert ops_stats.accept_hist == kernel_stats.accept_hist and kernel_stats.accept_len_mean > 2.5
    assert len(launches) == kernel_stats.verify_steps  # the kernels' steps, each with the one launch


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", range(48))
def test_the_lookup_kernel_writes_the_torch_ops_rows(device, seed):
    """tree_lookup (one launch) against record_step, lookup_proposal and merge_lookup: the same
    history, rows, ids, positions, parents and the slot map's entries a row reads (those below its
    depth), over random kept trees and conversations of a few tokens (many repeats), a history
    longer than a scan block, a step before that accepted up to the whole depth, and walks (and
    chains) deeper than the tree."""
    from speculative.kernels.tree_lookup import _BLOCK, tree_lookup

    rng = random.Random(seed)
    nodes, vocab = rng.randrange(3, 40), rng.randrange(2, 6)
    depth = 8
    tree = _tree(rng, nodes, vocab)
    while int(tree.depths.max()) > depth:
        tree = _tree(rng, nodes, vocab)
    n = rng.randrange(1, 2 * _BLOCK + 50) if seed % 3 == 0 else rng.randrange(0, 40)
    walk = depth + (rng.randrange(1, 9) if seed % 2 else 0)  # odd seeds: a walk (and chain) deeper than the tree
    history = torch.tensor([rng.randrange(vocab) for _ in range(n + 1 + walk + 2)])
    length = rng.randrange(1, min(walk, nodes) + 1)
    n_t = torch.tensor(n)
    accepted = rng.randrange(min(n, walk) + 1)
    last = torch.tensor([accepted] + [rng.randrange(vocab) for _ in range(walk + 1)])
    verify = verify_rows(tree, torch.zeros(vocab, dtype=torch.long), n_t, torch.tensor([7]), depth)
    on = lambda t: t.to(device)  # noqa: E731
    history_got = on(history)
    want_history = history.clone()
    record_step(want_history, last, n_t)
    assert want_history[n - accepted:n].tolist() == last[2:2 + accepted].tolist() and want_history[n] == last[1]
    want = merge_lookup(verify, *lookup_proposal(want_history, n_t, length), n_t, width=walk + 1)
    assert want.slot_map.shape == (nodes + 1, walk + 1)
    got = tree_lookup(history_got, type(verify)(*[None if f is None else on(f) for f in (
        verify.tokens, verify.parents, verify.depths, verify.scores, verify.ids, verify.positions, verify.slots,
        verify.slot_map, verify.map_base)]), on(n_t), length, on(last), width=walk + 1, pdl=False)
    assert got.slot_map.shape == want.slot_map.shape
    assert torch.equal(history_got.cpu(), want_history)
    for name in ("tokens", "parents", "depths", "scores", "ids", "positions", "slots", "map_base"):
        assert torch.equal(getattr(got, name).cpu(), getattr(want, name)), name
    depths = [0] + want.depths.tolist()
    for r, d in enumerate(depths):  # the entries a row reads: its ancestors', depth 0 to its own less one
        assert got.slot_map[r, :max(d, 1)].cpu().tolist() == want.slot_map[r, :max(d, 1)].tolist(), r
