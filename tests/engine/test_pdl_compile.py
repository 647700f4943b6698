"""Every Triton kernel compiles for an sm90 GPU with programmatic dependent launch on (and its
PTX waits on the previous grid before anything else), and without it (no grid-dependency
instructions). Compiled on the CPU with Triton's own ptxas: no GPU needed; skipped where
Triton or its CUDA backend is missing."""

from __future__ import annotations

import importlib.util
import inspect

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

POINTERS = {"part_ptr": "*fp32", "count_ptr": "*i32", "pos_ptr": "*i64", "ids_ptr": "*i64", "row_ptr": "*i64",
            "offsets_ptr": "*i64", "n_ptr": "*i64", "result_ptr": "*i64", "window_ptr": "*i64",
            "accepted_ptr": "*i64", "draft_pos_ptr": "*i64", "choice_ptr": "*i64", "part_o_ptr": "*fp32",
            "part_lse_ptr": "*fp32", "cos_sin_ptr": "*fp32", "own_ptr": "*i64", "slot_ptr": "*i64", "alts_ptr": "*i64",
            "state_rows_ptr": "*i64", "kv_move_ptr": "*i64", "alt_draft_ptr": "*i64", "move_ptr": "*i64",
            "rows_ptr": "*i64", "part_val_ptr": "*fp32", "part_idx_ptr": "*i32", "next_ptr": "*i64",
            "map_ptr": "*i32", "map_base_ptr": "*i32", "sq_ptr": "*fp32", "temp_ptr": "*fp32", "e_ptr": "*fp32",
            "q_ptr": "*fp32", "tok_ptr": "*i64", "stats_ptr": "*fp32", "drafts_ptr": "*i64", "to_draft_ptr": "*i32",
            "u_ptr": "*fp32", "alt_ptr": "*i64", "u_alt_ptr": "*fp32", "mass_ptr": "*fp32", "words_ptr": "*i32",
            "scales_ptr": "*fp32"}
_TREE_POINTERS = {"frontier_ptr": "*i64", "tokens_ptr": "*i64", "parents_ptr": "*i64", "scores_ptr": "*fp32",
                  "d2t_ptr": "*i64", "slot_of_ptr": "*i64", "slots_ptr": "*i64", "above_ptr": "*i64",
                  "part_max_ptr": "*fp32", "part_sum_ptr": "*fp32", "part_keys_ptr": "*i64"}
_SELECT_POINTERS = {**_TREE_POINTERS, "depths_ptr": "*i64", "root_ptr": "*i64", "rank_ptr": "*i32", "index_ptr": "*i32",
                    "out_tokens_ptr": "*i64", "out_parents_ptr": "*i64", "out_depths_ptr": "*i64",
                    "out_scores_ptr": "*fp32", "base_ptr": "*i32"}
FLOATS = {"eps", "eps_a", "eps_b", "qk_scale"}
# Kernels that read what no kernel of the step writes just before them (positions, tables)
# before their PDL wait.
READ_EARLY = {"rope_and_cache", "attention reduce trigger first", "attention reduce rounded trigger first"}


