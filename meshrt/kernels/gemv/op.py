"""Tiled GEMV on a w x h grid, in either orientation (`axis`, the direction its partials reduce).

axis "col" (the default): core (column i, row j) holds W[in-chunk j, out-chunk i]; the input is
split over rows, the partials reduce down each column. axis "row": core (i, j) holds
W[in-chunk i, out-chunk j]; the input is split over columns, the partials reduce along each row.
Consecutive GEMVs on one region alternate orientations, so each one's result is already laid out
as the next one's input (WaferLLM's MeshGEMV): no data moves between them but the reductions.
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import DenseArrayBase, StringAttr, UnitAttr, i64
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType
from meshrt.dialects.base import int_value
from meshrt.kernels.allreduce.op import AllReduceOp
from meshrt.kernels.attention.layout import splits_heads
from meshrt.kernels.attention.op import AttentionOp, qkv_blocks, reads_qkv_in_place
from meshrt.dialects.graph import verify_weights
from meshrt.kernels.compute import DEQUANT, FMAC
from meshrt.kernels.gemv.numerics import Gemv
from meshrt.kernels.gemv.pe import bodies_for
from meshrt.kernels.gemv.tiles import array_values, split_counts, tile_shape
from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    Footprint,
    KernelContext,
    KernelOp,
    Role,
    UNARY_FORMAT,
    ceil_div,
)


def _split_heads(attn: graph.AttentionOp | AttentionOp) -> DenseArrayBase | None:
    """[heads, kv_heads, head_dim, columns] of attention `attn` where it splits head_dim
    over its columns, else None."""
    w = attn.region.rects.data[0].w.data  # its own rectangle (not a spill tile)
    heads, kv, d = (int_value(a) for a in (attn.heads, attn.kv_heads, attn.head_dim))
    if not splits_heads(kv, w):
        return None
    return DenseArrayBase.from_list(i64, [heads, kv, d, w])


@irdl_op_definition
class GemvOp(KernelOp):
    """Tiled GEMV on its grid, in the orientation `axis` names (default "col").

    axis "col": the input is split over rows and the output over columns, so
    the result is partial sums in every row; the column `allreduce` that
    follows completes them. axis "row": transposed (input over columns,
    partials completed by a row `allreduce`).
    """

    name = "mesh_kernel.gemv"
    axis = opt_prop_def(StringAttr)
    # the output laid out blocked per column (`numerics.block_order`): q | k | v for an
    # attention on the same columns, which then reads it in place
    blocks = opt_prop_def(DenseArrayBase)
    # [heads, kv_heads, head_dim, columns] of an attention splitting head_dim over its
    # columns (`attention.layout`): out_heads, the q | k | v it reads in place is laid out
    # in its units; in_heads, the input is such an attention's output (rows permuted)
    out_heads = opt_prop_def(DenseArrayBase)
    in_heads = opt_prop_def(DenseArrayBase)
    weights = opt_prop_def(StringAttr)  # W stored quantized (`meshrt.quant`): decoded per tile
    bias = opt_prop_def(UnitAttr)  # y = x W + b: the cores of the first input rows hold b
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#377eb8"
    VIZ_RANK: ClassVar[int] = 2
    COMPUTE: ClassVar[tuple] = (FMAC, *DEQUANT.values())
    VALUE_IN_FP32: ClassVar[bool] = True  # partial sums: the allreduce after it sums them
    NUMERICS: ClassVar[type] = Gemv
    LOWERS: ClassVar[tuple] = (graph.MatmulOp,)

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return bodies_for(info, micro_batch, hp, tile)

    @property
    def reduce_axis(self) -> str:
        return self.axis.data if self.axis is not None else "col"

    def splits(self) -> tuple[int, int]:
        """(cores the input is split over, cores the output is split over)."""
        _, _, w, h = self.grid()
        return split_counts(w, h, self.reduce_axis)

    @property
    def weight_format(self) -> str | None:
        return self.weights.data if self.weights is not None else None

    def verify_kernel(self) -> None:
        verify_weights(self)
        if self.reduce_axis not in ("row", "col"):
            raise self.fail(f"axis must be 'row' or 'col', got '{self.reduce_axis}'")
        across_in, across_out = self.splits()
        n_in, n_out = self.input.type.width.data, self.output.type.width.data
        if self.blocks is not None and sum(self.blocks.get_values()) != n_out:
            raise self.fail(f"blocks {list(self.blocks.get_values())} do not add up to the "
                            f"output width {n_out}")
        for key, heads in (("out_heads", self.out_heads), ("in_heads", self.in_heads)):
            if heads is not None:
                vals = heads.get_values()
                if len(vals) != 4 or min(vals) < 1 or not splits_heads(vals[1], vals[3]):
                    raise self.fail(f"{key} must be [heads, kv_heads, head_dim, columns] of an "
                                    f"attention wider than its KV heads, got {list(vals)}")
        if self.out_heads is not None and self.blocks is None:
            raise self.fail("out_heads lays out a blocked q | k | v: it needs blocks")
        if n_in < across_in or n_out < across_out:
            _, _, w, h = self.grid()
            raise self.fail(
                f"a {w} x {h} grid is too large for a {n_in} x "
                f"{n_out} matrix: every core needs at least one row and column"
            )

    @staticmethod
    def footprint(n_in: int, n_out: int, weight_bytes: float, micro_batch: int, w: int, h: int,
                  axis: str = "col", tile: tuple[int, int] | None = None,
                  bias: bool = False) -> Footprint:
        """The weight tile (`tile`: its rows and columns where the split is not plain,
        `tile_shape`) and its columns' biases, plus input and output buffers and one input
        row of staging."""
        across_in, across_out = split_counts(w, h, axis)
        it, ot = tile or (ceil_div(n_in, across_in), ceil_div(n_out, across_out))
        return Footprint((it * ot + (ot if bias else 0)) * weight_bytes,
                         micro_batch * (it + ot) * ACT_BYTES + it * weight_bytes)

    def tile_shape(self) -> tuple[int, int]:
        """(input rows, output columns) of the fullest core's tile (`tile_shape`)."""
        _, _, w, h = self.grid()
        return tile_shape(self.input.type.width.data, self.output.type.width.data, w, h,
                          self.reduce_axis, array_values(self.blocks), array_values(self.out_heads),
                          array_values(self.in_heads))

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        n_in, n_out = self.input.type.width.data, self.output.type.width.data
        fmt = self.weight_format
        it, ot = self.tile_shape()
        state = self.footprint(n_in, n_out, kctx.stored_bytes(fmt, kctx.weight_bytes),
                               kctx.micro_batch, w, h, self.reduce_axis, (it, ot),
                               self.bias is not None).state
        tile = it * ot
        # a quantized tile is decoded where the kernel computes, once per step
        decode = [("compute", DEQUANT[fmt].name, tile)] if fmt else []
        events = [INPUTS, *decode, ("compute", "fmac", kctx.micro_batch * tile)]
        return [Role("tile", self.region, events, int(state))], []

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.splits()[0])

    def input_layout(self) -> str:
        return "rows" if self.reduce_axis == "col" else "cols"

    def output_layout(self) -> str:
        return "partial"

    @classmethod
    def lower(cls, op, operands, make):
        """A GEMV and its allreduce; transposed when its input is laid out over columns of
        its own region (the previous GEMV's result there, or a kernel on some of its columns,
        as a DeltaNet narrower than its layer), so it is read in place or moved down the
        columns; its output blocked as q | k | v when an attention on its columns reads it
        (`reads_qkv_in_place`)."""
        rt = op.results[0].type
        producer = operands[0].owner
        transposed = False
        if isinstance(producer, KernelOp) and producer.output_layout() == "cols":
            px0, _, px1, _ = producer.result_cores().extent
            x0, _, x1, _ = op.region.extent
            transposed = x0 <= px0 and px1 <= x1
        props = {"axis": StringAttr("row")} if transposed else {}
        if op.weights is not None:
            props["weights"] = op.weights
        if op.bias is not None:
            props["bias"] = UnitAttr()
        if any(isinstance(u.operation, graph.ElementwiseOp) and u.operation.kind.data == "silu_mul"
               for u in op.results[0].uses):
            # gate | up: each core of the output split holds its part of both, which
            # silu_mul pairs
            half = rt.width.data // 2
            props["blocks"] = DenseArrayBase.from_list(i64, [half, half])
        for use in () if transposed else op.results[0].uses:
            attn = use.operation
            if isinstance(attn, graph.AttentionOp) and reads_qkv_in_place(attn, op.region):
                blocks = qkv_blocks(int_value(attn.heads), int_value(attn.kv_heads), int_value(attn.head_dim),
                                    attn.is_gated)
                props["blocks"] = DenseArrayBase.from_list(i64, blocks)
                heads = _split_heads(attn)
                if heads is not None:
                    props["out_heads"] = heads
        if isinstance(producer, AttentionOp):
            heads = _split_heads(producer)
            if heads is not None:  # its rows in the order the attention leaves its output
                props["in_heads"] = heads
        gemv = make(cls, op, operands, rt, **props)
        red = make(AllReduceOp, op, gemv.results, rt, name=f"{op.kernel_name}.reduce",
                   axis=StringAttr("row" if transposed else "col"))
        return [gemv, red], red.results[0]
