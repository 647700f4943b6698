"""One level of a draft tree's growth in one launch with no host sync (safe to capture in a CUDA
graph):

    tree_level(logits, frontier, tokens, parents, scores, grown, k, next_frontier)

logits (F, Dv): the draft's logits after each of the F frontier nodes (indices `frontier` into the
candidate buffers; None: the root, F = 1). Each row's top k, ordered by value with ties to the
lower index, becomes that node's children: candidates grown + f * k + j get the draft id, the
parent, and the parent's score plus the child's log-probability (its logit less the row's
logsumexp). The k best of the F * k new candidates by score (ties: the lower index) go to
next_frontier, as candidate indices: the nodes the next level expands. With `inputs` (LevelInputs)
the same launch writes what that expansion reads: the frontier's scratch rows, slot map, target
ids, positions and parents.

This is speculative/tree/grow.py's level (a log-softmax, a top-k with its ordering sorts, the
candidates' scores and buffers, the selection's sort) and TreeDrafting._grow's inputs to the next
expansion (some thirty launches in all) as one: F programs, one a frontier row (its logsumexp,
then k passes each taking the best value after the one before: over the row held in registers
where the draft's vocabulary is up to _ONE_LIMIT, else over the row read again in steps each
pass), the last to finish choosing the next frontier from the scores the others wrote, and
writing its inputs.
Where grow.py takes torch.topk (a vocabulary over its SORT_LIMIT), the order differs only where
the k-th and the next value tie; scores may differ from the torch ops' by a rounding.
tree_level_ref is the same in torch ops (the tests' reference). Below, tree_select keeps the best
candidates in verify order with the verify rows' inputs, and tree_accept walks a greedy step's
tree along the target's choices and writes what follows: one launch each. Their references are
the torch ops they replace, beside them (speculative/tree/grow.py verify_rows_ref,
speculative/tree/accept.py step_end_ref).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = order_key = key_value = key_index = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 2048  # logits per loop step, where a row is read in steps
_ONE_LIMIT = 16384  # a draft vocabulary up to this is one block, in registers (8 warps hold 64 values a thread)


@functools.cache
def _kernels():
    global triton, tl, order_key, key_value, key_index  # module globals: the kernel reads them by name
    import triton
    import triton.language as tl

    @triton.jit
    def _order_key(x, offs, ok):
        """fp32 values with their indices as int64 keys that order as the picks go: the higher
        value first, then the lower index (the value's bits made monotonic above, the index
        reversed below). Not ok: below every key. -0.0 is taken as 0.0 (equal values: one key)."""
        bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
        ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
        key = (ordered.to(tl.int64) << 32) | (0x7FFFFFFF - offs).to(tl.int64)
        return tl.where(ok, key, tl.full(key.shape, -2147483648, tl.int64) << 32)

    @triton.jit
    def _key_value(key):
        hi = (key >> 32).to(tl.int32)
        return tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)

    @triton.jit
    def _key_index(key):
        return 0x7FFFFFFF - (key & 0x7FFFFFFF).to(tl.int32)

    order_key, key_value, key_index = _order_key, _key_value, _key_index

    @triton.jit
    def tree_level_kernel(logits_ptr, stride, frontier_ptr, tokens_ptr, parents_ptr, scores_ptr, next_ptr,
                          count_ptr, n_ptr, d2t_ptr, slot_of_ptr, map_of_ptr, slots_ptr, map_ptr, ids_ptr, pos_ptr,
                          above_ptr, part_max_ptr, part_sum_ptr, part_keys_ptr,
                          vocab, grown, K: tl.constexpr, KP: tl.constexpr, CP: tl.constexpr, ROOT: tl.constexpr,
                          NEXT: tl.constexpr, DEPTH: tl.constexpr, MAPW: tl.constexpr, MAPWP: tl.constexpr,
                          BLOCK: tl.constexpr, ONE: tl.constexpr, KEYS: tl.constexpr, SPLIT: tl.constexpr,
                          FP: tl.constexpr, SP: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        f = tl.program_id(0)
        rows = tl.num_programs(0)
        base = logits_ptr + f * stride
        lane = tl.arange(0, KP)
        vals = tl.full([KP], float("-inf"), tl.float32)
        idxs = tl.zeros([KP], tl.int32)
        if SPLIT:
            # program (f, s) takes BLOCK logits of row f: its maximum, its sum of exponentials
            # after that maximum, and its k best keys (value and index) go to the part buffers;
            # the last program of the launch merges every row's parts
            s = tl.program_id(1)
            parts = tl.num_programs(1)
            offs = s * BLOCK + tl.arange(0, BLOCK)
            inside = offs < vocab
            x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32)
            key = order_key(x, offs, inside)
            best = tl.max(key, axis=0)
            top = key_value(best)
            # an all -inf block adds nothing (not exp(-inf - -inf))
            total = tl.sum(tl.where(inside & (x != float("-inf")), tl.exp(x - top), 0.0), axis=0)
            picks = tl.full([KP], -2147483648, tl.int64) << 32
            for j in tl.static_range(K):
                if j > 0:
                    best = tl.max(key, axis=0)
                picks = tl.where(lane == j, best, picks)
                key = tl.where(key == best, tl.full(key.shape, -2147483648, tl.int64) << 32, key)
            part_at = f * parts + s
            tl.store(part_max_ptr + part_at, top)
            tl.store(part_sum_ptr + part_at, total)
            tl.store(part_keys_ptr + part_at * KP + lane, picks)
            tl.debug_barrier()  # the parts are written before the counter moves
            arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            last = arrived == rows * parts - 1
            if last:
                tl.debug_barrier()
                fr = tl.arange(0, FP)
                sc = tl.arange(0, SP)
                live = fr < rows
                in_parts = live[:, None] & (sc[None, :] < parts)
                at2 = fr[:, None] * parts + sc[None, :]
                part_m = tl.load(part_max_ptr + at2, mask=in_parts, other=float("-inf"), cache_modifier=".cg")
                part_t = tl.load(part_sum_ptr + at2, mask=in_parts, other=0.0, cache_modifier=".cg")
                row_top = tl.max(part_m, axis=1)
                lse2 = row_top + tl.log(tl.sum(tl.where(part_m != float("-inf"),
                                                        part_t * tl.exp(part_m - row_top[:, None]), 0.0), axis=1))
                kcol = tl.arange(0, SP * KP)
                in_keys = live[:, None] & ((kcol[None, :] // KP) < parts) & ((kcol[None, :] % KP) < K)
                keys2 = tl.load(part_keys_ptr + fr[:, None] * (parts * KP) + kcol[None, :], mask=in_keys,
                                other=tl.full([], -2147483648, tl.int64) << 32, cache_modifier=".cg")
                vals2 = tl.full([FP, KP], float("-inf"), tl.float32)
                idxs2 = tl.zeros([FP, KP], tl.int32)
                for j in tl.static_range(K):
                    b2 = tl.max(keys2, axis=1)
                    vals2 = tl.where(lane[None, :] == j, key_value(b2)[:, None], vals2)
                    idxs2 = tl.where(lane[None, :] == j, key_index(b2)[:, None], idxs2)
                    keys2 = tl.where(keys2 == b2[:, None], tl.full(keys2.shape, -2147483648, tl.int64) << 32, keys2)
                if ROOT:
                    parent2 = tl.full([FP], -1, tl.int64)
                    p_score2 = tl.zeros([FP], tl.float32)
                else:
                    parent2 = tl.load(frontier_ptr + fr, mask=live, other=0)
                    p_score2 = tl.load(scores_ptr + parent2, mask=live, other=0.0)
                out2 = grown + fr[:, None] * K + lane[None, :]
                kept2 = live[:, None] & (lane[None, :] < K)
                tl.store(tokens_ptr + out2, idxs2.to(tokens_ptr.dtype.element_ty), mask=kept2)
                tl.store(parents_ptr + out2, tl.zeros([FP, KP], tl.int64) + parent2.to(tl.int64)[:, None],
                         mask=kept2)
                tl.store(scores_ptr + out2, p_score2[:, None] + (vals2 - lse2[:, None]), mask=kept2)
                tl.debug_barrier()  # read back below, by other threads of this program
        elif ONE:
            # the whole row in registers, read once: the logsumexp, then k passes each taking the
            # best value left (ties: the lower index) and striking it out
            offs = tl.arange(0, BLOCK)
            inside = offs < vocab
            x = tl.load(base + offs, mask=inside, other=float("-inf")).to(tl.float32)
            if KEYS:
                # one reduction a pick (of a value and its index as one key) instead of two; the
                # first pick's value is the row's maximum
                key = order_key(x, offs, inside)
                best = tl.max(key, axis=0)
                top = key_value(best)
                lse = top + tl.log(tl.sum(tl.where(inside, tl.exp(x - top), 0.0), axis=0))
                for j in tl.static_range(K):
                    if j > 0:
                        best = tl.max(key, axis=0)
                    vals = tl.where(lane == j, key_value(best), vals)
                    idxs = tl.where(lane == j, key_index(best), idxs)
                    key = tl.where(key == best, tl.full(key.shape, -2147483648, tl.int64) << 32, key)
            else:
                top = tl.max(x, axis=0)
                lse = top + tl.log(tl.sum(tl.where(inside, tl.exp(x - top), 0.0), axis=0))
                alive = inside
                for j in tl.static_range(K):
                    v = tl.max(tl.where(alive, x, float("-inf")), axis=0)
                    i = tl.min(tl.where(alive & (x == v), offs, BLOCK), axis=0)
                    vals = tl.where(lane == j, v, vals)
                    idxs = tl.where(lane == j, i, idxs)
                    alive = alive & (offs != i)
        else:
            # the row's logsumexp: a running maximum and sum lane by lane, then across the lanes
            m = tl.full([BLOCK], float("-inf"), tl.float32)
            s = tl.zeros([BLOCK], tl.float32)
            for v0 in range(0, vocab, BLOCK):
                offs = v0 + tl.arange(0, BLOCK)
                x = tl.load(base + offs, mask=offs < vocab, other=float("-inf")).to(tl.float32)
                m_new = tl.maximum(m, x)
                s = s * tl.exp(tl.where(m_new == float("-inf"), 0.0, m - m_new)) \
                    + tl.where(x == float("-inf"), 0.0, tl.exp(x - m_new))
                m = m_new
            top = tl.max(m, axis=0)
            lse = top + tl.log(tl.sum(s * tl.exp(tl.where(m == float("-inf"), float("-inf"), m - top)), axis=0))
            # the top k in order: pass j takes the best value after pass j - 1's (value, index) in the
            # order "higher value first, then the lower index"
            last_v = tl.full([], float("inf"), tl.float32)
            last_i = tl.full([], -1, tl.int32)
            for j in tl.static_range(K):
                best = tl.full([BLOCK], float("-inf"), tl.float32)
                best_i = tl.full([BLOCK], vocab, tl.int32)
                for v0 in range(0, vocab, BLOCK):
                    offs = v0 + tl.arange(0, BLOCK)
                    ok = offs < vocab
                    x = tl.load(base + offs, mask=ok, other=float("-inf")).to(tl.float32)
                    after = ok & ((x < last_v) | ((x == last_v) & (offs > last_i)))
                    # a lane's first eligible value enters even at -inf; later ones only above
                    better = after & ((x > best) | (best_i == vocab))
                    best = tl.where(better, x, best)
                    best_i = tl.where(better, offs, best_i)
                v = tl.max(best, axis=0)
                i = tl.min(tl.where((best == v) & (best_i < vocab), best_i, vocab), axis=0)
                vals = tl.where(lane == j, v, vals)
                idxs = tl.where(lane == j, i, idxs)
                last_v = v
                last_i = i
        if not SPLIT:
            if ROOT:
                parent = -1
                p_score = 0.0
            else:
                parent = tl.load(frontier_ptr + f)
                p_score = tl.load(scores_ptr + parent)
            out = grown + f * K + lane
            kept = lane < K
            tl.store(tokens_ptr + out, idxs.to(tokens_ptr.dtype.element_ty), mask=kept)
            tl.store(parents_ptr + out, tl.full([KP], 0, tl.int64) + parent, mask=kept)
            tl.store(scores_ptr + out, p_score + (vals - lse), mask=kept)
            tl.debug_barrier()  # the row's candidates are written before the counter moves
            arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
            last = arrived == rows - 1
            if last:
                tl.debug_barrier()
        if last:  # the last program to finish: the next frontier from every row's candidates
            c = tl.arange(0, CP)
            width = rows * K
            cand = tl.load(scores_ptr + grown + c, mask=c < width, other=float("-inf"), cache_modifier=".cg")
            # (names of their own: a variable bound before this branch keeps its type in it)
            nodes = tl.zeros([KP], tl.int32)
            if KEYS:
                c_key = order_key(cand, c, c < width)
                for j in tl.static_range(K):
                    c_best = tl.max(c_key, axis=0)
                    i_sel = key_index(c_best)
                    tl.store(next_ptr + j, (grown + i_sel).to(next_ptr.dtype.element_ty), mask=j < width)
                    nodes = tl.where(lane == j, grown + i_sel, nodes)
                    c_key = tl.where(c_key == c_best, tl.full(c_key.shape, -2147483648, tl.int64) << 32, c_key)
            else:
                sel_v = tl.full([], float("inf"), tl.float32)
                sel_i = tl.full([], -1, tl.int32)
                for j in tl.static_range(K):
                    after = (c < width) & ((cand < sel_v) | ((cand == sel_v) & (c > sel_i)))
                    v_sel = tl.max(tl.where(after, cand, float("-inf")), axis=0)
                    i_sel = tl.min(tl.where(after & (cand == v_sel), c, CP), axis=0)
                    tl.store(next_ptr + j, (grown + i_sel).to(next_ptr.dtype.element_ty), mask=j < width)
                    nodes = tl.where(lane == j, grown + i_sel, nodes)
                    sel_v = v_sel
                    sel_i = i_sel
            if NEXT:
                # the next expansion's inputs, for the new frontier (depth DEPTH): its scratch rows
                # in the draft's cache, its tokens in the target's ids, their positions, the rows
                # of this level's frontier (their parents) whose states they continue from, and each
                # one's ancestors' rows
                ok = lane < K
                n = tl.load(n_ptr)
                slot = n + K * (DEPTH - 1) + lane
                tl.store(slots_ptr + lane, slot, mask=ok)
                tl.store(slot_of_ptr + nodes, slot, mask=ok)
                t = tl.load(tokens_ptr + nodes, mask=ok, other=0, cache_modifier=".cg")
                tl.store(ids_ptr + lane, t + tl.load(d2t_ptr + t, mask=ok, other=0), mask=ok)
                tl.store(pos_ptr + lane, tl.zeros([KP], tl.int64) + n + (DEPTH - 1), mask=ok)
                up = tl.load(parents_ptr + nodes, mask=ok, other=0, cache_modifier=".cg")
                tl.store(above_ptr + lane, ((nodes - grown) // K).to(tl.int64), mask=ok)
                # entry j: the row of the ancestor at depth j + 1 (from DEPTH - 1 on, 0 and never
                # read): the parent's own map with the parent's row after it, kept for the children
                col = tl.arange(0, MAPWP)
                in_map = ok[:, None] & (col[None, :] < MAPW)
                if DEPTH == 1:
                    rows_map = tl.zeros([KP, MAPWP], tl.int32)
                else:
                    rows_map = tl.load(map_of_ptr + up[:, None] * MAPW + col[None, :], mask=in_map, other=0,
                                       cache_modifier=".cg")
                    at = tl.load(slot_of_ptr + up, mask=ok, other=0, cache_modifier=".cg")
                    rows_map = tl.where(col[None, :] == DEPTH - 2, at.to(tl.int32)[:, None], rows_map)
                tl.store(map_ptr + lane[:, None] * MAPW + col[None, :], rows_map, mask=in_map)
                tl.store(map_of_ptr + nodes[:, None] * MAPW + col[None, :], rows_map, mask=in_map)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return tree_level_kernel


@functools.cache
def _counter(device: torch.device) -> torch.Tensor:
    # zeroed once; each launch leaves it at zero again. The launches that share it run one after
    # another on one stream.
    return torch.zeros(1, dtype=torch.int32, device=device)


_SPLIT_BLOCK = 1024  # logits a program where a level's rows are split (at least; see _split_block)
_MAX_PARTS = 16  # parts a row at most: the merge holds rows x parts x k keys in one program


def _split_block(vocab: int) -> int:
    return max(_SPLIT_BLOCK, next_pow2(-(-vocab // _MAX_PARTS)))


@functools.cache
def _parts(device: torch.device, count: int, keys: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # each part's maximum, sum of exponentials and `keys` best keys. Written and read within one
    # launch; the launches that share them run one after another on one stream, like the counter's.
    return (torch.empty(count, dtype=torch.float32, device=device),
            torch.empty(count, dtype=torch.float32, device=device),
            torch.empty(count * keys, dtype=torch.int64, device=device))


@dataclass(frozen=True)
class LevelInputs:
    """What the next expansion of a tree's frontier reads, written by the level before it (see
    TreeDrafting._grow): n () int64 the root's position; d2t (Dv,) int64 draft id -> target id
    less draft id; slot_of (candidates,) int64 each expanded node's scratch row in the draft's
    cache; map_of (candidates, width) int32 its slot map (a child's is its parent's with the
    parent's row added: one read, not a walk up the tree); and for the k frontier nodes: slots
    (k,) int64 their scratch rows (n + k * (depth - 1) + r), slot_map (k, width) int32 (entry j:
    the row of the ancestor at depth j + 1), ids (k,) int64 their tokens in the target's ids,
    positions (k,) int64 (n + depth - 1), above (k,) int64 each one's parent's row among the frontier
    the level expanded (the root's row 0 at depth 1): the row of that expansion's output holding the
    state it continues from, so that no state is kept by node."""

    n: torch.Tensor
    d2t: torch.Tensor
    slot_of: torch.Tensor
    map_of: torch.Tensor
    slots: torch.Tensor
    slot_map: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    above: torch.Tensor


def tree_level(logits: torch.Tensor, frontier: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor,
               scores: torch.Tensor, grown: int, k: int, next_frontier: torch.Tensor,
               inputs: LevelInputs | None = None, depth: int = 0, pdl: bool = True, keys: bool = False,
               split: bool = False) -> None:
    """The module's docstring. logits (F, Dv) fp32 or bf16, last dim contiguous; frontier (F,)
    int64 or None (the root: F = 1, parent -1, score 0); tokens, parents (int64) and scores (fp32)
    the candidate buffers, written at grown .. grown + F * k; next_frontier (min(k, F * k),) int64.
    k at most Dv. inputs: the next expansion's (LevelInputs), for a frontier of `depth` (the
    children's depth); None where no expansion follows. keys (KernelOptions.tree_level_keys):
    each pick one reduction of a value and its index packed in an int64 key, instead of a maximum
    and then the lowest index holding it (the row held in registers, and the next frontier's
    picks); the same outputs. split (KernelOptions.tree_level_split): each row's logits in parts of
    a program each (at least 1,024 logits, at most 16 parts a row), each part's maximum, sum of
    exponentials and top k by packed keys, merged by the launch's last program: F x parts programs
    where F programs each read a whole row; the same tokens, parents and next frontier, scores
    within a rounding (the logsumexp summed by parts). CUDA (or the Triton interpreter); no host
    sync."""
    rows, vocab = logits.shape
    assert logits.stride(1) == 1 and 1 <= k <= vocab
    assert (rows == 1) if frontier is None else frontier.shape == (rows,)
    assert scores.dtype == torch.float32 and tokens.dtype == parents.dtype == torch.int64
    assert next_frontier.numel() >= min(k, rows * k)
    width = 1 if inputs is None else inputs.slot_map.shape[1]
    if inputs is not None:
        assert 1 <= depth and depth - 1 <= width and inputs.slot_map.dtype == torch.int32
        assert inputs.slot_map.is_contiguous() and inputs.slot_map.shape[0] == k
    io = inputs or LevelInputs(*([tokens] * 9))  # never read without NEXT
    one = next_pow2(vocab) <= _ONE_LIMIT  # the row fits in registers: read once
    block = next_pow2(vocab) if one else _BLOCK
    parts = 1
    if split and vocab > _split_block(vocab):  # one part: the row in one program, as without
        block = _split_block(vocab)
        parts = -(-vocab // block)
    bufs = _parts(logits.device, max(64, next_pow2(rows * parts)), next_pow2(k))
    _kernels()[(rows, parts)](logits, logits.stride(0), tokens if frontier is None else frontier, tokens, parents,
                              scores, next_frontier, _counter(logits.device), io.n, io.d2t, io.slot_of, io.map_of,
                              io.slots, io.slot_map, io.ids, io.positions, io.above, *bufs, vocab, grown, K=k,
                              KP=next_pow2(k), CP=next_pow2(rows * k), ROOT=frontier is None,
                              NEXT=inputs is not None, DEPTH=max(depth, 1), MAPW=width, MAPWP=next_pow2(width),
                              BLOCK=block, ONE=one, KEYS=keys, SPLIT=parts > 1, FP=next_pow2(rows),
                              SP=next_pow2(parts), num_warps=4 if block <= 4096 else 8,
                              **pdl_args(logits.device, pdl))


def tree_level_ref(logits: torch.Tensor, frontier: torch.Tensor | None, tokens: torch.Tensor, parents: torch.Tensor,
                   scores: torch.Tensor, grown: int, k: int, next_frontier: torch.Tensor,
                   inputs: LevelInputs | None = None, depth: int = 0, keys: bool = False, split: bool = False) -> None:
    """tree_level in torch ops: a stable sort gives the order (ties to the lower index). keys and
    split are accepted and have nothing to choose (tree_level gives the same picks either way), so
    that the reference stands in for tree_level wherever that is called (grow_tree's fused levels
    in tests)."""
    rows = logits.shape[0]
    lp = torch.log_softmax(logits.float(), dim=-1)
    order = torch.sort(lp, dim=-1, descending=True, stable=True)
    values, indices = order.values[:, :k], order.indices[:, :k]
    width = rows * k
    p_score = torch.zeros(rows, device=logits.device) if frontier is None else scores.index_select(0, frontier)
    scores[grown:grown + width] = (p_score[:, None] + values).flatten()
    tokens[grown:grown + width] = indices.flatten()
    parents[grown:grown + width] = (torch.full((rows,), -1, dtype=torch.int64, device=logits.device)
                                    if frontier is None else frontier)[:, None].expand(-1, k).flatten()
    best = grown + torch.sort(scores[grown:grown + width], descending=True, stable=True).indices[:min(k, width)]
    next_frontier[:best.shape[0]] = best
    if inputs is None:
        return
    n = inputs.n
    inputs.slots.copy_(n + k * (depth - 1) + torch.arange(k, device=n.device))
    inputs.slot_of[best] = inputs.slots
    t = tokens[best]
    inputs.ids.copy_(t + inputs.d2t[t])
    inputs.positions.fill_(int(n) + depth - 1)
    inputs.above.copy_(torch.div(best - grown, k, rounding_mode="floor"))
    inputs.slot_map.zero_()
    up = parents[best]
    for j in range(depth - 2, -1, -1):  # the ancestor at depth j + 1
        inputs.slot_map[:, j] = inputs.slot_of[up].to(torch.int32)
        up = parents[up.clamp_min(0)]
    inputs.map_of[best] = inputs.slot_map


@functools.cache
def _select_kernel():
    global triton, tl  # module globals: the kernel reads them by name
    import triton
    import triton.language as tl

    @triton.jit
    def tree_select_kernel(tokens_ptr, parents_ptr, depths_ptr, scores_ptr, d2t_ptr, n_ptr, root_ptr, rank_ptr,
                           index_ptr, out_tokens_ptr, out_parents_ptr, out_depths_ptr, out_scores_ptr, ids_ptr,
                           pos_ptr, slots_ptr, map_ptr, base_ptr, count, T: tl.constexpr, CP: tl.constexpr,
                           D: tl.constexpr, W: tl.constexpr, WP: tl.constexpr, TP: tl.constexpr,
                           PASSES: tl.constexpr, BLOCKS: tl.constexpr, RB: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        i = tl.arange(0, CP)
        live = i < count
        s = tl.load(scores_ptr + i, mask=live, other=float("-inf"))
        d = tl.load(depths_ptr + i, mask=live, other=0)
        # rank: how many candidates come first (a higher score, or the same and a lower index,
        # which is the shallower: the index order is the depth order); pos: the verify order, by
        # depth, then rank among the kept
        if BLOCKS:
            # every pair compared, RB candidates j at a time against all i: count / RB steps that
            # do not depend on each other's sums, where the loops below take 2 * count dependent
            # steps and the passes 2 T dependent reductions
            rank = tl.zeros([CP], tl.int32)
            for j0 in range(0, count, RB):
                j = j0 + tl.arange(0, RB)
                jl = j < count
                sj = tl.load(scores_ptr + j, mask=jl, other=float("-inf"))
                first = (sj[None, :] > s[:, None]) | ((sj[None, :] == s[:, None]) & (j[None, :] < i[:, None]))
                rank += tl.sum((jl[None, :] & first).to(tl.int32), axis=1)
            kept = live & (rank < T)
            tl.store(rank_ptr + i, tl.where(kept, rank, CP + 1), mask=live)
            tl.debug_barrier()
            pos = tl.zeros([CP], tl.int32)
            for j0 in range(0, count, RB):
                j = j0 + tl.arange(0, RB)
                jl = j < count
                rj = tl.load(rank_ptr + j, mask=jl, other=CP + 1)
                dj = tl.load(depths_ptr + j, mask=jl, other=0)
                before = (rj[None, :] <= CP) & ((dj[None, :] < d[:, None])
                                                | ((dj[None, :] == d[:, None]) & (rj[None, :] < rank[:, None])))
                pos += tl.sum((jl[None, :] & before).to(tl.int32), axis=1)
        elif PASSES:
            # T passes over the scores in registers, each taking the best left (ties: the lower
            # index): pass j's pick has rank j. Then the kept nodes' order among themselves. Some
            # 2 T reductions over CP, where the loops below take 2 * count dependent steps.
            lane = tl.arange(0, TP)
            sel = tl.zeros([TP], tl.int32)
            alive = live
            for j in tl.static_range(T):
                v = tl.max(tl.where(alive, s, float("-inf")), axis=0)
                pick = tl.min(tl.where(alive & (s == v), i, CP), axis=0)
                sel = tl.where(lane == j, pick, sel)
                alive = alive & (i != pick)
            on = lane < T
            match = (i[:, None] == sel[None, :]) & on[None, :]  # (CP, TP): candidate i is pick j
            rank = tl.min(tl.where(match, lane[None, :], CP + 1), axis=1)
            d_sel = tl.load(depths_ptr + sel, mask=on, other=0)
            ahead = on[None, :] & ((d_sel[None, :] < d_sel[:, None])
                                   | ((d_sel[None, :] == d_sel[:, None]) & (lane[None, :] < lane[:, None])))
            pos = tl.sum(tl.where(match, tl.sum(ahead.to(tl.int32), axis=1)[None, :], 0), axis=1)
            kept = live & (rank < T)
        else:
            rank = tl.zeros([CP], tl.int32)
            for j in range(0, count):
                sj = tl.load(scores_ptr + j)
                rank += ((sj > s) | ((sj == s) & (j < i))).to(tl.int32)
            kept = live & (rank < T)
            tl.store(rank_ptr + i, tl.where(kept, rank, CP + 1), mask=live)
            tl.debug_barrier()
            pos = tl.zeros([CP], tl.int32)
            for j in range(0, count):
                rj = tl.load(rank_ptr + j)
                dj = tl.load(depths_ptr + j)
                pos += ((rj <= CP) & ((dj < d) | ((dj == d) & (rj < rank)))).to(tl.int32)
        tl.store(index_ptr + i, tl.where(kept, pos, -1), mask=live)
        tl.debug_barrier()
        n = tl.load(n_ptr)
        tok = tl.load(tokens_ptr + i, mask=live, other=0)
        up = tl.load(parents_ptr + i, mask=live, other=-1)
        new_up = tl.load(index_ptr + tl.maximum(up, 0), mask=kept & (up >= 0), other=-1)
        tl.store(out_tokens_ptr + pos, tok, mask=kept)
        tl.store(out_parents_ptr + pos, tl.where(up >= 0, new_up, -1).to(tl.int64), mask=kept)
        tl.store(out_depths_ptr + pos, d, mask=kept)
        tl.store(out_scores_ptr + pos, s, mask=kept)
        tl.store(ids_ptr + 1 + pos, tok + tl.load(d2t_ptr + tok, mask=kept, other=0), mask=kept)
        tl.store(pos_ptr + 1 + pos, n + d, mask=kept)
        # the verify rows' slot map: entry e of a row the cache row of its ancestor at depth e (0:
        # the root, row n; node m, row n + 1 + m), entries from its own depth on 0
        col = tl.arange(0, WP)
        rows_map = tl.where((col[None, :] == 0) & kept[:, None], (n + tl.zeros([CP, WP], tl.int64)).to(tl.int32), 0)
        cur = up
        for step in tl.static_range(D - 1):
            at = d - 1 - step  # the depth of `cur`, where it is a node
            real = kept & (at >= 1)
            row = n + 1 + tl.load(index_ptr + tl.maximum(cur, 0), mask=real, other=0)
            rows_map = tl.where((col[None, :] == at[:, None]) & real[:, None], row.to(tl.int32)[:, None], rows_map)
            cur = tl.load(parents_ptr + tl.maximum(cur, 0), mask=real & (at >= 2), other=-1)
        tl.store(map_ptr + (1 + pos)[:, None] * W + col[None, :], rows_map, mask=kept[:, None] & (col[None, :] < W))
        # row 0, the root
        r = tl.arange(0, TP)
        tl.store(map_ptr + col, tl.where(col == 0, n, 0).to(tl.int32), mask=col < W)
        tl.store(ids_ptr, tl.load(root_ptr))
        tl.store(pos_ptr, n)
        tl.store(slots_ptr + r, n + r, mask=r < T + 1)
        tl.store(base_ptr + r, (n + tl.zeros([TP], tl.int64)).to(tl.int32), mask=r < T + 1)

    return tree_select_kernel


_SELECT_BLOCK = 32  # tree_select with blocks: candidates compared against all at a time


@functools.cache
def _select_scratch(device: torch.device, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    # each candidate's rank, then its verify index: written and read within one launch
    return (torch.empty(size, dtype=torch.int32, device=device), torch.empty(size, dtype=torch.int32, device=device))


@dataclass(frozen=True)
class VerifyRows:
    """A grown tree's kept nodes and the verify step's inputs for them (tree_select): the tree
    (DraftTree fields: draft ids, parents, depths, scores) in verify order, and for its N + 1 rows
    (0 the root): ids (target ids), positions, slots (cache rows), slot_map (N + 1, width) int32
    and map_base (N + 1,) int32, as tree_slot_map gives them (None where rows attend through
    explicit masks: speculative/tree/grow.py verify_rows)."""

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    scores: torch.Tensor
    ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    slot_map: torch.Tensor | None
    map_base: torch.Tensor | None


def tree_select(tokens: torch.Tensor, parents: torch.Tensor, depths: torch.Tensor, scores: torch.Tensor, most: int,
                d2t: torch.Tensor, n: torch.Tensor, root: torch.Tensor, depth: int, pdl: bool = True,
                passes: bool = False, blocks: bool = False) -> VerifyRows:
    """The `most` best candidates (grow_tree's selection: by score, ties to the lower index), in
    verify order (by depth, then score), with the verify step's inputs: one launch, one program.
    tokens, parents, depths (int64) and scores (fp32): every candidate, in grow_tree's layout
    (index order is depth order); d2t (Dv,) int64; n () int64 the root's position; root (1,) int64
    its token; depth: the tree shape's (the slot map is depth + 1 wide). passes: the ranks by `most`
    passes over the scores held in registers instead of a loop over the candidates per candidate
    (KernelOptions.tree_select_passes; the same outputs). blocks: the ranks and the verify order by
    comparing every pair of candidates, a block of them at a time (KernelOptions.tree_select_blocks;
    the same outputs; before passes). CUDA (or the Triton interpreter); no host sync."""
    count, dev = tokens.shape[0], tokens.device
    T = min(most, count)
    W = depth + 1
    long = dict(dtype=torch.int64, device=dev)
    out = VerifyRows(tokens=torch.empty(T, **long), parents=torch.empty(T, **long), depths=torch.empty(T, **long),
                     scores=torch.empty(T, dtype=torch.float32, device=dev), ids=torch.empty(T + 1, **long),
                     positions=torch.empty(T + 1, **long), slots=torch.empty(T + 1, **long),
                     slot_map=torch.empty(T + 1, W, dtype=torch.int32, device=dev),
                     map_base=torch.empty(T + 1, dtype=torch.int32, device=dev))
    CP = next_pow2(count)
    rank, index = _select_scratch(dev, CP)
    _select_kernel()[(1,)](tokens, parents, depths, scores, d2t, n, root, rank, index, out.tokens, out.parents,
                           out.depths, out.scores, out.ids, out.positions, out.slots, out.slot_map, out.map_base,
                           count, T=T, CP=CP, D=depth, W=W, WP=next_pow2(W), TP=next_pow2(T + 1), PASSES=passes,
                           BLOCKS=blocks, RB=_SELECT_BLOCK, num_warps=4, **pdl_args(dev, pdl))
    return out


walk_start = write_step_end = None  # bound by _step_end(): the kernels below read them by name


@functools.cache
def _step_end():
    """Binds walk_start (a tree walk's starting values) and write_step_end (what a tree step writes
    after its walk: StepEnd, the result, the root, n, from the walk's path and accepted tokens
    (DP,), count and next token), shared by the greedy and the sampled accept kernels."""
    global triton, tl, walk_start, write_step_end
    import triton
    import triton.language as tl

    @triton.jit
    def walk_start(tokens_ptr, parents_ptr, N, NP: tl.constexpr, DP: tl.constexpr):
        """A walk's start: node indices i (NP,), live, parents and tokens; depths d (DP,), the path
        (-1s), its tokens (the first node's token: what the torch path's clamped gather gives past
        the path's end), the row (0: the root; m + 1 node m) and the count."""
        i = tl.arange(0, NP)
        live = i < N
        par = tl.load(parents_ptr + i, mask=live, other=-2)
        tok = tl.load(tokens_ptr + i, mask=live, other=-1)
        d = tl.arange(0, DP)
        path = tl.full([DP], -1, tl.int64)
        acc = tl.zeros([DP], tl.int64) + tl.load(tokens_ptr)
        return i, live, par, tok, d, path, acc, tl.full([], 0, tl.int32), tl.full([], 0, tl.int32)

    @triton.jit
    def write_step_end(n_ptr, root_ptr, result_ptr, count_ptr, src_ptr, dst_ptr, window_ptr, rows_ptr, ext_pos_ptr,
                       path, acc, count, nxt, D: tl.constexpr, DP: tl.constexpr):
        d = tl.arange(0, DP)
        n = tl.load(n_ptr)
        on = d < D
        taken = d < count
        tl.store(src_ptr + d, n + 1 + tl.where(taken, path, d.to(tl.int64)), mask=on)
        tl.store(dst_ptr + d, n + 1 + d, mask=on)
        tl.store(window_ptr + d, tl.where(taken, acc, nxt), mask=on)
        tl.store(window_ptr + D, nxt)
        tl.store(rows_ptr, 0)
        tl.store(rows_ptr + 1 + d, tl.where(taken, 1 + path, 0), mask=on)
        e = tl.arange(0, 2 * DP)
        tl.store(ext_pos_ptr + e, n + e, mask=e < D + 1)
        tl.store(result_ptr, count.to(tl.int64))
        tl.store(result_ptr + 1, nxt)
        tl.store(result_ptr + 2 + d, acc, mask=on)
        tl.store(count_ptr, count.to(tl.int64))
        tl.store(root_ptr, nxt)
        tl.store(n_ptr, n + count + 1)


@functools.cache
def _accept_kernel():
    global triton, tl  # module globals: the kernel reads them by name
    _step_end()
    import triton
    import triton.language as tl

    @triton.jit
    def tree_accept_kernel(choice_ptr, tokens_ptr, parents_ptr, n_ptr, root_ptr, result_ptr, count_ptr, src_ptr,
                           dst_ptr, window_ptr, rows_ptr, ext_pos_ptr, N, D: tl.constexpr, NP: tl.constexpr,
                           DP: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        i, live, par, tok, d, path, acc, row, count = walk_start(tokens_ptr, parents_ptr, N, NP, DP)
        for step in tl.static_range(D):
            want = tl.load(choice_ptr + row)
            # (where a step finds no child the walk stays put, and so every later step finds none)
            hit = live & (par == (row - 1).to(tl.int64)) & (tok == want)
            node = tl.min(tl.where(hit, i, NP), axis=0)  # siblings hold distinct tokens: one at most
            found = node < NP
            path = tl.where((d == step) & found, node.to(tl.int64), path)
            acc = tl.where((d == step) & found, want, acc)
            row = tl.where(found, node + 1, row)
            count += found.to(tl.int32)
        nxt = tl.load(choice_ptr + row)
        write_step_end(n_ptr, root_ptr, result_ptr, count_ptr, src_ptr, dst_ptr, window_ptr, rows_ptr, ext_pos_ptr,
                       path, acc, count, nxt, D, DP)

    return tree_accept_kernel


@functools.cache
def _sampled_accept_kernel():
    global triton, tl  # module globals: the kernel reads them by name
    _step_end()
    import triton
    import triton.language as tl

    @triton.jit
    def tree_accept_sampled_kernel(probs_ptr, sums_ptr, u_ptr, e_ptr, tokens_ptr, parents_ptr, n_ptr, root_ptr,
                                   result_ptr, count_ptr, src_ptr, dst_ptr, window_ptr, rows_ptr, ext_pos_ptr, N, V,
                                   D: tl.constexpr, K: tl.constexpr, NP: tl.constexpr, DP: tl.constexpr,
                                   KP: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        i, live, par, tok, d, path, acc, row, count = walk_start(tokens_ptr, parents_ptr, N, NP, DP)
        ks = tl.arange(0, KP)
        walking = tl.full([], 1, tl.int1)
        left = tl.load(sums_ptr)  # the residual's mass: the row's sum less the refused children's
        refused = tl.full([KP], -1, tl.int64)  # the current row's refused tokens (zeroed for the last draw)
        for step in tl.static_range(D):
            # the row's children in verify order (best score first): rank among those under it
            under = live & (par == (row - 1).to(tl.int64))
            rank = tl.cumsum(under.to(tl.int32), axis=0) - 1
            stepped = tl.full([], -1, tl.int32)
            for s in tl.static_range(K):
                child = tl.min(tl.where(under & (rank == s), i, NP), axis=0)
                exists = child < NP
                token = tl.sum(tl.where(i == child, tok, 0), axis=0)
                tried = walking & exists & (stepped < 0)
                mass = tl.load(probs_ptr + row.to(tl.int64) * V + token, mask=tried, other=0.0)
                take = tried & (tl.load(u_ptr + step * K + s) * left < mass)
                stepped = tl.where(take, child, stepped)
                refuse = tried & (take == 0)
                left = tl.where(refuse, left - mass, left)
                refused = tl.where(refuse & (ks == s), token, refused)
            moved = stepped >= 0
            node = tl.maximum(stepped, 0)
            path = tl.where((d == step) & moved, stepped.to(tl.int64), path)
            acc = tl.where((d == step) & moved, tl.sum(tl.where(i == node, tok, 0), axis=0), acc)
            row = tl.where(moved, stepped + 1, row)
            left = tl.where(moved, tl.load(sums_ptr + row), left)
            refused = tl.where(moved, -1, refused)
            count += moved.to(tl.int32)
            walking = walking & moved
        # the last draw: argmax of r / e (an exponential race over r normalized), r the row's
        # probabilities with the refused children's zeroed; all of them where nothing is left
        keep = left > 0
        best_v = tl.full([BLOCK], -1.0, tl.float32)
        best_i = tl.full([BLOCK], 0, tl.int32)
        base = probs_ptr + row.to(tl.int64) * V
        for v0 in range(0, V, BLOCK):
            v = v0 + tl.arange(0, BLOCK)
            ok = v < V
            r = tl.load(base + v, mask=ok, other=0.0)
            out = tl.sum(tl.where(refused[None, :] == v.to(tl.int64)[:, None], 1, 0), axis=1) > 0
            r = tl.where(out, tl.where(keep, 0.0, r), r)
            q = tl.where(ok, r / tl.load(e_ptr + v, mask=ok, other=1.0), -1.0)
            better = q > best_v  # the first of equals keeps its place: the lowest index, as argmax
            best_i = tl.where(better, v, best_i)
            best_v = tl.where(better, q, best_v)
        top = tl.max(best_v, axis=0)
        nxt = tl.min(tl.where(best_v == top, best_i, V), axis=0).to(tl.int64)
        write_step_end(n_ptr, root_ptr, result_ptr, count_ptr, src_ptr, dst_ptr, window_ptr, rows_ptr, ext_pos_ptr,
                       path, acc, count, nxt, D, DP)

    return tree_accept_sampled_kernel


@dataclass(frozen=True)
class StepEnd:
    """What a greedy tree step does after its verify forward, from tree_accept: count () the
    accepted drafts; src, dst (D,) the cache rows the accepted nodes' K/V move from and to; window
    (D + 1,) the draft-extend's tokens, rows (D + 1,) the verify rows whose target states it pairs
    them with, ext_pos (D + 1,) its positions."""

    count: torch.Tensor
    src: torch.Tensor
    dst: torch.Tensor
    window: torch.Tensor
    rows: torch.Tensor
    ext_pos: torch.Tensor


def tree_accept(choice: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor, n: torch.Tensor, depth: int,
                result: torch.Tensor, root: torch.Tensor, pdl: bool = True) -> StepEnd:
    """The greedy walk (speculative/tree/accept.py greedy_tree_path) and the step's bookkeeping in
    one launch: choice (N + 1,) int64 the target's choice at each verify row (0 the root); tokens
    (N,) the nodes' target ids, parents (N,) (-1 under the root), in verify order; depth D the
    longest path. Writes result [count, next token, the accepted tokens (D)], root (1,) the next
    token and n () += count + 1 (the step's state), and returns the rest (StepEnd). CUDA (or the
    Triton interpreter); no host sync."""
    N, dev = tokens.shape[0], tokens.device
    long = dict(dtype=torch.int64, device=dev)
    end = StepEnd(count=torch.empty((), **long), src=torch.empty(depth, **long), dst=torch.empty(depth, **long),
                  window=torch.empty(depth + 1, **long), rows=torch.empty(depth + 1, **long),
                  ext_pos=torch.empty(depth + 1, **long))
    assert result.shape == (2 + depth,) and choice.shape == (N + 1,)
    _accept_kernel()[(1,)](choice, tokens, parents, n, root, result, end.count, end.src, end.dst, end.window,
                           end.rows, end.ext_pos, N, D=depth, NP=next_pow2(max(N, 1)), DP=next_pow2(depth),
                           num_warps=1, **pdl_args(dev, pdl))
    return end


_DRAW_BLOCK = 4096  # the last draw's loads in flight: 12 steps over a 49,152-token row


def tree_accept_sampled(probs: torch.Tensor, u: torch.Tensor, e: torch.Tensor, tokens: torch.Tensor,
                        parents: torch.Tensor, n: torch.Tensor, depth: int, result: torch.Tensor, root: torch.Tensor,
                        pdl: bool = True) -> StepEnd:
    """The sampled walk (speculative/tree/accept.py sampled_tree_path: each row's children tried
    best first, child c taken with probability r(c) / sum(r), r the row's probabilities less the
    refused children's; the next token drawn from r by the exponential race over e) and the step's
    bookkeeping, as tree_accept does it for greedy steps, in one launch where the torch ops take
    some ten a try. probs (N + 1, V) fp32 the target's at each verify row; u (D, K) a uniform for
    each try; e (V,) Exp(1) variates. The residual's sum is kept as the row's sum less the refused
    masses (the torch path sums the zeroed row again), so a draw within rounding of a threshold may
    go the other way; the rule is the same. CUDA (or the Triton interpreter); no host sync."""
    N, dev = tokens.shape[0], tokens.device
    V = probs.shape[1]
    assert probs.shape[0] == N + 1 and probs.dtype == torch.float32 and probs.is_contiguous()
    assert u.shape[0] == depth and u.dtype == torch.float32 and u.is_contiguous() and e.shape == (V,)
    assert result.shape == (2 + depth,)
    long = dict(dtype=torch.int64, device=dev)
    end = StepEnd(count=torch.empty((), **long), src=torch.empty(depth, **long), dst=torch.empty(depth, **long),
                  window=torch.empty(depth + 1, **long), rows=torch.empty(depth + 1, **long),
                  ext_pos=torch.empty(depth + 1, **long))
    k = u.shape[1]
    _sampled_accept_kernel()[(1,)](probs, probs.sum(-1), u, e, tokens, parents, n, root, result, end.count, end.src,
                                   end.dst, end.window, end.rows, end.ext_pos, N, V, D=depth, K=k,
                                   NP=next_pow2(max(N, 1)), DP=next_pow2(depth), KP=next_pow2(k),
                                   BLOCK=_DRAW_BLOCK, num_warps=8, **pdl_args(dev, pdl))
    return end
