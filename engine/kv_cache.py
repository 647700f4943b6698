"""KVCache: static, preallocated keys and values for every layer, indexed by position."""

from __future__ import annotations

import torch


class KVCache:
    """k[layer] and v[layer] are (max_len, num_kv_heads, head_dim) views of one allocation.

    Nothing is ever freed or compacted: the valid length is owned by the caller, so rejecting
    draft tokens is just moving that length back (rows past it are overwritten later).
    """

    def __init__(self, num_layers: int, max_len: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device | str):
        shape = (num_layers, max_len, num_kv_heads, head_dim)
        self.k_all = torch.zeros(shape, dtype=dtype, device=device)
        self.v_all = torch.zeros(shape, dtype=dtype, device=device)
        self.k = list(self.k_all.unbind(0))
        self.v = list(self.v_all.unbind(0))
        self.max_len = max_len

    @property
    def nbytes(self) -> int:
        return self.k_all.nbytes + self.v_all.nbytes
