"""Carries expert outputs back and sums them with their gate weights."""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition, operand_def, result_def, var_operand_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.kernels.combine import csl
from meshrt.kernels.combine.numerics import Combine
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch.relay import RelayOp

COMBINE = ComputeOp("combine", "fmac", csl.combine)
"""y += expert result x its gate weight."""


@irdl_op_definition
class CombineOp(RelayOp):
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
    COMPUTE: ClassVar[tuple] = (COMBINE,)
    NUMERICS: ClassVar[type] = Combine
    BACKWARDS: ClassVar[bool] = True  # expert results and their metainfo travel back to the head

    def verify_kernel(self) -> None:
        if not self.inputs:
            raise self.fail("combine needs at least one expert output")

    def output_layout(self) -> str:
        return "full"  # at the head of the corridor