def _kernels():
    import engine.kernels.activation as activation
    import engine.kernels.attention as attention
    import engine.kernels.gemv as gemv
    import engine.kernels.norm as norm
    import engine.kernels.packed_gemv as packed_gemv
    import engine.kernels.pick as pick
    import engine.kernels.rope as rope
    import speculative.kernels.alternative as alternative
    import speculative.kernels.draft_pick as draft_pick
    import speculative.kernels.greedy_verify as greedy_verify
    import speculative.kernels.sampled_pick as sampled_pick
    import speculative.kernels.kv_rows as kv_rows
    import speculative.kernels.tree_level as tree_level
    import speculative.kernels.tree_lookup as tree_lookup

    split, reduce = attention._kernels()
    row_kernel, dot_kernel = gemv._kernels()
    shared = dict(HAS_RESIDUAL=True, HAS_BIAS=False, SPLIT_K=1, K_PER_SPLIT=768, EVEN_K=False, BLOCK_K=256, LINE=64,
                  PREFETCH_LINES=gemv.PREFETCH_LINES)
    row_base = dict(shared, NORM_MODE=0, K_POW2=1, GATED=False, NORM_TAIL=False, N_POW2=1, EPILOGUE=0)
    dot_base = dict(shared, DOT_F32=False, SWAP_AB=False, EPILOGUE=0, SQ_POW2=1, GATE=False)
    return [
        ("add_rms_norm", norm._kernels()[0], dict(HAS_RESIDUAL=True, BLOCK=1024, ROUND=0), 4),
        ("add_rms_norm rounded", norm._kernels()[0], dict(HAS_RESIDUAL=True, BLOCK=4096, ROUND=1), 16),
        ("embed_pair_norm", norm._kernels()[1], dict(BLOCK=1024, B_ROWS=False), 4),
        ("embed_pair_norm b_rows", norm._kernels()[1], dict(BLOCK=1024, B_ROWS=True), 4, {"b_rows_ptr": "*i64"}),
        ("embed_rows", norm._kernels()[2], dict(BLOCK=1024), 4),
        ("embed_pair_norm rows as given", norm._kernels()[1], dict(BLOCK=1024, B_ROWS=False, HAS_IDS=False), 4),
        # a packed table's lookup: Q4_1 (offsets), and Q6_K (signed, two high bits, super-block units)
        ("embed packed Q4_1", packed_gemv._kernel()[1],
         dict(ONE_BYTE=False, FP8=False, HIGH=0, ZERO=0, G=32, UNIT=0, HAS_OFFSET=True, BLOCK_N=16, BLOCK_K=64,
              SG=1, UG=1, PAIRED=False, BY_IDS=True), 2,
         {"q_ptr": "*u8", "qh_ptr": "*u8", "s_ptr": "*fp16", "o_ptr": "*fp16", "su_ptr": "*fp16", "ou_ptr": "*fp16"}),
        ("embed packed Q6_K", packed_gemv._kernel()[1],
         dict(ONE_BYTE=False, FP8=False, HIGH=2, ZERO=32, G=16, UNIT=16, HAS_OFFSET=False, BLOCK_N=1, BLOCK_K=128,
              SG=1, UG=1, PAIRED=False, BY_IDS=True), 1,
         {"q_ptr": "*u8", "qh_ptr": "*u8", "s_ptr": "*i8", "o_ptr": "*i8", "su_ptr": "*fp16", "ou_ptr": "*fp16"}),
        ("argmax_pick", draft_pick._kernels()[0], dict(HAS_OFFSETS=True, BLOCK=2048), 8),
        ("greedy_verify", greedy_verify._kernel(), dict(HAS_ALTS=False, BLOCK=2048, BLOCK_R=16), 8),
        ("greedy_verify alternatives", greedy_verify._kernel(), dict(HAS_ALTS=True, BLOCK=2048, BLOCK_R=16), 8),
        ("greedy_next", pick._kernels()[0], dict(CHUNK=2048, BLOCK=2048, BLOCK_P=64), 8),
        ("rows_argmax", pick._kernels()[1], dict(BLOCK=4096), 8, {"out_ptr": "*i64"}),
        ("rows_argmax in parts", pick._kernels()[2], dict(CHUNK=4096, BLOCK=1024, RP=16, PP=16), 4,
         {"out_ptr": "*i64", "part_val_ptr": "*fp32", "part_idx_ptr": "*i32", "count_ptr": "*i32"}),
        ("draft_pick", draft_pick._kernels()[1], dict(ALTS=3, HAS_OFFSETS=True, BLOCK=2048), 8,
         {"out_ptr": "*i64"}),
        ("take_alternative", alternative._kernels(), dict(OUT_ROWS=6, BLOCK=256, BLOCK_W=2048), 4),
        ("silu_and_mul", activation._kernels(), dict(BLOCK=1024, ROUND=0), 4),
        ("silu_and_mul rounded", activation._kernels(), dict(BLOCK=1024, ROUND=2), 4),
        ("rope_and_cache", rope._kernels(), dict(HEAD_DIM=64, HALF=32, BLOCK_HQ=16, BLOCK_HKV=4, BLOCK_HALF=32,
                                                 BLOCK_D=64), 4),
        ("attention split", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=256, BLOCK_M=16, BLOCK_N=64, BLOCK_D=64,
                                        DOT_F32=False, EARLY_KV=False, FUSE_ROPE=False, PER_TOKEN=False, MAP_W=0, ROPE_ROWS=1), 4),
        ("attention split early", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=256, BLOCK_M=16, BLOCK_N=64,
                                              BLOCK_D=64, DOT_F32=False, EARLY_KV=True, FUSE_ROPE=False, PER_TOKEN=False, MAP_W=0, ROPE_ROWS=1), 4),
        ("attention split rope early", split, dict(GROUP=4, HEAD_DIM=128, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                   BLOCK_D=128, DOT_F32=False, EARLY_KV=True, FUSE_ROPE=True, PER_TOKEN=False, MAP_W=0, ROPE_ROWS=1), 4),
        ("attention split per token", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                  BLOCK_D=64, DOT_F32=False, EARLY_KV=False, FUSE_ROPE=False,
                                                  PER_TOKEN=True, MAP_W=0, ROPE_ROWS=1), 4),
        ("attention split rope per token early", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                       BLOCK_D=64, DOT_F32=False, EARLY_KV=True, FUSE_ROPE=True,
                                                       PER_TOKEN=True, MAP_W=0, ROPE_ROWS=1), 4),
        ("attention split per token slot map", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                           BLOCK_D=64, DOT_F32=False, EARLY_KV=False, FUSE_ROPE=False,
                                                           PER_TOKEN=True, MAP_W=8, ROPE_ROWS=1), 4),
        ("attention split rope verify rows per token", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16,
                                                                BLOCK_N=64, BLOCK_D=64, DOT_F32=False, EARLY_KV=False,
                                                                FUSE_ROPE=True, PER_TOKEN=True, MAP_W=0, ROPE_ROWS=8), 4),
        ("attention split rope tree rows", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                       BLOCK_D=64, DOT_F32=False, EARLY_KV=False, FUSE_ROPE=True,
                                                       PER_TOKEN=True, MAP_W=8, ROPE_ROWS=16), 4),
        ("attention split rope tree row", split, dict(GROUP=3, HEAD_DIM=64, SPLIT_SIZE=64, BLOCK_M=16, BLOCK_N=64,
                                                      BLOCK_D=64, DOT_F32=False, EARLY_KV=False, FUSE_ROPE=True,
                                                      PER_TOKEN=True, MAP_W=8, ROPE_ROWS=1), 4),
        ("attention reduce trigger first", reduce, dict(HEAD_DIM=64, SPLIT_SIZE=256, BLOCK_S=16, BLOCK_D=64, ROUND=0), 4),
        ("attention reduce rounded trigger first", reduce,
         dict(HEAD_DIM=128, SPLIT_SIZE=64, BLOCK_S=16, BLOCK_D=128, ROUND=1), 4),
        ("gemv rms_norm M=1", row_kernel, dict(row_base, PROLOGUE=1, BLOCK_N=8), 4),
        ("gemv rms_norm M=1 one pass", row_kernel, dict(row_base, PROLOGUE=1, BLOCK_N=8, NORM_MODE=1, K_POW2=4096), 4),
        ("gemv gated M=1", row_kernel,
         dict(row_base, PROLOGUE=0, HAS_RESIDUAL=False, HAS_BIAS=True, BLOCK_N=4, GATED=True), 4),
        ("gemv rms_norm gated M=1 one pass", row_kernel,
         dict(row_base, PROLOGUE=1, BLOCK_N=4, NORM_MODE=1, K_POW2=1024, GATED=True), 4),
        ("gemv norm tail M=1", row_kernel,
         dict(row_base, PROLOGUE=0, HAS_BIAS=True, BLOCK_N=4, NORM_TAIL=True, N_POW2=4096), 4),
        ("gemv add_stats M=1", row_kernel, dict(row_base, PROLOGUE=0, BLOCK_N=4, EPILOGUE=1), 4),
        ("draft_sample", sampled_pick._kernels()[0], dict(BLOCK=2048, ALT=False), 8, {"logits_ptr": "*fp32"}),
        ("draft_sample runner-up", sampled_pick._kernels()[0], dict(BLOCK=2048, ALT=True), 8,
         {"logits_ptr": "*fp32"}),
        ("sampled row stats", sampled_pick._kernels()[1], dict(CHUNK=6144, BLOCK=2048), 4),
        ("sampled accept", sampled_pick._kernels()[2],
         dict(K=5, PARTS=8, CHUNK=6144, BLOCK=2048, ALT=False, CHAIN=False, KP=8), 4,
         {"part_ptr": "*fp32", "out_ptr": "*i64", "count_ptr": "*i32"}),
        ("sampled accept moving the chain", sampled_pick._kernels()[2],
         dict(K=5, PARTS=8, CHUNK=6144, BLOCK=2048, ALT=False, CHAIN=True, KP=8), 4,
         {"part_ptr": "*fp32", "out_ptr": "*i64", "count_ptr": "*i32"}),
        ("sampled accept runners-up", sampled_pick._kernels()[2],
         dict(K=5, PARTS=8, CHUNK=6144, BLOCK=2048, ALT=True, CHAIN=False, KP=8), 4,
         {"part_ptr": "*fp32", "out_ptr": "*i64", "count_ptr": "*i32"}),
        ("sampled residual mass", sampled_pick._kernels()[3], dict(K=5, PARTS=8, CHUNK=6144, BLOCK=2048), 4,
         {"logits_ptr": "*fp32"}),
        ("tree level root", tree_level._kernels(),
         dict(K=4, KP=4, CP=4, ROOT=True, NEXT=True, DEPTH=1, MAPW=3, MAPWP=4, BLOCK=8192, ONE=True, KEYS=False,
              SPLIT=False, FP=1, SP=1), 8,
         _TREE_POINTERS),
        ("tree level", tree_level._kernels(),
         dict(K=3, KP=4, CP=16, ROOT=False, NEXT=True, DEPTH=4, MAPW=3, MAPWP=4, BLOCK=8192, ONE=True, KEYS=False,
              SPLIT=False, FP=1, SP=1), 8,
         {**_TREE_POINTERS, "logits_ptr": "*fp32"}),
        ("tree level last", tree_level._kernels(),
         dict(K=8, KP=8, CP=64, ROOT=False, NEXT=False, DEPTH=1, MAPW=1, MAPWP=1, BLOCK=2048, ONE=False, KEYS=False,
              SPLIT=False, FP=1, SP=1), 4,
         _TREE_POINTERS),
        ("tree level in steps", tree_level._kernels(),
         dict(K=3, KP=4, CP=16, ROOT=False, NEXT=True, DEPTH=4, MAPW=3, MAPWP=4, BLOCK=2048, ONE=False, KEYS=False,
              SPLIT=False, FP=1, SP=1), 4,
         {**_TREE_POINTERS, "logits_ptr": "*fp32"}),
        ("tree level keys", tree_level._kernels(),
         dict(K=6, KP=8, CP=64, ROOT=False, NEXT=True, DEPTH=4, MAPW=6, MAPWP=8, BLOCK=8192, ONE=True, KEYS=True,
              SPLIT=False, FP=1, SP=1), 8,
         {**_TREE_POINTERS, "logits_ptr": "*bf16"}),
        ("tree level split", tree_level._kernels(),
         dict(K=4, KP=4, CP=16, ROOT=False, NEXT=True, DEPTH=6, MAPW=6, MAPWP=8, BLOCK=1024, ONE=True, KEYS=True,
              SPLIT=True, FP=4, SP=16), 4, {**_TREE_POINTERS, "logits_ptr": "*bf16"}),
        ("tree level split root", tree_level._kernels(),
         dict(K=4, KP=4, CP=4, ROOT=True, NEXT=True, DEPTH=1, MAPW=6, MAPWP=8, BLOCK=1024, ONE=True, KEYS=True,
              SPLIT=True, FP=1, SP=8), 4, {**_TREE_POINTERS, "logits_ptr": "*bf16"}),
        ("tree select", tree_level._select_kernel(),
         dict(T=12, CP=32, D=3, W=4, WP=4, TP=16, PASSES=False, BLOCKS=False, RB=32), 4, _SELECT_POINTERS),
        ("tree select passes", tree_level._select_kernel(),
         dict(T=15, CP=512, D=8, W=9, WP=16, TP=16, PASSES=True, BLOCKS=False, RB=32), 4, _SELECT_POINTERS),
        ("tree select blocks", tree_level._select_kernel(),
         dict(T=15, CP=512, D=8, W=9, WP=16, TP=16, PASSES=False, BLOCKS=True, RB=32), 4, _SELECT_POINTERS),
        ("tree lookup", tree_lookup._kernel(),
         dict(N=15, NP=16, L=8, LP=8, GMIN=2, GMAX=4, MP=16, R=9, RP=16, D=8, W=9, WP=16, BLOCK=1024), 4,
         {**_SELECT_POINTERS, "hist_ptr": "*i64", "last_ptr": "*i64", "out_ids_ptr": "*i64"}),
        ("tree lookup 24", tree_lookup._kernel(),
         dict(N=24, NP=32, L=4, LP=4, GMIN=1, GMAX=3, MP=32, R=9, RP=16, D=8, W=9, WP=16, BLOCK=1024), 4,
         {**_SELECT_POINTERS, "hist_ptr": "*i64", "last_ptr": "*i64", "out_ids_ptr": "*i64"}),
        ("tree accept", tree_level._accept_kernel(), dict(D=5, NP=16, DP=8), 1,
         {"choice_ptr": "*i64", "tokens_ptr": "*i64", "parents_ptr": "*i64", "root_ptr": "*i64",
          "count_ptr": "*i64", "src_ptr": "*i64", "dst_ptr": "*i64", "rows_ptr": "*i64", "ext_pos_ptr": "*i64"}),
        ("tree accept sampled", tree_level._sampled_accept_kernel(), dict(D=8, K=4, NP=16, DP=8, KP=4, BLOCK=4096), 8,
         {"probs_ptr": "*fp32", "sums_ptr": "*fp32", "u_ptr": "*fp32", "e_ptr": "*fp32", "tokens_ptr": "*i64",
          "parents_ptr": "*i64", "root_ptr": "*i64", "count_ptr": "*i64", "src_ptr": "*i64", "dst_ptr": "*i64",
          "rows_ptr": "*i64", "ext_pos_ptr": "*i64"}),
        ("move kv rows", kv_rows._kernel(), dict(R=5, RP=8, BLOCK=256), 4,
         {"src_ptr": "*i64", "dst_ptr": "*i64"}),
        ("gemv silu_mul M=16 split", dot_kernel,
         dict(dot_base, PROLOGUE=2, BLOCK_M=16, BLOCK_N=16, SPLIT_K=2, K_PER_SPLIT=512, EVEN_K=True), 4),
        ("gemv M=16 swap_ab", dot_kernel, dict(dot_base, PROLOGUE=0, BLOCK_M=16, BLOCK_N=64, SWAP_AB=True), 4),
        # the batch-invariant packed kernel at the demo's K, on its short-K tile (Q4_1: offsets)
        ("gemv packed Q4_1 M=16 split", packed_gemv._kernel()[0],
         dict(K=576, ONE_BYTE=False, FP8=False, HIGH=0, ZERO=0, G=32, UNIT=0, HAS_OFFSET=True, HAS_BIAS=False,
              DOT_F32=False, MAGIC=True, SPLIT_K=6, K_PER_SPLIT=96, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, SG=1, UG=1,
              PAIRED=False, PF_LINES=1), 2,
         {"q_ptr": "*u8", "qh_ptr": "*u8", "s_ptr": "*fp16", "o_ptr": "*fp16", "su_ptr": "*fp16", "ou_ptr": "*fp16"}),
    ]


