"""Rotary position embedding of q and k, fused with writing k and v into the KV cache.

cos_sin_cache: (max_pos, D) fp32, row p = [cos(p * inv_freq) | sin(p * inv_freq)], i.e.
cos in the first D/2 columns and sin in the last D/2 (inv_freq already scaled, e.g. by
`llama3` RoPE scaling). Rotation is the neox / HF Llama half-split style:
out = x * cos + rotate_half(x) * sin, with rotate_half(x) = [-x2 | x1]. It is computed in
fp32 and rounded once (HF rounds cos/sin to the model dtype first: bf16 results may
differ from HF's by an ulp).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = rotate = rotate_rows = None  # bound by _kernels(): Triton is imported on first use only


def _check(q, k, v, cos_sin_cache, positions, k_cache, v_cache) -> None:
    assert q.dim() == 3 and k.dim() == 3 and k.shape == v.shape
    assert q.shape[0] == k.shape[0] == positions.shape[0] and q.shape[2] == k.shape[2]
    assert cos_sin_cache.dim() == 2 and cos_sin_cache.shape[1] == q.shape[2]
    assert k_cache.shape[1:] == k.shape[1:] and v_cache.shape == k_cache.shape
    assert q.shape[2] % 2 == 0


@functools.cache
def _kernels():
    # Kernels and the jit helper they call are module globals: Triton resolves names there.
    global triton, tl, rotate, rotate_rows
    import triton
    import triton.language as tl

    @triton.jit
    def rotate(x, partner, cos, signed_sin):
        """One rotated element: x * cos + partner * signed_sin, fp32, one explicit FMA, so every
        kernel that rotates (here, and attention's fused decode step) rounds alike. First half:
        partner = x2, signed_sin = -sin; second half: partner = x1, signed_sin = sin."""
        return tl.fma(x, cos, partner * signed_sin)

    @triton.jit
    def rotate_rows(src_ptr, dst_ptr, stride_src_h, stride_dst_h, num_heads, cos, sin, offs_d, d_ok,
                    HALF: tl.constexpr, BLOCK_H: tl.constexpr):
        # Rotates num_heads rows of one token: src/dst point at the token's head 0.
        offs_h = tl.arange(0, BLOCK_H)
        mask = (offs_h < num_heads)[:, None] & d_ok[None, :]
        src = src_ptr + offs_h[:, None] * stride_src_h + offs_d[None, :]
        dst = dst_ptr + offs_h[:, None] * stride_dst_h + offs_d[None, :]
        x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)  # (BLOCK_H, BLOCK_HALF)
        x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
        out_ty = dst_ptr.dtype.element_ty
        tl.store(dst, rotate(x1, x2, cos[None, :], -sin[None, :]).to(out_ty), mask=mask)
        tl.store(dst + HALF, rotate(x2, x1, cos[None, :], sin[None, :]).to(out_ty), mask=mask)

    @triton.jit
    def rope_and_cache_kernel(
        q_ptr, k_ptr, v_ptr, cos_sin_ptr, pos_ptr, slot_ptr, q_out_ptr, k_cache_ptr, v_cache_ptr,
        num_q_heads, num_kv_heads,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_qo_t, stride_qo_h,
        stride_kc_t, stride_kc_h, stride_vc_t, stride_vc_h, stride_cs,
        HEAD_DIM: tl.constexpr, HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HKV: tl.constexpr,
        BLOCK_HALF: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr,
    ):
        # Positions and slots are written before the step's projection that precedes this kernel,
        # and the table never: they are read before the PDL wait, which only q, k and v need.
        t = tl.program_id(0)
        pos = tl.load(pos_ptr + t).to(tl.int64)
        row = tl.load(slot_ptr + t).to(tl.int64)  # the cache row: pos, or the row's own slot
        offs_d = tl.arange(0, BLOCK_HALF)
        d_ok = offs_d < HALF
        cos = tl.load(cos_sin_ptr + pos * stride_cs + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        sin = tl.load(cos_sin_ptr + pos * stride_cs + HALF + offs_d, mask=d_ok, other=0.0).to(tl.float32)
        if USE_PDL:  # wait for the previous kernel's writes, then let the next one launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        rotate_rows(q_ptr + t * stride_qt, q_out_ptr + t * stride_qo_t, stride_qh, stride_qo_h,
                    num_q_heads, cos, sin, offs_d, d_ok, HALF, BLOCK_HQ)
        rotate_rows(k_ptr + t * stride_kt, k_cache_ptr + row * stride_kc_t, stride_kh, stride_kc_h,
                    num_kv_heads, cos, sin, offs_d, d_ok, HALF, BLOCK_HKV)
        offs_h = tl.arange(0, BLOCK_HKV)
        offs_v = tl.arange(0, BLOCK_D)
        mask = (offs_h < num_kv_heads)[:, None] & (offs_v < HEAD_DIM)[None, :]
        v = tl.load(v_ptr + t * stride_vt + offs_h[:, None] * stride_vh + offs_v[None, :], mask=mask)
        tl.store(v_cache_ptr + row * stride_vc_t + offs_h[:, None] * stride_vc_h + offs_v[None, :],
                 v.to(v_cache_ptr.dtype.element_ty), mask=mask)

    return rope_and_cache_kernel


def rotate_helper():
    """The jit helper both RoPE kernels call (bound once this module's kernels are built)."""
    _kernels()
    return rotate


def rope_and_cache(
    q: torch.Tensor,  # (T, Hq, D), last dim contiguous (may be a view of a fused qkv)
    k: torch.Tensor,  # (T, Hkv, D)
    v: torch.Tensor,  # (T, Hkv, D)
    cos_sin_cache: torch.Tensor,  # (max_pos, D) fp32: [cos | sin], see the module docstring
    positions: torch.Tensor,  # (T,) int32/int64, each < min(max_pos, S_max)
    k_cache: torch.Tensor,  # (S_max, Hkv, D), written at rows `positions` (rotated k)
    v_cache: torch.Tensor,  # (S_max, Hkv, D), written at rows `positions` (v as is)
    slots: torch.Tensor | None = None,  # (T,): write at these cache rows instead of `positions`
    pdl: bool = True,  # programmatic dependent launch (KernelOptions.pdl)
) -> torch.Tensor:
    """Returns the rotated q, a new (T, Hq, D) tensor in q's dtype; q and k are untouched.

    CUDA (or the Triton interpreter); no host sync; one program per token.
    """
    _check(q, k, v, cos_sin_cache, positions, k_cache, v_cache)
    for x in (q, k, v, cos_sin_cache, k_cache, v_cache):
        assert x.stride(-1) == 1
    kernel = _kernels()
    num_rows, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    q_out = torch.empty((num_rows, num_q_heads, head_dim), dtype=q.dtype, device=q.device)
    kernel[(num_rows,)](
        q, k, v, cos_sin_cache, positions, positions if slots is None else slots, q_out, k_cache, v_cache,
        num_q_heads, num_kv_heads,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        q_out.stride(0), q_out.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        cos_sin_cache.stride(0),
        HEAD_DIM=head_dim, HALF=head_dim // 2, BLOCK_HQ=next_pow2(num_q_heads), BLOCK_HKV=next_pow2(num_kv_heads),
        BLOCK_HALF=next_pow2(head_dim // 2), BLOCK_D=next_pow2(head_dim),
        num_warps=4, **pdl_args(q.device, pdl),
    )
    return q_out


def rope_and_cache_ref(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cos_sin_cache: torch.Tensor,
    positions: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference and CPU path; same contract. Index writes, no host sync."""
    _check(q, k, v, cos_sin_cache, positions, k_cache, v_cache)
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)  # (T, D/2) each
    cos, sin = cos[:, None, :], sin[:, None, :]

    def rotate(x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.float().chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    rows = positions if slots is None else slots
    k_cache[rows] = rotate(k).to(k_cache.dtype)
    v_cache[rows] = v.to(v_cache.dtype)
    return rotate(q).to(q.dtype)
