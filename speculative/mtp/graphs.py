"""MTPWindow: the one static buffer set of the MTP window pass, and one CUDA graph per step.

The window is W = 2S rows at positions start .. start + W - 1. Every value that changes between
iterations lives in these buffers and is written before replay: window token ids, positions,
states (target states first; in chain mode each step writes the state it produced over them,
inside its graph, for the next step to read), the accepted count that selects the row to draft
from, and the S - 1 rows of ids and target states kept for the next window. On CPU, or without
graphs, the same step function runs eagerly over the same buffers.
"""

from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch
from engine.graphs import capture


class MTPWindow:
    def __init__(self, draft, draft_steps: int, embed, lm_head, cos_sin_table, kvs, dtype, device):
        mc = draft.config
        S = draft_steps
        W = 2 * S
        self.draft, self.embed, self.lm_head, self.cos_sin_table, self.kvs = draft, embed, lm_head, cos_sin_table, kvs
        self.draft_steps, self.num_rows, self.chain = S, W, mc.chain
        self.ids = torch.zeros(W, dtype=torch.long, device=device)
        self.offsets = torch.arange(W, dtype=torch.long, device=device)
        self.positions = self.offsets.clone()
        self.hidden = torch.zeros(W, mc.extend_width, dtype=dtype, device=device)
        self.accepted = torch.zeros((), dtype=torch.long, device=device)  # drafts accepted by the last verify
        # Rows kept from one window for the next: ids (token j + 1) and target states of the
        # S - 1 positions before the next bonus token.
        self.tail_offsets = torch.arange(S - 1, dtype=torch.long, device=device)
        self.tail_ids = torch.zeros(S - 1, dtype=torch.long, device=device)
        self.tail_hidden = torch.zeros(S - 1, mc.extend_width, dtype=dtype, device=device)
        self.start = 0  # host copy of positions[0], for eager attention only
        self.graphs: list | None = None
        self.outs: list | None = None

    @property
    def last_row(self) -> torch.Tensor:
        """() device index of the row at the last accepted position: where every step drafts."""
        return self.accepted + (self.draft_steps - 1)

    def begin(self, start: int, cur_ids: torch.Tensor, cur_states: torch.Tensor, accepted: torch.Tensor) -> None:
        """Writes a window. start: position of row 0 (= bonus position - S + 1);
        cur_ids: (S + 1,) token j + 1 for the verify rows j = bonus .. bonus + S;
        cur_states: (S + 1, extend_width) target states of those rows; accepted: () device."""
        torch.cat([self.tail_ids, cur_ids], out=self.ids)
        torch.cat([self.tail_hidden, cur_states.to(self.hidden.dtype)], out=self.hidden)
        torch.add(self.offsets, start, out=self.positions)
        self.accepted.copy_(accepted)
        self.start = start
        keep = self.tail_offsets + (self.accepted + 1)  # rows of the next window's first S - 1 positions
        self.tail_ids.copy_(self.ids.index_select(0, keep))
        self.tail_hidden.copy_(self.hidden.index_select(0, keep))

    def push_draft(self, token: torch.Tensor) -> None:
        """Rotates the ids one row up (step s + 1 reads token j + s + 2 at row j) and puts the
        new draft at the last accepted row. token: (1,) device."""
        self.ids.copy_(torch.roll(self.ids, -1))
        self.ids.index_copy_(0, self.last_row.view(1), token)

    def step(self, s: int, start_pos: int | None = None) -> torch.Tensor:
        """Step s over the window as written: (1, V) fp32 logits of its draft. start_pos: the
        window's first position when the host knows it (eager), None inside a graph."""
        return self._step(s, start_pos)

    def _step(self, s: int, start_pos: int | None = None) -> torch.Tensor:
        batch = ForwardBatch(self.ids, self.positions, start_pos)
        passed, normed = self.draft.step(s, self.ids, self.hidden, batch, self.embed, self.kvs[s], self.cos_sin_table)
        row = normed.index_select(0, self.last_row.view(1))
        if self.chain and s < self.draft_steps - 1:
            self.hidden.copy_(passed)  # the state this step produced, for step s + 1
        return self.lm_head(row).float()  # (1, V)

    def run(self, s: int) -> torch.Tensor:
        """Step s over the window; returns (1, V) fp32 logits of its draft (a static tensor in
        graph mode, overwritten by the next replay of step s)."""
        if self.graphs is not None:
            self.graphs[s].replay()
            return self.outs[s]
        return self._step(s, self.start)

    def capture(self) -> None:
        pool = torch.cuda.graph_pool_handle()
        graphs, outs = [], []
        with torch.inference_mode():
            for s in range(self.draft_steps):
                g, out = capture(lambda s=s: self._step(s), pool)
                graphs.append(g)
                outs.append(out)
        torch.cuda.synchronize()
        self.graphs, self.outs = graphs, outs
