"""Kernel routing: which kernel and tile serve each projection of a decode or verify step on CUDA,
as pure functions of the options, the kernel set (mode), the projection's role, the row count and
the weight's shape. No tensors here: the layer code (layer_kernels.py, ops.py) asks and launches.

A projection on its own (linear_route), in a bf16 step:
    batch_invariant, up to 16 rows (a      our GEMV: invariant_tile(shape) on tensor cores, or with
    draft tree's INVARIANT set: up to 64)  each_row a small weight's one-row route, row by row
    a draft's step (DRAFT), up to 16 rows  our GEMV, its built-in tile (with draft_rows, several
                                           rows on invariant_tile)
    o_proj or down, one row                our GEMV, row_tile(K)
    qkv, one row of the ROW set            our GEMV, its built-in tile (qkv_gemv)
    anything else                          cuBLAS (nn.Linear)
Fused launches (layer_kernels.py) of the ROW set (one bf16 row, no draft; or, with each_row, up
to 16 rows of a small layer, row by row; layer_mode) and the INVARIANT set (up to 16 bf16 rows
with batch_invariant, a draft tree's verify step up to 64: tree_rows):
    norm + qkv, norm + gate_up             rms_norm_gemv with FUSED_TILES' tile, or apart (UNFUSED)
    ROW: gate_up + activation              gated_gemv (gated_mlp), then down on its own
    INVARIANT: norm + gate_up + activation gemv_rstd(gate=True) after a Scaled stream (gated_mlp)
    activation + down otherwise            silu_mul_gemv with FUSED_TILES' tile, or apart
    ROW: o_proj or down + the next norm    gemv_add_norm where that norm stays apart (norm_tail)
KernelOptions.row_tiles (a benchmark instrument) override the one-row tiles by weight shape.

Re-measure the tables on the GPU and edit: `python benchmarks/bench_gemv.py --rows 1,6 --out fused.json`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch

from engine.kernels.gemv import MAX_ROWS, MAX_TREE_ROWS, GemvConfig
from engine.options import CUBLAS, KernelOptions

# Kernel sets (modes): which kernels a decoder layer's step runs (layer_mode).
UNFUSED = "unfused"  # add_rms_norm and silu_and_mul apart, projections routed one by one
ROW = "row"  # one bf16 row without a draft: the fused one-row kernels
INVARIANT = "invariant"  # up to 16 bf16 rows (a tree's 64) with batch_invariant: the fused invariant kernels
DRAFT = "draft"  # a draft's step: our GEMV for up to 16 rows, bits of no concern to the output

GEMV = "gemv"  # Route.kernel: our GEMV (CUBLAS: nn.Linear)
ROLES = ("qkv", "o_proj", "gate_up", "down", "lm_head")


@dataclass(frozen=True)
class Route:
    kernel: str  # GEMV or CUBLAS
    tile: GemvConfig | None = None  # GEMV: None, the kernel's built-in table (default_config)
    invariant: bool = False  # GEMV: the batch-invariant tensor-core tile, the same for every row count
    each_row: bool = False  # GEMV: the one-row kernel and tile, row after row (batch-invariant too)


# Batch invariance (a draft loaded) runs each projection on one kernel chosen by the weight's shape
# alone, so that a verify row and the decode step of its token take the same one: the tensor-core
# tile over 16 padded rows (invariant_tile), or, with KernelOptions.each_row, for weights up to
# EACH_ROW_MAX_BYTES, the one-row kernels with one program per row (their re-reads of the weights
# come from L2; one row then runs exactly as without a draft, fusions included).
EACH_ROW_MAX_BYTES = 8 << 20


def each_row_serves(options: KernelOptions, shape: tuple[int, int], dtype: torch.dtype) -> bool:
    """Whether a batch-invariant step runs the projection of weight `shape` row by row."""
    return (options.batch_invariant and options.each_row and dtype == torch.bfloat16
            and shape[0] * shape[1] * 2 <= EACH_ROW_MAX_BYTES)


@functools.lru_cache(maxsize=256)
def each_row_layer(options: KernelOptions, shapes: tuple[tuple[int, int], ...], dtype: torch.dtype) -> bool:
    """Whether a decoder layer whose projections have these weight shapes runs its batch-invariant
    steps on the fused one-row set, row by row (all of them small enough), rather than INVARIANT.
    Asked by every layer at every eager step: cached."""
    return all(each_row_serves(options, s, dtype) for s in shapes)


def invariant_tile(shape: tuple[int, int]) -> GemvConfig:
    """The tensor-core tile of a batch-invariant projection (not each_row): the weight as the dot's
    long side (swap_ab). On an H200 (bench_invariant_tiles.py, --wide; docs/performance.md), one row
    against the fastest one-row kernel: for K <= 1024, 64 columns and 128-element steps (SmolLM2's
    lm_head 19.1 against 20.7 us on longer steps); a small weight with a longer K (SmolLM2's down)
    16 columns and 128-element steps without the swap (3.49 against 4.00 us); a weight whose
    64-column programs would not fill one wave of SMs (N <= 4,096: the 8B's o_proj and down) 32
    columns and 512-element steps, twice the programs each with as many bytes in flight (10.2 and
    29.1 us against 11.5 and 32.1 on 64 x 256; the one-row kernel 10.3 and 29.5); a weight of many
    waves with N up to 64K (the 8B's gate_up) 128 columns, 128-element steps and 8 warps (58.3
    against 59.1 us); otherwise (the 8B's qkv and lm_head) 64 x 256."""
    n, k = shape
    if k <= 1024:
        return GemvConfig(64, 128, 1, 4, 3, swap_ab=True)
    if n * k * 2 <= EACH_ROW_MAX_BYTES:
        return GemvConfig(16, 128, 1, 4, 4)
    if n <= 4096:
        return GemvConfig(32, 512, 1, 4, 4, swap_ab=True)
    if 16384 <= n <= 65536:
        return GemvConfig(128, 128, 1, 8, 4, swap_ab=True)
    return GemvConfig(64, 256, 1, 4, 4, swap_ab=True)


CUBLAS_ROUTE = Route(CUBLAS)

# Four output columns by 512-element steps, no split: the fastest M = 1 tile for the o_proj and
# down shapes of both the 8B and the SmolLM2 models in the same benchmark.
ROW_TILE = GemvConfig(block_n=4, block_k=512, split_k=1, num_warps=4, num_stages=3)
# From K = 4096 on, 1,024-element steps: twice the bytes in flight per program (the 8B's down
# projection 1.014x-1.017x in the decode graph).
ROW_TILE_LONG_K = GemvConfig(block_n=4, block_k=1024, split_k=1, num_warps=4, num_stages=3)


def row_tile(k: int) -> GemvConfig:
    """The M = 1 tile of o_proj and down (and their fused prologues) for reduction length k."""
    return ROW_TILE_LONG_K if k >= 4096 else ROW_TILE


# The fused kernels' tiles by (mode, kernel, N, K). A GemvConfig: fuse with that tile. UNFUSED: run
# the unfused pair for that projection. A shape not listed: fuse with the built-in tile (row:
# default_config for rms_norm_gemv, row_tile for silu_mul_gemv; invariant: the invariant tile). The
# UNFUSED entries are the shapes where the fused kernel lost to the unfused pair on an H200
# (benchmarks/bench_gemv.py; us, fused vs unfused, an invariant entry measured at 6 rows): every
# program redoes the rms pre-pass over K (costly at K = 4096), and the 16-row prologues are slower
# than their separate kernels. A one-row launch reads the row for its rms in one load
# (kernels/gemv.py ONE_PASS): with that, SmolLM2's gate_up (3072 x 576) runs fused (the
# demo-shaped step 1.13x faster), while on the 8B folding the norm into qkv still lost (0.973x;
# into qkv and gate_up 0.950x).
FUSED_TILES: dict[tuple[str, str, int, int], GemvConfig | str] = {
    (ROW, "rms_norm_gemv", 6144, 4096): UNFUSED,  # Llama-3.1-8B qkv: 25.5 vs 17.9
    (ROW, "rms_norm_gemv", 28672, 4096): UNFUSED,  # 8B gate_up: 77.9 vs 58.8
    (INVARIANT, "rms_norm_gemv", 6144, 4096): UNFUSED,  # 36.5 vs 24.8
    (INVARIANT, "rms_norm_gemv", 28672, 4096): UNFUSED,  # 159.7 vs 74.7
    (INVARIANT, "rms_norm_gemv", 3072, 576): UNFUSED,  # 8.3 vs 6.9
    (INVARIANT, "silu_mul_gemv", 4096, 14336): UNFUSED,  # 201.0 vs 44.3
    (INVARIANT, "silu_mul_gemv", 576, 1536): UNFUSED,  # 7.9 vs 5.3
}


def is_invariant(options: KernelOptions, rows: int, dtype: torch.dtype, tree: bool = False) -> bool:
    """Whether a step of `rows` rows runs the batch-invariant tiles: up to MAX_ROWS rows, or with
    tree (a draft tree's verify step on the INVARIANT set: tree_rows) up to MAX_TREE_ROWS."""
    return (options.batch_invariant and rows <= (MAX_TREE_ROWS if tree else MAX_ROWS)
            and dtype == torch.bfloat16)


def tree_rows(options: KernelOptions, packed: bool) -> int:
    """The most rows one verify forward of a draft tree takes on a batch-invariant target: with
    tree_one_forward, all of a tree's nodes and its root where the INVARIANT set serves them (its
    tiles, in 16-row blocks, and the per-row attention keep every row's bits at any row count;
    the projections outside the set take its routes for a tree's rows: Ops.tree_project and
    FusedLayerKernels.mlp_down); else MAX_ROWS (the one-row set row by row, unfused or packed
    layers: their kernels take up to 16 rows), a longer tree going in chunks."""
    if (options.tree_one_forward and options.fuse and options.fuse_invariant and not options.each_row
            and not packed):
        return MAX_TREE_ROWS
    return MAX_ROWS


def layer_mode(options: KernelOptions, rows: int, dtype: torch.dtype, packed: bool,
               each_row: bool = False, tree: bool = False) -> str:
    """The kernel set of a decoder layer's step on CUDA: INVARIANT, ROW or UNFUSED (prefill,
    packed forwards, other dtypes, fusion off). each_row: the layer's weights are small enough for
    the one-row set row by row (each_row_layer); a batch-invariant step of 1 to 16 rows runs ROW.
    tree: a draft tree's verify rows (up to tree_rows)."""
    if not options.fuse or packed:
        return UNFUSED
    if is_invariant(options, rows, dtype, tree=tree and not each_row):
        if not options.fuse_invariant:
            return UNFUSED
        return ROW if each_row else INVARIANT
    return ROW if rows == 1 and dtype == torch.bfloat16 else UNFUSED


def linear_route(options: KernelOptions, mode: str, role: str, rows: int, shape: tuple[int, int],
                 dtype: torch.dtype) -> Route:
    """The kernel of a projection run on its own (not fused with the norm or activation before
    it). role: one of ROLES; o_proj and down stand for a sublayer's last projection, and for
    every projection of a fused draft step (the same one-row tile)."""
    bf16 = dtype == torch.bfloat16
    if mode == DRAFT:
        if rows > MAX_ROWS or not bf16:
            return CUBLAS_ROUTE
        # several rows with draft_rows: the invariant set's tile (a draft's bits are of no concern,
        # the tile is chosen for its speed at 1-16 rows)
        return Route(GEMV, invariant_tile(shape), invariant=True) if rows > 1 and options.draft_rows else Route(GEMV)
    if is_invariant(options, rows, dtype, tree=mode == INVARIANT):  # INVARIANT: a tree's rows too
        if not each_row_serves(options, shape, dtype):
            return Route(GEMV, invariant_tile(shape), invariant=True)
        one = linear_route(replace(options, batch_invariant=False), mode, role, 1, shape, dtype)
        return Route(GEMV, one.tile, each_row=True)  # the one-row route, never cuBLAS
    if rows != 1 or not bf16:
        return CUBLAS_ROUTE
    if role in ("o_proj", "down"):
        tile = options.row_tile(shape) or row_tile(shape[1])
    elif mode == ROW and role in ("qkv", "gate_up"):
        tile = options.row_tile(shape)
        if tile is None:
            # qkv on our GEMV: the attention kernel after it may then start while it ends (after a
            # cuBLAS launch it waits for it to finish); gate_up stays on cuBLAS, which streams the
            # widest projections faster.
            return Route(GEMV) if role == "qkv" and options.qkv_gemv else CUBLAS_ROUTE
    else:
        return CUBLAS_ROUTE  # lm_head; qkv and gate_up outside the fused one-row set
    return CUBLAS_ROUTE if tile == CUBLAS else Route(GEMV, tile)


def fused_tile(options: KernelOptions, mode: str, kernel: str, n: int, k: int) -> GemvConfig | str | None:
    """FUSED_TILES' entry for rms_norm_gemv or silu_mul_gemv in mode ROW or INVARIANT: a
    GemvConfig, UNFUSED, or None (fuse with the built-in tile)."""
    tile = FUSED_TILES.get((mode, kernel, n, k))
    if mode == ROW and kernel == "silu_mul_gemv" and options.row_tile((n, k)) is not None:
        tile = options.row_tile((n, k))
        return UNFUSED if tile == CUBLAS else tile
    if tile is None and kernel == "rms_norm_gemv" and k >= 4096:
        tile = UNFUSED  # as every such shape measured: each program's rms pre-pass over K costs more than it saves
    if tile is None and mode == ROW and kernel == "silu_mul_gemv":
        return row_tile(k)  # the down projection's tuned M = 1 tile, as unfused
    return tile


def _table_mode(mode: str, rows: int, each_row: bool) -> str:
    # A ROW-mode set on several rows without each_row (a draft-extend): the invariant entries,
    # measured on 6 and 16 rows, with the built-in tile for that row count; the row tiles are
    # M = 1 tiles, which each_row runs row by row.
    return INVARIANT if mode == ROW and rows > 1 and not each_row else mode


def _one_row(rows: int, each_row: bool) -> bool:
    # The one-row kernels serve this step: one row, or up to MAX_ROWS row by row.
    return rows == 1 or (each_row and rows <= MAX_ROWS)


def norm_tile(options: KernelOptions, mode: str, rows: int, shape: tuple[int, int],
              each_row: bool = False) -> GemvConfig | str | None:
    """rms_norm_gemv's tile for a norm and the projection after it (qkv, gate_up, a draft's
    lm_head) of weight `shape`: a GemvConfig, None (the built-in tile) or UNFUSED (apart)."""
    return fused_tile(options, _table_mode(mode, rows, each_row), "rms_norm_gemv", *shape)


def down_tile(options: KernelOptions, mode: str, rows: int, shape: tuple[int, int],
              each_row: bool = False) -> GemvConfig | str | None:
    """silu_mul_gemv's tile for the activation and the down projection of weight `shape`."""
    return fused_tile(options, _table_mode(mode, rows, each_row), "silu_mul_gemv", *shape)


def is_gated(options: KernelOptions, mode: str, rows: int, gate_up_shape: tuple[int, int],
             dtype: torch.dtype, each_row: bool = False) -> bool:
    """Whether an MLP runs as gated_gemv (gate_up with silu(gate) * up in its epilogue) and a plain
    down GEMV over I values: bf16 rows of the ROW set on the one-row kernel, unless row_tiles sends
    gate_up to cuBLAS (silu_mul_gemv recomputed the activation of all I columns in each of its
    programs)."""
    return (options.gated_mlp and mode == ROW and _one_row(rows, each_row) and dtype == torch.bfloat16
            and options.row_tile(gate_up_shape) != CUBLAS)


def gated_tile(options: KernelOptions, gate_up_shape: tuple[int, int]) -> GemvConfig | None:
    """The gated launch's tile (block_n: gate rows, and as many up rows); None: gemv.gated_config."""
    return options.row_tile(gate_up_shape)


def carries_norm(options: KernelOptions, mode: str, rows: int, dtype: torch.dtype, next_role: str,
                 next_shape: tuple[int, int], each_row: bool = False) -> bool:
    """Whether a sublayer's last projection (o_proj, down) ends with the residual add and the next
    RMSNorm in its last program (gemv_add_norm): a bf16 step of the ROW set on the one-row kernel,
    where that norm would otherwise be a launch of its own: before lm_head, or before a projection
    (next_role, of weight next_shape) whose norm FUSED_TILES keeps apart."""
    if not (options.norm_tail and mode == ROW and _one_row(rows, each_row) and dtype == torch.bfloat16):
        return False
    return next_role == "lm_head" or norm_tile(options, ROW, 1, next_shape) == UNFUSED


def plain_weight(linear, dtype: torch.dtype) -> bool:
    """Whether `linear` holds a plain (N, K) weight of `dtype` that the GEMV kernels read (not a
    packed one)."""
    w = getattr(linear, "weight", None)
    return isinstance(w, torch.Tensor) and w.dim() == 2 and w.dtype == dtype and w.stride(1) == 1


def carries_stats(options: KernelOptions, rows: int, dtype: torch.dtype, next_role: str, next_linear) -> bool:
    """Whether a sublayer's last projection (o_proj, down) of the invariant set ends with the residual
    add, the next norm's weight and the squares of its 1 / rms (gemv_add_stats), so that the
    projection after the norm (qkv or gate_up, on plain weights) runs it after its dot (gemv_rstd)
    instead of a norm launch apart. Not before lm_head: the final norm's output is the model's
    hidden state, read by drafts too."""
    return (options.norm_stats and is_invariant(options, rows, dtype, tree=True) and next_role in ("qkv", "gate_up")
            and plain_weight(next_linear, dtype))


def stats_route(options: KernelOptions, role: str, shape: tuple[int, int]) -> tuple[GemvConfig, bool]:
    """gemv_add_stats's (tile, each_row) for an invariant o_proj or down (role) of weight `shape`:
    the one-row tile row by row for a small weight of a role in options.row_stats (on an H200 the
    demo's down runs one row in 1.8 us that way against 3.5 on its tensor-core tile, six rows
    alike, sixteen 7.2 against 3.5; docs/performance.md), else invariant_tile."""
    if role in options.row_stats and shape[0] * shape[1] * 2 <= EACH_ROW_MAX_BYTES:
        return row_tile(shape[1]), True
    return invariant_tile(shape), False


def gates_invariant(options: KernelOptions, gate_up, dtype: torch.dtype) -> bool:
    """Whether the invariant set's gate_up projection, taking a Scaled stream (gemv_rstd), also runs
    the activation after its dot (gate=True) instead of a silu_and_mul launch apart (gated_mlp):
    the same tile's dots, so the same bits."""
    return (options.gated_mlp and plain_weight(gate_up, dtype)
            and invariant_tile(tuple(gate_up.weight.shape)).split_k == 1)


def tail_tile(options: KernelOptions, shape: tuple[int, int]) -> GemvConfig | None:
    """gemv_add_norm's tile for a one-row o_proj or down of weight `shape` that carries the next
    norm; None: the plain projection instead (cuBLAS by row_tiles, or a split-K tile: the tail
    needs whole columns in one program)."""
    tile = options.row_tile(shape) or row_tile(shape[1])
    return None if tile == CUBLAS or tile.split_k != 1 else tile
