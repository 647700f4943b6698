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
    # Packed independent sequences (feature extraction for training): segment id per token,
    # positions restart at 0 in each segment, attention stays inside a segment, and the KV
    # cache is neither read nor written.
    segment_ids: torch.Tensor | None = None
    segment_lengths: tuple[int, ...] = ()  # of the packed segments, in order (host side)

    @classmethod
    def packed(cls, input_ids: torch.Tensor, lengths: list[int]) -> "ForwardBatch":
        dev = input_ids.device
        seg = torch.repeat_interleave(torch.arange(len(lengths), device=dev), torch.tensor(lengths, device=dev))
        positions = torch.cat([torch.arange(n, device=dev) for n in lengths])
        return cls(input_ids=input_ids, positions=positions, start_pos=0, segment_ids=seg,
                   segment_lengths=tuple(lengths))

    @classmethod
    def eager(cls, input_ids: torch.Tensor, start_pos: int) -> "ForwardBatch":
        T = input_ids.shape[0]
        positions = torch.arange(start_pos, start_pos + T, device=input_ids.device)
        return cls(input_ids=input_ids, positions=positions, start_pos=start_pos)

    @property
    def num_tokens(self) -> int:
        return self.input_ids.shape[0]
