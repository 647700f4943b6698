"""GreedyIteration: one whole greedy EAGLE-3 iteration (verify, accept, draft-extend, the next k
drafts) as a single function over static device buffers, captured as one CUDA graph.

For a small target the separate pieces cost more in launches and host round trips than on the
GPU: every eager op between the verify and draft graphs is a Python call, and each of them
waits for the host. Here the host replays one graph and reads one small result per iteration.

State carried from one replay to the next, all on the device:
    n      () the target cache length before this iteration's verify
    ids    (k+1,) [bonus, d_1..d_k]: the token at position n and the k drafts after it
Each replay writes `result` = [accepted a, the target's next token, d_1..d_k as verified] and
leaves n, ids ready for the next replay. On CPU the same function runs eagerly.
"""

from __future__ import annotations

import torch

from engine.batch import ForwardBatch
from engine.graphs import capture

from .verify import greedy_accept


class GreedyIteration:
    def __init__(self, spec, runner):
        self.spec, self.runner = spec, runner
        k, dev = spec.k, runner.device
        self.k = k
        self.n = torch.zeros((), dtype=torch.long, device=dev)
        self.ids = torch.zeros(k + 1, dtype=torch.long, device=dev)
        self.result = torch.zeros(k + 2, dtype=torch.long, device=dev)
        self.offsets = torch.arange(k + 1, dtype=torch.long, device=dev)
        self.rows = self.offsets.clone()
        self.positions = self.offsets.clone()
        self.last_pos = runner.max_len - 1
        self.graph = None
        self.reader = None

    def capture(self) -> None:
        if self.runner.device.type != "cuda":
            return
        with torch.inference_mode():
            self.graph, _ = capture(self._body, torch.cuda.graph_pool_handle())

    def queue(self) -> None:
        """Queues one iteration on the graph (CUDA); its result comes from take()."""
        if self.reader is None:
            from engine.read_ahead import ReadAhead

            self.reader = ReadAhead(self.result)
        self.reader.queue(self.graph.replay)

    def take(self) -> list[int]:
        return self.reader.take()

    def drain(self) -> None:
        if self.reader is not None:
            self.reader.drain()

    @torch.inference_mode()
    def run(self) -> list[int]:
        """One iteration; returns [a, next_token, d_1..d_k] (syncs once)."""
        if self.graph is not None:
            self.graph.replay()
        else:  # eager: the host knows the lengths, so attention reads only the filled cache
            self._body(int(self.n))
        return self.result.tolist()

    def start(self, n: int, bonus: int, drafts: torch.Tensor) -> None:
        self.n.fill_(n)
        self.ids[0] = bonus
        self.ids[1:].copy_(drafts)

    def _body(self, n: int | None = None) -> None:
        """n: the cache length when the host knows it (eager), None inside the graph."""
        spec, runner, model, k = self.spec, self.runner, self.runner.model, self.k
        torch.add(self.offsets, self.n, out=self.positions)
        out = model(ForwardBatch(self.ids, self.positions, start_pos=n), runner.kv, runner.aux_layer_ids)
        choice = model.logits(out.hidden).argmax(-1)
        drafts = self.ids[1:]
        accepted, next_token = greedy_accept(drafts, choice)
        self.result[0].copy_(accepted)
        self.result[1].copy_(next_token)
        self.result[2:].copy_(drafts)
        # Draft-extend over the window of k+1 rows: row i pairs target state n+i with the token
        # at n+i+1; rows past the accepted ones carry the next token and are never read.
        window = torch.where(self.rows < accepted, torch.cat([drafts, drafts[-1:]]), next_token)
        states = spec._target_states(out.aux_hidden, out.hidden)
        logits, hidden = spec.draft(window, self.positions, states, True, spec.embed, spec.kv, start_pos=n)
        d_logits, d_hidden = logits.index_select(0, accepted.view(1)), hidden.index_select(0, accepted.view(1))
        # The next iteration starts at n + a + 1 with the next token as its bonus.
        self.n.add_(accepted + 1)
        n_next = None if n is None else n + int(accepted) + 1
        self.ids[0].copy_(next_token)
        for s in range(k):
            tok = spec.draft.to_target_ids(d_logits[-1].argmax().view(1))
            self.ids[s + 1].copy_(tok[0])
            if s < k - 1:
                # Past the context the host switches to plain steps before using these drafts;
                # clamping only keeps the writes inside the cache.
                pos = (self.n + s).clamp_max(self.last_pos).view(1)
                start = None if n_next is None else min(n_next + s, self.last_pos)
                d_logits, d_hidden = spec.draft(tok, pos, d_hidden, False, spec.embed, spec.kv, start_pos=start)
