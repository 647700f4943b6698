"""A draft tree's level in one launch, the kept nodes with the verify rows' inputs in one more, and
a greedy step's walk with its bookkeeping in a third (speculative/kernels/tree_level.py), and the
accepted nodes' K/V moved in a fourth (speculative/kernels/kv_rows.py): each kernel equals its
torch reference, a tree grown level by level with them is the one grow_tree's torch ops grow, and
tree speculation with them in the engine stays plain decoding.

The kernel runs on CUDA (marked gpu), and on the CPU through Triton's interpreter only with
LOCALCHAT_TRITON_INTERPRET=1 (run this file alone then)."""

import importlib.util
import os

import pytest
import torch

INTERPRET = os.environ.get("LOCALCHAT_TRITON_INTERPRET") == "1" and importlib.util.find_spec("triton") is not None
if INTERPRET:
    os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are first defined (lazily)

from speculative.kernels.tree_level import tree_level, tree_level_ref  # noqa: E402
from speculative.tree.grow import DraftTree, grow_tree  # noqa: E402
from speculative.tree.shape import TreeShape  # noqa: E402

DEVICES = [
    pytest.param("cpu", marks=pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]),
]


def _buffers(count, g, device):
    return (torch.zeros(count, dtype=torch.int64, device=device),
            torch.full((count,), -7, dtype=torch.int64, device=device),
            torch.randn(count, generator=g).to(device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("V,k,F,dtype,ties", [
    (200, 3, 1, torch.float32, False),  # the root
    (200, 3, 3, torch.float32, False),
    (6151, 4, 4, torch.bfloat16, False),  # several blocks a row; the lean draft's bf16 logits
    (15360, 4, 4, torch.bfloat16, False),  # a grown draft vocabulary: the largest row held in registers
    (50, 8, 8, torch.float32, True),  # ten equal logits a row: the lower index first
    (5, 5, 5, torch.float32, False),  # every token a child
    (8, 8, 3, torch.float32, "zeros"),  # every token a child: zeros of both signs tie, then -inf ones
])
@pytest.mark.parametrize("in_steps,keys,split", [(False, False, False), (True, False, False), (False, True, False),
                                                 (True, True, False), (False, True, True), (False, False, True)],
                         ids=["row in registers", "row in steps", "registers, keys", "steps, keys", "split, keys",
                              "split"])
def test_tree_level_equals_its_reference(device, V, k, F, dtype, ties, in_steps, keys, split, monkeypatch):
    """keys: each pick one reduction of a packed value and index (KernelOptions.tree_level_keys;
    the row in steps keeps its passes, the next frontier's picks take the keys). split
    (KernelOptions.tree_level_split): each row in parts of a program each, merged by the last;
    parts of 4 logits at least here, so that the small rows split too (5 and 8 tokens: parts with
    fewer tokens than k, a part of one)."""
    import speculative.kernels.tree_level as TL

    if in_steps:  # the path of a draft vocabulary too wide for registers, on these rows
        monkeypatch.setattr(TL, "_ONE_LIMIT", 0)
    if split and V < 1024:
        monkeypatch.setattr(TL, "_SPLIT_BLOCK", 4)
    g = torch.Generator().manual_seed(V + k)
    for trial in range(3):
        logits = (torch.randn(F, V, generator=g) * 3).to(dtype)
        if ties == "zeros":  # below zero, but -0.0 at 2 and 5 and 0.0 at 4 (equal), -inf at 0 and 7
            logits = -logits.abs() - 1
            logits[:, [2, 4, 5]] = torch.tensor([-0.0, 0.0, -0.0], dtype=dtype)
            logits[:, [0, 7]] = float("-inf")
        elif ties:
            logits[:, 10:20] = 4.0
        frontier = None if F == 1 else torch.randperm(20, generator=g)[:F]
        got = _buffers(200, g, device)
        want = tuple(b.clone() for b in got)
        nexts = [torch.full((k,), -1, dtype=torch.int64, device=device) for _ in range(2)]
        fr = None if frontier is None else frontier.to(device)
        tree_level(logits.to(device), fr, *got, 40, k, nexts[0], keys=keys, split=split)
        tree_level_ref(logits.to(device), fr, *want, 40, k, nexts[1])
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), trial
        torch.testing.assert_close(got[2], want[2], atol=2e-6, rtol=1e-6)
        assert torch.equal(nexts[0], nexts[1]), (nexts, trial)
        # a child's score is never above its parent's (grow_tree's selection keeps ancestors so)
        parent_scores = got[2][got[1][40:40 + F * k].clamp_min(0)] if F > 1 else torch.zeros(k, device=device)
        assert bool((got[2][40:40 + F * k] <= parent_scores).all())


class _RandomHead:
    """expand(): logits after each frontier node, a fixed function of the node's path."""

    def __init__(self, V, seed, device, dtype):
        g = torch.Generator().manual_seed(seed)
        self.table = (torch.randn(97, V, generator=g) * 2.5).to(device, dtype)

    def __call__(self, frontier: torch.Tensor, grown: DraftTree) -> torch.Tensor:
        key = grown.tokens.index_select(0, frontier) * 7 + grown.parents.index_select(0, frontier) + 1
        return self.table.index_select(0, key % 97)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TreeShape(3, 3, 12), TreeShape(4, 5, 24), TreeShape(8, 6, 48), TreeShape(1, 4, 4),
                                   TreeShape(2, 1, 2)])
