"""MTPGreedyIteration: one whole greedy MTP iteration (the target's verify of [bonus, d_1..d_S],
the greedy acceptance, the window of S chained MTP steps that drafts the next S tokens) as one
function over static device buffers, captured as one CUDA graph: the MTP counterpart of
eagle3/greedy_loop.py's GreedyIteration.

The step-by-step loop (speculator.py) runs the same pieces with the acceptance, the window's
writes and a host read between graph replays; here the host replays one graph an iteration and
reads its small result, queued ahead (iterations.run_iterations). On a CPU the same function runs
eagerly.

State carried from one replay to the next, on the device (ChainState, no alternatives):
    n    () the target cache length before the verify
    ids  (S+1,) [bonus, d_1..d_S]
and the window's buffers (graphs.MTPWindow: its kept tail rows). Each replay writes `result` =
[accepted a, the target's next token, d_1..d_S as verified] and leaves n and ids ready for the
next one.
"""

from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch
from engine.graphs import capture

from speculative.chain_state import ChainState
from speculative.iterations import IterationHost
from speculative.kernels.greedy_verify import greedy_verify_ref
from speculative.mtp.graphs import MTPWindow


class MTPGreedyIteration(IterationHost):
    def __init__(self, window: MTPWindow, runner):
        self.window, self.runner = window, runner
        self.k = S = window.draft_steps
        self.chain = chain = ChainState(S, runner.max_len - 1, runner.device)
        self.n, self.ids, self.result = chain.n, chain.ids, chain.result
        self.width = S + 1  # verify rows, and the target cache rows an iteration writes from n
        self._positions = torch.zeros(S + 1, dtype=torch.long, device=runner.device)
        self.graph = None
        self._failed = False  # a capture that failed, or whose replay differed from the body: not again

    def scratch(self) -> int:
        """Where a capture's warm-ups start: engine.graphs.capture runs the body twice for real,
        each moving n on by at most S + 1 and writing target rows n..n+S and window rows
        n-S+1..n+S, so started here they stay in the caches' last 3 (S + 1) positions."""
        return self.runner.max_len - 3 * (self.k + 1)  # captured at load, before any conversation

    def begin(self, n: int, bonus: int, drafts: torch.Tensor) -> None:
        """The first iteration's inputs: the bonus token at n and the S drafts after it (the
        window written for them already: speculator._prefill)."""
        self.n.fill_(n)
        self.ids[0] = bonus
        self.ids[1:].copy_(drafts)

    def _body(self, n: int | None = None) -> None:
        """n: the cache length when the host knows it (eager), None inside the graph."""
        chain, window, S = self.chain, self.window, self.k
        runner = self.runner
        torch.add(chain.offsets, chain.n, out=self._positions)
        out = runner.model(ForwardBatch(chain.ids, self._positions, start_pos=n), runner.kv)
        logits = runner.model.logits(out.hidden)
        start = None if n is None else n - S + 1  # the window's first position, when the host knows it
        window_start = chain.n - (S - 1) if start is None else start  # before greedy_verify moves n on
        greedy_verify_ref(logits, chain)  # accepted, window = the accepted drafts then the next token
        window.begin(window_start, chain.window, out.hidden, chain.accepted)
        for s in range(S):
            tok = window.step(s, start).argmax(-1)  # (1,): the draft of step s
            chain.ids[1 + s:2 + s].copy_(tok)
            if s < S - 1:
                window.push_draft(tok)

    def capture(self) -> bool:
        """Captures the iteration's graph (CUDA), its warm-ups writing at scratch(), and keeps it
        only if one replay equals one eager run of the body from the same state. Returns whether a
        graph is ready; the caller keeps the step-by-step loop otherwise."""
        if self.graph is not None:
            return True
        if self.runner.device.type != "cuda" or self._failed or self.scratch() < self.k:
            return False
        self.n.fill_(self.scratch())
        try:
            with torch.inference_mode():
                self.graph, _ = capture(self._body, torch.cuda.graph_pool_handle())
                ok = self._replay_equals_eager()
        except Exception:  # out of memory, an op that cannot be captured: the loop stays step by step
            ok = False
        if not ok:
            self._failed = True
            self.graph = None
        return ok

    def _buffers(self) -> list[torch.Tensor]:
        w = self.window
        return [self.n, self.ids, w.ids, w.hidden, w.positions, w.accepted, w.tail_ids, w.tail_hidden]

    @torch.inference_mode()
    def _replay_equals_eager(self) -> bool:
        saved = [t.clone() for t in self._buffers()]
        self.graph.replay()
        replayed = [t.clone() for t in [self.result] + self._buffers()]
        for t, s in zip(self._buffers(), saved):
            t.copy_(s)
        self._body(int(self.n))
        eager = [self.result] + self._buffers()
        return all(torch.equal(a, b) for a, b in zip(replayed, eager))
