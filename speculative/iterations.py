"""The host side of whole-iteration loops (EAGLE-3's greedy and sampled iterations, MTP's greedy
one): an iteration is one function over static device buffers, replayed as one CUDA graph (or run
eagerly on a CPU), and the host only commits each iteration's small result.

IterationHost gives such a loop queue / take / drain (a ReadAhead queues the next replay before
the host reads a result) and run() (one iteration, eager or replayed). A subclass sets `graph`,
`result`, `n` and `width`, and writes _body(n) (n: the cache length when the host knows it,
None inside the graph). run_iterations() drives one answer with it.
"""

from __future__ import annotations

from typing import Callable, Iterator

import torch

from engine import read_ahead
from engine.decode import plain_steps


class IterationHost:
    graph = None  # the captured graph (subclasses), None: eager
    reader = None

    def _prepare(self) -> None:
        """Before each iteration, on the stream (the sampled one draws its random numbers)."""

    def _replay(self) -> None:
        self._prepare()
        self.graph.replay()

    def queue(self) -> None:
        """Queues one iteration on the graph (CUDA); its result comes from take()."""
        if self.reader is None:
            self.reader = read_ahead.ReadAhead(self.result)
        self.reader.queue(self._replay)

    def take(self) -> list[int]:
        return self.reader.take()

    def drain(self) -> None:
        if self.reader is not None:
            self.reader.drain()

    @torch.inference_mode()
    def run(self) -> list[int]:
        """One iteration; returns its result as a list (syncs once)."""
        if self.graph is not None:
            self._replay()
        else:  # eager: the host knows the lengths, so attention reads only the filled cache
            self._prepare()
            self._body(int(self.n))
        return self.result.tolist()

    def _body(self, n: int | None = None) -> None:
        raise NotImplementedError


def run_iterations(runner, state, it: IterationHost, k: int,
                   commit: Callable[[list[int], int, object], tuple[list[int], int]]) -> Iterator[list[int]]:
    """Runs a started whole-iteration loop to the end of the context, then plain steps. k: the
    most drafts an iteration accepts; commit(result, n, state) -> (new tokens, the cache length
    after them). With a graph, the iteration after the next is queued before the host reads a
    result (it needs nothing from the host), whenever it surely fits in the context."""
    n, width = state.kv_len, it.width
    if it.graph is None:  # eager: one iteration at a time
        while n + width <= runner.max_len:
            state.verify_rows.append(width)
            out, n = commit(it.run(), n, state)
            yield out
        yield from plain_steps(runner, state)
        return
    it.drain()
    try:
        it.queue()
        queued = 1
        while queued:
            # The queued iteration starts at n; the one after it at n + k + 1 at most, and
            # each writes `width` cache rows from where it starts.
            if queued < read_ahead.DEPTH and n + k + 1 + width <= runner.max_len:
                it.queue()
                queued += 1
            state.verify_rows.append(width)
            out, n = commit(it.take(), n, state)
            queued -= 1
            if not queued and n + width <= runner.max_len:
                it.queue()
                queued = 1
            yield out
    finally:
        it.drain()  # an iteration queued past the answer's end wrote only at or past kv_len
    yield from plain_steps(runner, state)
