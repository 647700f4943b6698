"""TreeDrafting: EAGLE-3 with a draft tree (EAGLE-2's dynamic tree), one verify step at a time.

Each step, from the bonus token at position n (the root; the target has cached n tokens):
1. grow: the draft's top-k after the root form depth 1; at each further depth the k best nodes by
   cumulative draft log-probability run one draft step together (each node's entry in a scratch
   row of the draft's cache, attending to the draft's context, its ancestors' rows and its own)
   and give their top-k children; the best TOKENS nodes are kept (speculative/tree/grow.py);
2. verify: one target forward over the root and every kept node, node i at position n + its
   depth with its K/V in row n + 1 + i, each row attending to the context, its ancestors and
   itself;
3. accept: greedy, the walk along the target's choices; sampled, the multi-candidate rule that
   keeps the target's distribution exactly (speculative/tree/accept.py), its random numbers
   drawn from the request's generator before the step;
4. move the accepted nodes' K/V to their positions n + 1.., run the draft-extend over the
   accepted path (the draft's cache rows n.. now hold the path, overwriting the scratch rows), and
   commit the path and the target's next token.

The step is one function over static device buffers (n, the root token, the draft's logits and
state at the root, the sampling parameters and draws), all of fixed shapes: a step reads the
device once (its result), and on a GPU with graphs it is captured as one CUDA graph for each kind
(greedy, sampling, sampling with cuts), replayed each step. There every row reads
its ancestors through a slot map (the decode kernel's, ForwardBatch.slot_map): the verify rows in
forwards of at most 16 rows on a batch-invariant target, so that each has the bits of its token's
decode step and greedy answers are plain decoding's, and the draft's rows the same way. Where
the host knows n and there is no attention kernel (the CPU), the rows attend on SDPA with an
explicit mask instead. A step needs the tree's rows past n in both caches: where they would not
fit, plain steps finish."""

from __future__ import annotations

from typing import Iterator

import torch
import torch.nn.functional as F

from engine.decode import plain_steps
from engine.forward_batch import ForwardBatch
from engine import routing
from engine.kernels.pick import rows_argmax
from engine.model import ForwardOutput
from engine.options import triton_interpreting
from engine.sampling import SamplingTensors, filtered, probabilities_t

from speculative.kernels.kv_rows import move_kv_rows, move_kv_rows_ref
from speculative.kernels.states import gather_states
from speculative.kernels.tree_level import LevelInputs, tree_accept, tree_accept_sampled, tree_select
from speculative.kernels.tree_lookup import tree_lookup
from speculative.tree.accept import greedy_tree_path, sampled_tree_path, step_end
from speculative.tree.grow import DraftTree, grow_tree, tree_mask, verify_rows
from speculative.tree.lookup import lookup_proposal, merge_lookup, record_step
from speculative.tree.shape import TreeShape


