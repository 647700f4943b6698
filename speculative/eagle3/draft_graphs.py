"""CUDA graphs for the draft: one decode step (1 row) and the draft-extend window (k+1 rows).

Every value that changes between iterations (token ids, positions, hidden states, the index
of the last accepted row) is written into these static buffers before replay; nothing else.
"""

from __future__ import annotations

import torch

from engine.graphs import capture

from speculative.eagle3.draft_parts import DraftParts


class DraftGraphs:
    def __init__(self, parts: DraftParts, scratch: int):
        """scratch: the cache position where the capture's warm-ups write (the decode step at
        scratch, the extend window from there); nothing live may be at or past it."""
        draft, embed, kv = parts.draft, parts.embed, parts.kv
        dc = draft.config
        dev, dtype = kv.k_all.device, kv.k_all.dtype
        rows = parts.k + 1
        pool = torch.cuda.graph_pool_handle()
        # decode step buffers: sized from the draft config's decode width
        self.dec_ids = torch.zeros(1, dtype=torch.long, device=dev)
        self.dec_pos = torch.full((1,), scratch, dtype=torch.long, device=dev)
        self.dec_hidden = torch.zeros(1, dc.decode_width, dtype=dtype, device=dev)
        # extend window buffers: sized from the extend width
        self.ext_ids = torch.zeros(rows, dtype=torch.long, device=dev)
        self.ext_offsets = torch.arange(rows, dtype=torch.long, device=dev)
        self.ext_pos = self.ext_offsets + scratch
        self.ext_hidden = torch.zeros(rows, dc.extend_width, dtype=dtype, device=dev)
        self.ext_last = torch.zeros((), dtype=torch.long, device=dev)

        def decode():
            return draft(self.dec_ids, self.dec_pos, self.dec_hidden, False, embed, kv)

        def extend():
            return draft(self.ext_ids, self.ext_pos, self.ext_hidden, True, embed, kv, last=self.ext_last)

        with torch.inference_mode():
            self.dec_graph, self.dec_out = capture(decode, pool)
            self.ext_graph, self.ext_out = capture(extend, pool)

    def decode(self, tok: torch.Tensor, pos: int, hidden: torch.Tensor):
        self.dec_ids.copy_(tok)
        self.dec_pos.fill_(pos)
        self.dec_hidden.copy_(hidden)
        self.dec_graph.replay()
        return self.dec_out

    def extend(self, window: torch.Tensor, start: int, target_states: torch.Tensor, last: torch.Tensor):
        self.ext_ids.copy_(window)
        torch.add(self.ext_offsets, start, out=self.ext_pos)
        self.ext_hidden.copy_(target_states)
        self.ext_last.copy_(last)
        self.ext_graph.replay()
        return self.ext_out
