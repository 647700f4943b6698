"""ForwardBatch: the inputs of one model forward (batch size 1, T new tokens)."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    input_ids: torch.Tensor  # (T,) int64
    positions: torch.Tensor  # (T,) int64, contiguous: start_pos .. start_pos + T - 1
    # Cache length before these tokens, known on the host in eager mode. None in a captured
    # graph: attention then reads the lengths from `positions` on the device.
    start_pos: int | None = None
    # Packed independent sequences (feature extraction for training), their lengths in order:
    # positions restart at 0 in each, attention stays inside one, and the KV cache is neither
    # read nor written. (): one sequence over the cache.
    segment_lengths: tuple[int, ...] = ()
    # (T,) cache rows the tokens' K/V go to, when not their positions: a verify step's
    # alternative draft tokens share a position with a chain token and are kept past the chain.
    # Each row attends to the rows before its position and to its own. None: the positions.
    slots: torch.Tensor | None = None
    # (T, S) bool: which cache rows 0..S-1 each row attends to, when neither positions nor slots
    # say it (a draft tree's verify step: the context, the row's ancestors and itself). Eager
    # only, on SDPA. None: by position (and own slot).
    visible: torch.Tensor | None = None
    # The same tree rows for the decode kernel (CUDA, up to 16 rows, batch-invariant): row t reads
    # the keys of positions map_base[t] .. map_base[t] + W - 1 below its own from cache rows
    # slot_map[t] (its ancestors, wherever the tree put them), in the blocks and order of the
    # decode step of its token, so its bits are that step's. (T, W) int32 and (T,); given instead
    # of `visible` where that kernel serves (a batch-invariant target's rows on CUDA).
    slot_map: torch.Tensor | None = None
    map_base: torch.Tensor | None = None

    @classmethod
    def packed(cls, input_ids: torch.Tensor, lengths: list[int]) -> "ForwardBatch":
        positions = torch.cat([torch.arange(n, device=input_ids.device) for n in lengths])
        return cls(input_ids=input_ids, positions=positions, start_pos=0, segment_lengths=tuple(lengths))

    @classmethod
    def eager(cls, input_ids: torch.Tensor, start_pos: int) -> "ForwardBatch":
        T = input_ids.shape[0]
        positions = torch.arange(start_pos, start_pos + T, device=input_ids.device)
        return cls(input_ids=input_ids, positions=positions, start_pos=start_pos)

    @property
    def is_packed(self) -> bool:
        return bool(self.segment_lengths)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
