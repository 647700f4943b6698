"""The decode graph's greedy pick in one launch with no host sync (safe to capture in a CUDA
graph), and the argmax helpers that the speculation kernels (speculative/kernels) build on.

    greedy_next(logits, next_token, ids, pos) the decode graph's greedy chaining: i = argmax;
                                              next_token[0] = ids[0] = i; pos[0] += 1
    rows_argmax(logits)                       each row's argmax (a greedy tree step's verify rows)
    argmax_helpers()                          the @triton.jit argmax over a span of logits

Ties go to the lowest index, as torch.argmax (which, unlike these, would pick a NaN).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = span_best = row_argmax = None  # bound by argmax_helpers(): Triton is imported on first use only


@functools.cache
def argmax_helpers():
    """(span_best, row_argmax), @triton.jit functions for other kernels to call. A kernel calls
    them by name from its own module's globals, so a module binds them there before defining it."""
    global triton, tl, span_best, row_argmax  # module globals: row_argmax calls span_best by name
    import triton
    import triton.language as tl

    @triton.jit
    def span_best(base, start, end, BLOCK: tl.constexpr):
        """(the largest of the values at base[start:end], its index): ties and all -inf go to
        the lowest index; NaN never wins, unlike torch.argmax."""
        best = tl.full([BLOCK], float("-inf"), tl.float32)
        best_i = start + tl.arange(0, BLOCK)  # all -inf: the span's first index
        for v0 in range(start, end, BLOCK):  # per lane: the first maximum of its strided slice
            offs = v0 + tl.arange(0, BLOCK)
            x = tl.load(base + offs, mask=offs < end, other=float("-inf")).to(tl.float32)
            better = x > best
            best = tl.where(better, x, best)
            best_i = tl.where(better, offs, best_i)
        top = tl.max(best, axis=0)
        return top, tl.min(tl.where(best == top, best_i, end), axis=0)  # the lowest lane index holding it

    @triton.jit
    def row_argmax(base, vocab, BLOCK: tl.constexpr):
        """The index of the largest of vocab values at base (as span_best)."""
        return span_best(base, 0, vocab, BLOCK)[1]

    return span_best, row_argmax


