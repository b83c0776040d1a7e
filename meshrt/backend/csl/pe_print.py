"""A compute body (`meshrt.kernels.pe`) as CSL statements, through xDSL's CSL printer.

The body's buffers are the program's arrays: `renames` maps a buffer the
body names to (array, element offset), e.g. a kernel's resident gains to
their region of `w`. What the interpreter executes (`meshrt.runtime.pe_exec`)
is what is printed: the ops are cloned, renamed and handed to
`xdsl.backend.csl.print_csl` unchanged otherwise.
"""

from __future__ import annotations

from io import StringIO

from xdsl.backend.csl.print_csl import CslPrintContext
from xdsl.dialects import arith, csl, memref
from xdsl.dialects.builtin import AffineMapAttr, BFloat16Type, IntegerAttr, SymbolRefAttr
from xdsl.ir import Attribute
from xdsl.ir.affine import AffineMap

from meshrt.diagnostics import MeshrtError


class _PrintContext(CslPrintContext):
    """xDSL's CSL printer, knowing bf16 (a bf16 program's activations; xDSL's knows f16)."""

    def mlir_type_to_csl_type(self, type_attr: Attribute) -> str:
        if isinstance(type_attr, BFloat16Type):
            return "bf16"
        return super().mlir_type_to_csl_type(type_attr)


def body_lines(fn: csl.FuncOp, renames: dict[str, tuple[str, int]]) -> list[str]:
    """The statements of `fn`'s body, its buffers named as `renames` says."""
    body = fn.clone()
    for op in list(body.walk()):
        if not isinstance(op, memref.GetGlobalOp):
            continue
        name = op.name_.root_reference.data
        array, offset = renames.get(name, (name, 0))
        op.properties["name"] = SymbolRefAttr(array)
        if not offset:
            continue
        for use in list(op.memref.uses):
            user = use.operation
            if isinstance(user, memref.LoadOp | memref.StoreOp):  # one element: its index moved on
                (index,) = user.indices
                at = arith.ConstantOp(IntegerAttr(offset, index.type))
                moved = arith.AddiOp(index, at.result)
                user.parent_block().insert_ops_before([at, moved], user)
                user.operands = (*user.operands[:-1], moved.result)
                continue
            if not isinstance(user, csl.GetMemDsdOp):
                raise MeshrtError(f"internal error: body {fn.sym_name.data} reads buffer {name} at "
                                  f"an offset other than through a DSD or an element load")
            amap = user.tensor_access.data
            (expr,) = amap.results
            user.properties["tensor_access"] = AffineMapAttr(
                AffineMap(amap.num_dims, 0, (expr + offset,)))
    out = StringIO()
    ctx = _PrintContext(out)
    ctx.register_binops()
    for op in body.walk():  # the module's `<math>` import and parameters are the program's
        for v in op.operands:
            if isinstance(v.owner, csl.ImportModuleConstOp):
                ctx.variables[v] = "math"
            elif isinstance(v.owner, csl.ParamOp):
                ctx.variables[v] = v.owner.param_name.data
    ctx.print_block(body.body.block)
    return [line for line in out.getvalue().splitlines() if line.strip() and line.strip() != "return;"]


def calls_math(fn: csl.FuncOp) -> bool:
    return any(isinstance(op, csl.MemberCallOp) for op in fn.walk())
