"""Eagle3Speculator: draft k tokens, verify them in one target forward, accept, draft-extend."""

from __future__ import annotations

from typing import Iterator

import torch

from engine.decode import choose_next, plain_steps
from engine.kernels.attention import MAX_INVARIANT_ROWS as MAX_VERIFY_ROWS
from engine.kv_cache import KVCache
from engine.options import AUTO
from engine.sampling import probabilities, sample_from

from speculative.commit import commit
from speculative.iterations import run_iterations
from speculative.eagle3.draft_graphs import DraftGraphs
from speculative.eagle3.draft_parts import DraftParts
from speculative.eagle3.model import Eagle3Draft
from speculative.eagle3 import sampled_loop
from speculative.eagle3.greedy_loop import GreedyIteration
from speculative.eagle3.tree_loop import TreeDrafting
from speculative.kernels.draft_pick import MAX_ALTS
from speculative.tree.shape import TreeShape
from speculative.verify import accept_drafts


def shaped_alternatives(k: int, rows: int) -> tuple[int, ...]:
    """`rows` alternatives spread over k drafts where they are likeliest to be taken: the
    runner-up r (1 = second best) of draft d in the order of r + d, then r (an early draft is
    reached more often, and its runners-up are likelier than a later draft's). k = 5, 10 rows:
    (3, 3, 2, 1, 1)."""
    order = sorted(((r, d) for r in range(1, MAX_ALTS + 1) for d in range(1, k + 1)), key=lambda x: (x[0] + x[1], x[0]))
    counts = [0] * k
    for r, d in order[:max(0, rows)]:
        counts[d - 1] += 1
    return tuple(counts)


