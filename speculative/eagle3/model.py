"""Eagle3Draft: the EAGLE-3 head (fc, one 2H-input decoder layer, norm, reduced-vocab lm_head, d2t)."""

from __future__ import annotations

import torch
from torch import nn

from engine.attention import attend
from engine.layers import GatedMLP, RMSNorm
from engine.kernels.gemv import MAX_ROWS, gemv_add_stats, gemv_rstd
from engine.ops import Ops
from engine.packed_linear import PackedEmbedding
from engine.routing import ROW_TILE, invariant_tile
from engine.rope import apply_rope, rope_cos_sin

from speculative.eagle3.config import DraftConfig


def pick_row(x: torch.Tensor, row: int | torch.Tensor) -> torch.Tensor:
    """x's row `row` as (1, ...): a view for a Python index, one gather (no host sync) for a
    0-dim index tensor."""
    if isinstance(row, int):
        return x.narrow(0, row % x.shape[0], 1)
    return x.index_select(0, row.view(1))


class Eagle3Layer(nn.Module):
    """Attention reads [input_layernorm(embed(token)), hidden_norm(h)], 2H wide.

    One computation on three paths that differ in kernels, and so in their last bits (which only
    change what is drafted, never the output); they share _cached_attention where they agree:
        forward        plain torch: the CPU, training, and the reference the GPU paths are tested against
        fused_forward  GPU kernels for any number of rows: prompts longer than the GEMV's MAX_ROWS
        lean_forward   GPU, fewest launches, up to MAX_ROWS rows: draft steps and draft-extends
    """

    def __init__(self, dc: DraftConfig):
        super().__init__()
        H = dc.hidden_size
        self.num_heads, self.num_kv_heads, self.head_dim = dc.num_heads, dc.num_kv_heads, dc.head_dim
        self.q_size, self.kv_size = dc.num_heads * dc.head_dim, dc.num_kv_heads * dc.head_dim
        self.scale = dc.head_dim ** -0.5
        self.norm_before_residual = dc.norm_before_residual
        self.input_layernorm = RMSNorm(H, dc.rms_norm_eps)
        self.hidden_norm = RMSNorm(H, dc.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(H, dc.rms_norm_eps)
        self.self_attn = nn.Module()
        self.self_attn.qkv_proj = nn.Linear(2 * H, self.q_size + 2 * self.kv_size, bias=False)
        self.self_attn.o_proj = nn.Linear(self.q_size, H, bias=False)
        self.mlp = GatedMLP(H, dc.intermediate_size)

    def packed_shards(self) -> dict[str, tuple[str, int, int]]:
        q, kv = self.q_size, self.kv_size
        return {"q_proj": ("qkv_proj", 0, q), "k_proj": ("qkv_proj", q, kv), "v_proj": ("qkv_proj", q + kv, kv)}

    def forward(self, embeds, hidden, positions, start_pos, cos_sin, k_cache, v_cache, kernel, last=None,
                slots=None, visible=None, slot_map=None, map_base=None):
        """The layer in plain torch (CPU, and the reference for fused_forward). last: see
        Eagle3Draft.forward. slots, visible (a draft tree's nodes): the K/V go to cache rows
        `slots`, and each row attends to the rows `visible` (T, S) names, or (slot_map, map_base:
        ForwardBatch.slot_map) to its ancestors' rows wherever they are."""
        T = embeds.shape[0]
        normed_h = self.hidden_norm(hidden)
        residual = normed_h if self.norm_before_residual else hidden
        x = torch.cat([self.input_layernorm(embeds), normed_h], dim=-1)  # (T, 2H)
        q, k, v = self.self_attn.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.view(T, self.num_heads, self.head_dim), cos_sin)
        k = apply_rope(k.view(T, self.num_kv_heads, self.head_dim), cos_sin)
        rows = positions if slots is None else slots
        k_cache.index_copy_(0, rows, k)
        v_cache.index_copy_(0, rows, v.view(T, self.num_kv_heads, self.head_dim))
        o = attend(q, k_cache, v_cache, positions, start_pos, self.scale, kernel, slots, visible, slot_map, map_base)
        o = o.reshape(T, self.q_size)
        if last is not None:
            o, residual = pick_row(o, last), pick_row(residual, last)
        h = residual + self.self_attn.o_proj(o)
        return h + self.mlp(self.post_attention_layernorm(h))

    def fused_forward(self, embeds, hidden, positions, start_pos, cos_sin_table, k_cache, v_cache, ops,
                      final_norm: RMSNorm, last=None, tree=None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward() then final_norm, with the GPU kernels (norms, RoPE with the cache write,
        SiLU-and-mul; the residual adds ride on the norms): about a third of the launches of
        the torch version, which matters because the draft runs k times per verify step.
        tree: (slots, slot_map, map_base), a draft tree's rows (Eagle3Draft.forward). Returns
        (final_norm(out), out)."""
        eps = self.hidden_norm.eps
        normed_h, _ = ops.add_rms_norm(hidden, None, self.hidden_norm.weight, eps)
        residual = normed_h if self.norm_before_residual else hidden
        normed_e, _ = ops.add_rms_norm(embeds, None, self.input_layernorm.weight, self.input_layernorm.eps)
        lin = ops.row_linear  # our M = 1 GEMV for a draft step (faster than cuBLAS there); cuBLAS otherwise
        qkv = lin(torch.cat([normed_e, normed_h], dim=-1), self.self_attn.qkv_proj)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        o, residual = self._cached_attention(q, k, v, residual, positions, start_pos, cos_sin_table, k_cache, v_cache,
                                             ops, last, tree)
        attn_out = lin(o, self.self_attn.o_proj)
        normed, h = ops.add_rms_norm(attn_out, residual, self.post_attention_layernorm.weight,
                                     self.post_attention_layernorm.eps)
        mlp_out = lin(ops.silu_and_mul(lin(normed, self.mlp.gate_up_proj)), self.mlp.down_proj)
        normed_out, out = ops.add_rms_norm(mlp_out, h, final_norm.weight, final_norm.eps)
        return normed_out, out

    def lean_forward(self, input_ids, embed_weight, hidden, positions, start_pos, cos_sin_table, k_cache, v_cache,
                     ops, final_norm: RMSNorm, lm_head: nn.Linear, last=None,
                     tree=None, hidden_rows=None) -> tuple[torch.Tensor, torch.Tensor]:
        """fused_forward plus the lm_head, in fewer launches: the embedding lookup, both input norms
        and their concatenation in one (embed_pair_norm); each later norm rides on the projection
        after it (rms_norm_gemv), SiLU-and-mul on the down projection (silu_mul_gemv). The GEMVs
        use their fast tiles, not the batch-invariant ones the target needs: a draft's last bits
        do not matter to the output, only to which tokens it proposes. Several rows with
        KernelOptions.draft_rows finish on the invariant tiles instead (_rows_tail). hidden_rows:
        the rows' states are hidden[hidden_rows], gathered by embed_pair_norm's launch. input_ids
        None: embed_weight holds the rows' embeddings themselves (a packed table's lookup). Returns
        (logits in the weights' dtype, out)."""
        from engine.kernels.gemv import gemv
        from engine.kernels.norm import embed_pair_norm

        H = hidden.shape[1]
        fast, pdl = ops.draft_kernels, ops.options.pdl  # fused norm / activation + GEMV where FUSED_TILES says it pays
        x = embed_pair_norm(input_ids, embed_weight, hidden, self.input_layernorm.weight, self.hidden_norm.weight,
                            self.input_layernorm.eps, self.hidden_norm.eps, pdl=pdl, b_rows=hidden_rows)
        if hidden_rows is not None:
            x, hidden = x
        residual = x[:, H:] if self.norm_before_residual else hidden
        qkv = fast.project(x, self.self_attn.qkv_proj, "qkv")
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        o, residual = self._cached_attention(q, k, v, residual, positions, start_pos, cos_sin_table, k_cache, v_cache,
                                             ops, last, tree)
        if o.shape[0] > 1 and ops.options.draft_rows and o.dtype in (torch.bfloat16, torch.float32):
            return self._rows_tail(o, residual, final_norm, lm_head, pdl)
        o_proj = self.self_attn.o_proj
        attn_out = (gemv(o, o_proj.weight, config=ROW_TILE, pdl=pdl) if o.shape[0] == 1
                    else fast.project(o, o_proj, "o_proj"))
        gate_up, h = fast.norm_linear(attn_out, residual, self.post_attention_layernorm, self.mlp.gate_up_proj,
                                      "gate_up")
        mlp_out = fast.mlp_down(gate_up, self.mlp)
        logits, out = fast.norm_linear(mlp_out, h, final_norm, lm_head, "lm_head")
        return logits, out

    def _rows_tail(self, o, residual, final_norm: RMSNorm, lm_head: nn.Linear, pdl: bool):
        """lean_forward past the attention for several rows (KernelOptions.draft_rows): four
        launches on the invariant set's tensor-core tiles. o_proj adds the residual and takes the
        squares of the post-attention norm (gemv_add_stats), gate_up scales its dot by that norm's
        1 / rms and takes the activation in its epilogue (gemv_rstd, gate), down does the same for
        the final norm, and lm_head scales by it. Returns (logits, out) as lean_forward does."""
        def tile(linear: nn.Linear):
            return invariant_tile(tuple(linear.weight.shape))

        o_proj, gate_up, down, post = (self.self_attn.o_proj, self.mlp.gate_up_proj, self.mlp.down_proj,
                                       self.post_attention_layernorm)
        hg, h, sq = gemv_add_stats(o, o_proj.weight, o_proj.bias, residual, post.weight, config=tile(o_proj), pdl=pdl)
        act = gemv_rstd(hg, sq, post.eps, gate_up.weight, gate_up.bias, config=tile(gate_up), pdl=pdl, gate=True)
        hg, out, sq = gemv_add_stats(act, down.weight, down.bias, h, final_norm.weight, config=tile(down), pdl=pdl)
        return gemv_rstd(hg, sq, final_norm.eps, lm_head.weight, lm_head.bias, config=tile(lm_head), pdl=pdl), out

    def _cached_attention(self, q, k, v, residual, positions, start_pos, cos_sin_table, k_cache, v_cache, ops, last,
                          tree=None):
        """The attention of both GPU paths: RoPE with the cache write in one launch, attention over
        the cache (for a tree's rows with rope_in_tree, all in the attention's launch), then (with
        `last`) only that row of its output and of the residual. tree:
        (slots, slot_map, map_base) of a draft tree's rows. Returns (o (T, q_size), residual), one
        row each with `last`."""
        T = q.shape[0]
        slots, slot_map, map_base = tree if tree is not None else (None, None, None)
        q = q.view(T, self.num_heads, self.head_dim)
        k, v = k.view(T, self.num_kv_heads, self.head_dim), v.view(T, self.num_kv_heads, self.head_dim)
        # a tree's level (rows read through a map) with RoPE inside the attention launch where
        # rope_in_tree says so; a chain's steps keep the two launches
        fused = ops.one_row_attention(T, mapped=True) if tree is not None else None
        if fused is not None:
            o = fused(q, k, v, cos_sin_table, positions, k_cache, v_cache, self.scale, slots, slot_map=slot_map,
                      map_base=map_base).reshape(T, self.q_size)
        else:
            q = ops.rope_and_cache(q, k, v, cos_sin_table, positions, k_cache, v_cache, slots)
            o = attend(q, k_cache, v_cache, positions, start_pos, self.scale, ops.attention, slots, None, slot_map,
                       map_base).reshape(T, self.q_size)
        if last is not None:
            o, residual = pick_row(o, last), pick_row(residual, last)
        return o, residual


class Eagle3Draft(nn.Module):
    def __init__(self, dc: DraftConfig, target_cfg, max_len: int, ops: Ops | None):
        super().__init__()
        self.config = dc
        if dc.needs_fc:
            self.fc = nn.Linear(dc.extend_width, dc.hidden_size, bias=False)
        self.midlayer = Eagle3Layer(dc)
        self.norm = RMSNorm(dc.hidden_size, dc.rms_norm_eps)
        self.lm_head = nn.Linear(dc.hidden_size, dc.draft_vocab_size, bias=False)
        if dc.owns_embeddings:  # narrower than the target: the head ships its own embeddings
            self.embed_tokens = nn.Embedding(dc.vocab_size, dc.hidden_size)
        # draft id -> target id offset: target = draft + d2t[draft]
        self.register_buffer("d2t", torch.zeros(dc.draft_vocab_size, dtype=torch.long))
        self.register_buffer("cos_sin", rope_cos_sin(dc.layer_config(target_cfg), max_len).to(torch.get_default_device()),
                             persistent=False)
        self.ops = ops  # inference kernels: Ops.for_device (Triton on CUDA); None: plain torch (training)
        # Draft steps on the GPU kernels (Eagle3Layer.fused_forward): about a third of the torch
        # layer's launches, which matters because the draft runs k times per verify step.
        self.fused = ops is not None and ops.options.fused_draft and None not in (ops.rope_and_cache, ops.row_linear)

    def forward(self, input_ids, positions, hidden, is_extend: bool, embed: nn.Embedding, kv,
                start_pos: int | None = None, fp32_logits: bool = True, last: int | torch.Tensor | None = None,
                slots: torch.Tensor | None = None, visible: torch.Tensor | None = None,
                slot_map: torch.Tensor | None = None, map_base: torch.Tensor | None = None,
                hidden_rows: torch.Tensor | None = None):
        """input_ids: (T,) target ids; hidden: (T, extend_width) target states when is_extend,
        else (T, decode_width) the draft's previous outputs. Returns (logits (T, Vd), fp32 unless
        fp32_logits is False (then maybe the weights' dtype: enough for an argmax), out_hidden
        (T, H) pre-norm: the state the next draft step consumes). last: only that row's outputs
        ((1, Vd), (1, H)): a Python index or a 0-dim index tensor on the device. Every row still
        writes its K/V; past the attention only that row is computed (a prompt's extend and a
        verify step's draft-extend continue from one row, the last accepted). slots, visible: a
        draft tree's nodes (Eagle3Layer.forward), on the plain torch layer; slots, slot_map,
        map_base: the same nodes read through a map (ForwardBatch.slot_map), on any path.
        hidden_rows (T,): the rows' states are hidden[hidden_rows] (a tree level's parents in the
        level before's output), gathered inside the lean step's first launch."""
        # the lean step reads a plain table itself, a packed one (PackedEmbedding) as our lookup's rows
        packed = isinstance(embed, PackedEmbedding)
        lean = (self.lean and input_ids.shape[0] <= MAX_ROWS
                and (isinstance(embed, nn.Embedding) or packed and self.ops.options.packed_embed))
        if hidden_rows is not None and (is_extend or not lean):
            hidden, hidden_rows = hidden.index_select(0, hidden_rows), None
        if is_extend and self.config.needs_fc:
            hidden = self.fc(hidden)
        if visible is not None:
            cos_sin = self.cos_sin.index_select(0, positions)
            out = self.midlayer(self._lookup(embed, input_ids), hidden, positions, start_pos, cos_sin, kv.k[0],
                                kv.v[0], None, last, slots, visible)
            return self.lm_head(self.norm(out)).float(), out
        tree = None if slot_map is None else (slots, slot_map, map_base)
        # the GEMV's limit (a prompt's extend runs fused_forward)
        if lean:
            ids, table = (None, self.ops.lookup(embed, input_ids)) if packed else (input_ids, embed.weight)
            logits, out = self.midlayer.lean_forward(ids, table, hidden, positions, start_pos,
                                                     self.cos_sin, kv.k[0], kv.v[0], self.ops, self.norm, self.lm_head,
                                                     last, tree, hidden_rows)
            return (logits.float() if fp32_logits else logits), out
        if self.fused:
            normed, out = self.midlayer.fused_forward(self._lookup(embed, input_ids), hidden, positions, start_pos,
                                                      self.cos_sin, kv.k[0], kv.v[0], self.ops, self.norm, last, tree)
            return self.ops.row_linear(normed, self.lm_head).float(), out
        cos_sin = self.cos_sin.index_select(0, positions)
        kernel = self.ops.attention if self.ops is not None else None  # Triton on CUDA
        out = self.midlayer(self._lookup(embed, input_ids), hidden, positions, start_pos, cos_sin, kv.k[0], kv.v[0],
                            kernel, last, slots, None, slot_map, map_base)
        return self.lm_head(self.norm(out)).float(), out

    def _lookup(self, embed: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return self.ops.lookup(embed, ids) if self.ops is not None else embed(ids)

    @property
    def lean(self) -> bool:
        """Draft steps run Eagle3Layer.lean_forward (and the greedy loop picks on the device)."""
        return self.fused and self.ops.options.lean_draft

    def to_target_ids(self, draft_ids: torch.Tensor) -> torch.Tensor:
        return draft_ids + self.d2t[draft_ids]

    def checkpoint_target(self, name: str):
        if name in ("embed_tokens.weight", "model.embed_tokens.weight"):
            # Shared with the target when the widths agree (the copy in the file is ignored).
            return ("embed_tokens.weight", 0, -1) if self.config.owns_embeddings else None
        if name == "t2d":
            return None  # derivable from d2t
        if name.endswith("rotary_emb.inv_freq"):
            return None  # a buffer some trainers saved; RoPE is computed from the config
        if name == "d2t":
            return "d2t", 0, -1
        if name.startswith("layers.0."):  # speculators name the single layer layers.0
            name = "midlayer." + name[len("layers.0."):]
        elif name.startswith("model.layers.0."):
            name = "midlayer." + name[len("model.layers.0."):]
        parts = name.split(".")
        if parts[0] == "midlayer" and len(parts) == 4 and parts[2] in ("q_proj", "k_proj", "v_proj"):
            fused, off, rows = self.midlayer.packed_shards()[parts[2]]
            return f"midlayer.self_attn.{fused}.{parts[3]}", off, rows
        if parts[0] == "midlayer" and len(parts) == 4 and parts[2] in ("gate_proj", "up_proj"):
            fused, off, rows = self.midlayer.mlp.packed_shards()[parts[2]]
            return f"midlayer.mlp.{fused}.{parts[3]}", off, rows
        return name, 0, -1
