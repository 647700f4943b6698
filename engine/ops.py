"""Ops: the fused GPU kernels or their torch references, chosen once from the device."""

from __future__ import annotations

from dataclasses import dataclass
import functools
import os
from typing import Callable

import torch

from .kernels.activation import silu_and_mul, silu_and_mul_ref
from .kernels.attention import MAX_INVARIANT_ROWS, decode_attention, rope_decode_attention
from .kernels.gemv import (
    MAX_ROWS, GemvConfig, gated_gemv, gemv, gemv_add_norm, rms_norm_gated_gemv, rms_norm_gemv, silu_mul_gemv,
)
from .kernels.norm import add_rms_norm, add_rms_norm_ref, embed_rows
from .kernels.pick import greedy_next
from .kernels.rope import rope_and_cache


@dataclass(frozen=True)
class Ops:
    add_rms_norm: Callable  # (x, residual | None, weight, eps) -> (normed, x + residual)
    silu_and_mul: Callable  # (T, 2I) -> (T, I)
    rope_and_cache: Callable | None  # (q, k, v, cos_sin, positions, k_cache, v_cache, slots) -> rotated q; None: unfused
    attention: Callable | None  # (q, k_cache, v_cache, positions, scale, own_slots) -> out; graph safe; None: torch
    # (x, linear) -> linear(x) for the o_proj and down projections of a single-token step;
    # None: the nn.Linear itself (cuBLAS). On the H200 our GEMV beat cuBLAS there
    # (benchmarks/results/h200_gemv.json: 8B o_proj 11.1 vs 13.2 us, SmolLM2 down 2.3 vs 4.8 us).
    row_linear: Callable | None = None
    # (x, linear) -> linear(x) for the other projections and lm_head: cuBLAS, or in batch-invariant
    # mode the GEMV that gives each of up to 16 rows the same bits whatever the row count.
    linear: Callable = lambda x, linear: linear(x)
    invariance: "BatchInvariance | None" = None
    # Decode and verify steps run the fused norm/activation + projection kernels where valid
    # (layer_kernels). False: never (LOCALCHAT_FUSE=0, to compare in benchmarks and tests;
    # LOCALCHAT_FUSE=all fuses even the shapes FUSED_TILES keeps unfused).
    fuse: bool = True
    # (ids, table) -> table[ids] for a decode or verify step (up to 16 rows); None: nn.Embedding
    embed: Callable | None = None
    # (q, k, v, cos_sin, positions, k_cache, v_cache, scale, slots) -> attention output of one decode
    # row, RoPE and the cache write fused into the attention kernel (see one_row_attention)
    rope_attention: Callable | None = None
    # (logits (1, V), next_token, input_ids, positions) -> None: the decode graph's greedy chaining
    # in one launch (kernels.pick.greedy_next); None: torch ops
    greedy_next: Callable | None = None

    @classmethod
    def for_device(cls, device: torch.device) -> "Ops":
        if device.type == "cuda" and _has_triton():
            inv = BatchInvariance()
            return cls(add_rms_norm, silu_and_mul, rope_and_cache, inv.attention, inv.row_linear, inv.linear, inv,
                       fuse=os.environ.get("LOCALCHAT_FUSE", "1") != "0", embed=embed_rows,
                       rope_attention=inv.rope_attention, greedy_next=greedy_next)
        return cls(add_rms_norm_ref, silu_and_mul_ref, None, None)

    def one_row_attention(self, num_rows: int) -> Callable | None:
        """rope_attention for a step of num_rows unpacked rows where it applies (one row, CUDA,
        ROPE_IN_ATTENTION on); None: rope_and_cache, then the attention kernel."""
        if num_rows == 1 and ROPE_IN_ATTENTION:
            return self.rope_attention
        return None

    def layer_kernels(self, x: torch.Tensor, batch) -> "LayerKernels":
        """The kernels a decoder layer runs on x (T, H) for `batch`: the one place that picks
        fused norm/activation + projection launches (CUDA with Triton, bf16, a decode or verify
        step; see BatchInvariance.fused) or the unfused ops (CPU, prefill, packed forwards)."""
        if self.fuse and self.invariance is not None and not batch.is_packed:
            fused = self.invariance.fused(x)
            if fused is not None:
                return fused
        return self._unfused

    @functools.cached_property
    def _unfused(self) -> "LayerKernels":
        return LayerKernels(self.linear)

    def set_batch_invariant(self, on: bool) -> None:
        """Speculation verifies k+1 rows where plain decoding runs one: in bf16, cuBLAS picks other
        kernels for other row counts and the last bits differ, enough to flip a near-tie argmax.
        With this on, every projection of a step of up to 16 rows runs one GEMV tile whose
        per-row arithmetic is the same for any row count, so greedy speculation reproduces plain
        decoding token for token. Set before graphs are captured. No-op without kernels (CPU)."""
        if self.invariance is not None:
            self.invariance.on = on


