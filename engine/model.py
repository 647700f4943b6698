"""CausalLM: our Llama-family decoder (Llama, Mistral, Qwen2, Qwen3) over a static KV cache."""

from __future__ import annotations

from dataclasses import dataclass
import torch
from torch import nn

from engine.attention import attend, attention_packed
from engine.forward_batch import ForwardBatch
from engine.config import ModelConfig
from engine.kv_cache import KVCache
from engine.layers import GatedMLP, RMSNorm
from engine.kernels.attention import MAX_INVARIANT_ROWS, MAX_TREE_ROWS
from engine.layer_kernels import Normed, rows_of
from engine import routing
from engine.packed_linear import is_packed_layer, projection_device, share_packed
from engine.ops import Ops
from engine.options import KernelOptions
from engine.rope import apply_rope, rope_cos_sin
from engine.uninitialized import build_uninitialized


@dataclass
class ForwardOutput:
    hidden: torch.Tensor  # (T, H) after the final norm: what lm_head reads
    aux_hidden: torch.Tensor | None  # (T, num_aux * H): inputs of the chosen layers, concatenated
    # those inputs apart, (T, H) each, where the caller gathers rows of them itself (concat_aux=False)
    aux_parts: tuple[torch.Tensor, ...] | None = None


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        self.ops = ops
        self.num_heads, self.num_kv_heads, self.head_dim = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.q_size, self.kv_size = cfg.q_size, cfg.kv_size
        self.scale = cfg.head_dim ** -0.5
        self.qkv_proj = nn.Linear(cfg.hidden_size, cfg.q_size + 2 * cfg.kv_size, bias=cfg.attention_bias,
                                  device=projection_device())
        # Qwen2 puts a bias on q/k/v only; Llama and Qwen3 apply attention_bias to o_proj too.
        o_bias = cfg.attention_bias and not cfg.is_qwen2
        self.o_proj = nn.Linear(cfg.q_size, cfg.hidden_size, bias=o_bias, device=projection_device())
        if cfg.qk_norm:
            self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)
            self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_norm_eps)  # 3-D input: plain torch
        self.qk_norm = cfg.qk_norm

    def packed_shards(self) -> dict[str, tuple[str, int, int]]:
        q, kv = self.q_size, self.kv_size
        return {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv), "v_proj": ("qkv_proj", q + kv, kv)}

    def forward(self, qkv: torch.Tensor, batch: ForwardBatch, cos_sin: torch.Tensor,
                k_cache: torch.Tensor, v_cache: torch.Tensor, cos_sin_table: torch.Tensor,
                project=None) -> "torch.Tensor | Normed":
        """qkv: (T, q_size + 2 * kv_size), qkv_proj's output (the layer runs it, fused with the
        norm where it can: Ops.layer_kernels). Returns o_proj's output (T, H), or project(o, o_proj)
        (LayerKernels.ending: a Normed) where the layer gives one."""
        T = qkv.shape[0]
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(T, self.num_heads, self.head_dim)
        k = k.view(T, self.num_kv_heads, self.head_dim)
        v = v.view(T, self.num_kv_heads, self.head_dim)
        if self.qk_norm:
            q, k = self.q_norm(q), self.k_norm(k)
        if batch.is_packed:
            q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
            o = attention_packed(q, k, v, batch.segment_lengths, self.scale).reshape(T, self.q_size)
            return self.o_proj(o)
        fused = None  # a draft tree's rows in an eager mask (visible) take the separate launches
        if self.ops.rope_and_cache is not None and batch.visible is None:
            fused = self.ops.one_row_attention(T, mapped=batch.slot_map is not None)
        if fused is not None:
            # a quantized o_proj may take its row rounded to int8 by the attention's last launch (a
            # program a head rounds its head's vectors of 32)
            order = (self.ops.rounds_for(self.o_proj, T)
                     if project is None and batch.slot_map is None and self.head_dim % 32 == 0 else None)
            o = fused(q, k, v, cos_sin_table, batch.positions, k_cache, v_cache, self.scale, batch.slots,
                      slot_map=batch.slot_map, map_base=batch.map_base,
                      **({} if order is None else {"round_for": order}))
            if order is not None:
                o, rounded = o
                return self.ops.row_linear(o.reshape(T, self.q_size), self.o_proj, rounded=rounded)
            if project is not None:
                return project(o.reshape(T, self.q_size), self.o_proj)
            return self._o_proj(o.reshape(T, self.q_size), batch)
        if self.ops.rope_and_cache is not None:
            q = self.ops.rope_and_cache(q, k, v, cos_sin_table, batch.positions, k_cache, v_cache, batch.slots)
        else:
            q, k = apply_rope(q, cos_sin), apply_rope(k, cos_sin)
            rows = batch.positions if batch.slots is None else batch.slots
            k_cache.index_copy_(0, rows, k)
            v_cache.index_copy_(0, rows, v)
        o = attend(q, k_cache, v_cache, batch.positions, batch.start_pos, self.scale, self.ops.attention,
                   batch.slots, batch.visible, batch.slot_map, batch.map_base)
        o = o.reshape(T, self.q_size)
        if project is not None:
            return project(o, self.o_proj)
        return self._o_proj(o, batch)

    def _o_proj(self, o: torch.Tensor, batch) -> torch.Tensor:
        """o_proj on its own: a draft tree's rows by Ops.tree_project, other steps' on row_linear's
        route, or the nn.Linear."""
        out = self.ops.tree_project(o, self.o_proj, "o_proj") if batch.slot_map is not None else None
        if out is not None:
            return out
        return self.ops.row_linear(o, self.o_proj) if self.ops.row_linear else self.o_proj(o)


