"""GreedyIteration: one whole greedy EAGLE-3 iteration (verify, accept, draft-extend, the next k
drafts) as a single function over static device buffers, captured as one CUDA graph.

For a small target the separate pieces cost more in launches and host round trips than on the
GPU: every eager op between the verify and draft graphs is a Python call, and each of them
waits for the host. Here the host replays one graph and reads one small result per iteration.

State carried from one replay to the next, all on the device:
    n      () the target cache length before this iteration's verify
    ids    (k+1+sum(alts),) [bonus, d_1..d_k, alternatives]: the token at position n, the k drafts
           after it, and (greedy) the draft's next-best tokens for some drafts (ChainState)
Each replay writes `result` = [accepted a, the target's next token, the k drafts as verified]
and leaves n, ids ready for the next replay. On CPU the same function runs eagerly. An answer's
first chain is the second half of that function (the picks and draft steps) run from the
draft's pass over the prompt: a second, smaller graph (begin()).

Alternatives: the verify checks each draft's runner-up tokens too, as extra rows at the draft's
position, each seeing the chain before it and itself. Where the chain's draft is rejected and
the target chose one of them, it is accepted as well: one more token for that iteration, for
rows that cost little in a verify step whose time is launches, not arithmetic.
"""

from __future__ import annotations

from functools import partial

import torch

from engine.forward_batch import ForwardBatch
from engine.graphs import capture

from speculative.chain_state import ChainState
from speculative.eagle3.draft_parts import DraftParts
from speculative.iterations import IterationHost
from speculative.kernels.alternative import take_alternative, take_alternative_ref
from speculative.kernels.draft_pick import argmax_pick, argmax_pick_ref, draft_pick, draft_pick_ref
from speculative.kernels.greedy_verify import greedy_verify, greedy_verify_ref


class WholeIteration(IterationHost):
    """What the whole-iteration graphs share: the state carried between replays, the host side
    (queue / take / drain with a ReadAhead, or eager run()), and the verify and draft-extend
    halves of the body. Subclasses write _body() and may draw inputs in _prepare()."""

    def __init__(self, parts: DraftParts, runner, alts: tuple[int, ...] | int = 0):
        self.parts, self.runner = parts, runner
        k = parts.k
        self.k = k
        self.last_pos = runner.max_len - 1
        self.chain = chain = ChainState(k, self.last_pos, runner.device, alts)
        self.alts = chain.alts  # alternatives for each draft
        self.num_alts = chain.num_alts
        self.width = chain.rows  # verify rows, and the cache rows an iteration writes from n
        self.n, self.ids, self.result, self.offsets = chain.n, chain.ids, chain.result, chain.offsets
        self.draft_pos = chain.draft_pos  # where the draft steps of the next chain write
        # verify rows' positions, then (with alternatives) their cache rows: one add moves both
        self._row_offsets = torch.cat([chain.row_pos, chain.row_slots]) if self.num_alts else chain.row_pos
        self._rows = self._row_offsets.clone()
        self.positions = self._rows[:self.width]
        self.slots = self._rows[self.width:] if self.num_alts else None

    def scratch(self) -> int:
        """Where a capture's warm-ups start. engine.graphs.capture runs the body twice for real,
        each run moving n on by at most k + 1 and writing `width` rows of the target's cache
        (k + 1 of the draft's) from n, so started here they stay in the caches' last
        2 (k + 1) + width positions, past anything live while the conversation ends before this
        position. Negative: the context is too short to capture in (the loop runs eagerly)."""
        return self.runner.max_len - 2 * (self.k + 1) - self.width

    def fits_capture(self, kv_len: int) -> bool:
        """Whether a capture's warm-ups leave alone a conversation of kv_len cached tokens and
        the verify after it."""
        return kv_len + self.width < self.scratch()

    # --- the device side ----------------------------------------------------------------------
    def _verify(self, n: int | None):
        """The target forward over [bonus, d_1..d_k] at n..n+k (and the alternatives); returns its
        ForwardOutput."""
        runner = self.runner
        torch.add(self._row_offsets, self.n, out=self._rows)
        return runner.model(ForwardBatch(self.ids, self.positions, start_pos=n, slots=self.slots), runner.kv,
                            runner.aux_layer_ids)

    def _extend(self, out, accepted, next_token, n: int | None, fp32_logits: bool = True, moved: bool = False):
        """Moves the chain on (ChainState.advance: result, extend window, n, bonus, draft
        positions; moved: the acceptance's launch did) and runs the draft-extend over the k+1 rows
        (the sampled loop; the greedy one has greedy_verify move the chain). Returns (the draft's
        logits and state at the last accepted row, the next n when the host knows it)."""
        parts = self.parts
        if not moved:
            self.chain.advance(accepted, next_token)
        # Row i pairs target state n+i with the token at n+i+1; rows past the accepted ones carry
        # the next token and are never read. The draft steps write at n + a + 1 + s (clamped:
        # past the context the host switches to plain steps before using these drafts).
        states = parts.target_states(out.aux_hidden, out.hidden)
        logits, hidden = parts.draft(self.chain.window, self.positions[:self.k + 1], states, True, parts.embed,
                                     parts.kv, start_pos=n, last=accepted, fp32_logits=fp32_logits)
        return logits, hidden, None if n is None else n + int(accepted) + 1

    def _draft_step(self, tok, s: int, d_hidden, n_next: int | None, fp32_logits: bool = True):
        """Draft step s + 1 of the next chain (its input: draft token s at n + s)."""
        parts = self.parts
        start = None if n_next is None else min(n_next + s, self.last_pos)
        return parts.draft(tok, self.draft_pos[s:s + 1], d_hidden, False, parts.embed, parts.kv, start_pos=start,
                           fp32_logits=fp32_logits)


