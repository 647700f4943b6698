"""Single-launch decode/verify attention: flash-decoding whose splits merge in the same kernel.

Same contract as engine.kernels.attention.decode_attention. The grid is fixed per shape,
(kv heads, NUM_SPLITS programs each), and the cache rows 0..max(positions) are cut into
NUM_SPLITS equal chunks inside the kernel, so every program gets the same share at any
context length and the merge always covers at most NUM_SPLITS partials. Each program
writes its fp32 partial (output, log-sum-exp) and bumps its kv head's counter; the last
one to arrive merges the partials of every query row of that kv head, writes the output
and resets the counter. No host sync, grid independent of the positions' values, no
memset: safe to capture in a CUDA graph. Calls sharing the counters must not run
concurrently on different streams.
"""

from __future__ import annotations

import functools
import math

import torch

from . import next_pow2, triton_interpreting
from .attention import _check, decode_attention_ref

triton = tl = None  # bound by _kernels(): Triton is imported on first use only

_MAX_KV_HEADS = 1024  # counters per device


def _num_splits(num_kv_heads: int, max_seq_len: int, block_n: int, num_sms: int) -> int:
    # About one program per SM over all kv heads; a power of two (the merge tile's width).
    per_head = max(1, num_sms // num_kv_heads)
    return max(1, min(64, 1 << (per_head.bit_length() - 1), next_pow2(-(-max_seq_len // block_n))))


@functools.cache
def _counters(device: torch.device) -> torch.Tensor:
    return torch.zeros(_MAX_KV_HEADS, dtype=torch.int32, device=device)


@functools.cache
def _num_sms(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 132


@functools.cache
def _kernels():
    global triton, tl
    import triton
    import triton.language as tl

    @triton.jit
    def fused_kernel(
        q_ptr, k_ptr, v_ptr, pos_ptr, part_o_ptr, part_lse_ptr, out_ptr, count_ptr,
        num_rows, stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
        qk_scale,  # scale * log2(e): the softmax runs in base 2
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, NUM_SPLITS: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        MERGE_ROWS: tl.constexpr, DOT_F32: tl.constexpr,
    ):
        kv_head = tl.program_id(0)
        split = tl.program_id(1)
        num_heads = tl.num_programs(0) * GROUP
        # Program row r is query row t = r // GROUP of q head kv_head * GROUP + r % GROUP.
        offs_m = tl.arange(0, BLOCK_M)
        t = offs_m // GROUP
        head = kv_head * GROUP + offs_m % GROUP
        row_ok = t < num_rows
        pos = tl.load(pos_ptr + t, mask=row_ok, other=-1).to(tl.int32)  # padded rows see no key
        kv_len = tl.max(pos, axis=0) + 1
        chunk = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
        num_active = tl.cdiv(kv_len, chunk)  # programs past it have no rows and do not count
        start = split * chunk
        end = tl.minimum(start + chunk, kv_len)
        if start < end:
            offs_d = tl.arange(0, BLOCK_D)
            d_ok = offs_d < HEAD_DIM
            q = tl.load(
                q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh + offs_d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0,
            )  # (BLOCK_M, BLOCK_D)
            if DOT_F32:
                q = q.to(tl.float32)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            for n0 in range(start, end, BLOCK_N):
                offs_n = n0 + tl.arange(0, BLOCK_N)
                kv_mask = (offs_n < end)[:, None] & d_ok[None, :]
                k = tl.load(k_ptr + offs_n[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                            mask=kv_mask, other=0.0)  # (BLOCK_N, BLOCK_D)
                v = tl.load(v_ptr + offs_n[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                            mask=kv_mask, other=0.0)
                if DOT_F32:
                    s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
                else:
                    s = tl.dot(q, tl.trans(k))
                s = tl.where(offs_n[None, :] <= pos[:, None], s * qk_scale, float("-inf"))
                m_new = tl.maximum(m_i, tl.max(s, axis=1))
                m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
                alpha = tl.exp2(m_i - m_safe)
                p = tl.exp2(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
                l_i = l_i * alpha + tl.sum(p, axis=1)
                if DOT_F32:
                    pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
                else:
                    pv = tl.dot(p.to(v.dtype), v)
                acc = acc * alpha[:, None] + pv
                m_i = m_new
            has_key = l_i > 0.0  # rows whose position is below this chunk hold no key
            l_safe = tl.where(has_key, l_i, 1.0)
            lse = tl.where(has_key, m_i + tl.log2(l_safe), float("-inf"))
            # part_o: (T, Hq, NUM_SPLITS, HEAD_DIM) fp32; part_lse: (T, Hq, NUM_SPLITS)
            slot = (t * num_heads + head) * NUM_SPLITS + split
            tl.store(part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :], acc / l_safe[:, None],
                     mask=row_ok[:, None] & d_ok[None, :])
            tl.store(part_lse_ptr + slot, lse, mask=row_ok)
            tl.debug_barrier()  # every thread's partial is written before the counter moves
            arrived = tl.atomic_add(count_ptr + kv_head, 1, sem="acq_rel", scope="gpu")
            if arrived == num_active - 1:  # the last program of this kv head merges
                tl.debug_barrier()
                # (MERGE_ROWS, NUM_SPLITS, BLOCK_D) tiles: every split of a few rows at once.
                offs_r = tl.arange(0, MERGE_ROWS)
                offs_s = tl.arange(0, NUM_SPLITS)
                s_ok = offs_s < num_active
                for r0 in range(0, num_rows * GROUP, MERGE_ROWS):
                    r = r0 + offs_r
                    r_ok = r < num_rows * GROUP
                    rt = r // GROUP
                    rh = kv_head * GROUP + r % GROUP
                    base = (rt * num_heads + rh) * NUM_SPLITS  # (MERGE_ROWS,)
                    lse_ok = r_ok[:, None] & s_ok[None, :]
                    lse_all = tl.load(part_lse_ptr + base[:, None] + offs_s[None, :], mask=lse_ok,
                                      other=float("-inf"), cache_modifier=".cg")  # (R, S)
                    o_all = tl.load(
                        part_o_ptr + (base[:, None, None] + offs_s[None, :, None]) * HEAD_DIM
                        + offs_d[None, None, :],
                        mask=lse_ok[:, :, None] & d_ok[None, None, :], other=0.0, cache_modifier=".cg",
                    )  # (R, S, BLOCK_D)
                    m_all = tl.max(lse_all, axis=1)  # finite for real rows: chunk 0 holds key 0
                    m_all = tl.where(r_ok, m_all, 0.0)
                    w = tl.exp2(lse_all - m_all[:, None])  # 0 for masked splits
                    merged = tl.sum(w[:, :, None] * o_all, axis=1) / tl.sum(w, axis=1)[:, None]
                    tl.store(out_ptr + rt[:, None] * stride_ot + rh[:, None] * stride_oh + offs_d[None, :],
                             merged.to(out_ptr.dtype.element_ty), mask=r_ok[:, None] & d_ok[None, :])
                tl.atomic_xchg(count_ptr + kv_head, 0)  # ready for the next launch

    return fused_kernel


def decode_attention_fused(
    q: torch.Tensor,  # (T, Hq, D), last dim contiguous
    k_cache: torch.Tensor,  # (S_max, Hkv, D), holds the new rows already
    v_cache: torch.Tensor,  # (S_max, Hkv, D)
    positions: torch.Tensor,  # (T,) int32/int64 on q's device; row t sees cache rows 0..positions[t]
    scale: float,
) -> torch.Tensor:
    """Causal-by-position GQA attention, (T, Hq, D) in q's dtype, fp32 accumulation, one launch.

    CUDA (or the Triton interpreter). No host sync; graph-capturable. Allocates fp32
    partials of (T, Hq, num_splits, D) from the caching allocator on each call.
    """
    _check(q, k_cache, v_cache, positions)
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    kernel = _kernels()
    num_rows, num_heads, head_dim = q.shape
    max_seq_len, num_kv_heads, _ = k_cache.shape
    assert num_kv_heads <= _MAX_KV_HEADS
    group = num_heads // num_kv_heads
    block_n = 64
    block_d = max(16, next_pow2(head_dim))
    num_splits = _num_splits(num_kv_heads, max_seq_len, block_n, _num_sms(q.device))
    part_o = torch.empty((num_rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((num_rows, num_heads, num_splits), dtype=torch.float32, device=q.device)
    out = torch.empty((num_rows, num_heads, head_dim), dtype=q.dtype, device=q.device)
    block_m = max(16, next_pow2(num_rows * group))  # tl.dot needs >= 16 rows
    # Merge tiles of ~8K fp32 elements: a few rows of every split at once.
    merge_rows = max(1, min(next_pow2(num_rows * group), 8192 // (num_splits * block_d)))
    dot_f32 = q.dtype == torch.float32 or triton_interpreting()
    kernel[(num_kv_heads, num_splits)](
        q, k_cache, v_cache, positions, part_o, part_lse, out, _counters(q.device),
        num_rows, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1), out.stride(0), out.stride(1),
        scale * math.log2(math.e),
        GROUP=group, HEAD_DIM=head_dim, NUM_SPLITS=num_splits,
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, MERGE_ROWS=merge_rows, DOT_F32=dot_f32,
        num_warps=4 if block_m <= 32 else 8,
        num_stages=1 if dot_f32 else 2,
    )
    return out


decode_attention_fused_ref = decode_attention_ref  # the reference of the same contract
