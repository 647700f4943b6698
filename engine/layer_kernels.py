"""LayerKernels: the launches of a decoder layer's norm + projection pairs and MLP for one step,
unfused or fused (FusedLayerKernels), with the kernels and tiles engine/routing.py picks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from engine import routing
from engine.kernels.gemv import (MAX_ROWS, gated_gemv, gemv_add_norm, gemv_add_stats, gemv_rstd, rms_norm_gated_gemv,
                                 rms_norm_gemv, silu_mul_gemv)
from engine.options import KernelOptions
from engine.routing import INVARIANT, ROW, UNFUSED


@dataclass(frozen=True)
class Normed:
    """A sublayer's output already added to the stream and normed by `norm` (a projection with
    a norm tail, FusedLayerKernels.ending): the norm_linear or mlp that follows takes it as is."""
    normed: torch.Tensor  # norm(stream)
    stream: torch.Tensor  # the sublayer's output + the stream before it
    norm: object  # the RMSNorm module it was normed with


@dataclass(frozen=True)
class Scaled:
    """A sublayer's output added to the stream, times the weight of the norm that follows, with the
    squares that norm's 1 / rms comes from (gemv_add_stats: the invariant set's o_proj and down):
    the projection after the norm takes it as is and scales its dot by 1 / rms (gemv_rstd)."""
    hg: torch.Tensor  # stream * norm.weight
    stream: torch.Tensor  # the sublayer's output + the stream before it
    sq: torch.Tensor  # (T, programs) partial sums of stream^2
    norm: object  # the RMSNorm module whose weight hg carries


def rows_of(x: "torch.Tensor | Normed | Scaled") -> torch.Tensor:
    """The (T, H) tensor that stands for x's rows (shape, dtype, device)."""
    if isinstance(x, Scaled):
        return x.hg
    return x.normed if isinstance(x, Normed) else x