def _has_triton() -> bool:
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    from .kernels.triton_key import remember_triton_key

    remember_triton_key()
    return True


# Four output columns by 512-element steps, no split: the fastest M = 1 tile for the o_proj
# and down shapes of both the 8B and the SmolLM2 models in the same benchmark.
_ROW_GEMV = GemvConfig(block_n=4, block_k=512, split_k=1, num_warps=4, num_stages=3)
# From K = 4096 on, 1,024-element steps: twice the bytes in flight per program. In the 8B decode
# graph (variants.py, session 13) the down projection's tile alone gave 1.014x-1.017x.
_ROW_GEMV_LONG_K = GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3)


def row_tile(k: int) -> GemvConfig:
    """The M = 1 tile of o_proj and down (and their fused prologues) for reduction length k."""
    return _ROW_GEMV_LONG_K if k >= 4096 else _ROW_GEMV


# Which projections of a one-token step without a draft run our GEMV besides o_proj and down
# (LOCALCHAT_ROW_GEMV), where no fused norm + projection kernel takes them (FUSED_TILES):
# "qkv" (the default): qkv too. Our kernels launch with programmatic dependent launch, so the
# attention kernel after qkv starts while qkv ends and reads its positions and first K/V rows
# meanwhile; after a cuBLAS launch it can only start once that has finished. On two H200s the 8B
# step ran 1.024x and 1.022x faster with it (benchmarks/results/h200_variants_qkv_session14.json,
# h200_variants_8b_session14.json).
# "layers": gate_up too, so that every launch inside a decoder layer is one of our kernels (it
# lost: cuBLAS streams the widest projection faster than our GEMV); "all": the lm_head too;
# "cublas": o_proj and down only. These apply to gate_up only with GATED_MLP off: the gated MLP
# (below) runs gate_up on our GEMV whatever ROW_GEMV says.
ROW_GEMV = os.environ.get("LOCALCHAT_ROW_GEMV", "qkv")

CUBLAS = "cublas"

# Which norm + projection pairs of a one-token step without a draft run as one rms_norm_gemv
# launch whatever FUSED_TILES says (LOCALCHAT_NORM_GEMV, comma-separated): "qkv" (the layer's
# input norm inside the qkv GEMV), "gate_up" (the post-attention norm inside gate_up on our
# GEMV); empty: none. For benchmarks: at K = 4096 both folds lost even with the one-load rms
# pre-pass (kernels/gemv.py ONE_PASS_NORM; see FUSED_TILES).
NORM_GEMV_ROLES = ("qkv", "gate_up")


def parse_norm_gemv(spec: str) -> frozenset[str]:
    roles = frozenset(filter(None, (r.strip() for r in spec.split(","))))
    for role in roles - set(NORM_GEMV_ROLES):
        raise SystemExit(f"LOCALCHAT_NORM_GEMV: unknown projection {role!r} (use {', '.join(NORM_GEMV_ROLES)})")
    return roles


NORM_GEMV = parse_norm_gemv(os.environ.get("LOCALCHAT_NORM_GEMV", ""))


def parse_row_tiles(spec: str) -> dict[tuple[int, int], "GemvConfig | str"]:
    """LOCALCHAT_ROW_TILES (benchmarks): the M = 1 projection of weight shape N x K runs this tile,
    or cuBLAS. "NxK/block_n/block_k/split_k/warps/stages|NxK/cublas|...";
    e.g. "4096x14336/4/1024/1/4/3|6144x4096/cublas". A bad spec stops with a one-line error."""
    tiles = {}
    for entry in filter(None, spec.split("|")):
        try:
            shape, *fields = entry.split("/")
            n, k = (int(v) for v in shape.split("x"))
            tiles[(n, k)] = CUBLAS if fields == [CUBLAS] else GemvConfig(*(int(v) for v in fields))
        except (TypeError, ValueError):
            raise SystemExit(f"LOCALCHAT_ROW_TILES: cannot read {entry!r} (NxK/bn/bk/split/warps/stages or NxK/cublas)")
    return tiles


