"""ReadAhead: read each graph replay's small result one replay late.

A decode loop that replays a graph and then waits for its result leaves the GPU idle while the
host handles that result (detokenizing, stop checks, streaming). When the next replay needs
nothing from the host (its inputs are chained on the device), it can be queued before the host
waits for the previous result. Each replay's result is copied into a pinned host slot on the
stream, so the next replay may overwrite the device buffer. CUDA only.
"""

from __future__ import annotations

from collections import deque
from typing import Callable

import torch


# Replays in flight in the greedy graph loops: 2 reads each result one replay late, 1 waits
# for every replay before queueing the next (benchmarks/profile_spec.py compares the two).
DEPTH = 2


class ReadAhead:
    def __init__(self, result: torch.Tensor, depth: int = 2):
        """result: the device tensor each replay writes; depth: replays in flight at most."""
        self.result = result
        self.slots = [torch.empty(result.shape, dtype=result.dtype, pin_memory=True) for _ in range(depth)]
        self.events = [torch.cuda.Event() for _ in range(depth)]
        self.pending: deque[int] = deque()
        self.count = 0

    @property
    def in_flight(self) -> int:
        return len(self.pending)

    def queue(self, replay: Callable[[], None]) -> None:
        """Queues one replay and the copy of its result (no host sync)."""
        assert len(self.pending) < len(self.slots), "take() a result before queueing more"
        i = self.count % len(self.slots)
        self.count += 1
        replay()
        self.slots[i].copy_(self.result, non_blocking=True)
        self.events[i].record()
        self.pending.append(i)

    def drain(self) -> None:
        """Forgets the queued replays' results (they still run; their writes are stream-ordered)."""
        self.pending.clear()

    def take(self) -> list[int]:
        """The oldest queued replay's result (waits for that replay only)."""
        i = self.pending.popleft()
        self.events[i].synchronize()
        return self.slots[i].tolist()
