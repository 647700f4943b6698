"""KernelOptions: every kernel and routing switch of the engine and its drafts, and the one place
that reads them (and Triton's interpreter flag) from the environment."""

from __future__ import annotations

from dataclasses import dataclass
import functools
import os
from typing import Mapping

from engine.errors import UserError

CUBLAS = "cublas"  # a row_tiles entry that sends that shape to nn.Linear (cuBLAS) instead of our GEMV
AUTO = "auto"  # spec_alts: the GPU's shaped alternatives on any device
TREE_LOOKUP_MOST = 15  # the longest prompt-lookup chain (KernelOptions.tree_lookup says why)
# A row_tiles tile: an engine.kernels.gemv.GemvConfig (duck-typed here, so that this module imports no
# kernel code), or CUBLAS.
Tile = object


@dataclass(frozen=True)
class KernelOptions:
    """How decode and verify steps launch their kernels. The defaults are the measured winners
    (docs/performance.md); every switch left is one that a user or a benchmark turns off to
    compare. Built once (from_env, or by a benchmark) and passed in at construction: the target's
    Ops, its draft's, and through them every layer and kernel launch read these and nothing else."""

    # Every projection and attention of a step of up to 16 bf16 rows runs one tile whose per-row
    # arithmetic does not depend on the row count, so that a verify row has exactly the bits of the
    # decode step it stands for (in bf16, cuBLAS picks other kernels for other row counts, and the
    # last bits flip near-tied tokens). Chosen by whoever builds a target that a draft will verify
    # with (engine/build.py), never from the environment; a draft's own kernels never need it.
    batch_invariant: bool = False
    # Programmatic dependent launch on Hopper and later: each kernel of ours may start while the one
    # before it ends (1.22x on the demo model's plain decode). LOCALCHAT_PDL=0 launches plainly.
    pdl: bool = True
    # Decode and verify steps fold norms and the activation into the projections where
    # routing.FUSED_TILES says it pays. LOCALCHAT_FUSE=0: never (comparisons).
    fuse: bool = True
    # With batch_invariant, the fused kernels in their invariant tiles too (4% faster speculation).
    # LOCALCHAT_FUSE_INVARIANT=0: the unfused invariant ops.
    fuse_invariant: bool = True
    # With batch_invariant, a layer whose weights are all small (routing.EACH_ROW_MAX_BYTES) runs the
    # one-row kernels and fusions on each verify row too (each_row), so that plain decoding with a
    # draft loaded runs the kernels of plain decoding without one. Off: its verify rows cost too
    # much (demo model: plain decoding with the head loaded 0.90x of no draft instead of 0.73x, but
    # greedy speculation 0.75x instead of 1.63x; docs/performance.md). LOCALCHAT_EACH_ROW=1: on.
    each_row: bool = False
    # With batch_invariant, attention runs each query row in programs of its own (the one-row tile),
    # instead of one tile over 16 padded rows: plain decoding with a draft loaded 1.05x faster on
    # the demo's shape, 0.95x of no draft instead of 0.93x on the 8B's, verify steps no slower
    # (docs/performance.md). LOCALCHAT_TOKEN_ATTENTION=0: the 16-row tile.
    token_attention: bool = True
    # A one-row step without a draft runs qkv on our GEMV, so that attention may start while it ends
    # (1.024x on the 8B shape). LOCALCHAT_ROW_GEMV=cublas: cuBLAS (=qkv: the default).
    qkv_gemv: bool = True
    # A one-row step's MLP as gated_gemv (silu(gate) * up in gate_up's epilogue) and a plain down
    # GEMV (1.12x on the demo's shape); the invariant set's gate_up after a norm as squares
    # (norm_stats) with the activation after its dot (gemv_rstd gate=True), no silu_and_mul launch.
    # LOCALCHAT_GATED_MLP=0: gate_up, then silu_mul_gemv (or the activation apart).
    gated_mlp: bool = True
    # A one-row step's o_proj and down add the residual and run the next RMSNorm in their last
    # program where that norm would be a launch of its own (1.010x on the 8B shape).
    # LOCALCHAT_NORM_TAIL=0: the norms launch apart.
    norm_tail: bool = True
    # Quantized checkpoints (GGUF, AWQ, GPTQ, FP8) on a GPU: True keeps the decoder layers' weights
    # packed and decodes them inside the GEMV (engine/packed_linear.py); False dequantizes them to
    # bf16 at load, as the CPU does; None (the default) packs only a model whose bf16 weights would
    # not fit in the GPU's free memory, since the batch-invariant packed kernel a loaded draft
    # verifies with is still slower than bf16's (with no draft, 4-bit weights decode faster packed:
    # docs/performance.md). LOCALCHAT_PACKED_WEIGHTS=1|0.
    packed_weights: bool | None = None
    # With no draft loaded, a one-row step's packed projections run packed_row_gemv (CUDA cores, no
    # padding to 16 rows); with a draft, the batch-invariant tile of packed_gemv, so that verify rows
    # keep the decode step's bits. LOCALCHAT_PACKED_ROW=0: packed_gemv either way.
    packed_row: bool = True
    # There, x rounded to int8 (one scale per 16-32 inputs) against every block type but FP8 by
    # integer dot products, as llama.cpp's kernels do ("int8"), or in its own precision ("bf16").
    # LOCALCHAT_PACKED_ROW_X=int8|bf16.
    packed_row_x: str = "int8"
    # With a draft loaded (and a no-draft step of 2-16 rows), the batch-invariant packed GEMV: x
    # rounded to int8 per 32 inputs a row and multiplied in integer dot products (packed_rows_gemv:
    # every kind but FP8), or the weights decoded to bf16 for a tensor-core dot (packed_gemv).
    # Either is built to keep a verify row's bits equal to its one-row step's; int8 is slower with
    # rows than bf16 and not yet checked bit for bit on a GPU at an 8B's shapes, so bf16 is the
    # default (docs/performance.md). LOCALCHAT_PACKED_INVARIANT_X=bf16|int8.
    packed_invariant_x: str = "bf16"
    # A packed model's long steps (prefill) on a GPU (engine/packed_linear.py PREFILL_WAYS):
    # "fused" decodes tiles inside a Triton matmul; "dequant" decodes a slice of each weight by a
    # kernel, then cuBLAS; "torch" dequantizes slices by the torch reference. On an H200, 8B
    # Q4_K_M, 512-token prompts: 9,394 tok/s fused, 3,540 dequant, 2,450 torch (docs/performance.md).
    # LOCALCHAT_PACKED_PREFILL=fused|dequant|torch.
    packed_prefill: str = "fused"
    # A one-row step of a projection stored in two formats (a Q4_K_M file's Q4_K q and k and Q6_K
    # v) in one launch of the row kernel (packed_row_gemv_blocks) instead of one a block: the same
    # values. 8B Q4_K_M on an H200: 459.0 against 455.0 tok/s. LOCALCHAT_PACKED_ONE_LAUNCH=0: a
    # launch a block.
    packed_one_launch: bool = True
    # The one-row packed kernel with programmatic dependent launch (where `pdl` is on): its
    # weights' first lines requested before the wait, and the next kernel launched after this
    # kernel's stores (2) or right after the wait (1); 0 launches it without. Launched right after
    # the wait, the next kernel's waiting programs take the slots this one's last programs need.
    # 8B on an H100: AWQ 422.0 and 421.4 tok/s with 2 against 414.9 and 415.4 without, 403.3 with
    # 1; Q4_K_M 405.3 and 405.4 against 402.9 and 403.4 (docs/performance.md).
    # LOCALCHAT_PACKED_ROW_PDL=0|1|2.
    packed_row_pdl: int = 2
    # There, each program loads its first K step's weights (and their scales) before the PDL wait,
    # not only their first lines into L2, so that their round trip overlaps the kernel before (the
    # norm, the attention, the activation launch the next kernel right after their own wait); x is
    # read only after the wait. 8B on an H100: AWQ 426.3 and 426.8 tok/s against 417.8 and 418.0,
    # Q4_K_M 417.8 and 417.5 against 411.4 and 411.0 (docs/performance.md).
    # LOCALCHAT_PACKED_ROW_EARLY_WEIGHTS=0: only the first lines requested before the wait.
    packed_row_early_weights: bool = True
    # The batch-invariant packed kernel (packed_gemv: every step of an engine with a draft loaded)
    # with programmatic dependent launch too, where `pdl` is on: each program requests its first
    # lines of weights and scales before the wait, and launches the next kernel right after the
    # wait (1) or after its stores (2); 0 launches it without. The demo's shape (Q4_1) on an H100,
    # a head forced to 3.5 tokens a step: 2,498.6 tok/s speculating against 2,222.4 without, the
    # head loaded and speculation off 1,244.1 against 985.4 (docs/performance.md).
    # LOCALCHAT_PACKED_GEMV_PDL=0|1|2.
    packed_gemv_pdl: int = 1
    # ...for a projection whose K is under this: the 8B's shape (K of 4,096 and 14,336), Q4_K_M with
    # the same head, ran 416.4 tok/s with PDL 1 against 425.1 without. LOCALCHAT_PACKED_GEMV_PDL_K=N
    # (65536: every projection).
    packed_gemv_pdl_k: int = 2048
    # There, a K under 2,048 (a small model's) takes packed_gemv.default_tile's short-K tile: 32
    # columns a program on 2 warps, K in six shares. LOCALCHAT_PACKED_SHORT_TILES=0: the 8B's rule.
    packed_short_tiles: bool = True
    # There (int8 x), the norm before qkv and gate_up and the activation before down hand the
    # projection their output already rounded to int8 (rounded_x.RoundedX), in their own launch,
    # so that the row kernel reads a byte an input, not two, and no program rounds x again. 8B on
    # an H100: Q4_K_M 411.3 against 400.2 tok/s, AWQ 418.5 against 417.2 (docs/performance.md).
    # LOCALCHAT_PACKED_ROUNDED_X=0: each program rounds x itself.
    packed_rounded_x: bool = True
    # There, o_proj's row rounded to int8 by the attention's merge launch too (a program a head),
    # where o_proj's programs would each round it again. The demo's shape (Q4_1) on an H100:
    # 1,818.2 and 1,816.4 tok/s against 1,633.8 and 1,633.6; the 8B and 1B shapes 1.00x
    # (docs/performance.md). LOCALCHAT_PACKED_ROUNDED_O=0: o_proj rounds its own x.
    packed_rounded_o: bool = True
    # A table of token embeddings kept packed (a GGUF's token_embd) looked up by one launch of ours
    # (packed_embed_rows) on the GPU, where torch's gathers and unpacking take 14 (28.7 us of a
    # 565.7 us step of the demo's shape packed, against 2.9 for bf16's lookup), and an EAGLE-3
    # draft over such a target keeping its lean step. The demo's shape packed as Q4_1, a head
    # forced to 3.5 tokens a step, on an H100: speculation 1.18x, no draft 1.04x
    # (docs/performance.md). LOCALCHAT_PACKED_EMBED=0: torch's lookup, the fused draft step.
    packed_embed: bool = True
    # A one-row step rotates q and k and writes the cache inside the attention kernel, one launch
    # fewer with the same bits. LOCALCHAT_ROPE_IN_ATTENTION=0: RoPE launches apart.
    rope_in_attention: bool = True
    # With it, a batch-invariant verify step's rows (2 to 16) too: each split program writes the
    # step's keys it reads. LOCALCHAT_ROPE_IN_VERIFY=0: their RoPE launches apart.
    rope_in_verify: bool = True
    # With it, a draft tree's rows, which read their ancestors through a slot map (the target's
    # verify rows and the head's levels), too: one launch fewer a layer, the same bits.
    # LOCALCHAT_ROPE_IN_TREE=0: their RoPE launches apart.
    rope_in_tree: bool = True
    # A verify step's per-row attention programs share about two waves over the SMs instead of each
    # row taking the one-row step's count (kernels/attention.py _split_programs); the same bits.
    # LOCALCHAT_SHARE_SMS=0: every row the one-row count.
    share_sms: bool = True
    # EAGLE-3 draft steps on the GPU kernels (1625 against 1214 tok/s). LOCALCHAT_FUSED_DRAFT=0: the
    # torch layer.
    fused_draft: bool = True
    # Within those, the lean step (ten launches a draft token) and the greedy loop's picks on the
    # device (1.07x). LOCALCHAT_LEAN_DRAFT=0: the fused step and the picks in torch ops.
    lean_draft: bool = True
    # Within those, a draft step of several rows (a tree level's frontier; extends go on from one
    # row) on the tensor-core tiles of the batch-invariant set (routing.invariant_tile), its two
    # norms carried by the projections around them (gemv_add_stats, gemv_rstd) and the activation
    # by gate_up's epilogue, instead of the 16 x 256 tile with the norm and activation recomputed
    # in every program (a demo tree level of 6 rows: gate_up, down and lm_head about 44 us of its
    # forward's 61 on an H200, against 11 for one row). With the four tree switches below and
    # row_stats none, the demo's 4,8,15 trees 1.98x of no draft on an H100 against 1.62x without
    # it (docs/performance.md). LOCALCHAT_DRAFT_ROWS=0: the 16 x 256 tile.
    draft_rows: bool = True
    # Runners-up each draft gets as extra rows of a greedy verify step. None: the device's default
    # (GPU: as many as fill 16 rows, shaped; CPU: none, each row costs its arithmetic there); AUTO:
    # the shaped ones on any device; N: N for every draft; (A, B, ...): A for draft 1, B for draft 2,
    # none after. LOCALCHAT_SPEC_ALTS=auto|N|A,B,...
    spec_alts: int | tuple[int, ...] | str | None = None
    # Sampled EAGLE-3 iterations verify each draft's runner-up as well (a second rejection-sampling
    # round where the draft is refused; speculative/kernels/sampled_pick.py): k more verify rows.
    # LOCALCHAT_SAMPLED_RUNNERS_UP=1.
    sampled_runners_up: bool = False
    # A draft tree's level (the frontier's top-k, the candidates' scores and buffers, the next
    # frontier and its expansion's inputs) as one launch (speculative/kernels/tree_level.py)
    # instead of some thirty torch ops, the kept nodes with the verify rows' inputs as one more
    # (tree_select), and a greedy step's walk and bookkeeping as a third (tree_accept): the demo's
    # trees 1.18x-1.48x over no draft where the torch ops gave 0.77x-1.05x (docs/performance.md).
    # LOCALCHAT_TREE_LEVEL=0: the torch ops.
    tree_level: bool = True
    # With it, a tree step's accepted nodes' K/V move to their positions in one launch for every
    # layer's K and V (speculative/kernels/kv_rows.py) instead of an index_select and an index_copy
    # each (four launches). LOCALCHAT_TREE_KV_MOVE=0: the torch ops.
    tree_kv_move: bool = True
    # With it, tree_select ranks the candidates by TOKENS passes over their scores in registers
    # instead of a loop over every candidate for each (2 x 258 dependent steps for 6,8,15: 62 us of
    # its step on an H200; 6,8,15's select still takes 81 us on an H100 with them, 4,4,8's 5).
    # LOCALCHAT_TREE_SELECT_PASSES=0: the loops.
    tree_select_passes: bool = True
    # With it (taking precedence over the passes), tree_select compares every pair of candidates,
    # a block of 32 at a time: count / 32 steps that do not wait on each other's sums instead of
    # TOKENS dependent reductions. Timed on an H100, it lost: 6,8,15 1.73x against 1.95x with the
    # passes, 4,8,15 the same. Off: LOCALCHAT_TREE_SELECT_BLOCKS=1 turns it on.
    tree_select_blocks: bool = False
    # With it, a sampled tree step's walk (each row's children tried in turn) and its bookkeeping
    # are one launch (speculative/kernels/tree_level.py tree_accept_sampled) instead of some ten
    # torch ops a try and the step_end's after them (a 4,8,15 step at temperature 0.7 took 2.4 ms
    # on an H100 against 0.95 greedy). On an H100, 4,4,8 trees at 0.7 over 24 requests: 1.54x the
    # no-draft engine with it, 0.87x without (the same accepted length). LOCALCHAT_SAMPLED_TREE_ACCEPT=0
    # turns it off.
    sampled_tree_accept: bool = True
    # With it, each of tree_level's picks is one reduction of a value and its index packed in an
    # int64 key instead of two (a maximum, then the lowest index holding it): about half of a
    # level launch's dependent reductions. LOCALCHAT_TREE_LEVEL_KEYS=0: the two reductions.
    tree_level_keys: bool = True
    # With it, a tree step's reductions over a vocabulary split each row into parts of a program
    # each, merged by the launch's last program, instead of one program reading a whole row:
    # tree_level's rows (parts of 1,024 logits at least, at most 16 a row: 6 for the demo head's
    # 6,144 tokens, 15 for 15,360; the same picks, scores within a rounding) and the verify rows'
    # argmax (rows_argmax: 12 parts of the demo's 49,152; the same choices). On an H100, 4,8,15
    # steps 0.917 ms against 0.935 with the demo's head, 0.950 against 0.989 with a 15,360-token
    # head; every greedy answer the same. LOCALCHAT_TREE_LEVEL_SPLIT=0: a program a row.
    tree_level_split: bool = True
    # With it, a draft tree of more than 15 nodes is verified in one forward (the invariant tiles
    # in 16-row blocks, up to 64 rows: routing.tree_rows) instead of 16-row chunks, each a forward
    # of its own: on an H200, 4,8,24 trees ran 1.85x of no draft in one forward against 1.31x in
    # two, every greedy answer the same. LOCALCHAT_TREE_ONE_FORWARD=0: 16-row forwards.
    tree_one_forward: bool = True
    # A greedy tree step puts up to this many prompt-lookup tokens (what followed the latest earlier
    # occurrence of the context's last 4, else 3, else 2 tokens) into the kept tree, in the places
    # of its lowest-scored nodes (speculative/tree/lookup.py; on a GPU one launch after
    # tree_select, speculative/kernels/tree_lookup.py). A chain may go deeper than the tree: the
    # walk then goes as deep. On an H100, the demo model and its head, 24 unseen requests, in one
    # run: 4,8,15 trees accept 4.02 tokens a step with 12, 3.97 with 8, 3.93 with 15 and 3.63
    # without, 2.17x over no draft with 12 against 2.00x without (docs/performance.md). At most
    # TREE_LOOKUP_MOST: a walk 16 deep makes the draft-extend 17 rows, past the draft's 16-row
    # kernels (engine/routing.py DRAFT), and 4,7,24's step took 1.33 ms against 1.07 with 15.
    # LOCALCHAT_TREE_LOOKUP=N (0 none).
    tree_lookup: int = 12
    # The batch-invariant set's o_proj and down end with the residual add, the next norm's weight
    # and the squares of its 1 / rms, and the qkv or gate_up projection after it scales its dot by
    # that 1 / rms: no norm launches between them (kernels/gemv.py gemv_add_stats, gemv_rstd).
    # LOCALCHAT_NORM_STATS=0: the norm launches apart.
    norm_stats: bool = True
    # Of those, the sublayer ends (o_proj, down) whose small weights (routing.EACH_ROW_MAX_BYTES)
    # run on the one-row kernel row by row instead of the tensor-core tile (routing.stats_route):
    # one row as without a draft, each further row a re-read from L2. None by default: a verify
    # step's 16 rows took 0.785 ms on an H200 against 0.928 with down, 6 rows 0.644 against 0.658,
    # and only one row (plain decoding with the draft loaded, speculation toggled off) is faster
    # with down (0.508 against 0.549). LOCALCHAT_ROW_STATS=none|down|o_proj,down.
    row_stats: tuple[str, ...] = ()
    # Greedy MTP answers on a GPU as one CUDA graph an iteration (speculative/mtp/greedy_loop.py):
    # on an H200 the demo's MTP layers 0.99x of no draft, against 0.78x through the step-by-step
    # loop and its graphs per step (docs/performance.md). The CPU runs the same iteration eagerly
    # either way. LOCALCHAT_MTP_GRAPH=0: the step-by-step loop.
    mtp_graph: bool = True
    # Benchmarks only (benchmarks/variants.py tiles:SPEC): ((N, K), tile or CUBLAS) pairs that send a
    # one-row projection of that weight shape to that tile of our GEMV, or to cuBLAS.
    row_tiles: tuple[tuple[tuple[int, int], Tile], ...] = ()

    def __post_init__(self):
        alts = self.spec_alts
        ok = (alts is None or alts == AUTO or (isinstance(alts, int) and alts >= 0)
              or (isinstance(alts, tuple) and all(isinstance(a, int) and a >= 0 for a in alts)))
        if not ok:
            raise ValueError(f"spec_alts must be None, {AUTO!r}, a count or a tuple of counts, got {alts!r}")
        for shape, tile in self.row_tiles:
            if len(shape) != 2 or not (tile == CUBLAS or hasattr(tile, "split_k")):
                raise ValueError(f"row_tiles: ({shape!r}, {tile!r}) is not ((N, K), GemvConfig or {CUBLAS!r})")

    def row_tile(self, shape: tuple[int, int]) -> Tile | None:
        """row_tiles' entry for a weight of `shape` (N, K), None where there is none."""
        return self._row_tiles.get(tuple(shape))

    @functools.cached_property
    def _row_tiles(self) -> dict:
        return dict(self.row_tiles)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "KernelOptions":
        """The defaults, with the LOCALCHAT_* switches set in `environ` (the process's by default).
        A value it cannot read stops with a UserError naming the variable."""
        env = os.environ if environ is None else environ
        return cls(
            pdl=_flag(env, "LOCALCHAT_PDL"), fuse=_flag(env, "LOCALCHAT_FUSE"),
            fuse_invariant=_flag(env, "LOCALCHAT_FUSE_INVARIANT"), each_row=_flag(env, "LOCALCHAT_EACH_ROW", default=False),
            token_attention=_flag(env, "LOCALCHAT_TOKEN_ATTENTION"),
            qkv_gemv=_row_gemv(env.get("LOCALCHAT_ROW_GEMV", "")),
            gated_mlp=_flag(env, "LOCALCHAT_GATED_MLP"), norm_tail=_flag(env, "LOCALCHAT_NORM_TAIL"),
            packed_weights=None if env.get("LOCALCHAT_PACKED_WEIGHTS", "").strip() == ""
            else _flag(env, "LOCALCHAT_PACKED_WEIGHTS"),
            packed_row=_flag(env, "LOCALCHAT_PACKED_ROW"),
            packed_row_x=_choice(env, "LOCALCHAT_PACKED_ROW_X", ("int8", "bf16"), "int8"),
            packed_invariant_x=_choice(env, "LOCALCHAT_PACKED_INVARIANT_X", ("int8", "bf16"), "bf16"),
            packed_prefill=_choice(env, "LOCALCHAT_PACKED_PREFILL", ("fused", "dequant", "torch"), "fused"),
            packed_one_launch=_flag(env, "LOCALCHAT_PACKED_ONE_LAUNCH"),
            packed_row_pdl=_count(env, "LOCALCHAT_PACKED_ROW_PDL", 2, default=2),
            packed_row_early_weights=_flag(env, "LOCALCHAT_PACKED_ROW_EARLY_WEIGHTS"),
            packed_gemv_pdl=_count(env, "LOCALCHAT_PACKED_GEMV_PDL", 2, default=1),
            packed_gemv_pdl_k=_count(env, "LOCALCHAT_PACKED_GEMV_PDL_K", 1 << 16, default=2048),
            packed_short_tiles=_flag(env, "LOCALCHAT_PACKED_SHORT_TILES"),
            packed_rounded_x=_flag(env, "LOCALCHAT_PACKED_ROUNDED_X"),
            packed_rounded_o=_flag(env, "LOCALCHAT_PACKED_ROUNDED_O"),
            packed_embed=_flag(env, "LOCALCHAT_PACKED_EMBED"),
            rope_in_attention=_flag(env, "LOCALCHAT_ROPE_IN_ATTENTION"),
            rope_in_verify=_flag(env, "LOCALCHAT_ROPE_IN_VERIFY"),
            rope_in_tree=_flag(env, "LOCALCHAT_ROPE_IN_TREE"),
            share_sms=_flag(env, "LOCALCHAT_SHARE_SMS"),
            fused_draft=_flag(env, "LOCALCHAT_FUSED_DRAFT"), lean_draft=_flag(env, "LOCALCHAT_LEAN_DRAFT"),
            draft_rows=_flag(env, "LOCALCHAT_DRAFT_ROWS"),
            spec_alts=parse_spec_alts(env.get("LOCALCHAT_SPEC_ALTS", "")),
            sampled_runners_up=_flag(env, "LOCALCHAT_SAMPLED_RUNNERS_UP", default=False),
            tree_level=_flag(env, "LOCALCHAT_TREE_LEVEL"),
            tree_kv_move=_flag(env, "LOCALCHAT_TREE_KV_MOVE"),
            tree_select_passes=_flag(env, "LOCALCHAT_TREE_SELECT_PASSES"),
            tree_select_blocks=_flag(env, "LOCALCHAT_TREE_SELECT_BLOCKS", default=False),
            sampled_tree_accept=_flag(env, "LOCALCHAT_SAMPLED_TREE_ACCEPT", default=True),
            tree_level_keys=_flag(env, "LOCALCHAT_TREE_LEVEL_KEYS"),
            tree_level_split=_flag(env, "LOCALCHAT_TREE_LEVEL_SPLIT"),
            tree_one_forward=_flag(env, "LOCALCHAT_TREE_ONE_FORWARD"),
            tree_lookup=_count(env, "LOCALCHAT_TREE_LOOKUP", TREE_LOOKUP_MOST, default=12),
            mtp_graph=_flag(env, "LOCALCHAT_MTP_GRAPH"), norm_stats=_flag(env, "LOCALCHAT_NORM_STATS"),
            **({} if env.get("LOCALCHAT_ROW_STATS", "").strip() == ""
               else {"row_stats": _row_stats(env["LOCALCHAT_ROW_STATS"])}),
        )


