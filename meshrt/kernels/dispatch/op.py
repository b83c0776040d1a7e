"""Relays tokens from the gate toward expert regions over candidate paths."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import ArrayAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects.graph import ActType, RoutingType
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.dispatch import csl
from meshrt.kernels.dispatch.numerics import Dispatch
from meshrt.kernels.dispatch.relay import RelayOp
from meshrt.kernels.interface import ROUTED_FORMAT

ROUTE = ComputeOp("route", "add", csl.route)
"""Read the routing table: does each token turn into the expert regions here."""


@irdl_op_definition
class DispatchOp(RelayOp):
    """Relays tokens from the gate toward expert regions over candidate paths.

    `region` is the relay corridor; `expert_regions` the destinations. Which
    path a token takes is resolved hop by hop from its routing metainfo.
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

    def verify_kernel(self) -> None:
        if not self.expert_regions.data:
            raise self.fail("dispatch needs at least one expert region")

    def output_layout(self) -> str:
        return "flat"
