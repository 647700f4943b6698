"""Decode and verify attention of T = 1..16 new query rows over one layer's static KV cache.

Fast path: flash-decoding. The cache is cut into splits of `split_size` rows; a split kernel
runs a fixed number of programs per kv head (_split_programs), each taking every such
program-th split, and for each split every q head of its GQA group and every query row at once
(T * group rows), so K and V are read once per kv head. A reduce kernel merges the splits with
their log-sum-exp. The grid depends on S_max only, never on the positions' values, and nothing
syncs with the host: safe to capture in a CUDA graph. Splits past the largest position are
skipped, so the cost follows the filled length.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from engine.kernels import next_pow2, num_sms, pdl_args, triton_interpreting
from engine.kernels.gemv import MAX_TREE_ROWS
from engine.kernels.rounded_x import empty_rounded

# bound by _kernels(): Triton is imported on first use only
triton = tl = kv_block = attend_block = rotate = round_vectors = None


def _split_size(max_seq_len: int) -> int:
    # Cache rows per split program. Small splits keep ~100 programs busy at a few hundred
    # tokens on 8 kv heads; past 8192 rows larger splits bound the partial buffers
    # (T, Hq, num_splits, D) fp32 and the number of idle programs in the fixed grid.
    return 64 if max_seq_len <= 8192 else 128


def _split_programs(num_splits: int, num_kv_heads: int, num_sms: int, rows: int = 1) -> int:
    # Programs per kv head, each taking every stride-th split: about one wave over the SMs, at least
    # 16 (the 8B at 768 positions fills 12 splits of 64 per kv head), so that the grid, and the
    # idle programs in it, do not grow with the cache's capacity, only a long context's loop does.
    # rows > 1 (per-token programs for each of a verify step's rows): the rows share about two
    # waves, at least 4 programs a row. Most of a short context's programs find no split to read
    # and still cost their launch: with the one-row count for every row, each row of a demo
    # verify step added about 0.66 us a layer. A split's partial does not depend on which program
    # reads it, so the rows keep the one-row step's bits.
    if rows == 1:
        return min(num_splits, max(16, -(-num_sms // num_kv_heads)))
    return min(num_splits, max(4, -(-2 * num_sms // (num_kv_heads * rows))))


def _check(q, k_cache, v_cache, positions) -> None:
    assert q.dim() == 3 and k_cache.dim() == 3 and k_cache.shape == v_cache.shape
    assert q.shape[2] == k_cache.shape[2] and q.shape[1] % k_cache.shape[1] == 0
    assert positions.shape == (q.shape[0],)
    assert q.dtype == k_cache.dtype == v_cache.dtype


@functools.cache
def _kernels():
    # module globals: the kernels call the helpers by name
    global triton, tl, kv_block, attend_block, rotate, round_vectors
    import triton
    import triton.language as tl

    from engine.kernels.rope import rotate_helper
    from engine.kernels.rounded_x import round_helper

    rotate = rotate_helper()
    round_vectors = round_helper()

    @triton.jit
    def kv_block(k_ptr, v_ptr, n0, end, kv_head, stride_kt, stride_kh, stride_vt, stride_vh,
                 map_row, map_base, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HEAD_DIM: tl.constexpr,
                 MAP_W: tl.constexpr):
        """Positions n0 .. n0 + BLOCK_N (those below end) of kv_head: (K, V), each (BLOCK_N, BLOCK_D).
        A position is its cache row, except (MAP_W) positions map_base .. map_base + MAP_W - 1,
        whose rows map_row lists (a tree node's ancestors)."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        kv_mask = (offs_n < end)[:, None] & (offs_d < HEAD_DIM)[None, :]
        if MAP_W > 0:
            mapped = (offs_n >= map_base) & (offs_n < map_base + MAP_W) & (offs_n < end)
            rows = tl.where(mapped, tl.load(map_row + (offs_n - map_base), mask=mapped, other=0), offs_n)
        else:
            rows = offs_n
        k = tl.load(k_ptr + rows[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :], mask=kv_mask, other=0.0)
        v = tl.load(v_ptr + rows[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :], mask=kv_mask, other=0.0)
        return k, v

    @triton.jit
    def attend_block(q, k, v, n0, pos, m_i, l_i, acc, qk_scale, BLOCK_N: tl.constexpr, DOT_F32: tl.constexpr):
        """The online softmax over one block of keys (rows n0 ..): returns the new (m_i, l_i, acc)."""
        offs_n = n0 + tl.arange(0, BLOCK_N)
        if DOT_F32:
            s = tl.dot(q, tl.trans(k.to(tl.float32)), input_precision="ieee")
        else:
            s = tl.dot(q, tl.trans(k))
        s = tl.where(offs_n[None, :] < pos[:, None], s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])  # (BLOCK_M, BLOCK_N)
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if DOT_F32:
            pv = tl.dot(p, v.to(tl.float32), input_precision="ieee")
        else:
            pv = tl.dot(p.to(v.dtype), v)
        return m_new, l_i, acc * alpha[:, None] + pv

    @triton.jit
    def split_kernel(
        q_ptr, k_ptr, v_ptr, pos_ptr, own_ptr, part_o_ptr, part_lse_ptr,
        k_new_ptr, v_new_ptr, cos_sin_ptr,  # FUSE_ROPE: the step's unrotated k and v, the RoPE table
        q_rot_ptr, stride_qrt, stride_qrh,  # the rotated q: q itself, or (FUSE_ROPE) where it is written
        map_ptr, map_base_ptr, stride_mb,  # MAP_W: (T, MAP_W) cache rows of positions map_base[t] .., (T,) map_base
        num_rows, num_splits,
        stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
        stride_kn_t, stride_knh, stride_vn_t, stride_vnh, stride_cs,
        qk_scale,  # scale * log2(e): the softmax runs in base 2
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, SPLIT_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
        DOT_F32: tl.constexpr, USE_PDL: tl.constexpr, EARLY_KV: tl.constexpr, FUSE_ROPE: tl.constexpr,
        PER_TOKEN: tl.constexpr, MAP_W: tl.constexpr, ROPE_ROWS: tl.constexpr,
    ):
        # ROPE_ROWS (FUSE_ROPE): a power of two >= num_rows; above 1, a verify step's rows
        kv_head = tl.program_id(0)
        first = tl.program_id(1)  # this program's splits: first, first + stride, ... (num_splits in all)
        stride = tl.num_programs(1)
        num_heads = tl.num_programs(0) * GROUP
        # Program row r is query row t = r // GROUP of q head kv_head * GROUP + r % GROUP.
        offs_m = tl.arange(0, BLOCK_M)
        head = kv_head * GROUP + offs_m % GROUP
        if PER_TOKEN:  # one query row a program along the grid's third axis: the one-row tile for every row
            t = tl.program_id(2) + offs_m // GROUP
            row_ok = (offs_m < GROUP) & (t < num_rows)
        else:
            t = offs_m // GROUP
            row_ok = t < num_rows
        start = first * SPLIT_SIZE
        if USE_PDL and not EARLY_KV:  # wait for the previous kernel's writes, then let the next one launch
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        # MAP_W (PER_TOKEN: one query row a program): this row's map of positions to cache rows (a
        # kernel of this step writes it: read after the wait; a map never comes with EARLY_KV)
        map_t = 0
        if PER_TOKEN:
            map_t = tl.program_id(2)
        map_row = map_ptr + map_t * MAP_W
        map_base = 0
        if MAP_W > 0:
            map_base = tl.load(map_base_ptr + map_t * stride_mb).to(tl.int32)
        # EARLY_KV, one query row (a decode step): the cache rows its tile reads, below its position,
        # were written by earlier steps, and the positions before this step's first kernel; only the
        # kernel just before (RoPE + cache write: q and the row's own K/V) may still run. So the
        # first block of K/V is requested before the PDL wait, overlapping it.
        pos = tl.load(pos_ptr + t, mask=row_ok, other=-1).to(tl.int32)  # padded rows see no key
        own_slot = tl.load(own_ptr + t, mask=row_ok, other=0).to(tl.int64)  # where the row's own K/V is
        pos_max = tl.max(pos, axis=0)
        end = tl.minimum(start + SPLIT_SIZE, pos_max + 1)
        # Rows below every position only: no row's dot reads pos_max (own keys come separately, below).
        # Several rows with their RoPE here (ROPE_ROWS > 1): the block holds keys this kernel
        # writes first, so it is read after those writes (below).
        if ROPE_ROWS <= 1:
            k0, v0 = kv_block(k_ptr, v_ptr, start, tl.minimum(end, pos_max), kv_head, stride_kt, stride_kh,
                              stride_vt, stride_vh, map_row, map_base, BLOCK_N, BLOCK_D, HEAD_DIM, MAP_W)
        if FUSE_ROPE:  # cos | sin arranged for `rotate` along the whole head
            offs_r = tl.arange(0, BLOCK_D)
            lo_half = offs_r < HEAD_DIM // 2
            col = tl.where(lo_half, offs_r, offs_r - HEAD_DIM // 2)
            partner = tl.where(lo_half, offs_r + HEAD_DIM // 2, offs_r - HEAD_DIM // 2)
            r_ok = offs_r < HEAD_DIM
            if ROPE_ROWS <= 1:  # the one row's position
                cs_row = cos_sin_ptr + pos_max.to(tl.int64) * stride_cs
                cos = tl.load(cs_row + col, mask=r_ok, other=0.0).to(tl.float32)
                sin = tl.load(cs_row + HEAD_DIM // 2 + col, mask=r_ok, other=0.0).to(tl.float32)
                signed_sin = tl.where(lo_half, -sin, sin)
            else:  # each program row's position (q), and each step row's (its key)
                cs_m = cos_sin_ptr + tl.where(row_ok, pos, 0).to(tl.int64)[:, None] * stride_cs
                cos_m = tl.load(cs_m + col[None, :], mask=r_ok[None, :], other=0.0).to(tl.float32)
                sin_m = tl.load(cs_m + HEAD_DIM // 2 + col[None, :], mask=r_ok[None, :], other=0.0).to(tl.float32)
                signed_sin_m = tl.where(lo_half[None, :], -sin_m, sin_m)
                offs_j = tl.arange(0, ROPE_ROWS)
                j_ok = offs_j < num_rows
                pos_j = tl.load(pos_ptr + offs_j, mask=j_ok, other=0).to(tl.int32)
                slot_j = tl.load(own_ptr + offs_j, mask=j_ok, other=0).to(tl.int64)
                cs_j = cos_sin_ptr + pos_j.to(tl.int64)[:, None] * stride_cs
                cos_j = tl.load(cs_j + col[None, :], mask=r_ok[None, :], other=0.0).to(tl.float32)
                sin_j = tl.load(cs_j + HEAD_DIM // 2 + col[None, :], mask=r_ok[None, :], other=0.0).to(tl.float32)
                signed_sin_j = tl.where(lo_half[None, :], -sin_j, sin_j)
        if USE_PDL and EARLY_KV:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        q_mask = row_ok[:, None] & d_ok[None, :]
        if FUSE_ROPE and ROPE_ROWS > 1:
            # A verify step's rows, q, k and v straight from the projection, as the one-row case
            # below does for one. Row t's dot reads the keys of the step's rows before it, which no
            # other launch has written: so every program writes, at its own slot, the K/V of each
            # step row whose position lies in one of its splits (the splits it reads), before it
            # reads any. Programs that share a split write the same bits there.
            q_src = q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh
            q_raw = tl.load(q_src + offs_d[None, :], mask=q_mask, other=0.0)
            q_pair = tl.load(q_src + partner[None, :], mask=q_mask, other=0.0)
            q_turned = rotate(q_raw.to(tl.float32), q_pair.to(tl.float32), cos_m, signed_sin_m)
            tl.store(q_rot_ptr + t[:, None] * stride_qrt + head[:, None] * stride_qrh + offs_d[None, :],
                     q_turned.to(q_rot_ptr.dtype.element_ty), mask=q_mask)
            home_j = pos_j // SPLIT_SIZE
            mine = j_ok & (home_j >= first) & ((home_j - first) % stride == 0) & (home_j <= pos_max // SPLIT_SIZE)
            jd = mine[:, None] & d_ok[None, :]
            kv_src = offs_j[:, None] * stride_kn_t + kv_head * stride_knh
            k_new = tl.load(k_new_ptr + kv_src + offs_d[None, :], mask=jd, other=0.0).to(tl.float32)
            k_pair = tl.load(k_new_ptr + kv_src + partner[None, :], mask=jd, other=0.0).to(tl.float32)
            k_rot = rotate(k_new, k_pair, cos_j, signed_sin_j).to(k_ptr.dtype.element_ty)
            v_new = tl.load(v_new_ptr + offs_j[:, None] * stride_vn_t + kv_head * stride_vnh + offs_d[None, :],
                            mask=jd, other=0.0)
            tl.store(k_ptr + slot_j[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :], k_rot, mask=jd)
            tl.store(v_ptr + slot_j[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                     v_new.to(v_ptr.dtype.element_ty), mask=jd)
            tl.debug_barrier()  # this program's stores are visible to all its threads
            k0, v0 = kv_block(k_ptr, v_ptr, start, tl.minimum(end, pos_max), kv_head, stride_kt, stride_kh,
                              stride_vt, stride_vh, map_row, map_base, BLOCK_N, BLOCK_D, HEAD_DIM, MAP_W)
        elif FUSE_ROPE:
            # One decode row, q, k and v straight from the projection: rotate q and this kv head's
            # key as rope_and_cache does (same helper, same rounding) and store them where the
            # unfused step has them (q: q_rot; k and v: the cache, by the program whose split
            # holds the position). Everything after reads them back with the unfused step's code,
            # so that its reductions, whose order follows the compiler's layouts, are the unfused
            # step's too: the decode step then has the bits of a verify row.
            q_src = q_ptr + t[:, None] * stride_qt + head[:, None] * stride_qh
            q_raw = tl.load(q_src + offs_d[None, :], mask=q_mask, other=0.0)
            q_pair = tl.load(q_src + partner[None, :], mask=q_mask, other=0.0)
            q_turned = rotate(q_raw.to(tl.float32), q_pair.to(tl.float32), cos[None, :], signed_sin[None, :])
            tl.store(q_rot_ptr + t[:, None] * stride_qrt + head[:, None] * stride_qrh + offs_d[None, :],
                     q_turned.to(q_rot_ptr.dtype.element_ty), mask=q_mask)
            k_new = tl.load(k_new_ptr + kv_head * stride_knh + offs_d, mask=d_ok, other=0.0).to(tl.float32)
            k_pair = tl.load(k_new_ptr + kv_head * stride_knh + partner, mask=d_ok, other=0.0).to(tl.float32)
            k_rot = rotate(k_new, k_pair, cos, signed_sin).to(k_ptr.dtype.element_ty)
            v_new = tl.load(v_new_ptr + kv_head * stride_vnh + offs_d, mask=d_ok, other=0.0)
            own_row = tl.max(own_slot, axis=0)
            home = pos_max // SPLIT_SIZE  # the split holding the position, and its program
            writes = d_ok & (first <= home) & ((home - first) % stride == 0)
            tl.store(k_ptr + own_row * stride_kt + kv_head * stride_kh + offs_d, k_rot, mask=writes)
            tl.store(v_ptr + own_row * stride_vt + kv_head * stride_vh + offs_d, v_new.to(v_ptr.dtype.element_ty),
                     mask=writes)
            tl.debug_barrier()  # this program's stores are visible to all its threads
        # Splits past the largest position hold no key for any row: they are skipped (a program
        # whose first split is past it stores nothing). The first split's K/V came above.
        for split in range(first, pos_max // SPLIT_SIZE + 1, stride):
            start = split * SPLIT_SIZE
            end = tl.minimum(start + SPLIT_SIZE, pos_max + 1)
            if split != first:
                k0, v0 = kv_block(k_ptr, v_ptr, start, tl.minimum(end, pos_max), kv_head, stride_kt, stride_kh,
                                  stride_vt, stride_vh, map_row, map_base, BLOCK_N, BLOCK_D, HEAD_DIM, MAP_W)
            q_rows = q_rot_ptr + t[:, None] * stride_qrt + head[:, None] * stride_qrh
            q = tl.load(q_rows + offs_d[None, :], mask=q_mask, other=0.0)  # (BLOCK_M, BLOCK_D)
            # The row's own key, read from its own slot (requested with q) and added outside the
            # dot, last: a verify row whose K/V sits elsewhere (an alternative draft token) then
            # computes exactly what the decode step of its token computes, whatever else the
            # tile holds at pos.
            own = row_ok & (pos >= start) & (pos < start + SPLIT_SIZE)
            own_mask = own[:, None] & d_ok[None, :]
            k_own = tl.load(k_ptr + own_slot[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :],
                            mask=own_mask, other=0.0).to(tl.float32)
            v_own = tl.load(v_ptr + own_slot[:, None] * stride_vt + kv_head * stride_vh + offs_d[None, :],
                            mask=own_mask, other=0.0).to(tl.float32)
            if DOT_F32:
                q = q.to(tl.float32)
            m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
            l_i = tl.zeros([BLOCK_M], tl.float32)
            acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
            m_i, l_i, acc = attend_block(q, k0, v0, start, pos, m_i, l_i, acc, qk_scale, BLOCK_N, DOT_F32)
            for n0 in range(start + BLOCK_N, end, BLOCK_N):
                k, v = kv_block(k_ptr, v_ptr, n0, end, kv_head, stride_kt, stride_kh, stride_vt, stride_vh,
                                map_row, map_base, BLOCK_N, BLOCK_D, HEAD_DIM, MAP_W)
                m_i, l_i, acc = attend_block(q, k, v, n0, pos, m_i, l_i, acc, qk_scale, BLOCK_N, DOT_F32)
            s_own = tl.where(own, tl.sum(q.to(tl.float32) * k_own, axis=1) * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, s_own)
            m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
            alpha = tl.exp2(m_i - m_safe)
            p_own = tl.exp2(s_own - m_safe)
            l_i = l_i * alpha + p_own
            acc = acc * alpha[:, None] + p_own[:, None] * v_own
            m_i = m_new
            has_key = l_i > 0.0  # rows whose position is below this split hold no key
            l_safe = tl.where(has_key, l_i, 1.0)
            lse = tl.where(has_key, m_i + tl.log2(l_safe), float("-inf"))
            # part_o: (T, Hq, num_splits, HEAD_DIM) fp32; part_lse: (T, Hq, num_splits)
            slot = (t * num_heads + head) * num_splits + split
            tl.store(
                part_o_ptr + slot[:, None] * HEAD_DIM + offs_d[None, :],
                acc / l_safe[:, None], mask=row_ok[:, None] & d_ok[None, :],
            )
            tl.store(part_lse_ptr + slot, lse, mask=row_ok)

    @triton.jit
    def reduce_kernel(
        part_o_ptr, part_lse_ptr, pos_ptr, out_ptr, words_ptr, scales_ptr,
        num_splits, stride_ot, stride_oh,
        HEAD_DIM: tl.constexpr, SPLIT_SIZE: tl.constexpr,
        BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr, USE_PDL: tl.constexpr, ROUND: tl.constexpr = 0,
    ):
        # ROUND (one row): the output also rounded to int8 for o_proj (rounded_x.RoundedX; 1: the
        # nibbles' word order, 2: int8's), each head's HEAD_DIM / 32 vectors by its program
        t = tl.program_id(0)
        head = tl.program_id(1)
        num_heads = tl.num_programs(1)
        # Only splits that start at or before this row's position were written for it. (The
        # positions come from before the step's RoPE kernel: read before the PDL wait.)
        num_valid = tl.load(pos_ptr + t).to(tl.int32) // SPLIT_SIZE + 1
        if USE_PDL:
            # Let the next kernel (o_proj's GEMV) launch now, while the split kernel still
            # runs: it loads weights before its own wait, which holds until this grid is done.
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()  # the split kernel's writes
        base = (t * num_heads + head) * num_splits
        offs_d = tl.arange(0, BLOCK_D)
        d_ok = offs_d < HEAD_DIM
        # Online merge, BLOCK_S splits at a time. Every chunk starts at a split that holds
        # a key for this row, so its largest log-sum-exp is finite.
        m = tl.full([], float("-inf"), tl.float32)
        l = tl.full([], 0.0, tl.float32)
        acc = tl.zeros([BLOCK_D], tl.float32)
        for s0 in range(0, num_valid, BLOCK_S):
            offs_s = s0 + tl.arange(0, BLOCK_S)
            s_ok = offs_s < num_valid
            lse = tl.load(part_lse_ptr + base + offs_s, mask=s_ok, other=float("-inf"))
            o = tl.load(
                part_o_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0,
            )  # (BLOCK_S, BLOCK_D)
            m_new = tl.maximum(m, tl.max(lse, axis=0))
            alpha = tl.exp2(m - m_new)
            w = tl.exp2(lse - m_new)  # (BLOCK_S,), 0 where masked
            l = l * alpha + tl.sum(w, axis=0)
            acc = acc * alpha + tl.sum(w[:, None] * o, axis=0)
            m = m_new
        out = (acc / l).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + t * stride_ot + head * stride_oh + offs_d, out, mask=d_ok)
        if ROUND > 0:
            y = tl.where(d_ok, out.to(tl.float32), 0.0)
            words, scales, _ = round_vectors(tl.reshape(y, (BLOCK_D // 32, 32)), BLOCK_D // 32, ROUND == 1)
            i = tl.arange(0, BLOCK_D // 32)
            v = head * (HEAD_DIM // 32) + i
            v_ok = i < HEAD_DIM // 32
            tl.store(words_ptr + v[:, None] * 8 + tl.arange(0, 8)[None, :], words, mask=v_ok[:, None])
            tl.store(scales_ptr + v, scales, mask=v_ok)

    return split_kernel, reduce_kernel


MAX_INVARIANT_ROWS = 16  # the longest verify step (15 draft tokens + 1) of batch-invariant mode
# A draft tree's verify step (per-token tiles through a slot map: one program column a row, so any
# row count keeps the bits) takes MAX_TREE_ROWS, the projections' limit (gemv.py).


def decode_attention(
    q: torch.Tensor,  # (T, Hq, D), last dim contiguous
    k_cache: torch.Tensor,  # (S_max, Hkv, D), holds the new rows already
    v_cache: torch.Tensor,  # (S_max, Hkv, D)
    positions: torch.Tensor,  # (T,) int32/int64 on q's device; row t sees cache rows 0..positions[t]
    scale: float,
    invariant: bool = False,
    own_slots: torch.Tensor | None = None,
    pdl: bool = True,  # programmatic dependent launch (KernelOptions.pdl)
    per_token: bool = False,
    slot_map: torch.Tensor | None = None,
    map_base: torch.Tensor | None = None,
    share_sms: bool = True,
    round_for: bool | None = None,
):
    """Causal-by-position GQA attention, (T, Hq, D) in q's dtype, fp32 accumulation.

    own_slots (T,): where row t's own key and value are, in place of cache row positions[t]
    (None: there). A verify step's alternative draft tokens share a position with a chain
    token but keep their K/V past the chain's rows.

    invariant: one tile shape for every row count up to MAX_INVARIANT_ROWS, so a row's bits do
    not depend on how many rows came with it (a verify row equals the decode step of its
    token). Otherwise the tile follows the row count: on the H200 a 16-row step of a 3-group
    model (a 64-row tile, 8 warps) differed from the 1-row step in the last bits.

    CUDA (or the Triton interpreter). No host sync; graph-capturable. Allocates fp32
    partials of (T, Hq, S_max / split_size, D) from the caching allocator on each call.
    per_token (with invariant): each query row runs in programs of its own with the one-row tile
    (its K/V re-read from L2 by every row), the same for every row count too, and as fast as the
    one-row step for one row.

    slot_map (T, W) int32 with map_base (T,) int32 or int64, any stride (a tree level's rows share
    one: a 0-stride view of the cache length, no launch to make it) (per_token only): row t's keys
    and values for positions map_base[t] .. map_base[t] + W - 1 (those below positions[t]) sit in
    cache rows slot_map[t] instead, e.g. a tree node's ancestors, wherever the tree put them. The
    row then reads them in the order and blocks of the rows a plain decode step would read at those
    positions, so it computes exactly what that step computes.

    share_sms (per_token, T > 1): the rows share about two waves of programs
    (_split_programs) instead of each taking the one-row step's count; the same bits.

    round_for (one row; D a multiple of 32): returns (out, its row rounded to int8 for the
    projection after it, a rounded_x.RoundedX in that word order), the rounding in the merge's
    launch.
    """
    _check(q, k_cache, v_cache, positions)
    return _launch(q, k_cache, v_cache, positions, scale, invariant, own_slots, None, pdl, per_token,
                   _mapping(q, invariant, per_token, slot_map, map_base), share_sms, round_for)


def rope_decode_attention(
    q: torch.Tensor,  # (T, Hq, D) unrotated, last dim contiguous (may be a view of a fused qkv)
    k: torch.Tensor,  # (T, Hkv, D) unrotated
    v: torch.Tensor,  # (T, Hkv, D)
    cos_sin_cache: torch.Tensor,  # (max_pos, D) fp32 [cos | sin], as rope_and_cache takes it
    positions: torch.Tensor,  # (T,)
    k_cache: torch.Tensor,  # (S_max, Hkv, D): the rotated k is written at slots (or positions)
    v_cache: torch.Tensor,
    scale: float,
    invariant: bool = False,
    slots: torch.Tensor | None = None,
    pdl: bool = True,
    per_token: bool = False,
    share_sms: bool = True,
    slot_map: torch.Tensor | None = None,
    map_base: torch.Tensor | None = None,
    round_for: bool | None = None,
):
    """rope_and_cache then decode_attention for a decode row or a verify step's T <=
    MAX_INVARIANT_ROWS rows (a draft tree's, MAX_TREE_ROWS), with the same bits, one launch fewer:
    the split kernel rotates q and the keys itself, writes the keys and values into the cache (at
    slots, or positions) and q into a scratch row, and reads them back as decode_attention reads
    them. Returns (T, Hq, D).

    slot_map, map_base (per_token, invariant): a draft tree's rows, as decode_attention reads
    them. A program writes the step's rows whose positions lie in its splits before it reads any,
    and a row's ancestors sit at their own positions (depth d at map_base + d), so the program
    that reads an ancestor through the map has written it."""
    _check(q, k_cache, v_cache, positions)
    T = q.shape[0]
    assert 1 <= T <= (MAX_TREE_ROWS if slot_map is not None else MAX_INVARIANT_ROWS)
    assert k.shape == v.shape == (T, *k_cache.shape[1:])
    assert q.dtype == k.dtype == v.dtype
    assert k.stride(-1) == 1 and v.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
    assert cos_sin_cache.shape[1] == q.shape[2] and q.shape[2] % 2 == 0
    return _launch(q, k_cache, v_cache, positions, scale, invariant, slots, (k, v, cos_sin_cache), pdl, per_token,
                   _mapping(q, invariant, per_token, slot_map, map_base), share_sms, round_for)


def _mapping(q: torch.Tensor, invariant: bool, per_token: bool, slot_map: torch.Tensor | None,
             map_base: torch.Tensor | None) -> tuple | None:
    """(slot_map, map_base) checked against q's rows, or None without a map."""
    if slot_map is None:
        return None
    assert invariant and per_token, "a slot map needs the per-token invariant tiles"
    assert slot_map.dim() == 2 and slot_map.shape[0] == q.shape[0] and slot_map.is_contiguous()
    assert map_base is not None and map_base.shape == (q.shape[0],)
    return slot_map, map_base


def _launch(q, k_cache, v_cache, positions, scale, invariant, own_slots, rope, pdl_on,
            per_token: bool = False, mapping: tuple | None = None, share_sms: bool = True,
            round_for: bool | None = None):
    assert q.stride(2) == 1 and k_cache.stride(2) == 1 and v_cache.stride(2) == 1
    split_kernel, reduce_kernel = _kernels()
    num_rows, num_heads, head_dim = q.shape
    max_seq_len, num_kv_heads, _ = k_cache.shape
    group = num_heads // num_kv_heads
    split_size = _split_size(max_seq_len)
    num_splits = -(-max_seq_len // split_size)
    part_o = torch.empty((num_rows, num_heads, num_splits, head_dim), dtype=torch.float32, device=q.device)
    part_lse = torch.empty((num_rows, num_heads, num_splits), dtype=torch.float32, device=q.device)
    out = torch.empty((num_rows, num_heads, head_dim), dtype=q.dtype, device=q.device)
    per_token = per_token and invariant
    tile_rows = 1 if per_token else (MAX_INVARIANT_ROWS if invariant else num_rows)
    block_m = max(16, next_pow2(tile_rows * group))  # tl.dot: >= 16
    block_d = max(16, next_pow2(head_dim))
    dot_f32 = q.dtype == torch.float32 or triton_interpreting()
    pdl = pdl_args(q.device, pdl_on)
    k_new, v_new, cos_sin = rope if rope is not None else (k_cache, v_cache, part_o)  # unused without rope
    q_rot = torch.empty((num_rows, num_heads, head_dim), dtype=q.dtype, device=q.device) if rope is not None else q
    programs = _split_programs(num_splits, num_kv_heads, num_sms(q.device),
                               num_rows if per_token and share_sms else 1)
    split_kernel[(num_kv_heads, programs, num_rows if per_token else 1)](
        q, k_cache, v_cache, positions, positions if own_slots is None else own_slots, part_o, part_lse,
        k_new, v_new, cos_sin, q_rot, q_rot.stride(0), q_rot.stride(1),
        *(mapping if mapping is not None else (positions, positions)), 0 if mapping is None else mapping[1].stride(0),
        num_rows, num_splits,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k_new.stride(0) if rope is not None else 0, k_new.stride(-2),
        v_new.stride(0) if rope is not None else 0, v_new.stride(-2), cos_sin.stride(0),
        scale * math.log2(math.e),
        GROUP=group, HEAD_DIM=head_dim, SPLIT_SIZE=split_size,
        BLOCK_M=block_m, BLOCK_N=min(64, split_size), BLOCK_D=block_d,
        DOT_F32=dot_f32, EARLY_KV=num_rows == 1 and mapping is None, FUSE_ROPE=rope is not None,
        PER_TOKEN=per_token, MAP_W=0 if mapping is None else mapping[0].shape[1],
        ROPE_ROWS=1 if rope is None or num_rows == 1 else next_pow2(num_rows),
        num_warps=4 if block_m <= 32 else 8,
        num_stages=1 if dot_f32 else 2,  # fp32 tiles x 3 stages overflow shared memory
        **pdl,
    )
    rounded = None
    words = scales = out  # unused without rounding
    if round_for is not None:
        assert num_rows == 1 and head_dim % 32 == 0 and block_d >= 32, (num_rows, head_dim)
        rounded = empty_rounded(num_heads * head_dim, round_for, q.dtype, q.device)
        words, scales = rounded.words, rounded.scales
    reduce_kernel[(num_rows, num_heads)](
        part_o, part_lse, positions, out, words, scales,
        num_splits, out.stride(0), out.stride(1),
        HEAD_DIM=head_dim, SPLIT_SIZE=split_size,
        BLOCK_S=min(64, next_pow2(num_splits)), BLOCK_D=block_d,
        num_warps=4, **pdl, ROUND=0 if round_for is None else (1 if round_for else 2),
    )
    return out if round_for is None else (out, rounded)


def _visible(positions: torch.Tensor, own_slots: torch.Tensor | None, num_slots: int,
             mapping: tuple | None = None) -> torch.Tensor:
    """(T, S) bool: row t sees cache rows before positions[t] and its own row (own_slots[t], or
    positions[t]); with a slot map (slot_map, map_base), the rows of positions map_base[t] and up
    are slot_map[t]'s instead."""
    slots = torch.arange(num_slots, device=positions.device)
    own = positions if own_slots is None else own_slots
    if mapping is None:
        return (slots < positions[:, None]) | (slots == own[:, None])
    slot_map, base = mapping
    seen = (slots < torch.minimum(positions, base)[:, None]) | (slots == own[:, None])
    width = slot_map.shape[1]
    used = (base[:, None] + torch.arange(width, device=positions.device)) < positions[:, None]  # (T, W)
    hits = (slot_map.long()[:, :, None] == slots[None, None, :]) & used[:, :, None]
    return seen | hits.any(dim=1)


def decode_attention_ref(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, scale: float,
    own_slots: torch.Tensor | None = None, slot_map: torch.Tensor | None = None,
    map_base: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reference: fp32 einsum over all S_max rows with a position mask (and decode_attention's
    slot map). Any device, no host sync, correct for any positions; memory and time grow with
    S_max."""
    _check(q, k_cache, v_cache, positions)
    num_rows, num_heads, head_dim = q.shape
    max_seq_len, num_kv_heads, _ = k_cache.shape
    qf = q.float().view(num_rows, num_kv_heads, num_heads // num_kv_heads, head_dim)
    scores = torch.einsum("tkgd,skd->tkgs", qf, k_cache.float()) * scale  # (T, Hkv, g, S)
    mapping = None if slot_map is None else (slot_map, map_base)
    visible = _visible(positions, own_slots, max_seq_len, mapping)  # (T, S)
    scores = scores.masked_fill(~visible[:, None, None, :], float("-inf"))
    out = torch.einsum("tkgs,skd->tkgd", scores.softmax(dim=-1), v_cache.float())
    return out.reshape(num_rows, num_heads, head_dim).to(q.dtype)


def decode_attention_sdpa(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, positions: torch.Tensor, scale: float,
    own_slots: torch.Tensor | None = None,
) -> torch.Tensor:
    """Plain-torch fast variant (the CPU path): SDPA with GQA and a position mask.

    On CPU it reads only rows 0..max(positions), which syncs (harmless there); on CUDA it
    masks all S_max rows and stays graph-capturable.
    """
    _check(q, k_cache, v_cache, positions)
    if not q.is_cuda:
        kv_len = int((positions if own_slots is None else torch.maximum(positions, own_slots)).max()) + 1
        k_cache, v_cache = k_cache[:kv_len], v_cache[:kv_len]
    visible = _visible(positions, own_slots, k_cache.shape[0])  # (T, S)
    out = F.scaled_dot_product_attention(
        q.transpose(0, 1), k_cache.transpose(0, 1), v_cache.transpose(0, 1),
        attn_mask=visible, scale=scale, enable_gqa=True,
    )  # (Hq, T, D)
    return out.transpose(0, 1).contiguous()