class GreedyIteration(WholeIteration):
    def __init__(self, parts: DraftParts, runner, alts: tuple[int, ...] | int = 0):
        super().__init__(parts, runner, alts)
        self.graph = None
        self.first_graph = None  # begin()'s first chain, captured with the iteration
        self._first_logits = self._first_hidden = None  # its static inputs
        # The lean draft's GPU kernels: the acceptance and each pick in one launch; torch ops otherwise.
        self.lean = parts.draft.lean
        pdl = self.lean and parts.draft.ops.options.pdl

        def chosen(kernel, ref):
            return partial(kernel, pdl=pdl) if self.lean else ref

        self._accept = chosen(greedy_verify, greedy_verify_ref)
        self._take_alternative = chosen(take_alternative, take_alternative_ref)
        self._draft_pick = chosen(draft_pick, draft_pick_ref)
        self._argmax_pick = chosen(argmax_pick, argmax_pick_ref)
        # Benchmarks only (speculative/testing.py, ForcedDrafts): called with the verify step's logits
        # before the acceptance, it rewrites the verified drafts so that greedy acceptance takes as
        # many as it chooses. None: real acceptance.
        self.force = None

    def capture(self) -> None:
        """Captures the iteration's graph and the first chain's (CUDA), their warm-ups writing at
        scratch(): the caller makes sure nothing live is there (begin() then sets the state the
        first replay reads)."""
        if self.runner.device.type != "cuda":
            return
        dc, dev = self.parts.draft.config, self.runner.device
        pool = torch.cuda.graph_pool_handle()
        with torch.inference_mode():
            self._first_logits = torch.zeros(1, dc.draft_vocab_size, dtype=torch.float32, device=dev)
            self._first_hidden = torch.zeros(1, dc.decode_width, dtype=self.runner.dtype, device=dev)
            self.n.fill_(self.scratch())
            self.first_graph, _ = capture(lambda: self._first_chain(self._first_logits, self._first_hidden, None),
                                          pool)
            self.n.fill_(self.scratch())
            self.graph, _ = capture(self._body, pool)

    def _body(self, n: int | None = None) -> None:
        """n: the cache length when the host knows it (eager), None inside the graph."""
        parts, chain = self.parts, self.chain
        out = self._verify(n)
        lean = self.lean
        logits = self.runner.model.logits(out.hidden, fp32=not lean)
        if self.force is not None:
            self.force(logits)
        self._accept(logits, chain)
        states = parts.target_states(out.aux_hidden, out.hidden)
        if self.num_alts:
            # An accepted alternative: its K/V to its position, its state into the extend window.
            kv = self.runner.kv
            window_states = states.new_empty(self.k + 1, states.shape[1])
            states = self._take_alternative(kv.k_all, kv.v_all, chain.kv_move, states, chain.state_rows, window_states)
        # the draft's logits and state at the last accepted row start the next chain
        d_logits, d_hidden = parts.draft(chain.window, self.positions[:self.k + 1], states, True, parts.embed,
                                         parts.kv, start_pos=n, fp32_logits=not lean, last=chain.accepted)
        n_next = None if n is None else n + int(chain.accepted) + 1
        self._chain(d_logits, d_hidden, n_next)

    def _chain(self, d_logits, d_hidden, n: int | None) -> None:
        """The next k drafts (and their alternatives) into ids[1:], from the draft's logits (1, Vd)
        and state d_hidden (1, H) at the entry before the bonus token at n, the draft steps
        writing at draft_pos. n: the cache length when the host knows it."""
        draft, chain = self.parts.draft, self.chain
        for s in range(self.k):
            slot = self.ids[s + 1:s + 2]  # draft token s + 1, and the next step's input
            if self.alts[s]:
                self._draft_pick(d_logits, draft.d2t, slot, chain.alt_slots(s))
            else:
                self._argmax_pick(d_logits, draft.d2t, slot)
            if s < self.k - 1:
                d_logits, d_hidden = self._draft_step(slot, s, d_hidden, n, fp32_logits=not self.lean)

    # --- the first chain ----------------------------------------------------------------------
    @torch.inference_mode()
    def begin(self, n: int, bonus: int, d_logits: torch.Tensor, d_hidden: torch.Tensor) -> None:
        """The first iteration's inputs from the draft's pass over the prompt: the bonus token at
        n, and the draft's logits and state at its last row (the entry before n), from which the
        first chain is drafted on the device: one graph replay when captured (CUDA), else the
        same function eagerly. Nothing here waits for the GPU."""
        self.n.fill_(n)
        self.ids[0] = bonus
        if self.first_graph is not None:
            self._first_logits.copy_(d_logits[-1:])
            self._first_hidden.copy_(d_hidden[-1:])
            self.first_graph.replay()
        else:
            self._first_chain(d_logits[-1:], d_hidden[-1:], n)

    def _first_chain(self, d_logits, d_hidden, n: int | None) -> None:
        self.chain.place_drafts()  # draft step s writes at n + s
        self._chain(d_logits, d_hidden, n)
