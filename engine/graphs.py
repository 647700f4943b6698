"""CUDA-graph capture and replay of fixed-shape target forwards (decode: 1 token, verify: k+1)."""

from __future__ import annotations

import torch

from engine.forward_batch import ForwardBatch
from engine.kernels.pick import greedy_next_ref


def capture(fn, pool):
    """Warms `fn` up on a side stream (allocator, Triton compilation), then captures it.
    Returns (graph, fn's outputs as static tensors)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    return graph, out


class CapturedStep:
    """One graph for T new tokens. Inputs are written into static buffers before replay;
    outputs live in static tensors that the next replay overwrites."""

    def __init__(self, model, kv, num_tokens: int, aux_layer_ids: tuple[int, ...], pool):
        dev = kv.k_all.device
        self.num_tokens = num_tokens
        self.input_ids = torch.zeros(num_tokens, dtype=torch.long, device=dev)
        self.offsets = torch.arange(num_tokens, dtype=torch.long, device=dev)
        # Warm-ups run for real: they write K/V at the end of the cache, past anything live,
        # so a graph can be captured in the middle of a conversation too.
        self.positions = self.offsets + self.scratch_start(kv.max_len, num_tokens)
        batch = ForwardBatch(self.input_ids, self.positions, start_pos=None)
        self.next_token = torch.zeros(1, dtype=torch.long, device=dev)
        # The argmax, input-id copy and position step as one kernel of ours where there is one: torch's
        # argmax alone took 28 us of the 8B step (docs/performance.md).
        pick = model.ops.greedy_next or greedy_next_ref

        def run():
            out = model(batch, kv, aux_layer_ids)
            logits = model.logits(out.hidden)
            if num_tokens == 1:
                # Greedy chaining inside the graph: the argmax becomes the next replay's input,
                # so a greedy decode loop launches nothing but the graph itself.
                pick(logits, self.next_token, self.input_ids, self.positions)
            return logits, out.hidden, out.aux_hidden

        self.graph, (self.logits, self.hidden, self.aux_hidden) = capture(run, pool)
        self._reader = None

    @staticmethod
    def scratch_start(max_len: int, num_tokens: int) -> int:
        """First cache position a capture's warm-ups write (two runs, the decode graph moving
        one position per run)."""
        return max(0, max_len - num_tokens - 3)

    def read_ahead(self):
        """A ReadAhead over the decode graph's next token (made once, kept with the graph)."""
        if self._reader is None:
            from engine.read_ahead import ReadAhead

            self._reader = ReadAhead(self.next_token)
        return self._reader

    def replay(self, input_ids: torch.Tensor, start_pos: int):
        self.input_ids.copy_(input_ids)
        torch.add(self.offsets, start_pos, out=self.positions)  # no host sync
        self.graph.replay()
        return self.logits, self.hidden, self.aux_hidden
