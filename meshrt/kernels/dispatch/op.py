"""Hands each token's slices from the gate to the expert regions, with their routing."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch import csl
from meshrt.kernels.dispatch.numerics import Dispatch
from meshrt.kernels.interface import (
    INPUTS,
    OUTPUTS,
    ROUTED_FORMAT,
    KernelContext,
    KernelOp,
    Role,
    ceil_div,
)

ROUTE = ComputeOp("route", "add", csl.route)
"""Read the routing table: which of a token's chosen experts live in the regions this core feeds."""


@irdl_op_definition
class DispatchOp(KernelOp):
    """Hands each token's slices from the gate to the expert regions, with their routing.

    `region` is the corridor beside the expert regions (`expert_regions`),
    split flat: each core takes its slice of every token from the gate (from
    the gate core of its row when the gate's rows are the corridor's, else
    gathered from all of them), resolves the routing metainfo riding it and
    sends the slice on into the expert regions (along its row when their
    rows are the corridor's). No core relays a whole token.
    """

    name = "mesh_kernel.dispatch"
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    input = operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = ROUTED_FORMAT

    VIZ_COLOR: ClassVar[str] = "#f781bf"
    VIZ_RANK: ClassVar[int] = 6
    COMPUTE: ClassVar[tuple] = (ROUTE,)
    NUMERICS: ClassVar[type] = Dispatch
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True  # the tokens' routing metainfo rides the inputs
    INPUT_FROM_ROUTING_PRODUCER: ClassVar[bool] = True  # the gate forwards the tokens it gated
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True  # the slices leave where they are sent

    def verify_kernel(self) -> None:
        if not self.expert_regions.data:
            raise self.fail("dispatch needs at least one expert region")
        self.grid()

    def roles(self, kctx: KernelContext):
        return [Role("slice", self.region, [INPUTS, ("compute", "route", kctx.micro_batch * kctx.top_k),
                                            OUTPUTS], 0, ctrl=kctx.route_bytes, sends_output=True)], []

    def input_share(self, width: int) -> int:
        _, _, w, h = self.grid()
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "flat"

    def output_layout(self) -> str:
        return "flat"
