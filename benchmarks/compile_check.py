"""Compiles the gemv and single-launch attention kernels for sm_90 on a machine without a GPU.

Uses Triton's bundled ptxas; pointers and strides are marked 16-divisible as the JIT
specializes them at run time, so the PTX shows the vector widths the GPU will get.

    python benchmarks/compile_check.py  # prints one line per variant; exits 1 on a failure
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engine.kernels import gemv, next_pow2  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)


def compile_one(kern, sig: dict, consts: dict, divisible: list[str], num_warps: int, num_stages: int):
    names = kern.arg_names
    sig = {**sig, **{k: "constexpr" for k in consts}}
    src = ASTSource(fn=kern, signature=sig, constexprs={(names.index(k),): v for k, v in consts.items()},
                    attrs={(names.index(a),): [["tt.divisibility", 16]] for a in divisible})
    return triton.compile(src, target=TARGET, options=dict(num_warps=num_warps, num_stages=num_stages))


def gemv_variants():
    from engine.routing import invariant_tile, row_tile

    row_kernel, dot_kernel = gemv._kernels()
    ptrs = ["x_ptr", "res_ptr", "nw_ptr", "new_res_ptr", "w_ptr", "bias_ptr", "out_ptr"]
    ints = ["num_rows", "N", "K", "stride_x", "stride_res", "stride_new_res", "stride_w", "stride_out"]
    sig = {**{p: "*bf16" for p in ptrs}, "part_ptr": "*fp32", "count_ptr": "*i32", **{i: "i32" for i in ints},
           "eps": "fp32"}
    divisible = ptrs + ["part_ptr", "count_ptr"] + ints[1:]
    dot_sig = {**sig, "sq_ptr": "*fp32", "num_sq": "i32", "stride_sq": "i32"}
    row_sig = {**sig, "sq_ptr": "*fp32", "stride_sq": "i32"}
    for m in (1, 16):  # the one-row kernel; the tensor-core kernel on its invariant tile (any M up to 16)
        for n, k in [(6144, 4096), (4096, 4096), (4096, 14336), (28672, 4096), (128256, 4096),
                     (960, 576), (576, 576), (3072, 576), (576, 1536)]:
            # the invariant tile's epilogues (gemv_add_stats, gemv_rstd) after a plain prologue
            # and gemv_rstd's gated form (gate_up with the activation after its dot)
            # (the one-row kernel: ADD_STATS, gemv_add_stats each_row)
            epilogues = [(gemv.NONE, gemv.ADD_STATS), (gemv.NONE, gemv.RSTD)] if m == 16 else [(gemv.NONE, gemv.ADD_STATS)]
            gates = [(gemv.NONE, gemv.RSTD, True)] if m == 16 and n in (28672, 3072) else []
            for prologue, epilogue, gate in ([(p, gemv.NONE, False) for p in (gemv.NONE, gemv.RMS_NORM, gemv.SILU_MUL)]
                                             + [(p, e, False) for p, e in epilogues] + gates):
                cfg = gemv.default_config(1, n, k) if m == 1 else invariant_tile((n, k))
                if m == 1 and epilogue == gemv.ADD_STATS:
                    cfg = row_tile(k)
                k_per_split = -(-(-(-k // cfg.split_k)) // cfg.block_k) * cfg.block_k
                consts = dict(PROLOGUE=prologue, HAS_RESIDUAL=prologue == gemv.RMS_NORM, HAS_BIAS=False,
                              SPLIT_K=cfg.split_k, K_PER_SPLIT=k_per_split, EVEN_K=k_per_split * cfg.split_k == k,
                              BLOCK_K=cfg.block_k, USE_PDL=True, LINE=64, PREFETCH_LINES=gemv.PREFETCH_LINES)
                if m == 1:
                    kern = row_kernel
                    consts |= dict(BLOCK_N=cfg.block_n, NORM_MODE=gemv.norm_mode(1, k) if prologue else gemv.LOOP,
                                   K_POW2=next_pow2(k), GATED=False, NORM_TAIL=False, N_POW2=1, EPILOGUE=epilogue,
                                   HAS_RESIDUAL=prologue == gemv.RMS_NORM or epilogue == gemv.ADD_STATS)
                else:
                    kern = dot_kernel
                    consts |= dict(BLOCK_M=16, BLOCK_N=max(16, cfg.block_n), DOT_F32=False, SWAP_AB=cfg.swap_ab,
                                   EPILOGUE=epilogue, SQ_POW2=64 if epilogue == gemv.RSTD else 1, GATE=gate,
                                   HAS_RESIDUAL=prologue == gemv.RMS_NORM or epilogue == gemv.ADD_STATS)
                yield f"gemv M={m} N={n} K={k} prologue={prologue} epilogue={epilogue} gate={gate} {cfg}", kern, \
                    row_sig if m == 1 else dot_sig, consts, divisible, cfg.num_warps, cfg.num_stages


def main() -> None:
    failed = 0
    for variant in gemv_variants():
        name, *rest = variant
        try:
            ptx = compile_one(*rest).asm["ptx"]
            vec = len(re.findall(r"ld\.global(\.\w+)*\.v4", ptx))
            print(f"ok   {name}  v4 loads={vec} cp.async={ptx.count('cp.async.cg')}", flush=True)
        except Exception as exc:  # noqa: BLE001 - report every variant
            failed += 1
            print(f"FAIL {name}: {type(exc).__name__}: {str(exc)[:500]}", flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
