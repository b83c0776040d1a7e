"""Per-element work on a region: rmsnorm (with its row reduction), add, silu_mul."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import StringAttr
from xdsl.irdl import irdl_op_definition, opt_prop_def, prop_def, result_def, var_operand_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType
from meshrt.kernels.compute import ADD, SILU_MUL, ComputeOp
from meshrt.kernels.elementwise.numerics import Elementwise
from meshrt.kernels.elementwise.pe import bodies_for
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

# RMSNorm's compute is its PE bodies (elementwise/pe.py), which the CSL prints
SQUARE_SUM = ComputeOp("square_sum", "fmac", None, reads_input=True)
"""This core's partial sum of squares per slot (an fmac per element)."""
RSQRT = ComputeOp("rsqrt", "rsqrt", None)
"""The inverse RMS of each slot at the root of the column."""
SCALE = ComputeOp("scale", "mul", None, reads_input=True)
"""x * inverse RMS * gain on this core's rows."""

GAIN_BYTES = 4  # an RMSNorm gain as its bodies read it (float32, meshrt.kernels.pe)

ELEMENTWISE_KINDS = {"rmsnorm": 1, "add": 2, "silu_mul": 1}  # operand count


@irdl_op_definition
class ElementwiseOp(KernelOp):
    """Per-element work on the region: rmsnorm (with its row reduction), add, silu_mul."""

    name = "mesh_kernel.elementwise"
    kind = prop_def(StringAttr)
    # add / silu_mul: "cols" (the default) or "rows", the layout of the operands it reads in place
    layout = opt_prop_def(StringAttr)
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

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, h):
        return bodies_for(info, micro_batch, hp, h)

    @classmethod
    def up_carries_value(cls, info):
        return info.param("kind") != "rmsnorm"  # the root's inverse RMS comes back up

    @classmethod
    def operands_read(cls, info, op):
        if op == "add" and info.param("kind") == "add":  # its body reads both, where they are held
            return 2
        if op == "silu_mul":  # its body reads x: gate | up
            return 1
        return super().operands_read(info, op)

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
        if self.layout is not None and (self.is_rmsnorm or self.layout.data not in ("rows", "cols")):
            raise self.fail(f"layout must be 'rows' or 'cols' (and rmsnorm has none), got "
                            f"'{self.layout.data}'")

    @property
    def value_layout(self) -> str:
        """How its operands and result are laid out: rmsnorm over rows, the others as `layout` says."""
        if self.is_rmsnorm:
            return "rows"
        return self.layout.data if self.layout is not None else "cols"

    def _split(self) -> int:
        """Cores its vectors are split over (rows of its grid, or columns)."""
        _, _, w, h = self.grid()
        return h if self.value_layout == "rows" else w

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
                r.state_sram = ceil_div(n, h) * GAIN_BYTES  # its gains, resident
                r.events.insert(-1, ("compute", "scale", b * ceil_div(n, h)))
                r.sends_output = True
                if r.events[-1] != OUTPUTS:
                    r.events.append(OUTPUTS)
            return roles, flows
        return [Role("tile", self.region,
                     [INPUTS, ("compute", self.kind.data, b * ceil_div(n, self._split())), OUTPUTS], 0,
                     sends_output=True)], []

    def input_share(self, width: int) -> int:
        return ceil_div(width, self._split())

    def input_layout(self) -> str:
        return self.value_layout

    def output_layout(self) -> str:
        return self.value_layout

    def is_collective(self) -> bool:
        return self.is_rmsnorm

    @classmethod
    def lower(cls, op, operands, make):
        """One kernel; add / silu_mul take the "rows" layout of an operand already held in
        rows on their own region (so it is read in place), or on a one-column region
        (where "cols" would put the whole vector on every core), else "cols"."""
        props = cls.lower_props(op)
        _, _, w, h = op.region.rects.data[0].tuple[:4]
        if not isinstance(op, graph.RMSNormOp) and (w == 1 < h or any(
                isinstance(v.owner, KernelOp) and v.owner.region == op.region
                and v.owner.output_layout() == "rows" for v in operands)):
            props["layout"] = StringAttr("rows")
        k = make(cls, op, operands, op.results[0].type, **props)
        return [k], k.results[0]

    @classmethod
    def lower_props(cls, op):
        if isinstance(op, graph.RMSNormOp):
            return {"kind": StringAttr("rmsnorm")}
        if isinstance(op, graph.AddOp):
            return {"kind": StringAttr("add")}
        return {"kind": op.kind}