@pytest.mark.parametrize("V", [300, 6151])
@pytest.mark.parametrize("split", [False, True], ids=["rows whole", "rows split"])
def test_a_tree_grown_with_the_kernel_is_grow_trees(device, shape, V, split, monkeypatch):
    """Level by level with the kernel (logits in, log-softmax inside) against grow_tree's torch
    ops (log-probabilities in): the same tokens, parents and depths, scores to a rounding. Rows
    split: in parts of 32 logits (300 tokens: 10 parts) or 1,024 (6,151: 7)."""
    import speculative.kernels.tree_level as TL

    monkeypatch.setattr(TL, "_SPLIT_BLOCK", 32 if V < 1024 else 1024)
    head = _RandomHead(V, shape.topk * 10 + shape.depth, device, torch.float32)
    root = head.table[5]
    want = grow_tree(torch.log_softmax(root, -1), lambda f, t: torch.log_softmax(head(f, t), -1), shape)
    got = grow_tree(root, head, shape, fused=True, split=split)
    assert torch.equal(got.tokens, want.tokens) and torch.equal(got.parents, want.parents)
    assert torch.equal(got.depths, want.depths) and len(got) == min(shape.tokens, len(want))
    torch.testing.assert_close(got.scores, want.scores, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TreeShape(3, 3, 12), TreeShape(4, 5, 24), TreeShape(2, 6, 10), TreeShape(3, 2, 6)])
