"""Per-element work on a region: rmsnorm (with its row reduction), add, silu_mul."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import StringAttr
from xdsl.irdl import irdl_op_definition, prop_def, result_def, var_operand_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType
from meshrt.kernels.compute import ADD, SILU_MUL, ComputeOp
from meshrt.kernels.elementwise import csl
from meshrt.kernels.elementwise.numerics import Elementwise
from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    OUTPUTS,
    KernelContext,
    KernelOp,
    Role,
    ceil_div,
    chain,
)

SQUARE_SUM = ComputeOp("square_sum", "fmac", csl.square_sum, reads_input=True)
"""This core's partial sum of squares per slot (an fmac per element)."""
RSQRT = ComputeOp("rsqrt", "rsqrt", csl.rsqrt)
"""The inverse RMS of each slot at the root of the column."""
SCALE = ComputeOp("scale", "mul", csl.scale, reads_input=True)
"""x * inverse RMS * gain on this core's rows."""

ELEMENTWISE_KINDS = {"rmsnorm": 1, "add": 2, "silu_mul": 1}  # operand count


@irdl_op_definition
class ElementwiseOp(KernelOp):
    """Per-element work on the region: rmsnorm (with its row reduction), add, silu_mul."""

    name = "mesh_kernel.elementwise"
    kind = prop_def(StringAttr)
    inputs = var_operand_def(ActType)
    output = result_def(ActType)
    assembly_format = (
        "$kind $sym_name `(` $inputs `)` `on` $region attr-dict `:` type($inputs) `->` type($output)"
    )

    VIZ_COLOR: ClassVar[str] = "#999999"
    VIZ_RANK: ClassVar[int] = 10
    COMPUTE: ClassVar[tuple] = (SQUARE_SUM, ADD, RSQRT, SCALE, SILU_MUL)
    NUMERICS: ClassVar[type] = Elementwise
    LOWERS: ClassVar[tuple] = (graph.RMSNormOp, graph.AddOp, graph.ElementwiseOp)

    @property
    def is_rmsnorm(self) -> bool:
        return self.kind.data == "rmsnorm"

    def verify_kernel(self) -> None:
        kind = self.kind.data
        if kind not in ELEMENTWISE_KINDS:
            raise self.fail(
                f"unknown elementwise kind '{kind}', expected one of {', '.join(ELEMENTWISE_KINDS)}"
            )
        if len(self.inputs) != ELEMENTWISE_KINDS[kind]:
            raise self.fail(f"'{kind}' takes {ELEMENTWISE_KINDS[kind]} operands, got {len(self.inputs)}")

    def roles(self, kctx: KernelContext):
        _x, _y, w, h = self.grid()
        n = self.output.type.width.data
        b = kctx.micro_batch
        if self.is_rmsnorm:  # rows layout: sum of squares reduced down each column
            local = [("compute", "square_sum", b * ceil_div(n, h))]
            finish = [("compute", "rsqrt", b)]
            roles, flows = chain(self, local, "add", b * ACT_BYTES, finish,
                                 ceil_div(n, h) * ACT_BYTES, outputs_from_root=False, kctx=kctx)
            for r in roles:
                r.events.insert(-1, ("compute", "scale", b * ceil_div(n, h)))
                r.sends_output = True
                if r.events[-1] != OUTPUTS:
                    r.events.append(OUTPUTS)
            return roles, flows
        return [Role("tile", self.region,  # cols layout
                     [INPUTS, ("compute", self.kind.data, b * ceil_div(n, w)), OUTPUTS], 0,
                     sends_output=True)], []

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][3])

    def input_layout(self) -> str:
        return "rows" if self.is_rmsnorm else "cols"

    def output_layout(self) -> str:
        return "rows" if self.is_rmsnorm else "cols"

    def is_collective(self) -> bool:
        return self.is_rmsnorm

    @classmethod
    def lower_props(cls, op):
        if isinstance(op, graph.RMSNormOp):
            return {"kind": StringAttr("rmsnorm")}
        if isinstance(op, graph.AddOp):
            return {"kind": StringAttr("add")}
        return {"kind": op.kind}
