"""Fused residual add + RMSNorm over rows of hidden states, Llama convention."""

from __future__ import annotations

import functools

import torch

from . import next_pow2, pdl_args

triton = tl = None  # bound by _kernels(): Triton is imported on first use only


@functools.cache
def _kernels():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def add_rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr,
        hidden, stride_x, stride_res, stride_out, stride_new_res, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        if USE_PDL:  # wait for the previous kernel's writes, then let the next one launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        ok = offs < hidden
        x = tl.load(x_ptr + row * stride_x + offs, mask=ok, other=0.0)
        if HAS_RESIDUAL:
            res = tl.load(res_ptr + row * stride_res + offs, mask=ok, other=0.0)
            # Rounded to x's dtype like the model's `x + residual`, then normed from there.
            h = (x.to(tl.float32) + res.to(tl.float32)).to(x.dtype)
            tl.store(new_res_ptr + row * stride_new_res + offs, h, mask=ok)
        else:
            h = x
        hf = h.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(hf * hf, axis=0) / hidden + eps)
        w = tl.load(w_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        normed = (hf * inv_rms).to(x.dtype).to(tl.float32)  # HF casts before the weight
        tl.store(out_ptr + row * stride_out + offs, (normed * w).to(out_ptr.dtype.element_ty), mask=ok)

    return add_rms_norm_kernel


def add_rms_norm(
    x: torch.Tensor,  # (T, H), last dim contiguous
    residual: torch.Tensor | None,  # (T, H) like x, or None for the first layer
    weight: torch.Tensor,  # (H,)
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual), both (T, H) in x's dtype.

    new_residual = x + residual (rounded to x's dtype), or x itself when residual is None;
    normed = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(dtype) * weight.
    CUDA (or the Triton interpreter); no host sync; one program per row.
    """
    assert x.dim() == 2 and x.stride(1) == 1 and weight.shape == (x.shape[1],)
    kernel = _kernels()
    num_rows, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is None:
        res = new_res = x  # unused by the kernel
    else:
        assert residual.shape == x.shape and residual.stride(1) == 1
        res, new_res = residual, torch.empty_like(out)
    block = next_pow2(hidden)
    kernel[(num_rows,)](
        x, res, weight, out, new_res,
        hidden, x.stride(0), res.stride(0), out.stride(0), new_res.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(16, max(4, block // 256)), **pdl_args(x.device),
    )
    return out, new_res


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference and CPU path: the Llama formula in plain torch."""
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return (normed * weight).to(x.dtype), h
