"""SwiGLU activation: silu(gate) * up over a fused [gate | up] projection output."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.kernels import pdl_args

triton = tl = store_rounded = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 1024  # output columns per program


@functools.cache
def _kernels():
    global triton, tl, store_rounded
    import triton
    import triton.language as tl

    from engine.kernels.rounded_x import store_helper

    store_rounded = store_helper()

    @triton.jit
    def silu_and_mul_kernel(gate_up_ptr, out_ptr, words_ptr, scales_ptr, inter, stride_in, stride_out,
                            BLOCK: tl.constexpr, USE_PDL: tl.constexpr, ROUND: tl.constexpr = 0):
        # ROUND (one row): the output also rounded to int8 for the down projection
        # (rounded_x.RoundedX; 1: the nibbles' word order, 2: int8's)
        if USE_PDL:  # wait for the previous kernel's writes, then let the next one launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row = tl.program_id(0)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        ok = cols < inter
        gate = tl.load(gate_up_ptr + row * stride_in + cols, mask=ok, other=0.0).to(tl.float32)
        up = tl.load(gate_up_ptr + row * stride_in + inter + cols, mask=ok, other=0.0).to(tl.float32)
        # silu rounded to the output dtype before the product, as `F.silu(gate) * up` does.
        act = (gate * tl.sigmoid(gate)).to(out_ptr.dtype.element_ty).to(tl.float32)
        y = (act * up).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_out + cols, y, mask=ok)
        if ROUND > 0:
            v = tl.program_id(1) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
            store_rounded(tl.reshape(y.to(tl.float32), (BLOCK // 32, 32)), v, v < inter // 32, words_ptr,
                          scales_ptr, BLOCK // 32, ROUND == 1)

    return silu_and_mul_kernel


def silu_and_mul(gate_up: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """gate_up: (T, 2I) = [gate | up], last dim contiguous -> (T, I) in its dtype.

    CUDA (or the Triton interpreter); no host sync.
    """
    return _silu_and_mul(gate_up, pdl, None)[0]


def silu_and_mul_rounded(gate_up: torch.Tensor, nibble_order: bool, pdl: bool = True):
    """silu_and_mul of one row, which also hands the down projection its input rounded to int8
    (rounded_x.RoundedX in `nibble_order`) in the same launch: -> (act, rounded). The
    intermediate size must be a multiple of 32."""
    return _silu_and_mul(gate_up, pdl, nibble_order)


def _silu_and_mul(gate_up, pdl, nibble_order):
    from engine.kernels.rounded_x import rounded_args

    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and gate_up.stride(1) == 1
    kernel = _kernels()
    num_rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((num_rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    rounded, words, scales, round_code = rounded_args(out, nibble_order)
    kernel[(num_rows, -(-inter // _BLOCK))](
        gate_up, out, words, scales, inter, gate_up.stride(0), out.stride(0), BLOCK=_BLOCK, num_warps=4,
        **pdl_args(gate_up.device, pdl), ROUND=round_code,
    )
    return out, rounded


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference and CPU path."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