class LayerKernels:
    """A decoder layer's two norm + projection pairs and its MLP's down projection, unfused:
    add_rms_norm then the projection; silu_and_mul then the down projection (GatedMLP.down)."""

    def __init__(self, project: Callable, add_rms_norm: Callable | None = None,
                 silu_and_mul: Callable | None = None):
        # (x, linear, role) -> linear(x), on the kernel routing.linear_route picks for this set
        self.project = project
        # None: the modules' own (the target's carry the kernels); a draft's modules are plain
        # torch, so its kernels come here.
        self.add_rms_norm, self.silu_and_mul = add_rms_norm, silu_and_mul

    def norm_linear(self, x: torch.Tensor, residual: torch.Tensor | None, norm, linear: torch.nn.Linear, role: str):
        """-> (linear(norm(x + residual)), x + residual); residual None: the stream is x.
        role: the projection's (routing.ROLES)."""
        h, stream = self.add_norm(x, residual, norm)
        return self.project(h, linear, role), stream

    def add_norm(self, x: "torch.Tensor | Normed", residual: torch.Tensor | None,
                 norm) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (norm(x + residual), x + residual), on these kernels' add_rms_norm or the module's
        (x Normed: what its projection's tail computed)."""
        if isinstance(x, Normed):
            assert x.norm is norm, "normed for another norm"
            return x.normed, x.stream
        if isinstance(x, Scaled):  # a kernel set without gemv_rstd: the norm after all
            assert x.norm is norm, "scaled for another norm"
            return self.add_norm(x.stream, None, norm)
        if self.add_rms_norm is not None:
            return self.add_rms_norm(x, residual, norm.weight, norm.eps)
        return norm.add_forward(x, residual)

    def mlp(self, x, residual: torch.Tensor | None, norm, mlp, then=None) -> tuple["torch.Tensor | Normed", torch.Tensor]:
        """The MLP sublayer: (down(silu(gate) * up) of norm(x + residual), x + residual).
        then: the norm that follows and its projection, (norm, linear, role) (see ending)."""
        gate_up, stream = self.norm_linear(x, residual, norm, mlp.gate_up_proj, "gate_up")
        down = self.ending(stream, then)
        if down is not None:
            return down(self.activation(gate_up, mlp), mlp.down_proj), stream
        return self.mlp_down(gate_up, mlp), stream

    def activation(self, gate_up: torch.Tensor, mlp) -> torch.Tensor:
        """(T, 2I) [gate | up] -> silu(gate) * up, on these kernels' activation or the MLP's."""
        act = self.silu_and_mul or mlp.silu_and_mul
        if act is not None:
            return act(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up

    def ending(self, residual: torch.Tensor | None, then) -> Callable | None:
        """A sublayer's last projection (o_proj, down) as (x, linear) -> Normed, taking the
        residual add and `then`'s norm into its last program; None: a plain projection."""
        return None

    def mlp_down(self, gate_up: torch.Tensor, mlp) -> torch.Tensor:
        """(T, 2I) [gate | up] -> down(silu(gate) * up)."""
        if self.silu_and_mul is not None:
            return self.project(self.silu_and_mul(gate_up), mlp.down_proj, "down")
        return mlp.down(gate_up)


class FusedLayerKernels(LayerKernels):
    """One launch each: rms_norm_gemv for add_rms_norm + qkv and add_rms_norm + gate_up,
    silu_mul_gemv for silu_and_mul + down (or, on the one-row kernel, gated_gemv for gate_up and the
    activation), each with its routing tile, or unfused where routing says so. invariant: the
    batch-invariant tensor-core kernels (a row's bits the same for any row count up to 16); else
    the M = 1 tiles (with each_row, row by row: batch-invariant as well)."""

    def __init__(self, options: KernelOptions, invariant: bool, project: Callable, each_row: bool = False,
                 **unfused):
        super().__init__(project, **unfused)
        self.options = options
        self.invariant = invariant
        self.mode = INVARIANT if invariant else ROW
        # The ROW set on several rows runs the one-row kernels row by row (a batch-invariant
        # target's small layers: routing.each_row_layer); without it, the dot kernel (a draft's).
        self.each_row = each_row and not invariant

    def norm_linear(self, x, residual, norm, linear, role):
        if isinstance(x, Scaled) and self.invariant and routing.plain_weight(linear, x.hg.dtype):
            assert x.norm is norm, "scaled for another norm"
            out = gemv_rstd(x.hg, x.sq, norm.eps, linear.weight, linear.bias,
                            config=routing.invariant_tile(tuple(linear.weight.shape)), pdl=self.options.pdl)
            return out, x.stream
        tile = routing.norm_tile(self.options, self.mode, rows_of(x).shape[0], tuple(linear.weight.shape),
                                 self.each_row)
        if tile == UNFUSED or isinstance(x, (Normed, Scaled)):
            return super().norm_linear(x, residual, norm, linear, role)
        return rms_norm_gemv(x, residual, norm.weight, norm.eps, linear.weight, linear.bias, tile, self.invariant,
                             pdl=self.options.pdl, each_row=self.each_row)

    def mlp(self, x, residual, norm, mlp, then=None):
        gate_up, rows = mlp.gate_up_proj, rows_of(x)
        if isinstance(x, Scaled) and self.invariant and routing.gates_invariant(self.options, gate_up, rows.dtype):
            # gate_up scaled by the norm's 1 / rms and the activation after the same dots: one launch
            assert x.norm is norm, "scaled for another norm"
            act = gemv_rstd(x.hg, x.sq, norm.eps, gate_up.weight, gate_up.bias,
                            config=routing.invariant_tile(tuple(gate_up.weight.shape)), pdl=self.options.pdl,
                            gate=True)
            return self._down(act, x.stream, mlp, then), x.stream
        shape = tuple(gate_up.weight.shape)
        if not routing.is_gated(self.options, self.mode, rows.shape[0], shape, rows.dtype, self.each_row):
            return super().mlp(x, residual, norm, mlp, then if self.invariant else None)
        tile, pdl = routing.gated_tile(self.options, shape), self.options.pdl
        if routing.norm_tile(self.options, ROW, 1, shape) == UNFUSED or isinstance(x, (Normed, Scaled)):
            h, stream = self.add_norm(x, residual, norm)
            act = gated_gemv(h, gate_up.weight, gate_up.bias, tile, pdl=pdl)
        else:
            act, stream = rms_norm_gated_gemv(x, residual, norm.weight, norm.eps, gate_up.weight, gate_up.bias, tile,
                                              pdl=pdl)
        return self._down(act, stream, mlp, then), stream

    def _down(self, act: torch.Tensor, stream: torch.Tensor, mlp, then):
        """The down projection of an activation a gated launch computed: with `then`'s norm where
        ending() carries it, else on its own."""
        down = self.ending(stream, then)
        return down(act, mlp.down_proj) if down else self.project(act, mlp.down_proj, "down")

    def ending(self, residual, then):
        """A one-row step's o_proj or down with gemv_add_norm, where `then` = (norm, linear, role)
        would otherwise run the norm as its own launch (routing.carries_norm); the invariant set's
        with gemv_add_stats, where the projection after the norm takes a Scaled
        (routing.carries_stats). None elsewhere."""
        if then is None or residual is None:
            return None
        norm, next_linear, role = then
        if self.invariant:
            if not routing.carries_stats(self.options, residual.shape[0], residual.dtype, role, next_linear):
                return None

            ends = "o_proj" if role == "gate_up" else "down"  # the sublayer before `then`'s norm

            def project_stats(x: torch.Tensor, linear: torch.nn.Linear) -> "torch.Tensor | Scaled":
                if not routing.plain_weight(linear, x.dtype):
                    return self.project(x, linear, "o_proj")
                tile, each_row = routing.stats_route(self.options, ends, tuple(linear.weight.shape))
                return Scaled(*gemv_add_stats(x, linear.weight, linear.bias, residual, norm.weight, config=tile,
                                              pdl=self.options.pdl, each_row=each_row), norm)

            return project_stats
        if not routing.carries_norm(self.options, self.mode, residual.shape[0], residual.dtype, role,
                                    tuple(next_linear.weight.shape), self.each_row):
            return None

        def project(x: torch.Tensor, linear: torch.nn.Linear) -> "torch.Tensor | Normed":
            tile = routing.tail_tile(self.options, tuple(linear.weight.shape))
            if tile is None:
                return self.project(x, linear, "o_proj")  # o_proj and down route alike
            return Normed(*gemv_add_norm(x, linear.weight, linear.bias, residual, norm.weight, norm.eps, tile,
                                         pdl=self.options.pdl), norm)

        return project

    def mlp_down(self, gate_up, mlp):
        down = mlp.down_proj
        tile = routing.down_tile(self.options, self.mode, gate_up.shape[0], tuple(down.weight.shape), self.each_row)
        if (tile == UNFUSED and self.invariant and gate_up.shape[0] > MAX_ROWS and mlp.silu_and_mul is not None
                and routing.plain_weight(down, gate_up.dtype)):
            # a draft tree's rows (routing.tree_rows): apart on this set's route, which row_linear's
            # is up to 16 rows
            return self.project(mlp.silu_and_mul(gate_up), down, "down")
        if tile == UNFUSED:
            return super().mlp_down(gate_up, mlp)
        return silu_mul_gemv(gate_up, down.weight, down.bias, tile, self.invariant, pdl=self.options.pdl,
                             each_row=self.each_row)


class RoundingLayerKernels(LayerKernels):
    """The unfused set of a quantized layer's one-row step with no draft loaded (the one-row packed
    kernel with int8 x): the norm before qkv and gate_up and the activation before down also round
    their output to int8 for the projection after them (rounded_x.RoundedX), in the same launch,
    where every block of that projection takes it (PackedLinear.rounded_order). The values are
    those of LayerKernels with int8 x, but for x's vectors: 32 inputs a scale here, the row
    kernel's own 16 or 32 there."""

    def __init__(self, options: KernelOptions, project: Callable):
        super().__init__(project)
        self.options = options

    def norm_linear(self, x, residual, norm, linear, role):
        from engine.kernels.norm import add_rms_norm_rounded

        order = _order(linear)
        if order is None or isinstance(x, (Normed, Scaled)) or x.shape[0] != 1:
            return super().norm_linear(x, residual, norm, linear, role)
        h, stream, rounded = add_rms_norm_rounded(x, residual, norm.weight, norm.eps, order, pdl=self.options.pdl)
        return self.project(h, linear, role, rounded=rounded), stream

    def mlp_down(self, gate_up, mlp):
        from engine.kernels.activation import silu_and_mul_rounded

        order = _order(mlp.down_proj)
        if order is None or gate_up.shape[0] != 1:
            return super().mlp_down(gate_up, mlp)
        act, rounded = silu_and_mul_rounded(gate_up, order, pdl=self.options.pdl)
        return self.project(act, mlp.down_proj, "down", rounded=rounded)


def _order(linear) -> bool | None:
    from engine.packed_linear import PackedLinear

    return linear.rounded_order() if isinstance(linear, PackedLinear) else None
