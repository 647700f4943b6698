"""MTPDraft: S multi-token-prediction layers, each its own weights and its own KV cache.

One layer (MiMo's names, which are the parameter names; DeepSeek-V3 calls the first three
enorm, hnorm and eh_proj):

    e = token_layernorm(embed(token))      embed: the target's, shared
    h = hidden_layernorm(state)            state: target hidden (post-norm) or a chained state
    x = input_proj([h, e] or [e, h])       (T, 2H) -> (T, H); the order is MTPConfig.hidden_first
    out = decoder block(x)                 a Llama/Qwen2 block over this layer's KV cache
    logits = lm_head(final_layernorm(out)) lm_head: the target's, shared

Alignment: layer s at position j reads token j+s+1 and the state of position j from step
s-1 (the target's for s = 0, or always in non-chain mode) and predicts token j+s+2.
"""

from __future__ import annotations

import torch
from torch import nn

from engine.forward_batch import ForwardBatch
from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.layers import RMSNorm
from engine.model import DecoderLayer
from engine.ops import Ops

from speculative.mtp.config import MTPConfig

_PACKED = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")


class MTPLayer(DecoderLayer):
    """The decoder block's parameters sit directly on the layer, as in MiMo's checkpoints."""

    def __init__(self, mc: MTPConfig, layer_cfg: ModelConfig, ops: Ops):
        super().__init__(layer_cfg, ops)
        H, eps = mc.hidden_size, mc.rms_norm_eps
        self.token_layernorm = RMSNorm(H, eps)
        self.hidden_layernorm = RMSNorm(H, eps)
        self.input_proj = nn.Linear(2 * H, H, bias=False)
        self.final_layernorm = RMSNorm(H, eps)
        self.hidden_first = mc.hidden_first
        self.mask_position0 = mc.mask_position0

    def forward(self, embeds, hidden, batch: ForwardBatch, cos_sin, k_cache, v_cache, cos_sin_table):
        """embeds, hidden: (T, H). Writes this layer's K/V at batch.positions.
        Returns (out (T, H) block output before the final norm, normed (T, H) after it)."""
        if self.mask_position0:
            embeds = embeds.masked_fill((batch.positions == 0)[:, None], 0)
        e, h = self.token_layernorm(embeds), self.hidden_layernorm(hidden)
        x = self.input_proj(torch.cat([h, e] if self.hidden_first else [e, h], dim=-1))
        y, residual = super().forward(x, None, batch, cos_sin, k_cache, v_cache, cos_sin_table)
        out = y + residual
        return out, self.final_layernorm(out)


class MTPDraft(nn.Module):
    def __init__(self, mc: MTPConfig, target_cfg: ModelConfig, ops: Ops):
        super().__init__()
        self.config = mc
        self.ops = ops
        layer_cfg = mc.layer_config(target_cfg)
        self.mtp_layers = nn.ModuleList(MTPLayer(mc, layer_cfg, ops) for _ in range(mc.num_layers))

    def step(self, s: int, input_ids, hidden, batch: ForwardBatch, embed: nn.Embedding, kv: KVCache,
             cos_sin_table: torch.Tensor):
        """Runs physical layer s over T rows. input_ids: (T,); hidden: (T, extend_width).
        Returns (passed_on (T, decode_width): the state chain mode feeds to step s + 1,
        normed (T, H): what lm_head reads)."""
        cos_sin = None if self.ops.rope_and_cache else cos_sin_table.index_select(0, batch.positions)
        out, normed = self.mtp_layers[s](self.ops.lookup(embed, input_ids), hidden, batch, cos_sin, kv.k[0], kv.v[0],
                                         cos_sin_table)
        return (normed if self.config.norm_in_layer else out), normed

    def checkpoint_target(self, name: str):
        """`{prefix}{i}.rest` -> our parameter; q/k/v and gate/up go to their fused slices.
        Names outside the prefix, or past the last layer, come back unmatched (a load error)."""
        prefix = self.config.prefix
        if not name.startswith(prefix):
            return name, 0, -1
        local = "mtp_layers." + name[len(prefix):]
        parts = local.split(".")
        if len(parts) == 5 and parts[3] in _PACKED:
            try:
                owner = self.get_submodule(".".join(parts[:3]))
            except AttributeError:
                return local, 0, -1
            fused, offset, rows = owner.packed_shards()[parts[3]]
            return ".".join(parts[:3] + [fused, parts[4]]), offset, rows
        return local, 0, -1
