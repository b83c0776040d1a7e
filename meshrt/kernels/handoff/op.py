"""Hidden state plus CF payload to the next stage (maybe the next wafer)."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.base import int_value
from meshrt.dialects.graph import ActType
from meshrt.kernels.handoff.numerics import Handoff
from meshrt.kernels.interface import INPUTS, OUTPUTS, UNARY_FORMAT, KernelContext, KernelOp, Role, ceil_div


@irdl_op_definition
class HandoffOp(KernelOp):
    """Hidden state plus CF payload to the next stage (maybe the next wafer)."""

    name = "mesh_kernel.handoff"
    to_stage = prop_def(IntegerAttr[I64])
    to_wafer = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#17becf"
    VIZ_RANK: ClassVar[int] = 8
    NUMERICS: ClassVar[type] = Handoff
    LOWERS: ClassVar[tuple] = (graph.HandoffOp,)
    STAGE_BOUNDARY: ClassVar[bool] = True

    @property
    def crosses_wafer(self) -> bool:
        return int_value(self.to_wafer) != self.wafer_index

    def verify_kernel(self) -> None:
        if int_value(self.to_stage) != self.stage_index + 1:
            raise self.fail(
                f"hands off from stage {self.stage_index} to stage {int_value(self.to_stage)}; "
                "a handoff must go to the next stage"
            )

    def roles(self, kctx: KernelContext):
        return [Role("egress", self.region, [INPUTS, OUTPUTS], 0, sends_output=True)], []

    def input_share(self, width: int) -> int:
        _, _, w, h = self.tiles()[0]
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "flat"

    def output_layout(self) -> str:
        return "flat"

    @classmethod
    def lower_props(cls, op):
        return {"to_stage": op.to_stage, "to_wafer": op.to_wafer}