def _choice(env: Mapping[str, str], name: str, choices: tuple[str, ...], default: str) -> str:
    """One of `choices` (unset: the default)."""
    value = env.get(name, "").strip()
    if value == "":
        return default
    if value not in choices:
        raise UserError(f"{name}={value!r}: use {' or '.join(choices)} (the default: {default})")
    return value


def _flag(env: Mapping[str, str], name: str, default: bool = True) -> bool:
    """A switch: 1 on, 0 off, unset the default."""
    value = env.get(name, "").strip()
    if value not in ("", "0", "1"):
        raise UserError(f"{name}={value!r}: use 1 (on{', the default' if default else ''}) or 0 "
                        f"(off{'' if default else ', the default'})")
    return default if value == "" else value == "1"


def _count(env: Mapping[str, str], name: str, most: int, default: int = 0) -> int:
    """A count from 0 to `most` (unset: the default)."""
    value = env.get(name, "").strip()
    if value == "":
        return default
    if not value.isdigit() or int(value) > most:
        raise UserError(f"{name}={value!r}: use a count from 0 (off) to {most} (unset: {default})")
    return int(value)


def _row_gemv(value: str) -> bool:
    value = value.strip()
    if value in ("layers", "all"):
        raise UserError(f"LOCALCHAT_ROW_GEMV={value} was removed (it measured slower: docs/performance.md); "
                        "use qkv (the default) or cublas")
    if value not in ("", "qkv", CUBLAS):
        raise UserError(f"LOCALCHAT_ROW_GEMV={value!r}: use qkv (the default) or cublas")
    return value != CUBLAS