@functools.cache
def _kernels():
    argmax_helpers()  # binds triton, tl and span_best, which the kernel below uses by name

    @triton.jit
    def greedy_next_kernel(logits_ptr, part_val_ptr, part_idx_ptr, count_ptr, next_ptr, ids_ptr, pos_ptr, vocab,
                           num_parts, CHUNK: tl.constexpr, BLOCK: tl.constexpr, BLOCK_P: tl.constexpr,
                           USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        p = tl.program_id(0)
        top, where = span_best(logits_ptr, p * CHUNK, tl.minimum(p * CHUNK + CHUNK, vocab), BLOCK)
        tl.store(part_val_ptr + p, top)
        tl.store(part_idx_ptr + p, where)
        tl.debug_barrier()  # the part is written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == num_parts - 1:  # the last chunk's program: the best of the chunks' best
            tl.debug_barrier()
            lane = tl.arange(0, BLOCK_P)
            ok = lane < num_parts
            val = tl.load(part_val_ptr + lane, mask=ok, other=float("-inf"), cache_modifier=".cg")
            idx = tl.load(part_idx_ptr + lane, mask=ok, other=vocab, cache_modifier=".cg")
            win = tl.min(tl.where(val == tl.max(val, axis=0), idx, vocab), axis=0).to(tl.int64)
            tl.store(next_ptr, win)
            tl.store(ids_ptr, win)
            tl.store(pos_ptr, tl.load(pos_ptr) + 1)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    @triton.jit
    def rows_argmax_kernel(logits_ptr, stride, out_ptr, vocab, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        tl.store(out_ptr + r, span_best(logits_ptr + r.to(tl.int64) * stride, 0, vocab, BLOCK)[1].to(tl.int64))

    @triton.jit
    def rows_argmax_parts_kernel(logits_ptr, stride, out_ptr, part_val_ptr, part_idx_ptr, count_ptr, vocab,
                                 CHUNK: tl.constexpr, BLOCK: tl.constexpr, RP: tl.constexpr, PP: tl.constexpr,
                                 USE_PDL: tl.constexpr):
        if USE_PDL:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        p = tl.program_id(1)
        rows = tl.num_programs(0)
        parts = tl.num_programs(1)
        top, where = span_best(logits_ptr + r.to(tl.int64) * stride, p * CHUNK,
                               tl.minimum(p * CHUNK + CHUNK, vocab), BLOCK)
        tl.store(part_val_ptr + r * parts + p, top)
        tl.store(part_idx_ptr + r * parts + p, where)
        tl.debug_barrier()  # the part is written before the counter moves
        arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu")
        if arrived == rows * parts - 1:  # the last program: each row's best of its parts' best
            tl.debug_barrier()
            rr = tl.arange(0, RP)
            pp = tl.arange(0, PP)
            ok = (rr[:, None] < rows) & (pp[None, :] < parts)
            at = rr[:, None] * parts + pp[None, :]
            val = tl.load(part_val_ptr + at, mask=ok, other=float("-inf"), cache_modifier=".cg")
            idx = tl.load(part_idx_ptr + at, mask=ok, other=vocab, cache_modifier=".cg")
            # the lowest index among the parts holding the row's best (each part's is its lowest)
            win = tl.min(tl.where(ok & (val == tl.max(val, axis=1)[:, None]), idx, vocab), axis=1)
            tl.store(out_ptr + rr, win.to(tl.int64), mask=rr < rows)
            tl.atomic_xchg(count_ptr, 0)  # ready for the next launch

    return greedy_next_kernel, rows_argmax_kernel, rows_argmax_parts_kernel


_ROWS_BLOCK = 4096  # rows_argmax: logits per loop step of a row's program
_ROWS_CHUNK = 4096  # rows_argmax in parts: logits a program (at least; at most _ROWS_MAX_PARTS a row)
_ROWS_MAX_PARTS = 16
_ROWS_MAX_PROGRAMS = 4096


@functools.cache
def _part_buffers(device: torch.device, count: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    # (each part's best value, its index, the arrival counter) for launches of up to `count`
    # parts: the counter is zeroed once and each launch leaves it at zero again. Launches must not
    # run concurrently on two streams.
    return (torch.empty(count, dtype=torch.float32, device=device),
            torch.empty(count, dtype=torch.int32, device=device),
            torch.zeros(1, dtype=torch.int32, device=device))


def rows_argmax(logits: torch.Tensor, out: torch.Tensor | None = None, pdl: bool = True,
                parts: bool = False) -> torch.Tensor:
    """Each row's argmax of logits (R, V) (fp32 or bf16, last dim contiguous; ties: the lowest
    index; NaN never wins) as int64 (R,), into out if given: the target's choices over a greedy
    tree step's verify rows, read from the lm_head's bf16 output by one program a row, where
    torch widened them to fp32 (a copy) and then took its argmax (a reduction over every row).
    parts (KernelOptions.tree_level_split): each row in parts of a program each (at least 4,096
    logits, at most 16 parts a row; 12 for a 49,152-token vocabulary), the launch's last program
    taking each row's best of its parts: the same choices. CUDA (or the Triton interpreter); no
    host sync."""
    assert logits.dim() == 2 and logits.stride(1) == 1
    rows, vocab = logits.shape
    out = torch.empty(rows, dtype=torch.int64, device=logits.device) if out is None else out
    assert out.shape == (rows,) and out.dtype == torch.int64
    chunk = max(_ROWS_CHUNK, next_pow2(-(-vocab // _ROWS_MAX_PARTS)))
    count = -(-vocab // chunk)
    if parts and count > 1 and rows * count <= _ROWS_MAX_PROGRAMS:
        part_val, part_idx, counter = _part_buffers(logits.device, _ROWS_MAX_PROGRAMS)
        _kernels()[2][(rows, count)](logits, logits.stride(0), out, part_val, part_idx, counter, vocab, CHUNK=chunk,
                                     BLOCK=min(chunk, 1024), RP=next_pow2(rows), PP=next_pow2(count), num_warps=4,
                                     **pdl_args(logits.device, pdl))
        return out
    _kernels()[1][(rows,)](logits, logits.stride(0), out, vocab, BLOCK=_ROWS_BLOCK, num_warps=8,
                           **pdl_args(logits.device, pdl))
    return out


def rows_argmax_ref(logits: torch.Tensor) -> torch.Tensor:
    """Reference and CPU path: torch's argmax (which, unlike rows_argmax, would pick a NaN)."""
    return logits.float().argmax(-1)


_NEXT_BLOCK = 2048  # greedy_next: logits per program and loop step
_NEXT_MAX_PARTS = 512


def greedy_next(logits: torch.Tensor, next_token: torch.Tensor, input_ids: torch.Tensor,
                positions: torch.Tensor, pdl: bool = True) -> None:
    """The greedy chaining of a one-token decode graph, in one launch: i = argmax(logits[0])
    (ties: the lowest index; NaN never wins); next_token[0] = input_ids[0] = i; positions[0] += 1.
    Programs take chunks of the vocabulary and the last to finish picks among their best (torch's
    argmax over a 128K vocabulary took 28 us on the H200, as one block). CUDA (or the Triton
    interpreter); no host sync."""
    assert logits.dim() == 2 and logits.shape[0] == 1 and logits.stride(1) == 1
    assert next_token.numel() == input_ids.numel() == positions.numel() == 1
    assert next_token.dtype == input_ids.dtype == positions.dtype == torch.int64
    vocab = logits.shape[1]
    chunk = _NEXT_BLOCK * -(-vocab // (_NEXT_BLOCK * _NEXT_MAX_PARTS))
    parts = -(-vocab // chunk)
    part_val, part_idx, count = _part_buffers(logits.device, _NEXT_MAX_PARTS)
    _kernels()[0][(parts,)](
        logits, part_val, part_idx, count, next_token, input_ids, positions, vocab, parts,
        CHUNK=chunk, BLOCK=_NEXT_BLOCK, BLOCK_P=max(16, next_pow2(parts)), num_warps=8,
        **pdl_args(logits.device, pdl),
    )


def greedy_next_ref(logits, next_token, input_ids, positions) -> None:
    """Reference and CPU path: the same in torch ops."""
    i = logits[0].argmax().view(1)
    next_token.view(1).copy_(i)
    input_ids.view(1).copy_(i)
    positions.add_(1)
