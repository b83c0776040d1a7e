"""The `pe` dialect: a core class's event table over its program's buffers.

The PE-program level (`lower-to-pe`) gives every core class of a segment
program a `csl.module` of xDSL's `csl` dialect, named after the class: its
arrays (`memref.global`), the compute bodies of the kinds written at the PE
level (`csl.func`, over those arrays) and, in a `pe.table`, the class's
events in the order the core runs them, each naming the arrays it reads and
writes:

    "csl.module"() <{kind = #csl<module_kind program>, sym_name = "l0_add2.tile"}> ({
      "memref.global"() <{sym_name = "v_handoff_s0", type = memref<4xf32>, ...}> ...
      csl.func @k7_add() { ... }
      pe.table {
        pe.segment 0 {
          pe.recv @l0_norm1.in0 into @x holds @handoff_s0
          pe.keep @x into @v_handoff_s0 elems 4
          pe.compute @l0_norm1 "square_sum" reads [@x] call @k0_square_sum
          pe.send @l0_norm1.down from @y
        }
        ...
      }
    }) : () -> ()

`x`, `y` and `p` are the working arrays (a kernel's input, its output, a
chain partner's message); `v_<kernel>` keeps a value a later kernel reads
(`meshrt.backend.csl.values`). The CSL backend prints the class's program
from this table and these bodies.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    IntegerAttr,
    StringAttr,
    SymbolRefAttr,
)
from xdsl.ir import Dialect
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import NoTerminator
from xdsl.utils.exceptions import VerifyException

UNKNOWN = "?"  # an operand the plan knows no array of (the backend then reads x)


def ref_name(ref: SymbolRefAttr) -> str:
    """The name a symbol reference of these ops names (a flow, kernel, array or body)."""
    return ref.root_reference.data


def _holds_only(op: IRDLOperation, types: tuple, what: str) -> None:
    for inner in op.body.block.ops:
        if not isinstance(inner, types):
            raise VerifyException(f"a {op.name} holds {what} only, found {inner.name}")


@irdl_op_definition
class TableOp(IRDLOperation):
    """The class's events, segment by segment, in the order the core runs them."""

    name = "pe.table"
    body = region_def("single_block")
    traits = traits_def(NoTerminator())
    assembly_format = "attr-dict-with-keyword $body"

    def segments(self) -> list[SegmentOp]:
        return [op for op in self.body.block.ops if isinstance(op, SegmentOp)]

    def verify_(self) -> None:
        _holds_only(self, (SegmentOp,), "pe.segment ops")


@irdl_op_definition
class SegmentOp(IRDLOperation):
    """The events of segment `index` of the class (`segment.segment`)."""

    name = "pe.segment"
    index = prop_def(IntegerAttr[I64])
    body = region_def("single_block")
    traits = traits_def(NoTerminator())
    assembly_format = "$index attr-dict-with-keyword $body"

    def verify_(self) -> None:
        _holds_only(self, EVENT_OPS, "pe event ops")


@irdl_op_definition
class RecvOp(IRDLOperation):
    """`event.recv` on `flow` into array `into`; `holds`: the kernel whose value it is
    (none: a partner's partial, a relay's sum)."""

    name = "pe.recv"
    flow = prop_def(SymbolRefAttr)
    into = prop_def(SymbolRefAttr)
    holds = opt_prop_def(SymbolRefAttr)
    assembly_format = "$flow `into` $into (`holds` $holds^)? attr-dict"


@irdl_op_definition
class SendOp(IRDLOperation):
    """`event.send` on `flow` of what array `source` holds."""

    name = "pe.send"
    flow = prop_def(SymbolRefAttr)
    source = prop_def(SymbolRefAttr)
    assembly_format = "$flow `from` $source attr-dict"


@irdl_op_definition
class ComputeOp(IRDLOperation):
    """`event.compute` `op` of `kernel`. `reads`: the array each operand is read from
    (`@?`: none known); `promote`: the array copied into x first (a body that reads its
    input reads x); `received`: where the kernel's own receive of this sub-schedule put
    its data (p or x; the older CSL bodies read it); `call`: its body, a `csl.func` of
    the module (none: the kind's CSL body)."""

    name = "pe.compute"
    kernel = prop_def(SymbolRefAttr)
    op = prop_def(StringAttr)
    reads = opt_prop_def(ArrayAttr[SymbolRefAttr])
    promote = opt_prop_def(SymbolRefAttr)
    received = opt_prop_def(SymbolRefAttr)
    call = opt_prop_def(SymbolRefAttr)
    assembly_format = ("$kernel $op (`reads` $reads^)? (`from` $promote^)? (`received` $received^)? "
                       "(`call` $call^)? attr-dict")

    def operand_arrays(self) -> tuple[str | None, ...]:
        if self.reads is None:
            return ()
        return tuple(None if ref_name(r) == UNKNOWN else ref_name(r) for r in self.reads.data)

    def verify_(self) -> None:
        if not self.op.data:
            raise VerifyException("a pe.compute names its compute op")


@irdl_op_definition
class KeepOp(IRDLOperation):
    """Copy `elems` elements of array `source` into `into`, where the value stays until a
    later kernel reads it (after the event before it)."""

    name = "pe.keep"
    source = prop_def(SymbolRefAttr)
    into = prop_def(SymbolRefAttr)
    elems = prop_def(IntegerAttr[I64])
    assembly_format = "$source `into` $into `elems` $elems attr-dict"

    def verify_(self) -> None:
        if self.elems.value.data < 1:
            raise VerifyException(f"pe.keep copies at least one element, got {self.elems.value.data}")


@irdl_op_definition
class MetaOp(IRDLOperation):
    """`event.meta_resolve` ("resolve") or `event.meta_produce` ("produce") of `flow`."""

    name = "pe.meta"
    kind = prop_def(StringAttr)
    flow = prop_def(SymbolRefAttr)
    assembly_format = "$kind $flow attr-dict"

    def verify_(self) -> None:
        if self.kind.data not in ("resolve", "produce"):
            raise VerifyException(f"pe.meta is 'resolve' or 'produce', got '{self.kind.data}'")


EVENT_OPS = (RecvOp, SendOp, ComputeOp, KeepOp, MetaOp)

Pe = Dialect("pe", [TableOp, SegmentOp, RecvOp, SendOp, ComputeOp, KeepOp, MetaOp], [])