def _row_stats(value: str) -> tuple[str, ...]:
    roles = tuple(r.strip() for r in value.split(",") if r.strip())
    if roles == ("none",):
        return ()
    if not roles or any(r not in ("o_proj", "down") for r in roles):
        raise UserError(f"LOCALCHAT_ROW_STATS={value!r}: use none (the default), down or o_proj,down")
    return roles


def parse_spec_alts(spec: str) -> int | tuple[int, ...] | str | None:
    """LOCALCHAT_SPEC_ALTS: "" (the device's default), "auto", "N" or "A,B,..." (see KernelOptions)."""
    spec = spec.strip()
    if spec in ("", AUTO):
        return spec or None
    parts = [p.strip() for p in spec.split(",")]
    if not all(p.isdigit() for p in parts):
        raise UserError(f"LOCALCHAT_SPEC_ALTS={spec!r}: use auto, a count (0: the chain alone) or counts "
                        "for the drafts in order, e.g. 2,1")
    return int(parts[0]) if len(parts) == 1 else tuple(int(p) for p in parts)


def triton_interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (Triton's own TRITON_INTERPRET=1).

    The interpreter computes bf16/fp16 arithmetic wrongly (it has no native bf16), so
    kernels upcast every operand to fp32 before any arithmetic or dot when this is set.
    """
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


# Other settings the engine takes from the process environment, read here and nowhere else.

def cpu_spec_setting() -> str:
    """LOCALCHAT_CPU_SPEC: "measure" (the default: whether speculation pays on a CPU is measured
    at a model and draft's first load) or "off" (not measured: off by default on a CPU)."""
    value = os.environ.get("LOCALCHAT_CPU_SPEC", "").strip().lower() or "measure"
    if value not in ("measure", "off"):
        raise UserError(f"LOCALCHAT_CPU_SPEC={value!r}: use measure or off")
    return value


def cuda_visible_devices() -> str | None:
    """$CUDA_VISIBLE_DEVICES as set (None: unset, every GPU visible)."""
    return os.environ.get("CUDA_VISIBLE_DEVICES")


def omp_threads_chosen(environ: Mapping[str, str] | None = None) -> bool:
    """Whether the user chose torch's CPU threads through OMP_NUM_THREADS."""
    return bool((os.environ if environ is None else environ).get("OMP_NUM_THREADS"))


def use_hub_token(token: str) -> None:
    """Makes `token` this process's Hugging Face token (huggingface_hub reads HF_TOKEN on every
    request); nothing is written to disk."""
    os.environ["HF_TOKEN"] = token