class DecoderLayer(nn.Module):
    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        self.self_attn = Attention(cfg, ops)
        self.mlp = GatedMLP(cfg.hidden_size, cfg.intermediate_size, bias=cfg.mlp_bias, silu_and_mul=ops.silu_and_mul,
                            row_linear=ops.row_linear, linear=ops.linear)
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops.add_rms_norm)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops.add_rms_norm)
        self.ops = ops
        self.shapes = tuple(tuple(m.weight.shape) for m in (self.self_attn.qkv_proj, self.self_attn.o_proj,
                                                            self.mlp.gate_up_proj, self.mlp.down_proj))

    def is_packed(self) -> bool:
        """Whether a projection of this layer is quantized (PackedLinear): the unfused set serves it."""
        return is_packed_layer(self.self_attn.qkv_proj, self.self_attn.o_proj, self.mlp.gate_up_proj,
                               self.mlp.down_proj)

    def forward(self, x, residual, batch, cos_sin, k_cache, v_cache, cos_sin_table, stream_in: list | None = None,
                then=None):
        """x: the last sublayer's output, residual: the stream before it (None at layer 0); x may
        be a Normed (the last projection ran this layer's input norm). Returns (the MLP's output,
        the stream before it). stream_in: a list that gets the stream at the layer's input,
        x + residual, as its first norm computes it (no extra launch). then: the norm after this
        layer and the projection after it, (norm, linear, role), which the MLP's down projection
        may run in its last program (the output is then a Normed: LayerKernels.ending)."""
        rows = rows_of(x)
        each_row = routing.each_row_layer(self.ops.options, self.shapes, rows.dtype)
        # fused norm + projection launches, or not
        kernels = self.ops.layer_kernels(rows, batch, each_row, self.is_packed())
        qkv, residual = kernels.norm_linear(x, residual, self.input_layernorm, self.self_attn.qkv_proj, role="qkv")
        if stream_in is not None:
            stream_in.append(residual)
        post = (self.post_attention_layernorm, self.mlp.gate_up_proj, "gate_up")
        x = self.self_attn(qkv, batch, cos_sin, k_cache, v_cache, cos_sin_table, kernels.ending(residual, post))
        return kernels.mlp(x, residual, self.post_attention_layernorm, self.mlp, then)


