"""Tiled GEMV: core (column i, row j) of the w x h grid holds W[in-chunk j, out-chunk i]."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import StringAttr
from xdsl.irdl import irdl_op_definition, operand_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType
from meshrt.kernels.allreduce.op import AllReduceOp
from meshrt.kernels.compute import FMAC
from meshrt.kernels.gemv.numerics import Gemv
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


@irdl_op_definition
class GemvOp(KernelOp):
    """Tiled GEMV: core (column i, row j) of the w x h grid holds W[in-chunk j, out-chunk i].

    The input is split over rows and the output over columns, so the result
    is partial sums in every row; the column `allreduce` that follows
    completes them.
    """

    name = "mesh_kernel.gemv"
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#377eb8"
    VIZ_RANK: ClassVar[int] = 2
    COMPUTE: ClassVar[tuple] = (FMAC,)
    NUMERICS: ClassVar[type] = Gemv
    LOWERS: ClassVar[tuple] = (graph.MatmulOp,)

    def verify_kernel(self) -> None:
        _, _, w, h = self.grid()
        n_in, n_out = self.input.type.width.data, self.output.type.width.data
        if n_in < h or n_out < w:
            raise self.fail(
                f"a {w} x {h} grid is too large for a {n_in} x "
                f"{n_out} matrix: every core needs at least one row and column"
            )

    @staticmethod
    def footprint(n_in: int, n_out: int, weight_bytes: float, micro_batch: int, w: int, h: int) -> Footprint:
        """The weight tile, plus input and output buffers and one input row of staging."""
        it, ot = ceil_div(n_in, h), ceil_div(n_out, w)
        return Footprint(it * ot * weight_bytes, micro_batch * (it + ot) * ACT_BYTES + it * weight_bytes)

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        n_in, n_out = self.input.type.width.data, self.output.type.width.data
        state = self.footprint(n_in, n_out, kctx.weight_bytes, kctx.micro_batch, w, h).state
        work = kctx.micro_batch * ceil_div(n_in, h) * ceil_div(n_out, w)
        return [Role("tile", self.region, [INPUTS, ("compute", "fmac", work)], int(state))], []

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][3])

    def input_layout(self) -> str:
        return "rows"

    def output_layout(self) -> str:
        return "partial"

    @classmethod
    def lower(cls, op, operands, make):
        rt = op.results[0].type
        gemv = make(cls, op, operands, rt)
        red = make(AllReduceOp, op, gemv.results, rt, name=f"{op.kernel_name}.reduce",
                   axis=StringAttr("col"))
        return [gemv, red], red.results[0]
