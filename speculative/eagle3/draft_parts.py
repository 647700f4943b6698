"""DraftParts: what EAGLE-3's whole-iteration loops and draft graphs use of the speculator."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from engine.kv_cache import KVCache

from speculative.eagle3.model import Eagle3Draft


@dataclass(frozen=True, eq=False)  # eq=False: fields are modules and tensors, compared by identity
class DraftParts:
    """The draft, the embedding table it reads (the target's, or its own when narrower), the
    cache it writes, and k, the draft tokens per verify step. Handed to the loops at
    construction, so that they reach into no speculator."""

    draft: Eagle3Draft
    embed: nn.Embedding
    kv: KVCache
    k: int

    def target_states(self, aux: torch.Tensor | None, hidden: torch.Tensor) -> torch.Tensor:
        """What the draft-extend consumes from a target forward: the aux layers' states
        (concatenated) or, for a head that does not use them, the last hidden state."""
        return aux if self.draft.config.use_aux_hidden_state else hidden
