"""SwiGLU activation: silu(gate) * up over a fused [gate | up] projection output."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.kernels import pdl_args

triton = tl = None  # bound by _kernels(): Triton is imported on first use only

_BLOCK = 1024  # output columns per program


@functools.cache
def _kernels():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def silu_and_mul_kernel(gate_up_ptr, out_ptr, inter, stride_in, stride_out, BLOCK: tl.constexpr,
                            USE_PDL: tl.constexpr):
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
        tl.store(out_ptr + row * stride_out + cols, (act * up).to(out_ptr.dtype.element_ty), mask=ok)

    return silu_and_mul_kernel


def silu_and_mul(gate_up: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """gate_up: (T, 2I) = [gate | up], last dim contiguous -> (T, I) in its dtype.

    CUDA (or the Triton interpreter); no host sync.
    """
    assert gate_up.dim() == 2 and gate_up.shape[1] % 2 == 0 and gate_up.stride(1) == 1
    kernel = _kernels()
    num_rows, inter = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty((num_rows, inter), dtype=gate_up.dtype, device=gate_up.device)
    kernel[(num_rows, -(-inter // _BLOCK))](
        gate_up, out, inter, gate_up.stride(0), out.stride(0), BLOCK=_BLOCK, num_warps=4,
        **pdl_args(gate_up.device, pdl),
    )
    return out


def silu_and_mul_ref(gate_up: torch.Tensor) -> torch.Tensor:
    """Reference and CPU path."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up
