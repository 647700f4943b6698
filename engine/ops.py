"""Ops: the kernels a model's layers launch, chosen once from the device and the KernelOptions:
our Triton kernels routed by engine/routing.py on CUDA, their torch references elsewhere."""

from __future__ import annotations

from dataclasses import dataclass, field
import functools
from typing import Callable

import torch

from engine import routing
from engine.kernels.activation import silu_and_mul, silu_and_mul_ref
from engine.kernels.attention import MAX_INVARIANT_ROWS, MAX_TREE_ROWS, decode_attention, rope_decode_attention
from engine.kernels.gemv import MAX_ROWS, gemv
from engine.kernels.norm import add_rms_norm, add_rms_norm_ref, embed_rows
from engine.kernels.pick import greedy_next
from engine.kernels.rope import rope_and_cache
from engine.layer_kernels import FusedLayerKernels, LayerKernels, RoundingLayerKernels
from engine.options import KernelOptions
from engine.packed_linear import PackedEmbedding, PackedLinear
from engine.routing import CUBLAS, DRAFT, UNFUSED


def _nn_linear(x: torch.Tensor, linear: torch.nn.Linear, role: str = "") -> torch.Tensor:
    return linear(x)


@dataclass(frozen=True)
class Ops:
    options: KernelOptions
    add_rms_norm: Callable  # (x, residual | None, weight, eps) -> (normed, x + residual)
    silu_and_mul: Callable  # (T, 2I) -> (T, I)
    rope_and_cache: Callable | None = None  # (q, k, v, cos_sin, positions, k_cache, v_cache, slots) -> rotated q; None: unfused
    attention: Callable | None = None  # (q, k_cache, v_cache, positions, scale, own_slots) -> out; graph safe; None: torch
    # (x, linear) -> linear(x) for a sublayer's last projection (o_proj, down) and a fused draft's
    # projections: the one-row tile of our GEMV for a single row, where it beat cuBLAS (8B o_proj
    # 11.1 vs 13.2 us, SmolLM2 down 2.3 vs 4.8 us); None: the nn.Linear itself.
    row_linear: Callable | None = None
    # (x, linear) -> linear(x) for the other projections and lm_head: cuBLAS, or with
    # batch_invariant the GEMV that gives each of up to 16 rows the same bits whatever the row count.
    linear: Callable = _nn_linear
    # (ids, table) -> table[ids] for a decode or verify step (up to 16 rows); None: nn.Embedding
    embed: Callable | None = None
    # (q, k, v, cos_sin, positions, k_cache, v_cache, scale, slots) -> attention output of one decode
    # row, RoPE and the cache write fused into the attention kernel (see one_row_attention)
    rope_attention: Callable | None = None
    # (logits (1, V), next_token, input_ids, positions) -> None: the decode graph's greedy chaining
    # in one launch (kernels.pick.greedy_next); None: torch ops
    greedy_next: Callable | None = None
    # The layer kernel sets layer_kernels picks from; None where there are no GPU kernels.
    fused_row: FusedLayerKernels | None = field(default=None, repr=False)
    fused_invariant: FusedLayerKernels | None = field(default=None, repr=False)
    # A draft's kernels: our GEMV for up to 16 rows on its fast tiles (a draft's last bits do not
    # change the output, only which tokens it proposes).
    draft_kernels: FusedLayerKernels | None = field(default=None, repr=False)

    @classmethod
    def for_device(cls, device: torch.device, options: KernelOptions = KernelOptions()) -> "Ops":
        if device.type == "cuda" and _has_triton():
            return cls.routed(options)
        return cls(options, add_rms_norm_ref, silu_and_mul_ref)

    @classmethod
    def routed(cls, options: KernelOptions) -> "Ops":
        """Our Triton kernels with their projections routed (the CUDA path; the kernels run on any
        device only under Triton's interpreter)."""
        pdl = options.pdl
        bound = functools.partial
        project = bound(routed_linear, options)
        return cls(
            options, bound(add_rms_norm, pdl=pdl), bound(silu_and_mul, pdl=pdl), bound(rope_and_cache, pdl=pdl),
            bound(attention, options), row_linear=bound(project, UNFUSED, role="o_proj"),
            linear=bound(project, UNFUSED, role="lm_head"), embed=bound(embed_rows, pdl=pdl),
            rope_attention=bound(rope_attention, options), greedy_next=bound(greedy_next, pdl=pdl),
            fused_row=FusedLayerKernels(options, False, bound(project, routing.ROW),
                                        each_row=options.batch_invariant and options.each_row),
            fused_invariant=FusedLayerKernels(options, True, bound(project, routing.INVARIANT)),
            draft_kernels=FusedLayerKernels(options, False, bound(project, DRAFT),
                                            add_rms_norm=bound(add_rms_norm, pdl=pdl),
                                            silu_and_mul=bound(silu_and_mul, pdl=pdl)),
        )

    def tree_project(self, x: torch.Tensor, linear: torch.nn.Linear, role: str) -> torch.Tensor | None:
        """linear(x) for more than 16 verify rows of a draft tree (routing.tree_rows) that a
        projection runs outside the INVARIANT set (lm_head, o_proj without the stats epilogue), on
        that set's route: row_linear's and linear's take up to 16 rows. None for fewer rows or
        without the GPU kernels: row_linear's or linear's route then."""
        if x.shape[0] <= MAX_ROWS or self.fused_invariant is None:
            return None
        return self.fused_invariant.project(x, linear, role)

    def lookup(self, embed: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
        """embed(ids): a table kept packed (PackedEmbedding) in one launch of ours on the GPU kernels
        (KernelOptions.packed_embed), any other embedding (or off the GPU) by its own lookup."""
        if isinstance(embed, PackedEmbedding) and self.fused_row is not None and self.options.packed_embed:
            return embed(ids, kernel=True, pdl=self.options.pdl)
        return embed(ids)

    def one_row_attention(self, num_rows: int, mapped: bool = False) -> Callable | None:
        """rope_attention for a step of num_rows unpacked rows where it applies (CUDA,
        rope_in_attention on: one row, or a batch-invariant verify step's rows with
        rope_in_verify; mapped: a draft tree's rows read through a slot map, with rope_in_tree);
        None: rope_and_cache, then the attention kernel."""
        o = self.options
        if not o.rope_in_attention or self.rope_attention is None:
            return None
        if mapped:
            return self.rope_attention if o.rope_in_tree and 1 <= num_rows <= MAX_TREE_ROWS else None
        if num_rows == 1 or (o.rope_in_verify and o.batch_invariant and 1 < num_rows <= MAX_INVARIANT_ROWS):
            return self.rope_attention
        return None

    def rounds_for(self, linear: torch.nn.Module, num_rows: int) -> bool | None:
        """The word order in which the kernel before `linear` hands it x rounded to int8
        (rounded_x.RoundedX), or None: a quantized projection whose every block takes it, in a
        one-row step with no draft loaded on the one-row kernel with int8 x
        (KernelOptions.packed_rounded_x and packed_rounded_o), on the GPU kernels."""
        if (self.fused_row is None or num_rows != 1 or not isinstance(linear, PackedLinear)
                or not _rounds_x(self.options) or not self.options.packed_rounded_o):
            return None
        return linear.rounded_order()

    def layer_kernels(self, x: torch.Tensor, batch, each_row: bool = False, packed: bool = False) -> LayerKernels:
        """The kernels a decoder layer runs on x (T, H) for `batch`: the one place that picks
        fused norm/activation + projection launches (CUDA with Triton, bf16, a decode or verify
        step: routing.layer_mode) or the unfused ops (CPU, prefill, packed forwards, a layer whose
        projections are quantized: `packed`, since the fused kernels read bf16 weights). each_row:
        the layer's weights are small enough for the one-row set row by row
        (routing.each_row_layer)."""
        if self.fused_row is None:
            return self._unfused
        mode = routing.layer_mode(self.options, x.shape[0], x.dtype, batch.is_packed, each_row,
                                  tree=batch.slot_map is not None)
        if packed:
            return self._rounding if _rounds_x(self.options) and mode == routing.ROW and not each_row else self._unfused
        if mode == routing.ROW:
            return self.fused_row
        return self.fused_invariant if mode == routing.INVARIANT else self._unfused

    @functools.cached_property
    def _rounding(self) -> RoundingLayerKernels:
        return RoundingLayerKernels(self.options, functools.partial(routed_linear, self.options, UNFUSED))

    @functools.cached_property
    def _unfused(self) -> LayerKernels:
        return LayerKernels(_nn_linear if self.row_linear is None else functools.partial(routed_linear, self.options,
                                                                                         UNFUSED))


def _rounds_x(options: KernelOptions) -> bool:
    """Whether a packed one-row step takes x rounded by the launch before its projections: the
    one-row kernel with int8 x and no draft loaded, packed_rounded_x on."""
    return (options.packed_rounded_x and options.packed_row and options.packed_row_x == "int8"
            and not options.batch_invariant)


def _row_pdl(options: KernelOptions) -> int:
    """The one-row packed kernel's pdl argument (packed_gemv.row_pdl_args): packed_row_pdl where
    PDL is on, with the bit for packed_row_early_weights."""
    from engine.kernels.packed_gemv import ROW_PDL_EARLY_W

    if not options.pdl or not options.packed_row_pdl:
        return 0
    return options.packed_row_pdl | (ROW_PDL_EARLY_W if options.packed_row_early_weights else 0)


def _packed_gemv_pdl(options: KernelOptions, in_features: int) -> int:
    """packed_gemv's PDL mode for a projection of this K: KernelOptions.packed_gemv_pdl where K is
    under packed_gemv_pdl_k, else 0."""
    return options.packed_gemv_pdl if options.pdl and in_features < options.packed_gemv_pdl_k else 0


def routed_linear(options: KernelOptions, mode: str, x: torch.Tensor, linear: torch.nn.Linear,
                  role: str, rounded=None) -> torch.Tensor:
    """linear(x) on cuBLAS or our GEMV, as routing.linear_route picks for (mode, role); a
    PackedLinear decodes its own weight (packed_gemv), from x's row already rounded where
    `rounded` comes (RoundingLayerKernels)."""
    if isinstance(linear, PackedLinear):
        return linear(x, one_row=options.packed_row and not options.batch_invariant, prefill=options.packed_prefill,
                      int8_x=options.packed_row_x == "int8", int8_rows=options.packed_invariant_x == "int8",
                      one_launch=options.packed_one_launch, row_pdl=_row_pdl(options),
                      rounded=rounded, pdl=_packed_gemv_pdl(options, linear.in_features),
                      short=options.packed_short_tiles)
    assert rounded is None
    route = routing.linear_route(options, mode, role, x.shape[0], tuple(linear.weight.shape), x.dtype)
    if route.kernel == CUBLAS:
        return linear(x)
    return gemv(x, linear.weight, linear.bias, config=route.tile, invariant=route.invariant, pdl=options.pdl,
                each_row=route.each_row)


def _tiles(options: KernelOptions, rows: int, mapped: bool) -> tuple[bool, bool]:
    """(invariant, per_token) of an attention launch: one tile for every row count under batch
    invariance; a draft tree's rows (mapped) on the per-row invariant tiles, the only ones that
    read a map, so a draft's tree rows take them too."""
    invariant = (options.batch_invariant or mapped) and rows <= (MAX_TREE_ROWS if mapped else MAX_INVARIANT_ROWS)
    return invariant, invariant and (options.token_attention or mapped)


def attention(options: KernelOptions, q, k_cache, v_cache, positions, scale, own_slots=None,
              slot_map=None, map_base=None) -> torch.Tensor:
    """decode_attention on the tiles _tiles picks. slot_map and map_base: a draft tree's rows
    (ForwardBatch.slot_map)."""
    invariant, per_token = _tiles(options, q.shape[0], slot_map is not None)
    return decode_attention(q, k_cache, v_cache, positions, scale, invariant=invariant, own_slots=own_slots,
                            pdl=options.pdl, per_token=per_token, slot_map=slot_map, map_base=map_base,
                            share_sms=options.share_sms)


def rope_attention(options: KernelOptions, q, k, v, cos_sin, positions, k_cache, v_cache, scale,
                   slots=None, slot_map=None, map_base=None, round_for=None):
    """rope_decode_attention (one row, a verify step's rows, or a draft tree's rows read through a
    slot map), on the tiles attention() picks, so with the bits of rope_and_cache then attention().
    round_for (Ops.rounds_for): (out, out rounded for o_proj)."""
    invariant, per_token = _tiles(options, q.shape[0], slot_map is not None)
    return rope_decode_attention(q, k, v, cos_sin, positions, k_cache, v_cache, scale, invariant=invariant,
                                 slots=slots, pdl=options.pdl, per_token=per_token, share_sms=options.share_sms,
                                 slot_map=slot_map, map_base=map_base, round_for=round_for)


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    from engine.kernels.triton_key import remember_triton_key

    remember_triton_key()
    return True