def _compile(fn, constexprs: dict, num_warps: int, pdl: bool, pointers: dict | None = None):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    # constexprs a case leaves out take their defaults (not an i32 argument)
    defaults = {p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty}
    consts = {**defaults, **constexprs, "USE_PDL": pdl}
    sig = {}
    for name in fn.arg_names:
        if name in consts:
            sig[name] = "constexpr"
        elif name.endswith("_ptr"):
            sig[name] = {**POINTERS, **(pointers or {})}.get(name, "*bf16")
        else:
            sig[name] = "fp32" if name in FLOATS else "i32"
    options = {"num_warps": num_warps, **({"launch_pdl": True} if pdl else {})}
    return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                          options=options)


KERNEL_CASES = 61  # len(_kernels()): a case added there and not counted here would go untested


def test_every_kernel_case_is_parametrized():
    assert len(_kernels()) == KERNEL_CASES


@pytest.mark.parametrize("index", range(KERNEL_CASES))
def test_kernel_compiles_for_sm90_with_and_without_pdl(index):
    try:
        name, fn, constexprs, warps, *pointers = _kernels()[index]
        on = _compile(fn, constexprs, warps, pdl=True, pointers=pointers[0] if pointers else None)
    except (ImportError, RuntimeError) as e:  # no CUDA backend or ptxas in this Triton build
        if "ptxas" in str(e) or isinstance(e, ImportError):
            pytest.skip(f"Triton cannot compile for CUDA here: {e}")
        raise
    ptx = on.asm["ptx"]
    body = ptx[ptx.index("{", ptx.index(".entry")):]
    first_store = min(i for i in (body.find("st.global"), body.find("atom.")) if i >= 0)
    first_memory = min(i for i in (body.find("ld.global"), first_store) if i >= 0)
    if name.endswith("early") or name in READ_EARLY:  # reads before the wait; nothing is written
        assert 0 <= body.find("ld.global") < body.find("griddepcontrol.wait") < first_store, name
    else:
        assert 0 <= body.find("griddepcontrol.wait") < first_memory, name
    assert "griddepcontrol.launch_dependents" in body and on.asm.get("cubin"), name
    if name.startswith("gemv"):  # the weights' first lines are requested before the wait
        assert 0 <= body.find("prefetch.global.L2") < body.find("griddepcontrol.wait"), name
    trigger, wait = body.find("griddepcontrol.launch_dependents"), body.find("griddepcontrol.wait")
    assert (trigger < wait) == name.endswith("trigger first"), name
    off = _compile(fn, constexprs, warps, pdl=False, pointers=pointers[0] if pointers else None)
    assert "griddepcontrol" not in off.asm["ptx"], name


