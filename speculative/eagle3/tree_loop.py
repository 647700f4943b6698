"""TreeDrafting: EAGLE-3 with a draft tree (EAGLE-2's dynamic tree), one verify step at a time.

Each step, from the bonus token at position n (the root; the target has cached n tokens):
1. grow: the draft's top-k after the root form depth 1; at each further depth the k best nodes by
   cumulative draft log-probability run one draft step together (each node's entry in a scratch
   row of the draft's cache, attending to the draft's context, its ancestors' rows and its own)
   and give their top-k children; the best TOKENS nodes are kept (speculative/tree/grow.py);
2. verify: one target forward over the root and every kept node, node i at position n + its
   depth with its K/V in row n + 1 + i, each row attending to the context, its ancestors and
   itself (ForwardBatch.visible);
3. accept: greedy, the walk along the target's choices; sampled, the multi-candidate rule that
   keeps the target's distribution exactly (speculative/tree/accept.py);
4. move the accepted nodes' K/V to their positions n + 1.., run the draft-extend over the
   accepted path (the draft's cache rows n.. now hold the path, overwriting the scratch rows), and
   commit the path and the target's next token.

Eager (no CUDA graph yet). On a GPU the verify rows attend through the decode kernel, reading
their ancestors through a slot map, in forwards of at most 16 rows on the batch-invariant tiles,
so that each has the bits of its token's decode step and greedy answers are plain decoding's; the
draft's growth attends on SDPA with an explicit mask, as the CPU's verify does. A step
needs the tree's rows past n in both caches: where they would not fit, plain steps finish."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from engine.decode import plain_steps
from engine.forward_batch import ForwardBatch
from engine.kernels.gemv import MAX_ROWS
from engine.model import ForwardOutput
from engine.sampling import probabilities

from speculative.tree.accept import greedy_tree_path, sampled_tree_accept
from speculative.tree.grow import DraftTree, grow_tree, tree_mask, tree_slot_map
from speculative.tree.shape import TreeShape


class TreeDrafting:
    def __init__(self, parts, shape: TreeShape):
        self.parts, self.shape = parts, shape  # DraftParts: the head, its embeddings and cache

    def rows_needed(self) -> int:
        """Cache rows a step uses past n: the target's root and nodes, the draft's scratch rows."""
        s = self.shape
        return max(1 + s.tokens, s.topk * max(1, s.depth - 1) + 1)

    def iterations(self, runner, state, d_logits, d_hidden, commit) -> Iterator[list[int]]:
        """Verify steps until the context is full (then plain steps); commit(result, n, state) as
        the speculator commits a step: returns (the new tokens, the cache length after them)."""
        state.tree = str(self.shape)
        while state.kv_len + self.rows_needed() <= runner.max_len:
            n = state.kv_len
            result, d_logits, d_hidden, rows = self.step(runner, state, n, d_logits, d_hidden)
            state.verify_rows.append(rows)
            out, _ = commit(result, n, state)
            yield out
        yield from plain_steps(runner, state)

    @torch.inference_mode()
    def step(self, runner, state, n: int, d_logits: torch.Tensor, d_hidden: torch.Tensor):
        """One verify step. Returns ([a, next token, the a accepted tokens], the draft's logits and
        state at the last accepted row, the rows verified)."""
        parts, draft, dev = self.parts, self.parts.draft, runner.device
        tree = self._grow(n, d_logits[-1], d_hidden[-1:])
        target_tree = DraftTree(draft.to_target_ids(tree.tokens), tree.parents, tree.depths, tree.scores)
        N = len(tree)
        ids = torch.cat([torch.tensor([state.tokens[n]], device=dev), target_tree.tokens])
        positions = torch.cat([torch.tensor([n], device=dev), n + tree.depths])
        slots = n + torch.arange(N + 1, device=dev)
        # A batch-invariant target (a GPU's) verifies at most MAX_ROWS rows a forward, so that every
        # row runs the kernels, and has the bits, of its token's decode step: a longer tree goes in
        # chunks, in order (a node's ancestors come before it, their K/V written by then). Its
        # rows attend through the decode kernel, reading their ancestors through a slot map;
        # elsewhere (the CPU's torch attention) through an explicit mask.
        model = runner.model
        chunk = MAX_ROWS if model.ops.options.batch_invariant else N + 1
        if model.ops.attention is not None and model.ops.options.batch_invariant:
            slot_map, map_base = tree_slot_map(tree.parents, tree.depths, n, self.shape.depth + 1)
            tree_rows = {"slot_map": slot_map, "map_base": map_base}
        else:
            visible = torch.zeros(N + 1, n + N + 1, dtype=torch.bool, device=dev)
            visible[:, :n] = True
            visible[:, n:] = tree_mask(tree.parents)
            tree_rows = {"visible": visible}
        outs = [model(ForwardBatch(ids[c:c + chunk], positions[c:c + chunk], start_pos=n, slots=slots[c:c + chunk],
                                   **{name: t[c:c + chunk] for name, t in tree_rows.items()}),
                      runner.kv, runner.aux_layer_ids)
                for c in range(0, N + 1, chunk)]
        logits = torch.cat([runner.model.logits(o.hidden) for o in outs])  # lm_head by chunk too
        out = outs[0] if len(outs) == 1 else ForwardOutput(
            hidden=torch.cat([o.hidden for o in outs]),
            aux_hidden=None if outs[0].aux_hidden is None else torch.cat([o.aux_hidden for o in outs]))
        if state.params.is_greedy:  # fixed shapes, no host read until the result
            depth = min(self.shape.depth, self.shape.tokens)  # the deepest a kept node can be
            path, count, next_token = greedy_tree_path(target_tree, logits.argmax(-1), depth)
        else:
            walked, token = sampled_tree_accept(target_tree, probabilities(logits, state.params), state.generator)
            depth = len(walked)
            path = torch.tensor(walked, dtype=torch.long, device=dev)
            count, next_token = torch.tensor(depth, device=dev), torch.tensor(token, device=dev)
        # path (depth,): the accepted nodes from depth 1, the first `count` of them real; rows past
        # them below copy onto themselves and pad the draft-extend (their K/V, past the accepted
        # length, is rewritten before anything reads it)
        index = torch.arange(depth, device=dev)
        taken = index < count
        if depth:  # the accepted nodes' K/V to positions n + 1 .. n + a
            kv = runner.kv
            src = n + 1 + torch.where(taken, path, index)
            kv.k_all[:, n + 1:n + 1 + depth] = kv.k_all.index_select(1, src)
            kv.v_all[:, n + 1:n + 1 + depth] = kv.v_all.index_select(1, src)
        accepted = target_tree.tokens.index_select(0, path.clamp_min(0))
        # The draft-extend: row i pairs the target state of the path's row i (0: the root) with the
        # token after it; its outputs are those of row `count`.
        window = torch.cat([torch.where(taken, accepted, next_token), next_token.view(1)])
        rows = torch.cat([torch.zeros(1, dtype=torch.long, device=dev), torch.where(taken, 1 + path, 0)])
        states = parts.target_states(out.aux_hidden, out.hidden).index_select(0, rows)
        ext_pos = n + torch.arange(depth + 1, device=dev)
        d_logits, d_hidden = draft(window, ext_pos, states, True, parts.embed, parts.kv, start_pos=n, last=count)
        result = torch.cat([count.view(1), next_token.view(1), accepted]).tolist()  # the step's one read
        a = result[0]
        return [a, result[1], *result[2:2 + a]], d_logits, d_hidden, N + 1

    def _grow(self, n: int, root_logits: torch.Tensor, root_hidden: torch.Tensor):
        """The draft tree after the root, its tokens in the draft's vocabulary. Each expansion's
        inputs (scratch rows, what each frontier node sees, the states it continues from) are
        tensor operations of fixed shapes over every candidate of the tree: no host read."""
        parts, draft, shape = self.parts, self.parts.draft, self.shape
        dev = root_logits.device
        k = min(shape.topk, root_logits.shape[-1])
        candidates = k + max(shape.depth - 1, 0) * k * k  # every node grow_tree can make
        slot_of = torch.full((candidates,), -1, dtype=torch.long, device=dev)  # expanded node -> scratch row
        hidden_of = root_hidden.new_zeros(candidates, root_hidden.shape[-1])  # -> the draft state after it
        used = [0]

        def expand(frontier: torch.Tensor, grown: DraftTree) -> torch.Tensor:
            width = frontier.shape[0]
            rows = torch.arange(width, device=dev)
            slots = n + used[0] + rows
            used[0] += width
            slot_of.index_copy_(0, frontier, slots)
            seen = n + used[0]
            # itself and its ancestors, all expanded before it; an unexpanded slot (-1) lands in the
            # extra last column, dropped after
            visible = torch.zeros(width, seen + 1, dtype=torch.bool, device=dev)
            visible[:, :n] = True
            parents, cur = grown.parents, frontier
            for _ in range(shape.depth):
                valid = cur >= 0
                visible[rows, torch.where(valid, slot_of.index_select(0, cur.clamp_min(0)), seen)] = True
                cur = torch.where(valid, parents.index_select(0, cur.clamp_min(0)), cur)
            above = parents.index_select(0, frontier)
            hidden = torch.where((above < 0)[:, None], root_hidden.expand(width, -1),
                                 hidden_of.index_select(0, above.clamp_min(0)))
            tokens = draft.to_target_ids(grown.tokens.index_select(0, frontier))
            positions = n + grown.depths.index_select(0, frontier) - 1
            logits, out = draft(tokens, positions, hidden, False, parts.embed, parts.kv, slots=slots,
                                visible=visible[:, :seen])
            hidden_of.index_copy_(0, frontier, out.to(hidden_of.dtype))
            return F.log_softmax(logits.float(), dim=-1)

        return grow_tree(F.log_softmax(root_logits.float(), dim=-1), expand, self.shape)