@pytest.mark.parametrize("split", [False, True], ids=["rows whole", "rows split"])
def test_each_level_writes_the_next_expansions_inputs(device, shape, split, monkeypatch):
    """With LevelInputs, each level's launch also writes what the next expansion reads (its
    scratch rows, slot map, target ids, positions, parents): the torch reference's, level by level.
    Rows split: 300 tokens in 10 parts, the last program of the launch writing the inputs."""
    import speculative.kernels.tree_level as TL
    import speculative.tree.grow as grow_module

    monkeypatch.setattr(TL, "_SPLIT_BLOCK", 32)

    head = _RandomHead(300, shape.depth, device, torch.float32)
    g = torch.Generator().manual_seed(shape.tokens)
    d2t = torch.randint(-5, 50, (300,), generator=g).to(device)
    k = shape.topk
    candidates = k + (shape.depth - 1) * k * k
    seen = {}
    for name, level in (("kernel", TL.tree_level), ("reference", TL.tree_level_ref)):
        monkeypatch.setattr(grow_module, "tree_level", level)  # what grow_tree's fused levels call
        long = dict(dtype=torch.long, device=device)
        width = max(1, shape.depth - 2)
        inputs = TL.LevelInputs(n=torch.tensor(37, device=device), d2t=d2t, slot_of=torch.full((candidates,), -9, **long),
                                map_of=torch.full((candidates, width), -9, dtype=torch.int32, device=device),
                                slots=torch.zeros(k, **long),
                                slot_map=torch.zeros(k, width, dtype=torch.int32, device=device),
                                ids=torch.zeros(k, **long), positions=torch.zeros(k, **long), above=torch.zeros(k, **long))
        record = []

        def expand(frontier, grown):
            record.append([t.clone() for t in (inputs.slots, inputs.slot_map, inputs.ids, inputs.positions,
                                               inputs.above, frontier)])
            return head(frontier, grown)

        tree = grow_tree(head.table[5], expand, shape, fused=True, inputs=inputs, split=split)
        seen[name] = (tree, record, inputs.slot_of.clone(), inputs.map_of.clone())
    (tree, record, slot_of, map_of), (tree_ref, record_ref, slot_of_ref, map_of_ref) = seen["kernel"], seen["reference"]
    assert torch.equal(tree.tokens, tree_ref.tokens) and torch.equal(slot_of, slot_of_ref)
    assert torch.equal(map_of, map_of_ref)  # each expanded node's map, which its children's start from
    assert len(record) == len(record_ref) == shape.depth - 1
    for depth, (got, want) in enumerate(zip(record, record_ref), start=1):
        for name, a, b in zip(("slots", "slot_map", "ids", "positions", "above", "frontier"), got, want):
            assert torch.equal(a, b), (depth, name, a, b)
    # the deepest expansion reads its ancestors' rows: n + k * (depth - 1) + rank, depth 1 first
    if shape.depth > 2:
        assert bool((record[-1][1][:, 0] >= 37).all() and (record[-1][1][:, 0] < 37 + k).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("count,width,rows", [(3, 64, [4, 0, 7]), (3, 576, [2, 2, 9, 1]), (4, 2304, [5]),
                                              (1, 96, [0, 3]), (5, 64, [1, 3])],
                         ids=["three parts", "a row twice", "two blocks a row", "one part", "five: torch"])
def test_gathered_states_equal_the_concatenation_gathered(device, count, width, rows):
    """The draft-extend's states in one launch (speculative/kernels/states.py) equal the aux
    parts concatenated and then gathered, bit for bit: parts read at their row strides (views into
    a wider tensor), a row taken twice, rows wider than a program's block; more parts than a launch
    takes go the torch way, with the same result."""
    from speculative.kernels.states import gather_states, gather_states_ref

    g = torch.Generator().manual_seed(count * width)
    wide = torch.randn(10, width + 32, count, generator=g).to(device, torch.bfloat16)
    parts = tuple(wide[:, 16:16 + width, j] if j % 2 else wide[:, :width, j].contiguous() for j in range(count))
    index = torch.tensor(rows, device=device)
    got = gather_states(parts, index)
    want = gather_states_ref(parts, index)
    assert got.shape == (len(rows), count * width) and torch.equal(got, want)
    for r, row in enumerate(rows):
        assert torch.equal(got[r, :width], parts[0][row]) and torch.equal(got[r, -width:], parts[-1][row])


@pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
@pytest.mark.parametrize("shape,kv_move", [(TreeShape(3, 3, 12), False), (TreeShape(4, 4, 20), False),
                                           (TreeShape(4, 4, 20), True)],
                         ids=["3,3,12", "4,4,20", "4,4,20 kv move, select blocks, level keys, split, sampled accept"])
def test_tree_speculation_with_the_level_kernel_equals_plain(tmp_path, shape, kv_move, monkeypatch):
    """The engine's tree step (the one a GPU captures: slot maps) with the tree kernels grows the
    trees the torch ops grow and answers as plain greedy decoding; sampled, it draws the torch
    path's tokens from the same seed. kv move: the accepted nodes' K/V moved in one launch
    (KernelOptions.tree_kv_move), the kept nodes ranked by every pair compared (tree_select_blocks,
    which goes before tree_select_passes), the levels' picks by packed keys (tree_level_keys) with
    each row in parts (tree_level_split: the head's 200 tokens in 7 parts of 32) and a sampled
    step's walk in one launch (sampled_tree_accept)."""
    import speculative.kernels.tree_level as TL
    import speculative.tree.grow as grow_module

    from speculative.eagle3.tree_loop import TreeDrafting
    from tests.speculative.heads import head_tensors, write_head
    from tests.speculative.test_tree_engine import _engine, _run, _set_tree
    from tests.tiny import make_tiny_model, read_config

    monkeypatch.setenv("LOCALCHAT_TREE_KV_MOVE", "1" if kv_move else "0")
    monkeypatch.setenv("LOCALCHAT_TREE_SELECT_PASSES", "1" if kv_move else "0")
    monkeypatch.setenv("LOCALCHAT_TREE_LEVEL_KEYS", "1" if kv_move else "0")
    monkeypatch.setenv("LOCALCHAT_TREE_SELECT_BLOCKS", "1" if kv_move else "0")
    monkeypatch.setenv("LOCALCHAT_SAMPLED_TREE_ACCEPT", "1" if kv_move else "0")
    monkeypatch.setenv("LOCALCHAT_TREE_LEVEL_SPLIT", "1" if kv_move else "0")
    monkeypatch.setattr(TL, "_SPLIT_BLOCK", 32)
    splits = []
    real_level = TL.tree_level
    monkeypatch.setattr(grow_module, "tree_level", lambda *a, **kw: splits.append(kw["split"]) or real_level(*a, **kw))
    moves, walks = [], []
    import speculative.eagle3.tree_loop as tree_loop

    real_walk = tree_loop.tree_accept_sampled
    monkeypatch.setattr(tree_loop, "tree_accept_sampled", lambda *a, **kw: walks.append(1) or real_walk(*a, **kw))
    gathers = []
    real_gather = tree_loop.gather_states
    monkeypatch.setattr(tree_loop, "gather_states", lambda *a, **kw: gathers.append(1) or real_gather(*a, **kw))
    if kv_move:
        real_move = tree_loop.move_kv_rows
        monkeypatch.setattr(tree_loop, "move_kv_rows", lambda *a, **kw: moves.append(1) or real_move(*a, **kw))
    target = make_tiny_model(tmp_path / "llama", "llama", num_layers=4, seed=3)
    cfg = read_config(target)
    e = _engine(target, write_head(tmp_path / "h0", cfg, "sglang",
                                   head_tensors(64, 64, 3, cfg["vocab_size"], 200, seed=4), 64, (1, 2, 3)))
    plain, _ = _run(e, False, n=48)
    grown: list = []
    grow = TreeDrafting._grow
    monkeypatch.setattr(TreeDrafting, "_grow", lambda self, n: grown.append(grow(self, n)) or grown[-1])
    grow_fused = TreeDrafting._grow_fused
    monkeypatch.setattr(TreeDrafting, "_grow_fused", lambda self: grown.append(grow_fused(self)) or grown[-1])
    trees = {}
    for fused in (False, True):
        grown.clear()
        _set_tree(e, shape, True)
        e.speculator.tree_step(shape).fused_level = fused
        trees[fused] = (_run(e, True, n=48)[0], list(grown))
    (torch_ops, by_ops), (kernel, by_kernel) = trees[False], trees[True]
    assert torch_ops == kernel == plain and len(by_ops) == len(by_kernel) > 5
    assert len(moves) == (len(by_kernel) if kv_move else 0)  # the kernels' steps only
    assert len(gathers) == len(by_kernel)  # the states gathered in one launch: the kernels' steps
    for a, b in zip(by_ops, by_kernel):
        assert torch.equal(a.tokens, b.tokens) and torch.equal(a.parents, b.parents)
        torch.testing.assert_close(a.scores, b.scores, atol=1e-4, rtol=1e-4)
    # sampled: the same trees, so the same draws from the same seed
    sampled = []
    for fused in (False, True):
        e.speculator.tree_step(shape).fused_level = fused
        sampled.append(_run(e, True, n=48, temperature=0.8, seed=11)[0])
    assert sampled[0] == sampled[1] and len(sampled[0]) == 48
    assert (len(walks) > 5) if kv_move else not walks  # the kernel's sampled steps only, with its switch
    assert splits and set(splits) == {kv_move}


@pytest.mark.skipif(not INTERPRET, reason="set LOCALCHAT_TRITON_INTERPRET=1 (needs triton)")
def test_paths_through_later_siblings_with_the_level_kernel(tmp_path):
    """A head whose logits all tie ranks c, a, b by index (the kernel's ties go to the lower
    index, as the torch ops' stable sort); the target takes a then b, so each step accepts a path
    of later siblings: the answer is plain decoding's, two drafts a step at least."""
    from tests.speculative.test_tree_engine import A, B, C, _chained_target, _engine, _ranked_draft, _run, _set_tree
    from tests.tiny import make_tiny_model, read_config

    target = make_tiny_model(tmp_path / "llama", "llama", num_layers=4, seed=3)
    chained = _chained_target(target, tmp_path / "chained")
    e = _engine(chained, _ranked_draft(tmp_path, read_config(target), [C, A, B]))
    plain, _ = _run(e, False, n=40)
    shape = TreeShape(3, 3, 12)
    _set_tree(e, shape, True)
    e.speculator.tree_step(shape).fused_level = True
    spec, stats = _run(e, True, n=40)
    assert spec == plain and plain[:4] == [A, B, A, B]
    assert stats.accept_len_mean >= 2.5, stats.accept_hist


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TreeShape(3, 3, 12), TreeShape(4, 5, 24), TreeShape(8, 6, 48), TreeShape(2, 1, 2),
                                   TreeShape(3, 4, 30), TreeShape(6, 8, 15)])
