"""Router logits and top-k expert selection; produces routing metainfo."""

from __future__ import annotations

from typing import ClassVar

from xdsl.irdl import irdl_op_definition, operand_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType, RoutingType
from meshrt.kernels.compute import ADD, FMAC, ComputeOp
from meshrt.kernels.gemv.op import GemvOp
from meshrt.kernels.interface import ACT_BYTES, UNARY_FORMAT, KernelContext, KernelOp, ceil_div, chain
from meshrt.kernels.topk_gate.numerics import TopKGate
from meshrt.kernels.topk_gate.pe import bodies_for, logit_columns

TOPK = ComputeOp("topk", "argmax", None)  # its PE body (topk_gate/pe.py)
"""The softmax of each token's router logits and its top-k into the routing table (an argmax
scan per choice), renormalised."""


@irdl_op_definition
class TopKGateOp(KernelOp):
    """Router logits and top-k expert selection; produces routing metainfo."""

    name = "mesh_kernel.topk_gate"
    input = operand_def(ActType)
    output = result_def(RoutingType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#984ea3"
    VIZ_RANK: ClassVar[int] = 5
    COMPUTE: ClassVar[tuple] = (FMAC, ADD, TOPK)
    NUMERICS: ClassVar[type] = TopKGate
    LOWERS: ClassVar[tuple] = (graph.GateTopKOp,)
    PRODUCES_AT_ROOT: ClassVar[frozenset[str]] = frozenset({"moe_routing"})

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return bodies_for(info, micro_batch, hp, tile)

    @classmethod
    def sends_value(cls, info, role):
        # what goes on to dispatch is the tokens it gated: its input's value
        return info.kernel_name if role.internal else info.input_names[0]

    logit_columns = staticmethod(logit_columns)

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        n_in = self.input.type.width.data
        experts = self.output.type.experts.data
        cols = self.logit_columns(experts, kctx.shared_experts, kctx.shared_expert_gate)
        b = kctx.micro_batch
        # The router matrix is tiled as a gemv's weights are.
        state = GemvOp.footprint(n_in, cols, kctx.weight_bytes, b, w, h).state
        # Every core forwards its rows of the tokens it gated (dispatch
        # needs whole tokens), once the routing has been relayed back up.
        # topk scans the routed logits and takes each shared gate's sigmoid.
        return chain(self, [("compute", "fmac", b * ceil_div(n_in, h) * ceil_div(cols, w))], "add",
                     b * ceil_div(cols, w) * ACT_BYTES, [("compute", "topk", b * cols)], int(state),
                     outputs_from_root=False, kctx=kctx)

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][3])

    def input_layout(self) -> str:
        return "rows"

    def output_layout(self) -> str:
        return "full"

    def is_collective(self) -> bool:
        return True
