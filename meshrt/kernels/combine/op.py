"""Sums the expert outputs with their gate weights, each corridor core its slice."""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition, operand_def, result_def, var_operand_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.kernels.combine import csl
from meshrt.kernels.combine.numerics import Combine
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch.corridor import CorridorOp
from meshrt.kernels.interface import KernelContext, ceil_div

COMBINE = ComputeOp("combine", "fmac", csl.combine)
"""y += expert result x its gate weight."""


@irdl_op_definition
class CombineOp(CorridorOp):
    """Sums the expert outputs with their gate weights, each corridor core its slice.

    Its region is the corridor the tokens left by; each core holds its flat
    slice of the result (a one-column corridor: a split over its rows, where
    the residual add reads it in place). Every core receives the slices of
    the expert outputs it needs from the expert regions' root columns
    (`expert_reduce`): along its row when the regions' rows line up with the
    corridor's, else gathered from every root. The routing metainfo riding
    them says which experts a token chose and with what weight.
    """

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

    def verify_kernel(self) -> None:
        if not self.inputs:
            raise self.fail("combine needs at least one expert output")
        super().verify_kernel()

    def work(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        share = ceil_div(self.output.type.width.data, w * h)
        return ("compute", "combine", kctx.micro_batch * max(kctx.top_k, 1) * share)  # an fmac per chosen expert
