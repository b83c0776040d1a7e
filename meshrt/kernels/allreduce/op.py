"""Reduction tree along each row (or column) of a grid, then broadcast back."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import StringAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects.graph import ActType
from meshrt.kernels.allreduce.numerics import AllReduce
from meshrt.kernels.compute import ADD
from meshrt.kernels.interface import ACT_BYTES, UNARY_FORMAT, KernelContext, KernelOp, ceil_div, chain


@irdl_op_definition
class AllReduceOp(KernelOp):
    """Reduction tree along each row (or column) of its grid, then broadcast back.

    Roles (the paper's Figure 5): `edge` sends its partial and later receives
    the result; `mid` receives, accumulates, forwards and relays the result
    back; `root` receives, reduces and starts the broadcast.
    """

    name = "mesh_kernel.allreduce"
    axis = prop_def(StringAttr)
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#9ecae1"
    VIZ_RANK: ClassVar[int] = 9
    COMPUTE: ClassVar[tuple] = (ADD,)
    NUMERICS: ClassVar[type] = AllReduce

    def verify_kernel(self) -> None:
        if self.axis.data not in ("row", "col"):
            raise self.fail(f"axis must be 'row' or 'col', got '{self.axis.data}'")
        self.grid()

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        n = self.output.type.width.data
        across = h if self.axis.data == "row" else w  # the output is split the other way
        share = ceil_div(n, across)
        gemv = self.input.owner
        if getattr(gemv, "reduce_axis", None) == self.axis.data:
            share = gemv.tile_shape()[1]  # its GEMV's fullest core's outputs (a head split's units)
        return chain(self, [], "add", kctx.micro_batch * share * ACT_BYTES, [], 0,
                     axis=self.axis.data, kctx=kctx)

    def input_share(self, width: int) -> int:
        return width

    def input_layout(self) -> str:
        return "partial"

    def output_layout(self) -> str:
        return "cols" if self.axis.data == "col" else "rows"

    def is_collective(self) -> bool:
        return True