@pytest.mark.parametrize("passes,blocks", [(False, False), (True, False), (False, True)],
                         ids=["loops", "passes", "blocks"])
def test_tree_select_equals_its_reference(device, shape, passes, blocks):
    """The kept nodes in verify order and the verify rows' inputs (ids, positions, slots, slot map)
    from one launch: grow_tree's selection and tree_slot_map's, on trees grown from a random head
    (ties among the scores too: the lower index, the shallower, first), with the ranks from loops
    over the candidates, from passes over the scores (KernelOptions.tree_select_passes) or from
    every pair compared a block at a time (tree_select_blocks)."""
    from speculative.kernels.tree_level import tree_select
    from speculative.tree.grow import verify_rows_ref

    head = _RandomHead(300, shape.topk + shape.depth, device, torch.float32)
    g = torch.Generator().manual_seed(shape.tokens)
    d2t = torch.randint(-5, 50, (300,), generator=g).to(device)
    for trial in range(2):
        if trial:  # ties: a coarse head, its logits rounded to halves
            head.table = (head.table * 2).round() / 2
        grown = grow_tree(torch.log_softmax(head.table[5], -1), lambda f, t: torch.log_softmax(head(f, t), -1), shape,
                          fused=False, select=False)
        n, root = torch.tensor(29, device=device), torch.tensor([7], device=device)
        got = tree_select(grown.tokens, grown.parents, grown.depths, grown.scores, shape.tokens, d2t, n, root,
                          shape.depth, passes=passes, blocks=blocks)
        want = verify_rows_ref(grown.tokens, grown.parents, grown.depths, grown.scores, shape.tokens, d2t, n, root,
                               shape.depth)
        for name in ("tokens", "parents", "depths", "scores", "ids", "positions", "slots", "slot_map", "map_base"):
            a, b = getattr(got, name), getattr(want, name)
            assert a.dtype == b.dtype and torch.equal(a, b), (trial, name, a, b)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape,V", [(TreeShape(3, 3, 12), 40), (TreeShape(4, 8, 15), 64), (TreeShape(4, 5, 24), 2500),
                                     (TreeShape(2, 1, 2), 40)])
