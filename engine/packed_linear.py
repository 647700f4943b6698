"""PackedLinear: a decoder layer's projection whose weight stays quantized on the GPU (one or more
GroupedWeight row blocks), decoded inside the GEMV of each decode or verify step
(kernels/packed_gemv.py).

Steps of up to 16 rows run a batch-invariant kernel, as the bf16 tiles are, so greedy speculation
over a quantized target keeps the bits of its plain decoding: packed_gemv (bf16 tensor-core dots),
or where asked (LOCALCHAT_PACKED_INVARIANT_X=int8, slower so far) packed_rows_gemv (x rounded to
int8, integer dot products) for the kinds with integer values; an engine with no draft loaded
runs its one-row steps on packed_row_gemv, which is faster and needs no such invariance.
Longer steps (prefill) run packed_matmul, which decodes each weight tile inside the matmul (or,
as asked, dequantize slices of the weight and run cuBLAS: _long_step). The layers that hold one run
the unfused norm and activation launches (Ops.layer_kernels), since the fused kernels read a bf16
weight. A projection whose parts come in different formats (a Q4_K_M file's Q4_K q and k beside
a Q6_K v) keeps a block per format, one launch each, each writing its columns of the output.
"""

from __future__ import annotations

import contextlib
import contextvars

import torch
import torch.nn.functional as F
from torch import nn

from engine.weights.grouped import TENSORS, GroupedWeight, dequantize_grouped, rows_of, select_rows

MAX_ROWS = 16
# Values dequantized at once by a long step: 32 MB as fp32, about 130 MB at dequantize_grouped's
# peak (some 16 bytes a value), the most a prefill adds to the memory a model holds.
DEQUANT_CHUNK = 1 << 23
# How a long step (prefill, more than MAX_ROWS rows) runs on a GPU: PackedLinear._long_step.
PREFILL_WAYS = ("fused", "dequant", "torch")
_ON_META = contextvars.ContextVar("projections_on_meta", default=False)


@contextlib.contextmanager
def projections_on_meta(on: bool = True):
    """Decoder layers built inside allocate their projections on the meta device (nothing), for a
    load that replaces them with PackedLinears: the dense weights are never allocated, so a model
    whose bf16 weights would not fit the GPU still loads. Any float part that arrives for one is
    allocated then (load_weights)."""
    token = _ON_META.set(on)
    try:
        yield
    finally:
        _ON_META.reset(token)


def projection_device() -> str | None:
    """The device argument of a decoder layer's projections: "meta" inside projections_on_meta."""
    return "meta" if _ON_META.get() else None


def kernel_for(block: GroupedWeight, num_rows: int, one_row: bool, int8_rows: bool = False):
    """The GEMV a step of num_rows (up to 16) runs on a block: packed_row_gemv for a single row
    when one_row (no draft loaded) and the kind is one it runs faster, else a batch-invariant one:
    packed_rows_gemv (x rounded to int8, integer dot products) where int8_rows and the kind has
    integer values, packed_gemv (bf16 tensor-core dots) otherwise."""
    from engine.kernels.packed_gemv import packed_gemv, packed_row_gemv, row_kernel_fits
    from engine.kernels.packed_rows import packed_rows_gemv, rows_kernel_fits

    if one_row and num_rows == 1 and row_kernel_fits(block):
        return packed_row_gemv
    return packed_rows_gemv if int8_rows and rows_kernel_fits(block) else packed_gemv