class TreeDrafting:
    def __init__(self, parts, shape: TreeShape, runner):
        self.parts, self.shape, self.runner = parts, shape, runner  # DraftParts: the head, its embeddings and cache
        draft, dev = parts.draft, runner.device
        # Rows read their ancestors through slot maps, the lengths on the device (what a graph
        # needs), wherever an attention kernel serves; tests set it on the CPU to run that body.
        self.on_device = runner.model.ops.attention is not None
        # The step's bookkeeping in the tree kernels (KernelOptions.tree_level: a level of the
        # growth a launch, the kept nodes, a greedy step's walk): a GPU's, or the interpreter's in
        # tests.
        self.fused_level = (self.on_device and runner.model.ops.options.tree_level
                            and (dev.type == "cuda" or triton_interpreting()))
        # the most rows a verify forward takes (routing.tree_rows): the whole tree, or 16-row chunks
        self.verify_rows = routing.tree_rows(runner.model.ops.options, runner.model.any_packed_layer())
        # the state a step starts from, left by the step before (or set by iterations())
        self.n = torch.zeros((), dtype=torch.long, device=dev)  # the root's position: the target's cache length
        self.root = torch.zeros(1, dtype=torch.long, device=dev)  # the token at n
        self.d_logits = torch.zeros(1, draft.config.draft_vocab_size, dtype=torch.float32, device=dev)
        self.d_hidden = torch.zeros(1, draft.config.decode_width, dtype=runner.dtype, device=dev)
        self.tree_depth = min(shape.depth, shape.tokens)  # the deepest a kept node can be
        k = self._topk = min(shape.topk, draft.config.draft_vocab_size)  # the children a node expands
        # Sampling: the request's parameters as device tensors and, drawn from its generator
        # before each step, a uniform for each try of a child (self.u, set_depth's) and Exp(1)
        # variates for the last draw (sampled_tree_path), so one graph serves every request of a
        # kind and a seed repeats.
        self.params = SamplingTensors(dev)
        self.e = torch.ones(runner.config.vocab_size, dtype=torch.float32, device=dev)
        self.generator: torch.Generator | None = None
        # the captured steps by kind (None greedy; False sampling with temperature alone, True
        # with top-k / top-p / min-p cuts: probabilities_t's sorting pass) and lookup chain length
        self.graphs: dict[tuple[bool | None, int], torch.cuda.CUDAGraph] = {}
        # row d: d, k times (an expansion's positions past n: every node of a level has one depth)
        self._level_offsets = torch.arange(shape.depth, device=dev)[:, None].expand(-1, k).contiguous()
        self._rows = torch.arange(k, device=dev)
        # Greedy steps' prompt-lookup chain (KernelOptions.tree_lookup; speculative/tree/lookup.py),
        # set_lookup's; its buffers made with the first chain
        self.lookup, self._kept = 0, min(shape.tokens, k + max(shape.depth - 1, 0) * k * k)  # the nodes a step keeps
        self.history: torch.Tensor | None = None
        self.depth = 0
        self.set_lookup(runner.model.ops.options.tree_lookup)

    def set_lookup(self, length: int) -> None:
        """Greedy steps' lookup chains of up to `length` tokens from the next answer (0: none), no
        more than the tree keeps nodes; a step of each length is captured once. A chain deeper
        than the tree deepens the walk (set_depth). The chain searches the conversation's tokens,
        kept on the device (each step first writes the accepted ones of the step before, so a
        replay needs none from the host)."""
        self.lookup = max(0, min(length, self._kept))
        self.set_depth(max(self.tree_depth, self.lookup))

    def set_depth(self, depth: int) -> None:
        """The most drafts a step accepts (the tree's depth, or a deeper lookup chain's), and the
        buffers it sizes: the step's result, the sampled walk's uniforms, the conversation's
        tokens (with room for the rows a step's write may reach past the cache's end). Steps
        captured for another depth are dropped: their buffers are gone."""
        dev = self.runner.device
        if depth != self.depth:
            self.depth, self.graphs, self.history = depth, {}, None
            self.result = torch.zeros(2 + depth, dtype=torch.long, device=dev)  # [a, next token, path...]
            self.u = torch.full((depth, self._topk), 0.5, dtype=torch.float32, device=dev)
        if self.lookup and self.history is None:
            self.history = torch.zeros(self.runner.max_len + depth + 2, dtype=torch.long, device=dev)

    def rows_needed(self) -> int:
        """Cache rows a step uses past n: the target's root and nodes, the draft's scratch rows."""
        s = self.shape
        return max(1 + s.tokens, s.topk * max(1, s.depth - 1) + 1)

    def scratch(self) -> int:
        """Where a capture's warm-ups start: two real runs, each writing rows_needed() rows from
        its n and moving n on by depth + 1 at most, stay in the caches' last positions."""
        return self.runner.max_len - 2 * (self.depth + 1) - self.rows_needed() - 1

    def capture(self, kv_len: int, kind: bool | None) -> bool:
        """Captures the step of `kind` (None greedy, else whether the sampling cuts) as a CUDA
        graph (once), if its warm-ups leave a conversation of kv_len cached tokens alone;
        False: steps run eagerly."""
        if (kind, self.lookup) in self.graphs:
            return True
        if not self.on_device or self.runner.device.type != "cuda" or kv_len + self.rows_needed() >= self.scratch():
            return False
        from engine.graphs import capture

        with torch.inference_mode():
            self.n.fill_(self.scratch())
            self.graphs[kind, self.lookup], _ = capture(lambda: self._body(None, kind), torch.cuda.graph_pool_handle())
        return True

    def iterations(self, runner, state, d_logits, d_hidden, commit, graphs: bool = True) -> Iterator[list[int]]:
        """Verify steps until the context is full (then plain steps); commit(result, n, state) as
        the speculator commits a step: returns (the new tokens, the cache length after them).
        graphs: steps replay a CUDA graph where one can be captured. A request with a repetition
        penalty is not served here (speculator.py keeps it on its step-by-step loop)."""
        state.tree = str(self.shape)
        kind = None if state.params.is_greedy else filtered(state.params)
        if kind is not None:
            self.params.set(state.params, runner.config.vocab_size)
            self.generator = state.generator
        graph = graphs and self.capture(state.kv_len, kind)
        with torch.inference_mode():
            self.n.fill_(state.kv_len)
            self.root.fill_(state.tokens[state.kv_len])
            if self.lookup:  # the conversation up to the root; the first step records only the root again
                self.history[:state.kv_len + 1].copy_(torch.as_tensor(state.tokens[:state.kv_len + 1]))
                self.result[0] = 0
                self.result[1] = state.tokens[state.kv_len]
            self.d_logits.copy_(d_logits[-1:])
            self.d_hidden.copy_(d_hidden[-1:])
        if graph:
            yield from self._replays(runner, state, commit, kind)
        else:
            while state.kv_len + self.rows_needed() <= runner.max_len:
                n = state.kv_len
                with torch.inference_mode():
                    self._prepare(kind)
                    self._body(None if self.on_device else n, kind)
                yield self._commit(self.result.tolist(), n, state, commit)  # the step's one read
        yield from plain_steps(runner, state)

    def _prepare(self, kind: bool | None) -> None:
        """A sampled step's random numbers, from the request's generator, on the stream (they land
        after the step before has read the last ones)."""
        if kind is not None:
            self.u.uniform_(generator=self.generator)
            self.e.exponential_(generator=self.generator)

    def _commit(self, result: list[int], n: int, state, commit) -> list[int]:
        a = result[0]
        state.verify_rows.append(self.shape.tokens + 1)
        return commit([a, result[1], *result[2:2 + a]], n, state)[0]

    def _replays(self, runner, state, commit, kind: bool | None) -> Iterator[list[int]]:
        """Graph replays while a step fits in the context, the next one queued before the host
        reads a result (it needs nothing from the host) where it surely fits too: a step moves n
        on by depth + 1 at most and writes rows_needed() rows from where it starts."""
        from engine.read_ahead import DEPTH, ReadAhead

        rows, advance, n = self.rows_needed(), self.depth + 1, state.kv_len
        if n + rows > runner.max_len:
            return
        graph = self.graphs[kind, self.lookup]

        def replay() -> None:
            self._prepare(kind)
            graph.replay()

        reader = ReadAhead(self.result, DEPTH)
        try:
            reader.queue(replay)
            queued = 1
            while queued:
                if queued < DEPTH and n + advance * queued + rows <= runner.max_len:
                    reader.queue(replay)
                    queued += 1
                out = self._commit(reader.take(), n, state, commit)
                n = state.kv_len
                queued -= 1
                if not queued and n + rows <= runner.max_len:
                    reader.queue(replay)
                    queued = 1
                yield out
        finally:
            reader.drain()  # a step queued past the answer's end wrote only at or past kv_len

    def _body(self, n: int | None, kind: bool | None = None) -> None:
        """One verify step from the state buffers, leaving the result and the next step's state.
        n: the cache length, given where the rows attend through explicit masks (the CPU's eager
        steps: no attention kernel); None: every length from self.n, the rows read through slot
        maps (a graph, and any step where the kernel serves). kind: None greedy, else sampling
        (with the cuts: True) by self.params and the step's draws."""
        parts, draft, runner = self.parts, self.parts.draft, self.runner
        dev, n_t = runner.device, self.n
        masks = n is not None  # the host's n is given only to attend through masks
        fused = self.fused_level and not masks  # the tree kernels (KernelOptions.tree_level)
        if fused:  # the kept tree and its verify rows' inputs, from the kernels
            verify = self._grow_fused()
        else:
            verify = verify_rows(self._grow(n if masks else None), draft.d2t, n_t, self.root, self.shape.depth,
                                 slot_map=not masks)
        lookup = self.lookup and kind is None
        # the step before's tokens into the history, then the lookup chain in the places of the kept
        # tree's lowest-scored nodes, its rows' slot map as wide as the walk goes deep (a chain may
        # go deeper than the tree)
        if lookup and fused:
            verify = tree_lookup(self.history, verify, n_t, self.lookup, self.result, width=self.depth + 1,
                                 pdl=runner.model.ops.options.pdl)
        elif lookup:  # the same in torch ops
            record_step(self.history, self.result, n_t)
            verify = merge_lookup(verify, *lookup_proposal(self.history, n_t, self.lookup), n_t,
                                  width=self.depth + 1)
        target_tree = DraftTree(verify.ids[1:], verify.parents, verify.depths, verify.scores)
        N = len(target_tree)
        # A verify forward takes at most routing.tree_rows rows, so that on a batch-invariant
        # target every row runs the kernels, and has the bits, of its token's decode step: a longer
        # tree goes in chunks, in order (a node's ancestors come before it, their K/V written by
        # then). Its rows read their ancestors through a slot map; with masks, SDPA sees them all.
        model = runner.model
        chunk = N + 1 if masks or model.ops.attention is None else self.verify_rows
        if masks:
            visible = torch.zeros(N + 1, n + N + 1, dtype=torch.bool, device=dev)
            visible[:, :n] = True
            visible[:, n:] = tree_mask(verify.parents)
            tree_rows = {"visible": visible}
        else:
            tree_rows = {"slot_map": verify.slot_map, "map_base": verify.map_base}
        ids, positions, slots = verify.ids, verify.positions, verify.slots
        # one forward with the kernels: the draft-extend's states are gathered from the aux layers'
        # inputs in one launch (gather_states), not concatenated whole and then gathered
        gather = fused and chunk >= N + 1 and bool(runner.aux_layer_ids) and draft.config.use_aux_hidden_state
        outs = [model(ForwardBatch(ids[c:c + chunk], positions[c:c + chunk], start_pos=n, slots=slots[c:c + chunk],
                                   **{name: t[c:c + chunk] for name, t in tree_rows.items()}),
                      runner.kv, runner.aux_layer_ids, concat_aux=not gather)
                for c in range(0, N + 1, chunk)]
        # lm_head by chunk too; a greedy step with the kernels reads the weights' dtype (rows_argmax
        # widens as it reads: no fp32 copy), one chunk without a concatenation's copy
        greedy_kernels = kind is None and fused
        logits = [model.logits(o.hidden, fp32=not greedy_kernels, tree=True) for o in outs]
        logits = logits[0] if len(logits) == 1 else torch.cat(logits)
        out = outs[0] if len(outs) == 1 else ForwardOutput(
            hidden=torch.cat([o.hidden for o in outs]),
            aux_hidden=None if outs[0].aux_hidden is None else torch.cat([o.aux_hidden for o in outs]))
        # The walk (fixed shapes, no host read), then its bookkeeping: the step's result, the next
        # root, n moved on, and the StepEnd below (in one launch with the kernels: greedy steps, and
        # sampled ones with sampled_tree_accept)
        depth = self.depth
        if greedy_kernels:
            choices = rows_argmax(logits, pdl=model.ops.options.pdl, parts=model.ops.options.tree_level_split)
            end = tree_accept(choices, target_tree.tokens, target_tree.parents, n_t, depth, self.result, self.root)
        elif kind is not None and fused and model.ops.options.sampled_tree_accept:  # the same, sampled
            end = tree_accept_sampled(probabilities_t(logits, self.params, kind), self.u, self.e, target_tree.tokens,
                                      target_tree.parents, n_t, depth, self.result, self.root,
                                      pdl=model.ops.options.pdl)
        else:
            if kind is None:
                path, count, next_token = greedy_tree_path(target_tree, logits.argmax(-1), depth)
            else:
                probs = probabilities_t(logits, self.params, kind)
                path, count, next_token = sampled_tree_path(target_tree, probs, self.u, self.e, depth)
            end = step_end(path, count, next_token, target_tree.tokens, n_t, depth, self.result, self.root)
        kv = runner.kv  # the accepted nodes' K/V to positions n + 1 .. n + a
        if fused and model.ops.options.tree_kv_move:
            move_kv_rows(kv.k_all, kv.v_all, end.src, end.dst)
        else:
            move_kv_rows_ref(kv.k_all, kv.v_all, end.src, end.dst)
        if gather:
            states = gather_states(out.aux_parts, end.rows, pdl=model.ops.options.pdl)
        else:
            states = parts.target_states(out.aux_hidden, out.hidden).index_select(0, end.rows)
        # the logits as the head leaves them: the copy into the fp32 buffer widens them (one launch
        # where a conversion and then a copy took two; the same values)
        d_logits, d_hidden = draft(end.window, end.ext_pos, states, True, parts.embed, parts.kv, start_pos=n,
                                   last=end.count, fp32_logits=False)
        self.d_logits.copy_(d_logits)
        self.d_hidden.copy_(d_hidden)

    def _grow(self, n: int | None):
        """The draft tree after the root, its tokens in the draft's vocabulary, from the draft's
        logits and state at the root (self.d_logits, self.d_hidden). Each expansion's inputs
        (scratch rows, which rows each frontier node reads, the states it continues from) are
        tensor operations of fixed shapes over every candidate of the tree: no host read. n: the
        host's cache length, for explicit masks; None: slot maps (lengths on the device)."""
        parts, draft, shape = self.parts, self.parts.draft, self.shape
        root_logits, root_hidden, n_t = self.d_logits[0], self.d_hidden, self.n
        dev = root_logits.device
        k = min(shape.topk, root_logits.shape[-1])
        candidates = k + max(shape.depth - 1, 0) * k * k  # every node grow_tree can make
        slot_of = torch.full((candidates,), -1, dtype=torch.long, device=dev)  # expanded node -> scratch row
        hidden_of = root_hidden.new_zeros(candidates, root_hidden.shape[-1])  # -> the draft state after it
        # an expanded node of depth d sits at position n + d - 1 and reads its ancestors' entries
        # (depths 1 .. d - 1) at positions n .. n + d - 2: a map this wide holds the deepest's
        width = max(1, shape.depth - 2)
        rows = self._rows
        base = n_t.to(torch.int32).expand(k).contiguous()
        level = [0]  # expansions so far: the frontier's depth less one (grow_tree goes level by level)

        def expand(frontier: torch.Tensor, grown: DraftTree) -> torch.Tensor:
            count, depth = frontier.shape[0], level[0] + 1
            assert count == k, "grow_tree expands k nodes a level"
            slots = n_t + (k * level[0]) + rows
            level[0] += 1
            slot_of.index_copy_(0, frontier, slots)
            parents = grown.parents
            above = parents.index_select(0, frontier)
            if n is not None:
                seen = n + k * level[0]
                # itself and its ancestors, all expanded before it; an unexpanded slot (-1) lands
                # in the extra last column, dropped after
                visible = torch.zeros(count, seen + 1, dtype=torch.bool, device=dev)
                visible[:, :n] = True
                cur = frontier
                for _ in range(shape.depth):
                    valid = cur >= 0
                    visible[rows, torch.where(valid, slot_of.index_select(0, cur.clamp_min(0)), seen)] = True
                    cur = torch.where(valid, parents.index_select(0, cur.clamp_min(0)), cur)
                tree_rows = {"visible": visible[:, :seen]}
            else:
                # entry j: the ancestor at depth j + 1, depth - 1 - j levels up (every frontier
                # node has this depth); entries from depth - 1 on are never read
                columns, cur = [], above
                for _ in range(depth - 1):
                    columns.append(slot_of.index_select(0, cur))
                    cur = parents.index_select(0, cur)
                columns = columns[::-1] + [slots.new_zeros(count)] * (width - len(columns))
                tree_rows = {"slot_map": torch.stack(columns[:width], dim=1).to(torch.int32), "map_base": base}
            # (kernels read rows at their strides: no expanded views)
            hidden = root_hidden.expand(count, -1).contiguous() if depth == 1 else hidden_of.index_select(0, above)
            tokens = draft.to_target_ids(grown.tokens.index_select(0, frontier))
            positions = n_t + self._level_offsets[depth - 1]
            logits, out = draft(tokens, positions, hidden, False, parts.embed, parts.kv, start_pos=n, slots=slots,
                                **tree_rows)
            hidden_of.index_copy_(0, frontier, out.to(hidden_of.dtype))
            return F.log_softmax(logits.float(), dim=-1)

        return grow_tree(F.log_softmax(root_logits.float(), dim=-1), expand, self.shape)

    def _grow_fused(self):
        """_grow's tree with each level one launch (KernelOptions.tree_level): the level's kernel
        also writes the next expansion's inputs (LevelInputs), so an expansion is the gather of
        the states it continues from (rows of the expansion before it) and the draft's forward.
        Then one launch keeps the best nodes in verify order with the verify rows' inputs
        (VerifyRows)."""
        parts, draft, shape = self.parts, self.parts.draft, self.shape
        root_logits, root_hidden, n_t = self.d_logits[0], self.d_hidden, self.n
        dev = root_logits.device
        k = min(shape.topk, root_logits.shape[-1])
        candidates = k + max(shape.depth - 1, 0) * k * k
        # Every entry below is written before anything reads it (a node's row once it is expanded,
        # the frontier's inputs by the level before): no fills.
        long = dict(dtype=torch.long, device=dev)
        width = max(1, shape.depth - 2)
        inputs = LevelInputs(n=n_t, d2t=draft.d2t, slot_of=torch.empty(candidates, **long),
                             map_of=torch.empty(candidates, width, dtype=torch.int32, device=dev),
                             slots=torch.empty(k, **long),
                             slot_map=torch.empty(k, width, dtype=torch.int32, device=dev),
                             ids=torch.empty(k, **long), positions=torch.empty(k, **long), above=torch.empty(k, **long))
        base = n_t.expand(k)  # every frontier node's map starts at n: a view, read at stride 0 (no launch)
        states = [root_hidden]  # the states after the frontier the last level expanded (the root's first)

        def expand(frontier: torch.Tensor, grown: DraftTree) -> torch.Tensor:
            # each node continues from its parent's row of the states before (inputs.above), read
            # by the draft step's first launch; the logits stay in the weights' dtype, which
            # tree_level widens as it reads them (the same fp32 values as a conversion before it)
            logits, states[0] = draft(inputs.ids, inputs.positions, states[0], False, parts.embed, parts.kv,
                                      start_pos=None, fp32_logits=False, slots=inputs.slots,
                                      slot_map=inputs.slot_map, map_base=base, hidden_rows=inputs.above)
            return logits

        options = self.runner.model.ops.options
        grown = grow_tree(root_logits, expand, shape, fused=True, inputs=inputs, select=False,
                          keys=options.tree_level_keys, split=options.tree_level_split)
        return tree_select(grown.tokens, grown.parents, grown.depths, grown.scores, shape.tokens, draft.d2t, n_t,
                           self.root, shape.depth, passes=options.tree_select_passes,
                           blocks=options.tree_select_blocks)
