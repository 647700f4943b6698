"""Fused residual add + RMSNorm over rows of hidden states, Llama convention."""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from engine.kernels import next_pow2, pdl_args

triton = tl = table_row = store_rounded = None  # bound by _kernels(): Triton is imported on first use only


@functools.cache
def _kernels():
    global triton, tl, table_row, store_rounded  # module globals: the kernels below call these by name
    import triton
    import triton.language as tl

    from engine.kernels.rounded_x import store_helper

    store_rounded = store_helper()

    @triton.jit
    def add_rms_norm_kernel(
        x_ptr, res_ptr, w_ptr, out_ptr, new_res_ptr, words_ptr, scales_ptr,
        hidden, stride_x, stride_res, stride_out, stride_new_res, eps,
        HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr, USE_PDL: tl.constexpr, ROUND: tl.constexpr = 0,
    ):
        # ROUND (one row): the output also rounded to int8 for the projection after it
        # (rounded_x.RoundedX; 1: the nibbles' word order, 2: int8's)
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
        y = (normed * w).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * stride_out + offs, y, mask=ok)
        if ROUND > 0:
            # the values the projection would read, rounded as its kernel would round them
            v = tl.arange(0, BLOCK // 32)
            store_rounded(tl.reshape(y.to(tl.float32), (BLOCK // 32, 32)), v, v < hidden // 32, words_ptr,
                          scales_ptr, BLOCK // 32, ROUND == 1)

    @triton.jit
    def table_row(ids_ptr, table_ptr, stride_table, hidden, BLOCK: tl.constexpr, HAS_IDS: tl.constexpr = True):
        """This program's row: (row, offsets, their mask, table[ids[row]]; without ids table[row])."""
        row = tl.program_id(0)
        offs = tl.arange(0, BLOCK)
        ok = offs < hidden
        if HAS_IDS:
            token = tl.load(ids_ptr + row).to(tl.int64)
        else:
            token = row.to(tl.int64)
        return row, offs, ok, tl.load(table_ptr + token * stride_table + offs, mask=ok, other=0.0)

    @triton.jit
    def embed_pair_norm_kernel(
        ids_ptr, table_ptr, b_ptr, wa_ptr, wb_ptr, out_ptr, b_rows_ptr, b_out_ptr,
        hidden, stride_table, stride_b, stride_out, eps_a, eps_b,
        BLOCK: tl.constexpr, B_ROWS: tl.constexpr, USE_PDL: tl.constexpr, HAS_IDS: tl.constexpr = True,
    ):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row, offs, ok, a = table_row(ids_ptr, table_ptr, stride_table, hidden, BLOCK, HAS_IDS)
        if B_ROWS:  # b's row through an index, also written out as read (the caller's residual)
            src = tl.load(b_rows_ptr + row).to(tl.int64)
            b = tl.load(b_ptr + src * stride_b + offs, mask=ok, other=0.0)
            tl.store(b_out_ptr + row * hidden + offs, b, mask=ok)
        else:
            b = tl.load(b_ptr + row * stride_b + offs, mask=ok, other=0.0)
        af, bf = a.to(tl.float32), b.to(tl.float32)
        inv_a = tl.rsqrt(tl.sum(af * af, axis=0) / hidden + eps_a)
        inv_b = tl.rsqrt(tl.sum(bf * bf, axis=0) / hidden + eps_b)
        wa = tl.load(wa_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        wb = tl.load(wb_ptr + offs, mask=ok, other=0.0).to(tl.float32)
        na = (af * inv_a).to(a.dtype).to(tl.float32)
        nb = (bf * inv_b).to(b.dtype).to(tl.float32)
        dst = out_ptr + row * stride_out + offs
        tl.store(dst, (na * wa).to(out_ptr.dtype.element_ty), mask=ok)
        tl.store(dst + hidden, (nb * wb).to(out_ptr.dtype.element_ty), mask=ok)

    @triton.jit
    def embed_rows_kernel(ids_ptr, table_ptr, out_ptr, hidden, stride_table, stride_out,
                          BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        row, offs, ok, x = table_row(ids_ptr, table_ptr, stride_table, hidden, BLOCK)
        tl.store(out_ptr + row * stride_out + offs, x, mask=ok)

    return add_rms_norm_kernel, embed_pair_norm_kernel, embed_rows_kernel


def add_rms_norm(
    x: torch.Tensor,  # (T, H), last dim contiguous
    residual: torch.Tensor | None,  # (T, H) like x, or None for the first layer
    weight: torch.Tensor,  # (H,)
    eps: float,
    pdl: bool = True,  # programmatic dependent launch (KernelOptions.pdl)
) -> tuple[torch.Tensor, torch.Tensor]:
    """Returns (normed, new_residual), both (T, H) in x's dtype.

    new_residual = x + residual (rounded to x's dtype), or x itself when residual is None;
    normed = (h.float() * rsqrt(mean(h.float()^2) + eps)).to(dtype) * weight.
    CUDA (or the Triton interpreter); no host sync; one program per row.
    """
    return _add_rms_norm(x, residual, weight, eps, pdl, None)[:2]


def add_rms_norm_rounded(x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float,
                         nibble_order: bool, pdl: bool = True):
    """add_rms_norm of one row, which also hands the projection after it the normed row rounded
    to int8 (rounded_x.RoundedX in `nibble_order`), in the same launch: -> (normed,
    new_residual, rounded). The hidden size must be a multiple of 32."""
    return _add_rms_norm(x, residual, weight, eps, pdl, nibble_order)


def _add_rms_norm(x, residual, weight, eps, pdl, nibble_order):
    from engine.kernels.rounded_x import rounded_args

    assert x.dim() == 2 and x.stride(1) == 1 and weight.shape == (x.shape[1],)
    kernel = _kernels()[0]
    num_rows, hidden = x.shape
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if residual is None:
        res = new_res = x  # unused by the kernel
    else:
        assert residual.shape == x.shape and residual.stride(1) == 1
        res, new_res = residual, torch.empty_like(out)
    block = next_pow2(hidden)
    rounded, words, scales, round_code = rounded_args(out, nibble_order)
    kernel[(num_rows,)](
        x, res, weight, out, new_res, words, scales,
        hidden, x.stride(0), res.stride(0), out.stride(0), new_res.stride(0), eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block,
        num_warps=min(16, max(4, block // 256)), **pdl_args(x.device, pdl), ROUND=round_code,
    )
    return out, new_res, rounded


def add_rms_norm_ref(
    x: torch.Tensor, residual: torch.Tensor | None, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference and CPU path: the Llama formula in plain torch."""
    h = x if residual is None else x + residual
    hf = h.float()
    normed = (hf * torch.rsqrt(hf.pow(2).mean(dim=-1, keepdim=True) + eps)).to(x.dtype)
    return (normed * weight).to(x.dtype), h


def embed_pair_norm(ids: torch.Tensor | None, table: torch.Tensor, b: torch.Tensor, weight_a: torch.Tensor,
                    weight_b: torch.Tensor, eps_a: float, eps_b: float, pdl: bool = True,
                    b_rows: torch.Tensor | None = None):
    """[rms_norm(table[ids]) * weight_a, rms_norm(b) * weight_b] side by side, (T, 2H), in one launch.

    ids (T,) row indices into table (V, H) (an embedding lookup); b (T, H). Each half is
    normed like add_rms_norm without a residual. The EAGLE-3 draft's input: the token's
    embedding and the incoming hidden state, each normed, concatenated for its attention.
    b_rows (T,) int64: b's rows are b[b_rows] instead (b then any (R, H)), and the result is
    (out, b[b_rows]): a tree level's parents' states, gathered in this launch rather than by a
    torch index_select of their own before it. ids None: table (T, H) is the rows' embeddings
    (looked up already: a packed table's rows). CUDA (or the Triton interpreter); no host sync;
    one program per row.
    """
    num_rows, hidden = (table if ids is None else ids).shape[0], b.shape[1]
    assert (ids is None or ids.dim() == 1) and (b_rows is not None or b.shape[0] == num_rows)
    assert b_rows is None or (b_rows.shape == (num_rows,) and b_rows.dtype == torch.int64)
    assert table.dim() == 2 and table.shape[1] == hidden and table.stride(1) == 1
    assert b.stride(1) == 1 and weight_a.shape == weight_b.shape == (hidden,) and table.dtype == b.dtype
    out = torch.empty((num_rows, 2 * hidden), dtype=b.dtype, device=b.device)
    gathered = None if b_rows is None else torch.empty((num_rows, hidden), dtype=b.dtype, device=b.device)
    block = next_pow2(hidden)
    ids_ptr = table if ids is None else ids  # without ids never read
    _kernels()[1][(num_rows,)](
        ids_ptr, table, b, weight_a, weight_b, out, ids_ptr if b_rows is None else b_rows,
        out if gathered is None else gathered, hidden, table.stride(0), b.stride(0), out.stride(0), eps_a, eps_b,
        BLOCK=block, B_ROWS=b_rows is not None, HAS_IDS=ids is not None, num_warps=min(16, max(4, block // 256)),
        **pdl_args(b.device, pdl),
    )
    return out if gathered is None else (out, gathered)


def embed_pair_norm_ref(ids, table, b, weight_a, weight_b, eps_a, eps_b, b_rows=None):
    """Reference and CPU path (ids, b_rows: as embed_pair_norm takes them)."""
    a = table if ids is None else F.embedding(ids, table)
    rows = b if b_rows is None else b.index_select(0, b_rows)
    halves = add_rms_norm_ref(a, None, weight_a, eps_a)[0], add_rms_norm_ref(rows, None, weight_b, eps_b)[0]
    out = torch.cat(halves, dim=-1)
    return out if b_rows is None else (out, rows)


def embed_rows(ids: torch.Tensor, table: torch.Tensor, pdl: bool = True) -> torch.Tensor:
    """table[ids], (T, H): the embedding lookup of a decode or verify step as one of our kernels,
    so it joins the step's chain of programmatic dependent launches (torch's gather for a
    16-row verify step took about 10 us on the H200, against 2 for a norm). CUDA (or the Triton
    interpreter); no host sync; one program per row."""
    assert ids.dim() == 1 and table.dim() == 2 and table.stride(1) == 1
    out = torch.empty((ids.shape[0], table.shape[1]), dtype=table.dtype, device=table.device)
    block = next_pow2(table.shape[1])
    _kernels()[2][(ids.shape[0],)](
        ids, table, out, table.shape[1], table.stride(0), out.stride(0),
        BLOCK=block, num_warps=min(16, max(4, block // 256)), **pdl_args(table.device, pdl),
    )
    return out


def embed_rows_ref(ids: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    return table.index_select(0, ids)