ROW_TILES = parse_row_tiles(os.environ.get("LOCALCHAT_ROW_TILES", ""))

# A one-token step without a draft runs its MLP as gated_gemv (gate_up on our GEMV with silu(gate)
# * up in its epilogue, the post-attention norm in its prologue where FUSED_TILES fuses gate_up's)
# and down as a plain GEMV over I values, where silu_mul_gemv recomputed the activation of all I
# columns in each of its programs. On an H200 (variants.py, session 16, one process each): the
# demo's shape 1.116x and 1.121x faster, the 8B's 1.008x, then 1.035x more with the one-step tile
# (kernels/gemv.py gated_config). LOCALCHAT_GATED_MLP=0 (variants.py gated_off): gate_up, then
# silu_mul_gemv.
GATED_MLP = os.environ.get("LOCALCHAT_GATED_MLP", "1") != "0"

# A one-row step without a draft ends each sublayer's last projection (o_proj, down) with the
# residual add and the next RMSNorm in the GEMV's last program (kernels/gemv.py gemv_add_norm),
# where that norm would otherwise run as its own add_rms_norm launch (FUSED_TILES keeps it
# unfused before the next projection, and the final norm before lm_head).
# LOCALCHAT_NORM_TAIL=0 (variants.py tail_off): add_rms_norm launches apart.
NORM_TAIL = os.environ.get("LOCALCHAT_NORM_TAIL", "1") != "0"

# A one-row step (plain decode, a chain-MTP draft step) rotates q and k and writes the cache
# inside the attention kernel, one launch fewer than rope_and_cache + attention, with the same
# bits. LOCALCHAT_ROPE_IN_ATTENTION=0 (variants.py rope_apart) launches them apart.
ROPE_IN_ATTENTION = os.environ.get("LOCALCHAT_ROPE_IN_ATTENTION", "1") != "0"


