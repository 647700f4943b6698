"""The target states a tree step's draft-extend reads, gathered in one launch with no host sync
(safe to capture in a CUDA graph):

    gather_states(parts, rows) == torch.cat(parts, dim=-1).index_select(0, rows)

parts: the aux layers' inputs of the verify forward, (T, H) each (up to MAX_PARTS, rows
contiguous); rows (R,) int64: the accepted path's rows. The concatenation and the gather were two
launches that Programmatic Dependent Launch could not overlap; here a program copies one row of
one part, after the kernels that wrote the rows and the parts. gather_states_ref is the torch
form (the tests' reference, and any other count of parts).
"""

from __future__ import annotations

import functools

import torch

from engine.kernels import next_pow2, pdl_args

triton = tl = None  # bound by _kernel(): Triton is imported on first use only

MAX_PARTS = 4  # parts a launch takes (an EAGLE-3 head reads three)
_BLOCK = 2048  # columns a program copies


@functools.cache
def _kernel():
    global triton, tl  # module globals: the kernel reads them by name
    import triton
    import triton.language as tl

    @triton.jit
    def gather_states_kernel(rows_ptr, out_ptr, p0, p1, p2, p3, s0, s1, s2, s3, width, stride_out,
                             BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
        if USE_PDL:  # the rows come from the walk's launch, the parts from the verify forward
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        r = tl.program_id(0)
        part = tl.program_id(1)
        cols = tl.program_id(2) * BLOCK + tl.arange(0, BLOCK)
        inside = cols < width
        row = tl.load(rows_ptr + r)
        if part == 0:
            src = p0 + row * s0
        elif part == 1:
            src = p1 + row * s1
        elif part == 2:
            src = p2 + row * s2
        else:
            src = p3 + row * s3
        values = tl.load(src + cols, mask=inside)
        tl.store(out_ptr + r * stride_out + part * width + cols, values, mask=inside)

    return gather_states_kernel


def gather_states(parts: tuple[torch.Tensor, ...] | list[torch.Tensor], rows: torch.Tensor,
                  pdl: bool = True) -> torch.Tensor:
    """The module's docstring. CUDA (or the Triton interpreter); more than MAX_PARTS parts, or parts
    of other widths or dtypes, take the torch form."""
    first = parts[0]
    if (len(parts) > MAX_PARTS or rows.dim() != 1
            or any(p.shape != first.shape or p.dtype != first.dtype or p.stride(1) != 1 for p in parts)):
        return gather_states_ref(parts, rows)
    width = first.shape[1]
    out = torch.empty((rows.shape[0], len(parts) * width), dtype=first.dtype, device=first.device)
    if rows.shape[0] == 0:
        return out
    padded = list(parts) + [first] * (MAX_PARTS - len(parts))  # never read past len(parts)
    block = min(_BLOCK, next_pow2(width))
    _kernel()[(rows.shape[0], len(parts), -(-width // block))](
        rows, out, *padded, *(p.stride(0) for p in padded), width, out.stride(0), BLOCK=block, num_warps=4,
        **pdl_args(first.device, pdl))
    return out


def gather_states_ref(parts, rows: torch.Tensor) -> torch.Tensor:
    """gather_states in torch ops."""
    return torch.cat(list(parts), dim=-1).index_select(0, rows)
