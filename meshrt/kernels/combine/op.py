"""Carries expert outputs back and sums them with their gate weights."""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition, operand_def, result_def, var_operand_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.kernels.combine import csl
from meshrt.kernels.combine.numerics import Combine
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch.op import ROUTE
from meshrt.kernels.dispatch.relay import relay_roles
from meshrt.kernels.interface import KernelContext, KernelOp, ceil_div

COMBINE = ComputeOp("combine", "fmac", csl.combine)
"""y += expert result x its gate weight."""


@irdl_op_definition
class CombineOp(KernelOp):
    """Carries expert outputs back and sums them with their gate weights."""

    name = "mesh_kernel.combine"
    inputs = var_operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = (
        "$sym_name `(` $routing `,` $inputs `)` `on` $region attr-dict `:` "
        "type($routing) `,` type($inputs) `->` type($output)"
    )

    VIZ_COLOR: ClassVar[str] = "#bcbd22"
    VIZ_RANK: ClassVar[int] = 7
    COMPUTE: ClassVar[tuple] = (COMBINE, ROUTE)  # a one-core corridor only routes
    NUMERICS: ClassVar[type] = Combine
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True  # expert results and their metainfo travel back
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True

    def verify_kernel(self) -> None:
        if not self.inputs:
            raise self.fail("combine needs at least one expert output")

    def roles(self, kctx: KernelContext):
        return relay_roles(self, kctx, backwards=True)

    def input_share(self, width: int) -> int:
        _, _, w, h = self.tiles()[0]
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "full"  # read in place only from a producer holding it whole; else a flow brings input_share

    def output_layout(self) -> str:
        return "full"  # at the head of the corridor