def default_alternatives(k: int, device: torch.device, spec_alts: int | tuple[int, ...] | str | None = None
                         ) -> tuple[int, ...]:
    """Alternatives for each draft in greedy verify steps. On a GPU, as many as fill the 16 rows
    of the batch-invariant kernels (shaped_alternatives): there a verify step's time is
    launches, and more rows cost little. On the CPU none: there each row costs its arithmetic
    (2 cores, demo model and head: accepted length 3.04 -> 3.60 with 2 a draft, but 43.5 ->
    40.2 tok/s). spec_alts (KernelOptions.spec_alts, for experiments): N sets N for every draft
    instead (0: the plain chain), within the 16 rows; "auto" the shaped ones on any device;
    (A, B, ..) A for draft 1, B for draft 2 and so on (missing ones: 0)."""
    room = MAX_VERIFY_ROWS - k - 1
    if isinstance(spec_alts, int):
        return (min(spec_alts, room // max(k, 1), MAX_ALTS),) * k
    if isinstance(spec_alts, tuple):
        counts = [min(c, MAX_ALTS) for c in spec_alts][:k]
        counts += [0] * (k - len(counts))
        while sum(counts) > room:  # within the 16 rows: the last drafts' first
            counts[max(i for i, c in enumerate(counts) if c)] -= 1
        return tuple(counts)
    return shaped_alternatives(k, room) if device.type == "cuda" or spec_alts == AUTO else (0,) * k


class Eagle3Speculator:
    """The EAGLE-3 Speculator (protocol.py). Answers run as whole iterations (greedy_loop.py,
    sampled_loop.py) where those compute them, the rest (a repetition penalty, for one) as the
    step-by-step loop in tokens()."""

    def __init__(self, draft: Eagle3Draft, runner, draft_steps: int, accept=None):
        """accept: the verify rule, with verify.accept_drafts's signature; None: accept_drafts,
        the lossless rule, which the whole iterations also compute inside their graphs. Another
        rule (speculative/testing.py fixes the accepted length) runs in the step-by-step loop."""
        dc = draft.config
        self.draft = draft
        self.config = dc
        self.k = draft_steps
        self.embed = draft.embed_tokens if dc.owns_embeddings else runner.model.model.embed_tokens
        self.kv = KVCache(1, runner.max_len, dc.num_kv_heads, dc.head_dim, runner.dtype, runner.device)
        self.graphs: DraftGraphs | None = None
        self._capture_pending = False  # CUDA graphs not captured yet (capture(defer=True))
        self._seq: list[int] = []  # draft entry j holds (seq[j + 1], target state j) for j < len - 1
        runner.aux_layer_ids = dc.aux_layer_ids if dc.use_aux_hidden_state else ()
        self.vocab_size = runner.config.vocab_size
        self.accept = accept or accept_drafts
        self.whole_iterations = accept is None
        self.sampled_whole_iterations = accept is None  # sampling's whole iterations (the lossless rule only)
        self.parts = DraftParts(draft, self.embed, self.kv, draft_steps)  # what the loops and graphs use
        self._runner = runner
        spec_alts = runner.model.ops.options.spec_alts
        self._shaped = default_alternatives(draft_steps, runner.device, spec_alts)
        # Whether a measurement may verify the chain alone instead (use_runners_up): where the
        # runners-up are the shaped default (a GPU's, or any device's with LOCALCHAT_SPEC_ALTS=auto)
        # rather than counts LOCALCHAT_SPEC_ALTS sets.
        self.runners_up_choice = spec_alts in (None, AUTO) and any(self._shaped)
        self._greedy_by_alts: dict[tuple[int, ...], GreedyIteration] = {}
        self.greedy = self._greedy_for(self._shaped)  # greedy, no penalty
        self.sampled = sampled_loop.SampledIteration(  # sampling without a penalty: the same
            self.parts, runner, runners_up=runner.model.ops.options.sampled_runners_up)
        self.tree: TreeShape | None = None  # a draft tree's shape (set_tree); None: chains of k
        self.tree_sampled = True  # sampled answers draft trees too (set_tree)
        self._tree_steps: dict[TreeShape, TreeDrafting] = {}  # each shape's step, its graph kept

    def _greedy_for(self, alts: tuple[int, ...]) -> GreedyIteration:
        """The greedy iteration verifying `alts` runners-up a draft, made once (its graph
        captured with the draft's, or on the first answer after it was chosen)."""
        if alts not in self._greedy_by_alts:
            self._greedy_by_alts[alts] = self._new_greedy(alts)
        return self._greedy_by_alts[alts]

    def _new_greedy(self, alts: tuple[int, ...]) -> GreedyIteration:
        return GreedyIteration(self.parts, self._runner, alts)

    @property
    def alts(self) -> tuple[int, ...]:
        """Runners-up each draft gets in its greedy verify steps."""
        return self.greedy.alts

    @property
    def runners_up(self) -> bool:
        """Whether greedy verify steps check runners-up beside the chain."""
        return any(self.alts)

    def use_runners_up(self, on: bool) -> None:
        """Greedy verify steps with the device's runners-up (on) or the chain alone, from the next
        answer. The runners-up add rows to every verify step for the tokens they win back where a
        draft is wrong: they pay where rows are cheap and the head's second choices are good,
        which a measurement decides (engine/spec_pays.py); a forced head's are never taken."""
        alts = self._shaped if on else (0,) * self.k
        self.greedy = self._greedy_for(alts)

    def set_tree(self, shape: TreeShape | None, sampled: bool = True) -> None:
        """Draft trees of `shape` from the next answer (tree_loop.py), or (None) chains of k.
        sampled=False: greedy answers only, sampled ones keep the chain (--tree auto's choice is
        timed greedily; at 0.7 a 4,4,8 tree, its walk in one launch, runs as fast as the chain, no
        faster: docs/performance.md). A repetition penalty keeps the chain."""
        self.tree = shape
        self.tree_sampled = sampled

    def auto_tree(self, engine, log=None) -> TreeShape | None:
        """--tree auto for `engine` (this speculator's): the calibrated shape (tree/calibrate.py)."""
        from speculative.tree.calibrate import auto_tree

        return auto_tree(engine, log=log)

    # --- the facade's hooks -------------------------------------------------------------
    def reusable_prefix(self, target_cached: list[int], prompt: list[int]) -> int:
        """Positions whose target K/V and draft entries both stay valid for this prompt."""
        n = 0
        limit = min(len(target_cached), len(self._seq), len(prompt))
        while n < limit and target_cached[n] == prompt[n] == self._seq[n]:
            n += 1
        self._seq = []
        return max(0, n - 1)  # entry n-1 pairs with token n, which may change

    def capture(self, defer: bool = False) -> None:
        """Captures the draft's decode and extend graphs and the greedy whole-iteration graph
        (CUDA), their warm-ups writing in the caches' last positions. defer: on the first request
        instead, after its first token; one whose conversation already reaches those positions
        runs eagerly and leaves the capture to a later one."""
        if self.greedy.runner.device.type != "cuda":
            return
        self._capture_pending = True
        if not defer:
            self._capture_if_pending(0)

    def _capture_if_pending(self, kv_len: int) -> None:
        if self._capture_pending:
            # The draft's graphs warm up below the widest iteration's scratch, clear of either
            # greedy iteration's.
            widest = self._greedy_for(self._shaped)
            if not widest.fits_capture(kv_len):
                return  # eager for now (in a context shorter than 4 (k + 1) tokens: always)
            self._capture_pending = False
            self.graphs = DraftGraphs(self.parts, widest.scratch())
        # the greedy iteration in use, captured once (one chosen by use_runners_up on its first answer)
        if self.graphs is not None and self.greedy.graph is None and self.greedy.fits_capture(kv_len):
            self.greedy.capture()

    def tokens(self, runner, state) -> Iterator[list[int]]:
        k = self.k
        dev = runner.device
        start = state.kv_len
        new = torch.tensor(state.tokens[start:], dtype=torch.long, device=dev)
        logits, _, aux = runner.forward(new, start, want_aux=True, all_logits=False)
        target_states = self.parts.target_states(aux, _)
        state.kv_len = len(state.tokens)
        yield [choose_next(logits[-1], state)]
        # Draft prefill: entries start..n-1 pair target state j with token j + 1.
        ids = torch.tensor(state.tokens[start + 1:], dtype=torch.long, device=dev)
        pos = torch.arange(start, state.kv_len, device=dev)
        d_logits, d_hidden = self.draft(ids, pos, target_states, True, self.embed, self.kv, start_pos=start, last=-1)
        self._seq = state.tokens[:state.kv_len + 1]
        self._capture_if_pending(state.kv_len)
        if (self.tree is not None and state.seen is None and self.whole_iterations
                and (self.tree_sampled or state.params.is_greedy)):
            yield from self.tree_step(self.tree).iterations(runner, state, d_logits, d_hidden, self._commit,
                                                            graphs=self.graphs is not None)
            return
        if self.whole_iterations and state.params.is_greedy and state.seen is None:
            yield from self._whole_iterations(runner, state, self.greedy, d_logits, d_hidden)
            return
        if self.sampled_whole_iterations and sampled_loop.supports(state.params, state) and self._sampled_ready(state):
            yield from self._whole_iterations(runner, state, self.sampled, d_logits, d_hidden)
            return
        while True:
            n = state.kv_len
            if n + k + 1 > runner.max_len:
                yield from plain_steps(runner, state)
                return
            bonus = torch.tensor([state.tokens[n]], dtype=torch.long, device=dev)
            drafts, q = self._draft_chain(d_logits, d_hidden, n, state)
            logits, hidden, aux = runner.forward(torch.cat([bonus, drafts]), n, want_aux=True)
            target_states = self.parts.target_states(aux, hidden)
            accepted, next_token = self.accept(drafts, q, logits, state.params, state.seen, state.generator)
            # Draft-extend over the fixed window of k+1 rows; row a (accepted) is the last valid.
            rows = torch.arange(k + 1, device=dev)
            window = torch.where(rows < accepted, torch.cat([drafts, drafts[-1:]]), next_token)
            d_logits, d_hidden = self._extend(window, n, target_states, accepted)
            # The one host sync of the iteration.
            state.verify_rows.append(k + 1)
            out, _ = self._commit(torch.cat([accepted.view(1), next_token.view(1), drafts]).tolist(), n, state)
            yield out

    def tree_step(self, shape: TreeShape) -> TreeDrafting:
        """The tree loop of `shape`, made once (its CUDA graph is captured on its first answer)."""
        if shape not in self._tree_steps:
            self._tree_steps[shape] = TreeDrafting(self.parts, shape, self.greedy.runner)
        return self._tree_steps[shape]

    def _whole_iterations(self, runner, state, it, d_logits, d_hidden) -> Iterator[list[int]]:
        """The first k drafts, then one `it` (GreedyIteration or SampledIteration) per verify
        step. The greedy iteration drafts the first chain itself (one graph replay); sampled
        ones draw it here."""
        n = state.kv_len
        if n + it.width > runner.max_len:
            yield from plain_steps(runner, state)
            return
        if it is self.greedy:
            it.begin(n, state.tokens[n], d_logits, d_hidden)
        else:
            drafts, q = self._draft_chain(d_logits, d_hidden, n, state)
            it.start(n, state.tokens[n], drafts, q, state.generator)
        yield from run_iterations(runner, state, it, self.k, self._commit)

    def _sampled_ready(self, state) -> bool:
        """Selects the request's sampling in SampledIteration. With graphs (CUDA) it runs only
        as a graph, captured on first use (before start(), since the warm-ups move its state);
        where that fails, the step-by-step loop, which replays the verify and draft graphs, is
        faster than the iteration's eager body."""
        self.sampled.select(state.params)
        # No graphs (CPU, --no-graphs, or not captured yet): the body runs eagerly, drawing the
        # same numbers as the graph would.
        return self.graphs is None or self.sampled.capture(state.kv_len)

    def _commit(self, result: list[int], n: int, state) -> tuple[list[int], int]:
        """commit() for the verify step at n, and the record of the tokens the draft's cache
        holds. Returns (the new tokens, the cache length after them)."""
        out = commit(state, n, result)
        self._seq = state.tokens[:state.kv_len + 1]
        return out, state.kv_len

    # --- pieces ---------------------------------------------------------------------------
    def _draft_chain(self, d_logits, d_hidden, n: int, state):
        """k chained draft tokens (target ids) and, when sampling, their (k, V) probabilities."""
        p, k = state.params, self.k
        tokens, probs = [], []
        for s in range(k):
            if p.is_greedy:
                tok = self.draft.to_target_ids(d_logits[-1].argmax().view(1))
            else:
                qd = probabilities(d_logits[-1], p)  # over the draft vocabulary
                q = torch.zeros(self.vocab_size, dtype=qd.dtype, device=qd.device)
                q.index_add_(0, self.draft.d2t + torch.arange(qd.shape[0], device=qd.device), qd)
                tok = sample_from(q, state.generator).view(1)
                probs.append(q)
            tokens.append(tok)
            if s < k - 1:
                d_logits, d_hidden = self._draft_step(tok, n + s, d_hidden)
        return torch.cat(tokens), (torch.stack(probs) if probs else None)

    def _draft_step(self, tok, pos: int, hidden):
        if self.graphs is not None:
            return self.graphs.decode(tok, pos, hidden)
        positions = torch.tensor([pos], device=tok.device)
        return self.draft(tok, positions, hidden, False, self.embed, self.kv, start_pos=pos)

    def _extend(self, window, n: int, target_states, accepted):
        if self.graphs is not None:
            return self.graphs.extend(window, n, target_states, accepted)
        positions = torch.arange(n, n + self.k + 1, device=window.device)
        return self.draft(window, positions, target_states, True, self.embed, self.kv, start_pos=n, last=accepted)
