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
from meshrt.kernels.dispatch.relay import relay_roles
from meshrt.kernels.interface import KernelContext, KernelOp, ceil_div

ROUTE = ComputeOp("route", "add", csl.route)
"""Read the routing table: does each token turn into the expert regions here."""


@irdl_op_definition
class DispatchOp(KernelOp):
    """Relays tokens from the gate toward expert regions over candidate paths.

    `region` is the relay corridor; `expert_regions` the destinations. Which
    path a token takes is resolved hop by hop from its routing metainfo.
    """

    name = "mesh_kernel.dispatch"
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    input = operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = (
        "$sym_name `(` $input `,` $routing `)` `on` $region attr-dict `:` "
        "type($input) `,` type($routing) `->` type($output)"
    )

    VIZ_COLOR: ClassVar[str] = "#f781bf"
    VIZ_RANK: ClassVar[int] = 6
    COMPUTE: ClassVar[tuple] = (ROUTE,)
    NUMERICS: ClassVar[type] = Dispatch
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True
    INPUT_FROM_ROUTING_PRODUCER: ClassVar[bool] = True  # the gate forwards the tokens it gated
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True

    def verify_kernel(self) -> None:
        if not self.expert_regions.data:
            raise self.fail("dispatch needs at least one expert region")

    def roles(self, kctx: KernelContext):
        return relay_roles(self, kctx, backwards=False)

    def input_share(self, width: int) -> int:
        _, _, w, h = self.tiles()[0]
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "full"  # read in place only from a producer holding it whole; else a flow brings input_share

    def output_layout(self) -> str:
        return "flat"
