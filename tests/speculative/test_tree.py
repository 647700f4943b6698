"""Tree drafting's pieces on the CPU: the shape, the EAGLE-2 growth, the attention mask, greedy and
sampled acceptance (the sampled rule checked statistically against the target's distribution), and
whole tree-speculative decoding loops that must give plain decoding's output: exactly for greedy,
in distribution for sampling, on bigram models and on a tiny transformer."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.errors import UserError
from speculative.tree.accept import greedy_tree_path, sampled_tree_path
from speculative.tree.grow import DraftTree, grow_tree, tree_mask
from speculative.tree.shape import TreeShape, parse_tree


def test_tree_shapes_parse_and_refuse_in_one_line():
    assert parse_tree("off") is None and parse_tree(" AUTO ") == "auto"
    assert parse_tree("8,6,48") == TreeShape(8, 6, 48) and str(TreeShape(8, 6, 48)) == "8,6,48"
    assert TreeShape(1, 5, 5).is_chain
    for bad, says in [("8,6", "use off, auto, or TOPK,DEPTH,TOKENS"), ("a,b,c", "use off, auto"),
                      ("0,6,10", "TOPK 1-16"), ("8,6,64", "TOKENS 1-63"), ("2,2,7", "hold fewer than 7 nodes")]:
        with pytest.raises(UserError, match=says) as e:
            parse_tree(bad)
        assert "\n" not in str(e.value)


def bigram(vocab: int, seed: int, sharp: float = 2.0) -> torch.Tensor:
    """(V, V) log-probabilities of the next token given the previous one."""
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(vocab, vocab, generator=g, dtype=torch.float64) * sharp, dim=-1)


def grow_on_bigram(draft: torch.Tensor, root_token: int, shape: TreeShape) -> DraftTree:
    def expand(frontier, grown):
        return draft[grown.tokens[frontier]]

    return grow_tree(draft[root_token], expand, shape)


def test_growth_keeps_the_best_candidates_with_their_ancestors():
    draft = bigram(12, 1)
    shape = TreeShape(3, 4, 10)
    tree = grow_on_bigram(draft, 5, shape)
    assert len(tree) == 10
    for i in range(len(tree)):  # parents first, depth one more than the parent's, scores add up
        p = int(tree.parents[i])
        assert p < i and int(tree.depths[i]) == (1 if p < 0 else int(tree.depths[p]) + 1)
        prev = 5 if p < 0 else int(tree.tokens[p])
        parent_score = 0.0 if p < 0 else float(tree.scores[p])
        assert float(tree.scores[i]) == pytest.approx(parent_score + float(draft[prev, tree.tokens[i]]))
    # the same candidates by brute force: depth 1 the root's top 3; then the 3 best of each depth expanded
    cands = [((int(t),), float(draft[5, t])) for t in draft[5].topk(3).indices]
    frontier = cands
    for _ in range(shape.depth - 1):
        new = [(path + (int(t),), s + float(draft[path[-1], t])) for path, s in frontier
               for t in draft[path[-1]].topk(3).indices]
        cands += new
        frontier = sorted(new, key=lambda c: -c[1])[:3]
    best = sorted(cands, key=lambda c: (-c[1], len(c[0])))[:10]
    got = {tuple(int(tree.tokens[j]) for j in tree.path(i)) for i in range(len(tree))}
    assert got == {path for path, _ in best}


def test_tree_mask_is_each_node_and_its_ancestors():
    parents = torch.tensor([-1, -1, 0, 0, 2, 1, 4])
    mask = tree_mask(parents)
    tree = DraftTree(torch.zeros(7, dtype=torch.long), parents, torch.zeros(7, dtype=torch.long), torch.zeros(7))
    for i in range(-1, 7):
        seen = {0} | ({j + 1 for j in tree.path(i)} if i >= 0 else set())
        assert {j for j in range(8) if mask[i + 1, j]} == seen, i


def walk(tree: DraftTree, choice: torch.Tensor) -> tuple[list[int], int]:
    """The greedy rule by the book, on the host: from the root, step to the child whose token is
    the target's choice at the current row while there is one."""
    choice, tokens, parents = choice.tolist(), tree.tokens.tolist(), tree.parents.tolist()
    path, node = [], -1
    while True:
        want = choice[node + 1]
        nxt = next((i for i in range(len(tokens)) if parents[i] == node and tokens[i] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def greedy_tree_accept(tree: DraftTree, choice: torch.Tensor, max_depth: int | None = None) -> tuple[list[int], int]:
    """greedy_tree_path read as the host sees it: (the accepted nodes, root to leaf; the next
    token), checked against the walk by the book."""
    path, count, nxt = greedy_tree_path(tree, choice, max_depth)
    got = path[:int(count)].tolist(), int(nxt)
    assert got == walk(tree, choice)
    return got


def test_greedy_acceptance_walks_the_targets_choices():
    tree = DraftTree(torch.tensor([4, 7, 2, 9, 3]), torch.tensor([-1, -1, 0, 0, 2]), torch.tensor([1, 1, 2, 2, 3]),
                     torch.zeros(5))
    # row 0 is the root, row i + 1 node i: the root picks 4 (node 0), node 0 picks 2 (node 2), node 2
    # picks 3 (node 4), node 4 picks 8: the whole path and the token after it
    assert greedy_tree_accept(tree, torch.tensor([4, 2, 0, 3, 0, 8])) == ([0, 2, 4], 8)
    assert greedy_tree_accept(tree, torch.tensor([7, 0, 0, 0, 0, 0])) == ([1], 0)  # node 1 is a leaf
    assert greedy_tree_accept(tree, torch.tensor([5, 0, 0, 0, 0, 0])) == ([], 5)  # no child: the root's choice
    assert greedy_tree_accept(tree, torch.tensor([4, 6, 0, 0, 0, 0])) == ([0], 6)
    # with a shape's depth past the tree's, the same walk (its fixed-shape form pads the path)
    assert greedy_tree_accept(tree, torch.tensor([4, 2, 0, 3, 0, 8]), max_depth=6) == ([0, 2, 4], 8)
    path, count, nxt = greedy_tree_path(tree, torch.tensor([4, 2, 0, 3, 0, 8]), max_depth=5)
    assert path.tolist() == [0, 2, 4, -1, -1] and int(count) == 3 and int(nxt) == 8


def _random_tree(gen: torch.Generator, size: int, vocab: int) -> DraftTree:
    """Nodes in verify order (by depth), siblings with distinct tokens, as grow_tree makes them."""
    parents, depths, tokens = [], [], []
    for i in range(size):
        p = int(torch.randint(-1, i, (), generator=gen)) if i else -1
        while p >= 0 and depths[p] >= 4:  # at most 5 deep
            p = parents[p]
        parents.append(p)
        depths.append(1 if p < 0 else depths[p] + 1)
        taken = {tokens[j] for j in range(i) if parents[j] == p}
        free = sorted(set(range(vocab)) - taken)
        tokens.append(free[int(torch.randint(0, len(free), (), generator=gen))])
    order = sorted(range(size), key=lambda i: depths[i])  # a parent before its children
    new = {old: j for j, old in enumerate(order)}
    return DraftTree(torch.tensor([tokens[i] for i in order]),
                     torch.tensor([new[parents[i]] if parents[i] >= 0 else -1 for i in order]),
                     torch.tensor([depths[i] for i in order]), torch.zeros(size))


def test_the_device_walk_and_slot_map_agree_with_the_book_on_random_trees():
    """greedy_tree_path and tree_slot_map, written in few tensor operations for a captured step,
    on 200 random trees: the walk by the book, and each row's ancestors by depth."""
    from speculative.tree.grow import tree_slot_map

    gen = torch.Generator().manual_seed(5)
    for trial in range(200):
        size = int(torch.randint(1, 30, (), generator=gen))
        tree = _random_tree(gen, size, 40)
        # choices that follow the tree for a while: each row picks a child's token most of the time
        choice = torch.randint(0, 40, (size + 1,), generator=gen)
        for row in range(size + 1):
            kids = [i for i in range(size) if int(tree.parents[i]) == row - 1]
            if kids and float(torch.rand((), generator=gen)) < 0.8:
                choice[row] = tree.tokens[kids[int(torch.randint(0, len(kids), (), generator=gen))]]
        greedy_tree_accept(tree, choice, max_depth=5)
        slot_map, base = tree_slot_map(tree.parents, tree.depths, 7 + trial, 6)
        assert base.tolist() == [7 + trial] * (size + 1)
        for i in range(size):
            ancestors = [7 + trial] + [7 + trial + 1 + j for j in tree.path(i)[:-1]]
            d = int(tree.depths[i])
            assert slot_map[i + 1, :d].tolist() == ancestors and not slot_map[i + 1, d:].any(), (trial, i)


def emitted(tree: DraftTree, path: list[int], nxt: int) -> list[int]:
    return [int(tree.tokens[i]) for i in path] + [nxt]


def sampled_tree_accept(tree: DraftTree, target_probs: torch.Tensor,
                        generator: torch.Generator | None = None) -> tuple[list[int], int]:
    """The sampled rule by the book, on the host (the reference of sampled_tree_path).
    target_probs: (N + 1, V) the target's distribution (after temperature and the cuts) at the
    root and at each node. Returns (the accepted nodes, root to leaf; the next token), the emitted
    tokens having the target's distribution (see the module's docstring)."""
    dev = target_probs.device
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path, node = [], -1
    while True:
        residual = target_probs[node + 1].double().clone()
        kids = [i for i in range(len(tokens)) if parents[i] == node]  # best score first (verify order)
        stepped = None
        for c in kids:
            total = residual.sum()
            if total <= 0:
                break
            u = torch.rand((), dtype=torch.float64, device=dev, generator=generator)
            if u * total < residual[tokens[c]]:
                stepped = c
                break
            residual[tokens[c]] = 0.0
        if stepped is None:
            if residual.sum() <= 0:  # every token the target allows was a refused child: cannot happen
                residual = target_probs[node + 1].double()
            nxt = torch.multinomial(residual / residual.sum(), 1, generator=generator)
            return path, int(nxt)
        path.append(stepped)
        node = stepped


def _device_rule(tree, probs, g):
    """sampled_tree_path (the captured step's rule) drawing its random numbers from g."""
    D, K = int(tree.depths.max()), 3
    u = torch.rand(D, K, generator=g)
    e = torch.empty(probs.shape[1]).exponential_(generator=g)
    path, count, nxt = sampled_tree_path(tree, probs, u, e, D)
    return path[:int(count)].tolist(), int(nxt)


@pytest.mark.slow  # tens of thousands of draws: some 17 s each on a 2-core CPU
@pytest.mark.parametrize("rule,draws,within", [(sampled_tree_accept, 40_000, 0.011), (_device_rule, 12_000, 0.02)],
                         ids=["book", "device"])
def test_sampled_acceptance_emits_the_targets_distribution(rule, draws, within):
    """Over a fixed tree whose siblings the target often refuses, the first two emitted tokens
    follow p(x1 | root) p(x2 | x1) (every cell within about 4 standard deviations): the rule by
    the book on the host, and the one in fixed shapes a captured step runs."""
    vocab = 5
    target, draft = bigram(vocab, 2, sharp=1.0), bigram(vocab, 3, sharp=1.0)
    tree = grow_on_bigram(draft, 0, TreeShape(3, 3, 9))
    rows = [0] + [int(t) for t in tree.tokens]
    probs = target.exp()[rows].float()
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(vocab, vocab)
    depths = []
    for _ in range(draws):
        path, nxt = rule(tree, probs, g)
        depths.append(len(path))
        out = emitted(tree, path, nxt)
        second = out[1] if len(out) > 1 else int(torch.multinomial(target.exp()[out[0]].float(), 1, generator=g))
        counts[out[0], second] += 1
    want = target.exp()[0][:, None] * target.exp()
    assert (counts / draws - want.float()).abs().max() < within
    assert max(depths) == int(tree.depths.max()) and sum(depths) / draws > 0.8  # deep paths too


def tree_decode(prompt: list[int], n: int, shape: TreeShape, target_logits, draft_logits, greedy: bool = True,
                generator: torch.Generator | None = None) -> tuple[list[int], float]:
    """Tree-speculative decoding by the book: grow the tree on the draft, run the target on the
    root and on every node's path, accept, repeat. Returns (n tokens, tokens per verify step)."""
    seq, out, steps = list(prompt), [], 0
    while len(out) < n:
        def expand(frontier, grown, base=list(seq)):
            return torch.stack([torch.log_softmax(draft_logits(base + [int(grown.tokens[j]) for j in grown.path(int(f))]), -1)
                                for f in frontier])

        tree = grow_tree(torch.log_softmax(draft_logits(seq), -1), expand, shape)
        rows = [seq] + [seq + [int(tree.tokens[j]) for j in tree.path(i)] for i in range(len(tree))]
        logits = torch.stack([target_logits(r) for r in rows])
        if greedy:
            path, nxt = greedy_tree_accept(tree, logits.argmax(-1))
        else:
            path, nxt = sampled_tree_accept(tree, torch.softmax(logits.double(), -1), generator)
        new = emitted(tree, path, nxt)
        out += new
        seq += new
        steps += 1
    return out[:n], len(out) / steps


def test_greedy_tree_decoding_is_plain_greedy_decoding_on_bigrams():
    target, draft = bigram(16, 4), bigram(16, 4) + 0.3 * bigram(16, 5)  # a draft close to the target
    t_logits, d_logits = (lambda s: target[s[-1]]), (lambda s: draft[s[-1]])
    plain, seq = [], [3]
    for _ in range(60):
        seq.append(int(target[seq[-1]].argmax()))
        plain.append(seq[-1])
    for shape in (TreeShape(1, 4, 4), TreeShape(4, 4, 12), TreeShape(8, 6, 40)):
        out, per_step = tree_decode([3], 60, shape, t_logits, d_logits)
        assert out == plain, shape
    assert per_step > 2  # the tree pays on a close draft


@pytest.mark.slow  # some 16 s on a 2-core CPU
def test_sampled_tree_decoding_has_the_targets_distribution_on_bigrams():
    """Three sampled tokens after a prompt: their joint distribution is the target's (6,000 runs;
    every one of the 64 cells within 0.02)."""
    vocab = 4
    target, draft = bigram(vocab, 6, sharp=1.0), bigram(vocab, 7, sharp=1.0)
    t_logits, d_logits = (lambda s: target[s[-1]]), (lambda s: draft[s[-1]])
    g = torch.Generator().manual_seed(1)
    counts = torch.zeros(vocab, vocab, vocab)
    n = 6000
    for _ in range(n):
        out, _ = tree_decode([0], 3, TreeShape(2, 2, 4), t_logits, d_logits, greedy=False, generator=g)
        counts[out[0], out[1], out[2]] += 1
    p = target.exp().float()
    want = torch.zeros(vocab, vocab, vocab)
    for a, b, c in itertools.product(range(vocab), repeat=3):
        want[a, b, c] = p[0, a] * p[a, b] * p[b, c]
    assert (counts / n - want).abs().max() < 0.02


def test_greedy_tree_decoding_is_plain_greedy_decoding_on_a_tiny_transformer(tiny_models):
    """A tiny Llama as the target and the same model with noise on its logits as the draft: greedy
    tree decoding gives plain greedy decoding's tokens, at more than one token a verify step."""
    from engine.engine import Engine

    engine = Engine.load(str(tiny_models["llama"]), device="cpu", use_graphs=False)
    runner = engine.runner

    @torch.inference_mode()
    def target_logits(seq):
        engine.reset()
        logits, _, _ = runner.forward(torch.tensor(seq), 0, all_logits=False)
        return logits[-1].double()

    noise = torch.Generator().manual_seed(0)
    vocab = runner.config.vocab_size
    jitter = torch.randn(vocab, generator=noise, dtype=torch.float64) * 0.5

    def draft_logits(seq):
        return target_logits(seq) + jitter

    prompt = engine.tokenizer.apply_chat_template([{"role": "user", "content": "Hello there"}])
    plain = [int(t) for e in engine.stream_ids(prompt, _greedy(24), speculative=False) for t in e.token_ids]
    out, per_step = tree_decode(prompt, len(plain), TreeShape(3, 3, 8), target_logits, draft_logits)
    assert out == plain and len(plain) == 24
    assert per_step > 1


def _greedy(n):
    from engine.types import SamplingParams

    return SamplingParams(max_tokens=n, ignore_eos=True)


def test_the_slot_map_shows_each_row_what_the_tree_mask_shows():
    """tree_slot_map: through the decode kernel's reference, each verify row attends to exactly the
    cache rows the explicit mask lets it see (the context, the root, its ancestors, itself), for
    a tree of mixed depths whose nodes sit past the root."""
    from engine.attention import attention_masked
    from engine.kernels.attention import decode_attention_ref
    from speculative.tree.grow import tree_mask, tree_slot_map

    parents = torch.tensor([-1, -1, 0, 0, 1, 2, 5, -1])
    depths = torch.zeros_like(parents)
    for i, p in enumerate(parents.tolist()):
        depths[i] = 1 if p < 0 else depths[p] + 1
    n, N = 11, parents.shape[0]
    slot_map, base = tree_slot_map(parents, depths, n)
    assert slot_map.shape == (N + 1, int(depths.max()) + 1) and base.tolist() == [n] * (N + 1)
    assert slot_map[7, :4].tolist() == [n, n + 1 + 0, n + 1 + 2, n + 1 + 5]  # node 6: root, 0, 2, 5
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(N + 1, 4, 16, generator=gen)
    k, v = torch.randn(40, 2, 16, generator=gen), torch.randn(40, 2, 16, generator=gen)
    positions = torch.cat([torch.tensor([n]), n + depths])
    slots = n + torch.arange(N + 1)
    visible = torch.zeros(N + 1, n + N + 1, dtype=torch.bool)
    visible[:, :n] = True
    visible[:, n:] = tree_mask(parents)
    via_map = decode_attention_ref(q, k, v, positions, 0.25, own_slots=slots, slot_map=slot_map, map_base=base)
    torch.testing.assert_close(via_map, attention_masked(q, k, v, visible, 0.25))
    wide, _ = tree_slot_map(parents, depths, n, 8)  # a shape's fixed width: the same map, padded
    assert wide.shape == (N + 1, 8) and torch.equal(wide[:, :slot_map.shape[1]], slot_map)
    assert not wide[:, slot_map.shape[1]:].any()


def test_the_top_of_a_long_row_is_the_stable_sorts():
    """_top over a vocabulary-sized row (torch.topk, then its k ordered): the stable sort's first
    k, ties among them to the lower index."""
    from speculative.tree.grow import SORT_LIMIT, _top

    gen = torch.Generator().manual_seed(3)
    x = torch.rand(6, SORT_LIMIT + 1000, generator=gen)
    for r in range(6):  # ties at the top: three 3.0s, two 2.0s, placed at random
        spots = torch.randperm(x.shape[1], generator=gen)[:5]
        x[r, spots[:3]], x[r, spots[3:]] = 3.0, 2.0
    for k in (1, 3, 5, 8):
        top = _top(x, k)
        ref = torch.sort(x, dim=-1, descending=True, stable=True)
        assert torch.equal(top.values, ref.values[:, :k]) and torch.equal(top.indices, ref.indices[:, :k]), k