def test_sampled_tree_accept_equals_its_reference(device, shape, V):
    """The sampled walk and the step's bookkeeping in one launch (tree_accept_sampled): the torch
    path's (sampled_tree_path, then step_end) on every output, for trees grown as the engine grows
    them and probabilities in sixteenths of small counts, whose sums are exact in any order (the
    kernel keeps the residual's sum as the row's less the refused masses: rounding could otherwise
    move a draw at a threshold). The probabilities favour the tree's tokens, so that walks of
    several lengths, refusals and leaves all occur; a row's mass all on refused children falls back
    to its whole row (V 2500: the last draw over several blocks)."""
    from speculative.kernels.tree_level import tree_accept_sampled
    from speculative.tree.accept import sampled_tree_path, step_end
    from speculative.tree.grow import _kept

    head = _RandomHead(V, shape.topk * 3 + shape.depth, device, torch.float32)
    grown = grow_tree(torch.log_softmax(head.table[5], -1), lambda f, t: torch.log_softmax(head(f, t), -1), shape,
                      select=False)
    tree = _kept(grown.tokens, grown.parents, grown.depths, grown.scores, shape.tokens)
    N, depth, k = len(tree), min(shape.depth, shape.tokens), shape.topk
    g = torch.Generator().manual_seed(V + shape.tokens)
    lengths, refusals = set(), 0
    for trial in range(16):
        counts = torch.randint(0, 3, (N + 1, V), generator=g).float()
        for m in range(N):  # the tree's tokens weigh more under their parents
            counts[int(tree.parents[m]) + 1, int(tree.tokens[m])] += float(torch.randint(0, 40, (1,), generator=g))
        if trial == 3:  # a row whose whole mass sits on its children: all refused, the whole row is drawn from
            kids = [m for m in range(N) if int(tree.parents[m]) == -1]
            counts[0] = 0.0
            counts[0, [int(tree.tokens[m]) for m in kids]] = 1.0
        probs = (counts / 16).to(device)
        u = torch.rand(depth, k, generator=g)
        if trial == 3:  # u = 1 (a uniform never quite is): every child refused, nothing left
            u[0] = 1.0
        u = u.to(device)
        e = torch.empty(V).exponential_(generator=g).to(device)
        outs = []
        for fused in (True, False):
            n, root, result = (torch.tensor(50, device=device), torch.zeros(1, dtype=torch.long, device=device),
                               torch.zeros(2 + depth, dtype=torch.long, device=device))
            if fused:
                end = tree_accept_sampled(probs, u, e, tree.tokens, tree.parents, n, depth, result, root)
            else:
                path, count, nxt = sampled_tree_path(tree, probs, u, e, depth)
                end = step_end(path, count, nxt, tree.tokens, n, depth, result, root)
            outs.append((end, n.clone(), root.clone(), result.clone()))
        (end, n, root, result), (end_ref, n_ref, root_ref, result_ref) = outs
        for name in ("count", "src", "dst", "window", "rows", "ext_pos"):
            assert torch.equal(getattr(end, name), getattr(end_ref, name)), (trial, name, getattr(end, name),
                                                                             getattr(end_ref, name))
        assert torch.equal(n, n_ref) and torch.equal(root, root_ref) and torch.equal(result, result_ref), trial
        lengths.add(int(end.count))
        refusals += int(end.count) < depth
        if trial == 3:
            assert int(end.count) == 0
    assert len(lengths) > 1 and refusals


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [TreeShape(3, 3, 12), TreeShape(4, 5, 24), TreeShape(8, 6, 48), TreeShape(2, 1, 2)])
def test_tree_accept_equals_its_reference(device, shape):
    """The greedy walk and the step's bookkeeping in one launch: greedy_tree_path and the torch
    ops' after it, for target choices that follow a path of each possible length (through later
    siblings too) and then leave the tree."""
    from speculative.kernels.tree_level import tree_accept
    from speculative.tree.accept import step_end_ref
    from speculative.tree.grow import _kept

    head = _RandomHead(300, shape.topk * 3 + shape.depth, device, torch.float32)
    grown = grow_tree(torch.log_softmax(head.table[5], -1), lambda f, t: torch.log_softmax(head(f, t), -1), shape,
                      select=False)
    tree = _kept(grown.tokens, grown.parents, grown.depths, grown.scores, shape.tokens)
    N, depth = len(tree), min(shape.depth, shape.tokens)
    g = torch.Generator().manual_seed(shape.tokens)
    seen = set()
    for trial in range(12):
        # a random node's path, its length cut at random: the choices walk it, then a token no child has
        node = int(torch.randint(N, (1,), generator=g))
        path = tree.path(node)[:int(torch.randint(len(tree.path(node)) + 1, (1,), generator=g))]
        choice = torch.randint(300, 400, (N + 1,), generator=g)
        row = 0
        for m in path:
            choice[row] = tree.tokens[m]
            row = m + 1
        choice = choice.to(device)
        outs = []
        for accept in (tree_accept, step_end_ref):
            n, root, result = (torch.tensor(50, device=device), torch.zeros(1, dtype=torch.long, device=device),
                               torch.zeros(2 + depth, dtype=torch.long, device=device))
            args = (choice, tree.tokens, tree.parents) + ((tree.depths,) if accept is step_end_ref else ())
            end = accept(*args, n, depth, result, root)
            outs.append((end, n.clone(), root.clone(), result.clone()))
        (end, n, root, result), (end_ref, n_ref, root_ref, result_ref) = outs
        assert int(end.count) == len(path), (path, int(end.count))
        seen.add(len(path))
        for name in ("count", "src", "dst", "window", "rows", "ext_pos"):
            assert torch.equal(getattr(end, name), getattr(end_ref, name)), (trial, name)
        assert torch.equal(n, n_ref) and torch.equal(root, root_ref) and torch.equal(result, result_ref), trial
    assert len(seen) > 1


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("heads,dim", [(3, 64), (12, 128)], ids=["one block a row", "two blocks a row"])
@pytest.mark.parametrize("moves", ["a path", "each row down one", "none taken"])
def test_moved_kv_rows_equal_the_torch_ops(device, heads, dim, moves):
    """The accepted nodes' K/V moved in one launch (speculative/kernels/kv_rows.py) equal the torch
    ops' index_select and index_copy bit for bit, with src and dst as a greedy tree step writes them
    (dst[d] = n + 1 + d; src[d] the accepted node's row, n + 1 + its index, or dst[d] past the
    accepted path): a path through later siblings, a chain of rows each moving down by one (every
    destination some other row's source), and no move at all."""
    from speculative.kernels.kv_rows import move_kv_rows, move_kv_rows_ref

    n, depth = 20, 5
    src = {"a path": [2, 5, 9, 3, 4], "each row down one": [1, 2, 3, 4, 5], "none taken": [0, 1, 2, 3, 4]}[moves]
    src = torch.tensor([n + 1 + i for i in src], device=device)
    dst = torch.arange(n + 1, n + 1 + depth, device=device)
    g = torch.Generator().manual_seed(heads)
    k_all = torch.randn(3, 48, heads, dim, generator=g).to(device, torch.bfloat16)
    v_all = torch.randn(3, 48, heads, dim, generator=g).to(device, torch.bfloat16)
    before_k, before_v = k_all.clone(), v_all.clone()
    want_k, want_v = k_all.clone(), v_all.clone()
    move_kv_rows_ref(want_k, want_v, src, dst)
    for d in range(depth):  # the reference: row src[d] as it was, now at dst[d]; the other rows untouched
        assert torch.equal(want_k[:, n + 1 + d], before_k[:, int(src[d])])
        assert torch.equal(want_v[:, n + 1 + d], before_v[:, int(src[d])])
    assert torch.equal(want_k[:, :n + 1], before_k[:, :n + 1]) and torch.equal(want_k[:, n + 1 + depth:],
                                                                             before_k[:, n + 1 + depth:])
    move_kv_rows(k_all, v_all, src, dst)
    assert torch.equal(k_all, want_k) and torch.equal(v_all, want_v)