@pytest.mark.parametrize("pdl", [1, 2])
@pytest.mark.parametrize("two_blocks", [False, True])
@pytest.mark.parametrize("early", [False, True])
def test_one_row_packed_kernel_waits_before_reading_x(pdl, two_blocks, early):
    """The one-row packed kernel with PDL (KernelOptions.packed_row_pdl): its weights' lines
    requested and then the wait before any load; the next kernel launched right after the wait
    (1) or after the last store (2); with PDL off, no grid-dependency instruction. AWQ's
    constants (one block), or AWQ then Q4_K's paired factors (two blocks in one launch). Early
    (packed_row_early_weights): the weights' and factors' loads come before the wait and x's
    after it, the same loads in all."""
    import engine.kernels.packed_gemv as packed_gemv
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    one, two = packed_gemv._row_kernel()
    awq = dict(ZERO=0, G=128, UNIT=0, HAS_OFFSET=True, HIGH=0, ONE_BYTE=False, FP8=False, XQ=True, ASM=True,
               HAS_BIAS=False, X_KIND=0, SPLIT_K=1, K_PER_SPLIT=4096, BLOCK_N=4, BLOCK_K=4096, CHUNK=128, VEC=4,
               SG=1, UG=1, PAIRED=False, PF_LINES=16)
    fn, consts = one, dict(awq)
    types = {"q_ptr": "*u8", "qh_ptr": "*u8", "s_ptr": "*fp16", "o_ptr": "*fp32", "su_ptr": "*fp16",
             "ou_ptr": "*fp16", "part_ptr": "*fp32", "count_ptr": "*i32"}
    if two_blocks:
        q4k = dict(awq, G=32, UNIT=8, CHUNK=32, SG=2, UG=2, PAIRED=True)
        shared = ("ASM", "X_KIND")
        fn = two
        consts.update({f"{k}_b": v for k, v in q4k.items() if k not in shared + ("PF_LINES",)}, TILES_A=8)
        types.update({f"{k[:-4]}_ptr_b": v for k, v in types.items()}, s_ptr_b="*u8", o_ptr_b="*u8")

    def build(mode, early_w=False):
        c = dict(consts, PDL=mode, EARLY_W=int(early_w))
        sig = {name: "constexpr" if name in c else types.get(name, "*bf16" if name.endswith("_ptr") or "_ptr_" in name
                                                             else "i32") for name in fn.arg_names}
        return triton.compile(ASTSource(fn=fn, signature=sig, constexprs=c), target=GPUTarget("cuda", 90, 32),
                              options={"num_warps": 4, **({"launch_pdl": True} if mode else {})})

    try:
        on = build(pdl)
    except (ImportError, RuntimeError) as e:
        if "ptxas" in str(e) or isinstance(e, ImportError):
            pytest.skip(f"Triton cannot compile for CUDA here: {e}")
        raise
    load = "ld.global"

    def entry(ptx):
        return ptx[ptx.index("{", ptx.index(".entry")):]

    if early:
        late, body = entry(on.asm["ptx"]), entry(build(pdl, True).asm["ptx"])
        wait = body.find("griddepcontrol.wait")
        assert 0 <= body.find("prefetch.global.L2") < wait
        assert body.count(load) == late.count(load)
        if two_blocks:  # each block's branch: loads, its wait, more loads
            parts = body.split("griddepcontrol.wait")
            assert len(parts) == 3 and all(p.count(load) > 0 for p in parts)
            return
        # x's loads after the wait (a bf16 x: 32 inputs a thread and block, as words here, where
        # the signature promises no alignment), the weights', their factors' before it
        before, after = body[:wait].count(load), body[wait:].count(load)
        assert 0 < after < before, (before, after)
        assert body[wait:].count("ld.global.b16") == 0  # a 16-bit factor (AWQ's fp16 scales) before it
        return
    ptx = on.asm["ptx"]
    body = entry(ptx)
    wait = body.find("griddepcontrol.wait")
    assert 0 <= body.find("prefetch.global.L2") < wait < body.find(load)
    trigger = body.find("griddepcontrol.launch_dependents")
    if pdl == 1:
        assert wait < trigger < body.find(load)
    else:
        assert body.rfind("st.global") < trigger
    assert "griddepcontrol" not in build(0).asm["ptx"]