class TransformerBody(nn.Module):
    """The `model.` part of the checkpoint: embeddings, layers, final norm."""

    def __init__(self, cfg: ModelConfig, ops: Ops):
        super().__init__()
        # it may come packed too (PackedEmbedding; allocated on meta for such a load)
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=projection_device())
        self.layers = nn.ModuleList(DecoderLayer(cfg, ops) for _ in range(cfg.num_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps, ops.add_rms_norm)


class CausalLM(nn.Module):
    def __init__(self, cfg: ModelConfig, max_len: int, ops: Ops):
        super().__init__()
        self.config = cfg
        self.ops = ops
        self.model = TransformerBody(cfg, ops)
        # untied, it may come packed too (engine/packed_linear.py: projections_on_meta)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False,
                                 device=None if cfg.tie_word_embeddings else projection_device())
        if cfg.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.register_buffer("cos_sin", rope_cos_sin(cfg, max_len).to(torch.get_default_device()), persistent=False)

    def any_packed_layer(self) -> bool:
        """Whether a decoder layer has quantized projections (their kernels take up to 16 rows)."""
        return any(layer.is_packed() for layer in self.model.layers)

    def forward(self, batch: ForwardBatch, kv: KVCache, aux_layer_ids: tuple[int, ...] = (),
                concat_aux: bool = True) -> ForwardOutput:
        """aux_layer_ids: capture the inputs of these layers (id == num_layers: the final stream),
        concatenated as aux_hidden, or (concat_aux False) apart as aux_parts, for a caller that
        needs only some rows of them (a tree step's accepted path: speculative/kernels/states.py)."""
        fused_rope = self.ops.rope_and_cache is not None and not batch.is_packed
        cos_sin = None if fused_rope else self.cos_sin.index_select(0, batch.positions)
        ids = batch.input_ids
        embed = self.model.embed_tokens
        most = MAX_TREE_ROWS if batch.slot_map is not None else MAX_INVARIANT_ROWS
        if (self.ops.embed is not None and ids.shape[0] <= most and not batch.is_packed
                and isinstance(embed, nn.Embedding)):
            x = self.ops.embed(ids, embed.weight)
        else:
            x = self.ops.lookup(embed, ids)
        residual = None
        captured: dict[int, torch.Tensor] = {}
        layers = self.model.layers
        for i, layer in enumerate(layers):
            stream_in = [] if i in aux_layer_ids else None
            # The norm after this layer and what reads it: a one-row step may run it in the layer's last GEMV.
            then = ((layers[i + 1].input_layernorm, layers[i + 1].self_attn.qkv_proj, "qkv") if i + 1 < len(layers)
                    else (self.model.norm, self.lm_head, "lm_head"))
            x, residual = layer(x, residual, batch, cos_sin, kv.k[i], kv.v[i], self.cos_sin, stream_in, then)
            if stream_in is not None:
                captured[i] = stream_in[0]
        if self.config.num_layers in aux_layer_ids:
            captured[self.config.num_layers] = x.stream if isinstance(x, Normed) else x + residual
        if isinstance(x, Normed):  # the last down projection ran the final norm
            hidden = x.normed
        else:
            hidden, _ = self.model.norm.add_forward(x, residual)
        if aux_layer_ids and not concat_aux:
            return ForwardOutput(hidden=hidden, aux_hidden=None, aux_parts=tuple(captured[i] for i in aux_layer_ids))
        aux = torch.cat([captured[i] for i in aux_layer_ids], dim=-1) if aux_layer_ids else None
        return ForwardOutput(hidden=hidden, aux_hidden=aux)

    def with_options(self, options: KernelOptions) -> "CausalLM":
        """This model's weights (shared, not copied) under other kernel options: e.g. the batch
        invariance that a draft's verify steps need, for a model built without it."""
        norm = self.model.norm.weight  # never packed: its device and dtype are the model's
        ops = Ops.for_device(norm.device, options)
        twin = build_uninitialized(lambda: CausalLM(self.config, self.cos_sin.shape[0], ops), torch.device("meta"),
                                   norm.dtype)
        share_packed(self, twin)  # its quantized projections, as this model holds them
        twin.load_state_dict(self.state_dict(), assign=True)
        twin.cos_sin = self.cos_sin
        return twin.eval().requires_grad_(False)

    def logits(self, hidden: torch.Tensor, fp32: bool = True, tree: bool = False) -> torch.Tensor:
        """(T, H) -> (T, V) fp32 (fp32 False: in the weights' dtype, enough for an argmax). tree: a
        draft tree's verify rows, more than 16 on the invariant route (Ops.tree_project)."""
        out = self.ops.tree_project(hidden, self.lm_head, "lm_head") if tree else None
        if out is None:
            out = self.ops.linear(hidden, self.lm_head)
        return out.float() if fp32 else out

    def checkpoint_target(self, name: str) -> tuple[str, int, int] | None:
        """Maps a checkpoint tensor name to (parameter name, row offset, rows) for fused
        projections, or (name, 0, -1) for a whole parameter; None for names we ignore."""
        if name.endswith("rotary_emb.inv_freq"):
            return None  # a buffer some old checkpoints saved; we compute our own
        if name == "lm_head.weight" and self.config.tie_word_embeddings:
            return None
        if self.config.architecture == "MiMoForCausalLM" and name.startswith("model.mtp_layers."):
            return None  # MiMo's MTP layers: loaded by the speculative decoder, not the target
        parts = name.split(".")
        if len(parts) >= 3 and parts[-2] in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"):
            owner = self.get_submodule(".".join(parts[:-2]))
            if isinstance(owner, (Attention, GatedMLP)):
                fused, offset, rows = owner.packed_shards()[parts[-2]]
                return ".".join(parts[:-2] + [fused, parts[-1]]), offset, rows
        return name, 0, -1
