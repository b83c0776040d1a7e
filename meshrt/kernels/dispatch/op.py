"""Hands each token's slices from the gate to the expert regions, with their routing."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch import csl
from meshrt.kernels.dispatch.corridor import CorridorOp
from meshrt.kernels.dispatch.numerics import Dispatch
from meshrt.kernels.interface import ROUTED_FORMAT, KernelContext

ROUTE = ComputeOp("route", "add", csl.route)
"""Read the routing table: which of a token's chosen experts live in the regions this core feeds."""


@irdl_op_definition
class DispatchOp(CorridorOp):
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
    INPUT_FROM_ROUTING_PRODUCER: ClassVar[bool] = True  # the gate forwards the tokens it gated
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True  # the slices leave where they are sent

    def verify_kernel(self) -> None:
        if not self.expert_regions.data:
            raise self.fail("dispatch needs at least one expert region")
        super().verify_kernel()

    def work(self, kctx: KernelContext):
        return ("compute", "route", kctx.micro_batch * kctx.top_k)