def test_packed_gemv_with_pdl_2_launches_the_next_kernel_after_its_stores():
    """packed_gemv's PDL mode 2 (KernelOptions.packed_gemv_pdl): the weights' lines requested, then
    the wait before any load, and the next kernel launched only after the last store."""
    name, fn, constexprs, warps, pointers = _kernels()[KERNEL_CASES - 1]
    assert name.startswith("gemv packed")
    try:
        on = _compile(fn, constexprs, warps, pdl=True, pointers=pointers)
    except (ImportError, RuntimeError) as e:
        if "ptxas" in str(e) or isinstance(e, ImportError):
            pytest.skip(f"Triton cannot compile for CUDA here: {e}")
        raise
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    consts = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.default is not inspect.Parameter.empty},
              **constexprs, "USE_PDL": 2}
    sig = {name: "constexpr" if name in consts else
           ({**POINTERS, **pointers}.get(name, "*bf16") if name.endswith("_ptr") else "i32") for name in fn.arg_names}
    two = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=consts), target=GPUTarget("cuda", 90, 32),
                         options={"num_warps": warps, "launch_pdl": True})
    for compiled, after_stores in ((on, False), (two, True)):
        ptx = compiled.asm["ptx"]
        body = ptx[ptx.index("{", ptx.index(".entry")):]
        wait, trigger = body.find("griddepcontrol.wait"), body.find("griddepcontrol.launch_dependents")
        assert 0 <= body.find("prefetch.global.L2") < wait < body.find("ld.global")
        assert (trigger > body.rfind("st.global")) == after_stores and trigger > wait
