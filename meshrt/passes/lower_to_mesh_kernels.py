"""`lower-to-mesh-kernels`: graph ops become the closed set of mesh kernels.

    graph.matmul       -> mesh_kernel.gemv + mesh_kernel.allreduce (col)
    graph.moe_experts  -> mesh_kernel.dispatch + mesh_kernel.expert_ffn (all
                          expert regions) + mesh_kernel.combine
    graph.rmsnorm/add/elementwise -> mesh_kernel.elementwise
    everything else    -> its namesake

Each lowering is written by the kernel kind that declares the graph op in
its `LOWERS` (`meshrt/kernels/<kind>/op.py`).

The pass is target-free: regions are kept as mapped; whether a region is
large enough for its kernel's tiles is checked by `synthesize-schedules`,
which knows the target's per-core SRAM. Kernel names stay the graph names
(the allreduce of `@l0.qkv` is `@l0.qkv.reduce`), so diagnostics at every
level name what the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import graph
from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import require_programs, topological_order
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.kernels import registry


def _common(op: graph.KernelOp, name: str | None = None, region: CoreSetAttr | None = None):
    return mk.KernelOp.common_props(
        name or op.kernel_name,
        region or op.region,
        op.layer_index,
        op.stage_index,
        op.wafer_index,
    )


def _make(cls: type[mk.KernelOp], src: graph.KernelOp, operands, result_type, *,
          name: str | None = None, region: CoreSetAttr | None = None, **props) -> mk.KernelOp:
    properties = _common(src, name, region)
    for key, value in props.items():
        properties[key] = IntegerAttr(value, i64) if isinstance(value, int) else value
    op = cls.create(operands=list(operands), properties=properties, result_types=[result_type])
    op.location = src.location
    return op


def lower_kernel(op: graph.KernelOp, operands: list[SSAValue]) -> tuple[list[Operation], SSAValue]:
    """The mesh kernels for one graph kernel, and the value that replaces its result.

    The kind whose folder declares the graph op in its LOWERS does it."""
    kind = registry.lowering_for(type(op))
    if kind is None:
        raise MeshrtError(f"no mesh-kernel lowering for '{op.name}'", op)
    return kind.lower(op, operands, _make)


def lower_model(model: graph.ModelOp) -> mk.ProgramOp:
    try:
        order = topological_order(model.kernels())
    except VerifyException as e:
        raise MeshrtError(str(e), model) from e
    block = Block()
    mapping: dict[SSAValue, SSAValue] = {}
    for op in order:
        missing = [v for v in op.operands if v not in mapping]
        if missing:
            raise MeshrtError(f"kernel @{op.kernel_name} uses a value no kernel defines", op)
        new_ops, result = lower_kernel(op, [mapping[v] for v in op.operands])
        block.add_ops(new_ops)
        mapping[op.results[0]] = result
    program = mk.ProgramOp.like(model, body=Region([block]))
    program.location = model.location
    return program


@dataclass(frozen=True)
class LowerToMeshKernels(ModulePass):
    """graph.model -> mesh_kernel.program, kernels in topological order."""

    name = "lower-to-mesh-kernels"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for model in require_programs(op, self.name, graph.ModelOp):
            program = lower_model(model)
            op.body.block.insert_op_before(program, model)
            op.body.block.erase_op(model, safe_erase=False)