class BatchInvariance:
    """The switch Ops.set_batch_invariant flips, read on every projection call."""

    def __init__(self):
        self.on = False
        self._fused_row = FusedLayerKernels(invariant=False, linear=self.layer_linear, qkv_linear=self.qkv_linear)
        self._fused_invariant = FusedLayerKernels(invariant=True, linear=self.linear)
        # A draft's kernels: the fast tiles whatever the switch says (a draft's last bits do not
        # change the output, only which tokens it proposes).
        self.row_kernels = FusedLayerKernels(invariant=False, linear=_fast_linear, add_rms_norm=add_rms_norm,
                                             silu_and_mul=silu_and_mul)

    def _invariant(self, x: torch.Tensor) -> bool:
        return self.on and x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16

    def attention(self, q, k_cache, v_cache, positions, scale, own_slots=None) -> torch.Tensor:
        """decode_attention with one tile for every row count while switched on."""
        return decode_attention(q, k_cache, v_cache, positions, scale,
                                invariant=self.on and q.shape[0] <= MAX_INVARIANT_ROWS, own_slots=own_slots)

    def rope_attention(self, q, k, v, cos_sin, positions, k_cache, v_cache, scale, slots=None) -> torch.Tensor:
        """rope_decode_attention with the tile the switch picks (as attention())."""
        return rope_decode_attention(q, k, v, cos_sin, positions, k_cache, v_cache, scale, invariant=self.on,
                                     slots=slots)

    def row_linear(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        if self._invariant(x):
            return gemv(x, linear.weight, linear.bias, invariant=True)
        if x.shape[0] != 1 or x.dtype != torch.bfloat16:
            return linear(x)
        return _row_tiled(x, linear)

    def linear(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        if self._invariant(x):
            return gemv(x, linear.weight, linear.bias, invariant=True)
        if ROW_GEMV == "all" and x.shape[0] == 1 and x.dtype == torch.bfloat16:
            return gemv(x, linear.weight, linear.bias)
        return linear(x)

    def layer_linear(self, x: torch.Tensor, linear: torch.nn.Linear, gemv_modes=("layers",)) -> torch.Tensor:
        """linear() for the gate_up projection of a decoder layer (our GEMV with ROW_GEMV "layers")."""
        if not self._invariant(x) and x.shape[0] == 1 and x.dtype == torch.bfloat16:
            tile = ROW_TILES.get(tuple(linear.weight.shape))
            if tile is not None:
                return _tiled(x, linear, tile)
            if ROW_GEMV in gemv_modes:
                return gemv(x, linear.weight, linear.bias)
        return self.linear(x, linear)

    def qkv_linear(self, x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
        """layer_linear() for the qkv projection: our GEMV with ROW_GEMV "qkv" or "layers"."""
        return self.layer_linear(x, linear, ("qkv", "layers"))

    def fused(self, x: torch.Tensor) -> "FusedLayerKernels | None":
        """Fused kernels where the GEMV runs anyway (the rows row_linear takes): batch-invariant
        ones for a step of up to 16 bf16 rows while switched on, the M = 1 tiles for a bf16
        decode step otherwise; None: the unfused ops (cuBLAS for the other row counts)."""
        if self._invariant(x):
            return self._fused_invariant if FUSE_INVARIANT else None
        if x.shape[0] == 1 and x.dtype == torch.bfloat16:
            return self._fused_row
        return None


def _row_tiled(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """One row through linear on its M = 1 tile: ROW_TILES' entry, else row_tile."""
    return _tiled(x, linear, ROW_TILES.get(tuple(linear.weight.shape), row_tile(linear.weight.shape[1])))


def _tiled(x: torch.Tensor, linear: torch.nn.Linear, tile: "GemvConfig | str") -> torch.Tensor:
    """linear(x) on cuBLAS (tile CUBLAS) or on our GEMV with that tile."""
    return linear(x) if tile == CUBLAS else gemv(x, linear.weight, linear.bias, config=tile)


def _fast_linear(x: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """Our GEMV for up to MAX_ROWS bf16 rows (the M = 1 tiles for one row), cuBLAS otherwise."""
    if x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16:
        return gemv(x, linear.weight, linear.bias)
    return linear(x)


@dataclass(frozen=True)
class Normed:
    """A sublayer's output already added to the stream and normed by `norm` (a projection with
    a norm tail, FusedLayerKernels.ending): the norm_linear or mlp that follows takes it as is."""
    normed: torch.Tensor  # norm(stream)
    stream: torch.Tensor  # the sublayer's output + the stream before it
    norm: object  # the RMSNorm module it was normed with


def rows_of(x: "torch.Tensor | Normed") -> torch.Tensor:
    """The (T, H) tensor that stands for x's rows (shape, dtype, device)."""
    return x.normed if isinstance(x, Normed) else x


class LayerKernels:
    """A decoder layer's two norm + projection pairs and its MLP's down projection, unfused:
    add_rms_norm then Ops.linear; silu_and_mul then the down projection (GatedMLP.down)."""

    def __init__(self, linear: Callable, add_rms_norm: Callable | None = None, silu_and_mul: Callable | None = None,
                 qkv_linear: Callable | None = None):
        self.linear = linear
        self.qkv_linear = qkv_linear or linear  # the attention's qkv projection (norm_linear(..., role="qkv"))
        # None: the modules' own (the target's carry the kernels); a draft's modules are plain
        # torch, so its kernels come here.
        self.add_rms_norm, self.silu_and_mul = add_rms_norm, silu_and_mul

    def norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None, norm, linear: torch.nn.Linear,
                    role: str = ""):
        """-> (linear(norm(x + residual)), x + residual); residual None: the stream is x.
        role: "qkv" (the attention's qkv projection) or "gate_up" (the MLP's) in a decoder layer."""
        h, stream = self.add_norm(x, residual, norm)
        return (self.qkv_linear if role == "qkv" else self.linear)(h, linear), stream

    def add_norm(self, x: "torch.Tensor | Normed", residual: torch.Tensor | None,
                 norm) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual), on these kernels' add_rms_norm or the module's
        (x Normed: what its projection's tail computed)."""
        if isinstance(x, Normed):
            assert x.norm is norm, "normed for another norm"
            return x.normed, x.stream
        if self.add_rms_norm is not None:
            return self.add_rms_norm(x, residual, norm.weight, norm.eps)
        return norm.add_forward(x, residual)

    def mlp(self, x, residual: torch.Tensor | None, norm, mlp, then=None) -> tuple["torch.Tensor | Normed", torch.Tensor]:
        """The MLP sublayer: (down(silu(gate) * up) of norm(x + residual), x + residual).
        then: the norm that follows and its projection, (norm, linear, role) (see ending)."""
        gate_up, stream = self.norm_linear(x, residual, norm, mlp.gate_up_proj, role="gate_up")
        return self.mlp_down(gate_up, mlp), stream

    def ending(self, residual: torch.Tensor | None, then) -> Callable | None:
        """A sublayer's last projection (o_proj, down) as (x, linear) -> Normed, taking the
        residual add and `then`'s norm into its last program; None: a plain projection."""
        return None

    def mlp_down(self, gate_up: torch.Tensor, mlp) -> torch.Tensor:
        """(T, 2I) [gate | up] -> down(silu(gate) * up)."""
        if self.silu_and_mul is not None:
            return self.linear(self.silu_and_mul(gate_up), mlp.down_proj)
        return mlp.down(gate_up)


# Batch-invariant mode (a draft loaded) runs the fused invariant kernels where FUSED_TILES says
# so. On the H200 (session 4) they keep every row of a 6- and a 16-row step bit-identical to the
# 1-row step (tests/engine/test_fused_layers.py), and with the demo model and its head they gave
# the same accepted length as the unfused ops at 4% more speed. (A session-3 run that seemed to
# show a lower accepted length with them had fallen back to the built-in prompts: see
# app/bench_setup.chat_prompts.) LOCALCHAT_FUSE_INVARIANT=0 turns them off for comparisons.
FUSE_INVARIANT = os.environ.get("LOCALCHAT_FUSE_INVARIANT", "1") != "0"

UNFUSED = "unfused"
# The fused kernels' tiles by (mode, kernel, N, K). mode "row": a decode step without a draft
# (M = 1); "invariant": a step of up to 16 rows in batch-invariant mode (one tile for every M,
# so each row's bits stay independent of M). A GemvConfig: fuse with that tile. UNFUSED: run
# the unfused pair for that projection. A shape not listed: fuse with the built-in tile
# (row: default_config for rms_norm_gemv, row_tile for silu_mul_gemv; invariant: _launch's).
# The UNFUSED entries are the shapes where the fused kernel lost in
# benchmarks/results/h200_gemv.json (us, fused vs unfused; its M = 6 rows run the invariant
# tile): every program redoes the rms pre-pass over K (costly at K = 4096), and the 16-row
# prologues are slower than their separate kernels. A one-row launch reads the row for its rms
# in one load (kernels/gemv.py ONE_PASS_NORM): with that, SmolLM2's gate_up (3072 x 576), UNFUSED
# before, made the demo-shaped decode step 1.13x faster fused (two runs: 1.132x, 1.128x, variants.py
# mlp_norm, benchmarks/results/h200_variants_norm_session15.json), while on the 8B folding the
# norm into qkv still lost (0.973x; into qkv and gate_up 0.950x). Re-measure on the GPU and edit:
#     python benchmarks/bench_gemv.py --rows 1,6 --only qkv,gate_up,down --out fused.json
FUSED_TILES: dict[tuple[str, str, int, int], GemvConfig | str] = {
    ("row", "rms_norm_gemv", 6144, 4096): UNFUSED,  # Llama-3.1-8B qkv: 25.5 vs 17.9
    ("row", "rms_norm_gemv", 28672, 4096): UNFUSED,  # 8B gate_up: 77.9 vs 58.8
    ("invariant", "rms_norm_gemv", 6144, 4096): UNFUSED,  # 36.5 vs 24.8
    ("invariant", "rms_norm_gemv", 28672, 4096): UNFUSED,  # 159.7 vs 74.7
    ("invariant", "rms_norm_gemv", 3072, 576): UNFUSED,  # 8.3 vs 6.9
    ("invariant", "silu_mul_gemv", 4096, 14336): UNFUSED,  # 201.0 vs 44.3
    ("invariant", "silu_mul_gemv", 576, 1536): UNFUSED,  # 7.9 vs 5.3
}


# LOCALCHAT_FUSE=all ignores the UNFUSED entries (benchmarks: every fusion against the table).
_FUSE_ALL = os.environ.get("LOCALCHAT_FUSE") == "all"


def fused_tile(mode: str, kernel: str, n: int, k: int) -> GemvConfig | str | None:
    """FUSED_TILES' entry: a GemvConfig, UNFUSED, or None (fuse with the built-in tile)."""
    tile = FUSED_TILES.get((mode, kernel, n, k))
    if mode == "row" and kernel == "silu_mul_gemv" and (n, k) in ROW_TILES:
        tile = ROW_TILES[(n, k)]
        return UNFUSED if tile == CUBLAS else tile
    if tile is None and kernel == "rms_norm_gemv" and k >= 4096:
        tile = UNFUSED  # as every such shape measured: each program's rms pre-pass over K costs more than it saves
    if tile == UNFUSED and _FUSE_ALL:
        tile = None
    if tile is None and mode == "row" and kernel == "silu_mul_gemv":
        return row_tile(k)  # the down projection's tuned M = 1 tile, as unfused
    return tile


class FusedLayerKernels(LayerKernels):
    """One launch each: rms_norm_gemv for add_rms_norm + qkv and add_rms_norm + gate_up,
    silu_mul_gemv for silu_and_mul + down, each with its FUSED_TILES tile, or unfused where
    that says so. invariant: the batch-invariant kernels (a row's bits the same for any row
    count up to 16); else the M = 1 tiles."""

    def __init__(self, invariant: bool, linear: Callable, **unfused):
        super().__init__(linear, **unfused)
        self.invariant = invariant
        self.mode = "invariant" if invariant else "row"

    def _tile(self, kernel: str, weight: torch.Tensor, rows: int):
        if self.mode == "row" and rows > 1:
            # Several rows (a draft-extend): the "invariant" entries, measured on 6 and 16 rows,
            # with the built-in tile for this row count; the row tiles are M = 1 tiles.
            return fused_tile("invariant", kernel, *weight.shape)
        return fused_tile(self.mode, kernel, *weight.shape)

    def norm_tile(self, role: str, weight: torch.Tensor, rows: int):
        """rms_norm_gemv's tile for norm_linear (UNFUSED: the unfused pair): FUSED_TILES', except
        for a one-row step's roles that NORM_GEMV names (a ROW_TILES entry, or the built-in tile)."""
        if role in NORM_GEMV and self.mode == "row" and rows == 1:
            tile = ROW_TILES.get(tuple(weight.shape))
            return UNFUSED if tile == CUBLAS else tile
        return self._tile("rms_norm_gemv", weight, rows)

    def norm_linear(self, x, residual, norm, linear, role=""):
        tile = self.norm_tile(role, linear.weight, rows_of(x).shape[0])
        if tile == UNFUSED or isinstance(x, Normed):
            return super().norm_linear(x, residual, norm, linear, role)
        return rms_norm_gemv(x, residual, norm.weight, norm.eps, linear.weight, linear.bias, tile, self.invariant)

    def mlp(self, x, residual, norm, mlp, then=None):
        gate_up = mlp.gate_up_proj
        tile = ROW_TILES.get(tuple(gate_up.weight.shape))  # block_n: gate rows (and as many up rows)
        rows = rows_of(x)
        if not (GATED_MLP and self.mode == "row" and rows.shape[0] == 1 and rows.dtype == torch.bfloat16
                and tile != CUBLAS):
            return super().mlp(x, residual, norm, mlp)
        if self.norm_tile("gate_up", gate_up.weight, 1) == UNFUSED or isinstance(x, Normed):
            h, stream = self.add_norm(x, residual, norm)
            act = gated_gemv(h, gate_up.weight, gate_up.bias, tile)
        else:
            act, stream = rms_norm_gated_gemv(x, residual, norm.weight, norm.eps, gate_up.weight, gate_up.bias, tile)
        project = self.ending(stream, then) or _row_tiled
        return project(act, mlp.down_proj), stream

    def ending(self, residual, then):
        """A one-row step's o_proj or down with gemv_add_norm, where `then` = (norm, linear, role)
        would otherwise run the norm as its own launch: before lm_head (role "lm_head"), or before a
        projection whose norm FUSED_TILES keeps unfused. None elsewhere, or with NORM_TAIL off."""
        if not (NORM_TAIL and then is not None and residual is not None and self.mode == "row"
                and residual.shape[0] == 1 and residual.dtype == torch.bfloat16):
            return None
        norm, linear, role = then
        if role != "lm_head" and self.norm_tile(role, linear.weight, 1) != UNFUSED:
            return None

        def project(x: torch.Tensor, linear: torch.nn.Linear) -> "torch.Tensor | Normed":
            tile = ROW_TILES.get(tuple(linear.weight.shape), row_tile(linear.weight.shape[1]))
            if tile == CUBLAS or tile.split_k != 1:
                return _tiled(x, linear, tile)
            return Normed(*gemv_add_norm(x, linear.weight, linear.bias, residual, norm.weight, norm.eps, tile), norm)

        return project

    def mlp_down(self, gate_up, mlp):
        down = mlp.down_proj
        tile = self._tile("silu_mul_gemv", down.weight, gate_up.shape[0])
        if tile == UNFUSED:
            return super().mlp_down(gate_up, mlp)
        return silu_mul_gemv(gate_up, down.weight, down.bias, tile, self.invariant)