class PackedLinear(nn.Module):
    def __init__(self, blocks: list[GroupedWeight], bias: nn.Parameter | None = None):
        super().__init__()
        assert blocks and all(b.shape[1] == blocks[0].shape[1] for b in blocks)
        self.in_features = blocks[0].shape[1]
        self.out_features = sum(b.shape[0] for b in blocks)
        self._meta = [(b.kind, b.shape, b.group, b.format, b.unit) for b in blocks]
        for i, b in enumerate(blocks):
            for name, t in zip(TENSORS, b.tensors()):
                self.register_buffer(f"{name}{i}", t)
        self.bias = bias
        self.format = "+".join(dict.fromkeys(b.format for b in blocks))

    @property
    def blocks(self) -> list[GroupedWeight]:
        return [GroupedWeight(kind, shape, group, *(getattr(self, f"{name}{i}") for name in TENSORS[:3]), fmt, unit,
                              *(getattr(self, f"{name}{i}") for name in TENSORS[3:]))
                for i, (kind, shape, group, fmt, unit) in enumerate(self._meta)]

    @property
    def nbytes(self) -> int:
        return sum(b.nbytes for b in self.blocks)

    def shared(self) -> "PackedLinear":
        """Another module over the same tensors (a model's twin under other kernel options)."""
        return PackedLinear(self.blocks, self.bias)

    def rounded_order(self) -> bool | None:
        """The word order (packed_gemv.rounds_x) in which every block of this projection takes one
        row of x rounded before its launch (RoundedX) on the one-row kernel, or None where some
        block does not (FP8, a K with no one-row tile, two orders)."""
        from engine.kernels.packed_gemv import rounds_x, row_kernel_fits

        if not hasattr(self, "_rounded_order"):  # asked at every step: the blocks never change
            blocks = self.blocks
            orders = {rounds_x(b) for b in blocks}
            fits = len(orders) == 1 and None not in orders and all(row_kernel_fits(b) for b in blocks)
            self._rounded_order = orders.pop() if fits and self.in_features % 32 == 0 else None
        return self._rounded_order

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return torch.cat([dequantize_grouped(b).to(dtype) for b in self.blocks])

    def forward(self, x: torch.Tensor, one_row: bool = False, prefill: str = "fused",
                int8_x: bool = False, int8_rows: bool = False, one_launch: bool = False,
                row_pdl: int = 0, rounded=None, pdl: int = 0, short: bool = True) -> torch.Tensor:
        """one_row: a single row runs packed_row_gemv (an engine with no draft loaded), not a
        batch-invariant kernel; int8_x: there with x rounded to int8 (every kind but FP8);
        rounded: there x's row already rounded (a RoundedX in rounded_order(), which the kernel
        before produced), in place of x;
        one_launch: there a projection's two blocks in one launch (packed_row_gemv_blocks).
        int8_rows: the batch-invariant steps on packed_rows_gemv (kernel_for). prefill: how a
        longer step runs on the GPU (PREFILL_WAYS). row_pdl: the one-row kernel's PDL
        (KernelOptions.packed_row_pdl); pdl and short: packed_gemv's (KernelOptions.packed_gemv_pdl,
        packed_short_tiles)."""
        from engine.kernels.packed_gemv import blocks_fit_one_launch, packed_row_gemv, packed_row_gemv_blocks
        from engine.kernels.packed_rows import nibble_order, packed_rows_gemv, quantize_rows

        lead = x.shape[:-1]
        rows = x.reshape(-1, self.in_features)
        if rows.is_cuda and 1 <= rows.shape[0] <= MAX_ROWS and rows.dtype in (torch.bfloat16, torch.float16):
            by_order = {}  # x rounded to int8 once for the blocks that share its word order
            if rounded is not None:
                assert one_row and int8_x and rows.shape[0] == 1 and rounded.nibble_order == self.rounded_order()

            def gemv(x, block, bias, out=None):
                kernel = kernel_for(block, x.shape[0], one_row, int8_rows)
                if kernel is packed_row_gemv:
                    return kernel(x if rounded is None else rounded, block, bias, out=out, int8_x=int8_x, pdl=row_pdl)
                if kernel is packed_rows_gemv:
                    order = nibble_order(block)
                    if order not in by_order:
                        by_order[order] = quantize_rows(x, order)
                    return kernel(x, block, bias, out=out, xq=by_order[order])
                return kernel(x, block, bias, out=out, pdl=pdl, short=short)

            rows = rows if rows.stride(1) == 1 else rows.contiguous()
            blocks = self.blocks
            if len(blocks) == 1:
                out = gemv(rows, blocks[0], self.bias)
            elif one_launch and one_row and rows.shape[0] == 1 and blocks_fit_one_launch(blocks):
                out = torch.empty((1, self.out_features), dtype=rows.dtype, device=rows.device)
                cut = blocks[0].shape[0]
                biases = [None, None] if self.bias is None else [self.bias[:cut], self.bias[cut:]]
                packed_row_gemv_blocks(rows if rounded is None else rounded, blocks, biases,
                                       [out[:, :cut], out[:, cut:]], int8_x=int8_x, pdl=row_pdl)
            else:
                out = torch.empty((rows.shape[0], self.out_features), dtype=rows.dtype, device=rows.device)
                for b, bias, cols in self._by_columns(blocks):
                    gemv(rows, b, bias, out=out[:, cols])
        else:
            out = self._long_step(rows, prefill)
        return out.reshape(*lead, self.out_features)

    def _by_columns(self, blocks: list[GroupedWeight]):
        """(block, its part of the bias or None, its columns of the output as a slice) for each of
        this projection's blocks (self.blocks, which the caller has): each launch writes its own
        columns."""
        start = 0
        for block in blocks:
            stop = start + block.shape[0]
            yield block, None if self.bias is None else self.bias[start:stop], slice(start, stop)
            start = stop

    def _long_step(self, rows: torch.Tensor, how: str) -> torch.Tensor:
        """A long step (prefill) or the CPU. On a GPU in bf16/fp16: "fused" decodes each weight
        tile inside the matmul (packed_matmul), no slice in memory (the fastest: 2.7x "dequant"
        on an 8B Q4_K_M); "dequant" decodes a slice of output rows at a time with a kernel
        (dequantize_packed) and multiplies it by cuBLAS; "torch" (and the CPU) dequantizes each
        slice with the torch reference. A slice holds at most DEQUANT_CHUNK values, so an 8B's
        lm_head never stands in memory whole."""
        if how not in PREFILL_WAYS:
            raise ValueError(f"prefill: {how!r} is not one of {PREFILL_WAYS}")
        on_gpu = rows.is_cuda and rows.dtype in (torch.bfloat16, torch.float16)
        out = torch.empty((rows.shape[0], self.out_features), dtype=rows.dtype, device=rows.device)
        if on_gpu and how == "fused":
            from engine.kernels.packed_gemv import packed_matmul

            for block, bias, cols in self._by_columns(self.blocks):
                packed_matmul(rows if rows.stride(1) == 1 else rows.contiguous(), block, bias, out=out[:, cols])
            return out
        if on_gpu and how == "dequant":
            from engine.kernels.packed_gemv import dequantize_packed

            def decoded(part):
                return dequantize_packed(part, rows.dtype)
        else:
            def decoded(part):
                return dequantize_grouped(part).to(rows.dtype)
        chunk = max(1, DEQUANT_CHUNK // self.in_features)
        start = 0
        for block in self.blocks:
            for a in range(0, block.shape[0], chunk):
                b = min(block.shape[0], a + chunk)
                w = decoded(rows_of(block, a, b))
                bias = None if self.bias is None else self.bias[start + a:start + b]
                out[:, start + a:start + b] = F.linear(rows, w, bias)
            start += block.shape[0]
        return out

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, format={self.format}"


class PackedEmbedding(nn.Module):
    """The token embeddings kept quantized (a GGUF's token_embd): a lookup dequantizes the rows
    of its tokens, in float32 as the format's reference does, then casts them to `dtype` (the
    model's), by torch ops or, on the GPU kernels, one launch (Ops.lookup). Values equal those of
    the table dequantized at load and cast the same way. A tied lm_head is a PackedLinear over the
    same tensors (PackedEmbedding.as_linear)."""

    def __init__(self, block: GroupedWeight, dtype: torch.dtype):
        super().__init__()
        self.num_embeddings, self.embedding_dim = block.shape
        self._meta = (block.kind, block.shape, block.group, block.format, block.unit)
        for name, t in zip(TENSORS, block.tensors()):
            self.register_buffer(name, t)
        self.dtype = dtype
        self.format = block.format

    @property
    def block(self) -> GroupedWeight:
        kind, shape, group, fmt, unit = self._meta
        return GroupedWeight(kind, shape, group, *(getattr(self, name) for name in TENSORS[:3]), fmt, unit,
                             *(getattr(self, name) for name in TENSORS[3:]))

    @property
    def nbytes(self) -> int:
        return self.block.nbytes

    def shared(self) -> "PackedEmbedding":
        return PackedEmbedding(self.block, self.dtype)

    def as_linear(self) -> PackedLinear:
        """lm_head tied to these embeddings: a projection over the same tensors."""
        return PackedLinear([self.block])

    def forward(self, ids: torch.Tensor, kernel: bool = False, pdl: bool = False) -> torch.Tensor:
        """kernel: the rows decoded by one launch of packed_embed_rows (the GPU kernels' way,
        Ops.lookup; pdl its launch option), else by torch ops: the same values."""
        flat = ids.reshape(-1).long()
        if kernel:
            from engine.kernels.packed_gemv import packed_embed_rows

            rows = packed_embed_rows(flat, self.block, self.dtype, pdl)
        else:
            rows = dequantize_grouped(select_rows(self.block, flat)).to(self.dtype)
        return rows.reshape(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, format={self.format}"


def share_packed(source: nn.Module, twin: nn.Module) -> None:
    """Puts into `twin` (the same architecture, built with plain nn.Linear and nn.Embedding) a
    PackedLinear or PackedEmbedding over the same tensors wherever `source` holds one, so that its
    state dict loads into it."""
    for name, module in source.named_modules():
        if isinstance(module, (PackedLinear, PackedEmbedding)):
            parent, _, attr = name.rpartition(".")
            setattr(twin.get_submodule(parent) if parent else twin, attr, module.shared())


def is_packed_layer(*linears: nn.Module) -> bool:
    return any(isinstance(m, PackedLinear) for m in linears)
