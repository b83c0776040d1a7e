"""`lower-to-mesh-kernels`: graph ops become the closed set of mesh kernels.

    graph.matmul       -> mesh_kernel.gemv + mesh_kernel.allreduce (col)
    graph.moe_experts  -> mesh_kernel.dispatch + mesh_kernel.expert_ffn (all
                          expert regions) + mesh_kernel.combine
    graph.rmsnorm/add/elementwise -> mesh_kernel.elementwise
    everything else    -> its namesake

The pass is target-free: regions are kept as mapped; whether a region is
large enough for its kernel's tiles is checked by `synthesize-schedules`,
which knows the target's per-core SRAM. Kernel names stay the graph names
(the allreduce of `@l0.qkv` is `@l0.qkv.reduce`), so diagnostics at every
level name what the user wrote.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, StringAttr, i64
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import graph
from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import topological_order
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.shape import HParams


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
    """The mesh kernels for one graph kernel, and the value that replaces its result."""
    rt = op.results[0].type
    match op:
        case graph.EmbedOp():
            k = _make(mk.EmbedOp, op, [], rt, vocab=op.vocab)
            return [k], k.results[0]
        case graph.MatmulOp():
            gemv = _make(mk.GemvOp, op, operands, rt)
            red = _make(mk.AllReduceOp, op, gemv.results, rt, name=f"{op.kernel_name}.reduce",
                        axis=StringAttr("col"))
            return [gemv, red], red.results[0]
        case graph.RMSNormOp():
            k = _make(mk.ElementwiseOp, op, operands, rt, kind=StringAttr("rmsnorm"))
            return [k], k.results[0]
        case graph.AddOp():
            k = _make(mk.ElementwiseOp, op, operands, rt, kind=StringAttr("add"))
            return [k], k.results[0]
        case graph.ElementwiseOp():
            k = _make(mk.ElementwiseOp, op, operands, rt, kind=op.kind)
            return [k], k.results[0]
        case graph.AttentionOp():
            model = op.parent_op()
            assert isinstance(model, graph.ModelOp)
            k = _make(mk.AttentionOp, op, operands, rt, heads=op.heads, kv_heads=op.kv_heads,
                      head_dim=op.head_dim, max_seq=op.max_seq, slots=inflight_slots(model))
            return [k], k.results[0]
        case graph.GateTopKOp():
            k = _make(mk.TopKGateOp, op, operands, rt)
            return [k], k.results[0]
        case graph.MoEExpertsOp():
            return _lower_moe(op, operands)
        case graph.SampleOp():
            k = _make(mk.SampleOp, op, operands, rt, eos=op.eos)
            return [k], k.results[0]
        case graph.HandoffOp():
            k = _make(mk.HandoffOp, op, operands, rt, to_stage=op.to_stage, to_wafer=op.to_wafer)
            return [k], k.results[0]
    raise MeshrtError(f"no mesh-kernel lowering for '{op.name}'", op)


def _lower_moe(op: graph.MoEExpertsOp, operands: list[SSAValue]) -> tuple[list[Operation], SSAValue]:
    act, routing = operands
    rt = op.results[0].type
    dispatch = _make(mk.DispatchOp, op, [act, routing], rt, name=f"{op.kernel_name}.dispatch",
                     expert_regions=op.expert_regions)
    union = CoreSetAttr([r for cs in op.expert_regions.data for r in cs.rects.data])
    experts = _make(mk.ExpertFFNOp, op, [dispatch.results[0], routing], rt,
                    name=f"{op.kernel_name}.experts", region=union,
                    expert_regions=op.expert_regions, placement=op.placement,
                    expert_ffn=op.expert_ffn)
    combine = _make(mk.CombineOp, op, [experts.results[0], routing], rt,
                    name=f"{op.kernel_name}.combine")
    return [dispatch, experts, combine], combine.results[0]


def inflight_slots(model) -> int:
    """Batch slots a stage keeps KV state for: the mapper's `kv_slots` (micro-batch x
    stages when pipelined)."""
    return HParams.of(model).kv_slots(model)


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
        for model in [o for o in op.body.block.ops if isinstance(o, graph.ModelOp)]:
            program = lower_model(model)
            op.body.block.insert_op_before(program, model)
            op.body.block.erase_op(model, safe_erase=False)

