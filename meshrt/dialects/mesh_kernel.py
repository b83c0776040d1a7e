"""The `mesh_kernel` dialect: the closed set of mesh kernels, each on a region.

`lower-to-mesh-kernels` turns graph ops into these. Each kernel is a
concrete spatial algorithm (tiled GEMV, reduction trees, attention over KV
tiles, ...) and knows its core roles, per-role resource demand, whether it is
a collective with all-or-nothing completion, and which roles receive or
produce runtime dynamism: see `meshrt.kernels` for that interface, which
`synthesize-schedules` queries.

Values reuse the graph types (`!graph.act`, `!graph.routing`,
`!graph.tokens`): the data is the same, only its placement is finer.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    StringAttr,
)
from xdsl.ir import Dialect
from xdsl.irdl import (
    irdl_op_definition,
    operand_def,
    prop_def,
    result_def,
    var_operand_def,
)
from xdsl.utils.exceptions import VerifyException

from meshrt.dialects.base import MappedKernelOp, MappedProgramOp, body_ops, int_value
from meshrt.dialects.graph import ActType, RoutingType, TokensType
from meshrt.dialects.mesh import CoreSetAttr


@irdl_op_definition
class ProgramOp(MappedProgramOp):
    """The mesh-kernel program of one model on one target."""

    name = "mesh_kernel.program"

    def kernels(self) -> list[KernelOp]:
        return [op for op in body_ops(self.body) if isinstance(op, KernelOp)]

    def verify_body(self) -> None:
        for op in body_ops(self.body):
            if not isinstance(op, KernelOp):
                raise VerifyException(
                    f"program @{self.program_name} may only hold mesh kernels, found '{op.name}'"
                )


class KernelOp(MappedKernelOp):
    """A mesh kernel instance."""

    def grid(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) of a kernel laid out on one dense rectangle."""
        rects = self.region.rects.data
        if len(rects) != 1 or not rects[0].is_unit_step():
            raise self.fail(f"needs one dense rectangle as its region, got {self.region}")
        r = rects[0]
        return r.x.data, r.y.data, r.w.data, r.h.data

    def tiles(self) -> list[tuple[int, int, int, int]]:
        """The same-shaped rectangles the kernel's roles repeat over."""
        return [self.grid()]


_UNARY = "$sym_name `(` $input `)` `on` $region attr-dict `:` type($input) `->` type($output)"


def _width(value) -> int:
    return value.type.width.data


@irdl_op_definition
class EmbedOp(KernelOp):
    """Embedding rows for the step's tokens; tokens arrive from the sampler."""

    name = "mesh_kernel.embed"
    vocab = prop_def(IntegerAttr[I64])
    output = result_def(ActType)
    assembly_format = "$sym_name `on` $region attr-dict `:` type($output)"


@irdl_op_definition
class GemvOp(KernelOp):
    """Tiled GEMV: core (column i, row j) of the w x h grid holds W[in-chunk j, out-chunk i].

    The input is split over rows and the output over columns, so the result
    is partial sums in every row; the column `allreduce` that follows
    completes them.
    """

    name = "mesh_kernel.gemv"
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def verify_kernel(self) -> None:
        _, _, w, h = self.grid()
        if _width(self.input) < h or _width(self.output) < w:
            raise self.fail(
                f"a {w} x {h} grid is too large for a {_width(self.input)} x "
                f"{_width(self.output)} matrix: every core needs at least one row and column"
            )


@irdl_op_definition
class AllReduceOp(KernelOp):
    """Reduction tree along each row (or column) of its grid, then broadcast back.

    Roles (the paper's Figure 5): `edge` sends its partial and later receives
    the result; `mid` receives, accumulates, forwards and relays the result
    back; `root` receives, reduces and starts the broadcast.
    """

    name = "mesh_kernel.allreduce"
    axis = prop_def(StringAttr)
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def verify_kernel(self) -> None:
        if self.axis.data not in ("row", "col"):
            raise self.fail(f"axis must be 'row' or 'col', got '{self.axis.data}'")
        self.grid()


@irdl_op_definition
class AttentionOp(KernelOp):
    """Decode attention over KV tiles; per-slot sequence lengths come from the RDT."""

    name = "mesh_kernel.attention"
    heads = prop_def(IntegerAttr[I64])
    kv_heads = prop_def(IntegerAttr[I64])
    head_dim = prop_def(IntegerAttr[I64])
    max_seq = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def verify_kernel(self) -> None:
        _, _, w, h = self.grid()
        kv = int_value(self.kv_heads)
        if int_value(self.slots) <= 0:
            raise self.fail("slots must be > 0")
        if kv <= 0 or int_value(self.heads) % kv:
            raise self.fail("heads must be a positive multiple of kv_heads")
        # KV positions are split over rows, KV heads x head_dim over columns.
        if int_value(self.max_seq) < h:
            raise self.fail(f"{int_value(self.max_seq)} KV positions cannot be tiled over {h} rows")
        if kv * int_value(self.head_dim) < w:
            raise self.fail(
                f"{kv * int_value(self.head_dim)} KV columns cannot be tiled over {w} columns"
            )


@irdl_op_definition
class TopKGateOp(KernelOp):
    """Router logits and top-k expert selection; produces routing metainfo."""

    name = "mesh_kernel.topk_gate"
    input = operand_def(ActType)
    output = result_def(RoutingType)
    assembly_format = _UNARY


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

    def verify_kernel(self) -> None:
        if not self.expert_regions.data:
            raise self.fail("dispatch needs at least one expert region")


@irdl_op_definition
class ExpertFFNOp(KernelOp):
    """SwiGLU FFNs of one MoE layer's experts, all expert regions in one kernel.

    Expert `e` runs on `expert_regions[placement[e]]`; every expert region has
    the same shape, so the roles (and core classes) of all of them are shared:
    IR size does not grow with the number of experts.
    """

    name = "mesh_kernel.expert_ffn"
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    placement = prop_def(DenseArrayBase)
    expert_ffn = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = (
        "$sym_name `(` $input `,` $routing `)` `on` $region attr-dict `:` "
        "type($input) `,` type($routing) `->` type($output)"
    )

    @property
    def expert_placement(self) -> tuple[int, ...]:
        return tuple(self.placement.get_values())

    def tiles(self) -> list[tuple[int, int, int, int]]:
        """(x, y, w, h) of every expert region, all of one shape."""
        return [_single_rect(self, r) for r in self.expert_regions.data]

    def experts_per_region(self) -> int:
        counts = [0] * len(self.expert_regions.data)
        for r in self.expert_placement:
            counts[r] += 1
        return max(counts)

    def verify_kernel(self) -> None:
        rt = self.routing.type
        assert isinstance(rt, RoutingType)
        place = self.expert_placement
        regions = self.expert_regions.data
        if len(place) != rt.experts.data:
            raise self.fail(f"placement lists {len(place)} experts, routing selects among {rt.experts.data}")
        bad = [r for r in place if not 0 <= r < len(regions)]
        if bad:
            raise self.fail(f"placement names expert regions {sorted(set(bad))}, but only {len(regions)} exist")
        shapes = {t[2:] for t in self.tiles()}
        if len(shapes) > 1:
            raise self.fail(f"expert regions must share one shape, got {sorted(shapes)}")
        if self.region.count != sum(r.count for r in regions) or not self.region.covers(
            CoreSetAttr([r for cs in regions for r in cs.rects.data])
        ):
            raise self.fail("region must be the union of the expert regions")


def _single_rect(op: KernelOp, cores: CoreSetAttr) -> tuple[int, int, int, int]:
    rects = cores.rects.data
    if len(rects) != 1 or not rects[0].is_unit_step():
        raise op.fail(f"needs one dense rectangle per tile, got {cores}")
    r = rects[0]
    return r.x.data, r.y.data, r.w.data, r.h.data


@irdl_op_definition
class CombineOp(KernelOp):
    """Carries expert outputs back and sums them with their gate weights."""

    name = "mesh_kernel.combine"
    inputs = var_operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = (
        "$sym_name `(` $routing `,` $inputs `)` `on` $region attr-dict `:` "
        "type($routing) `,` type($inputs) `->` type($output)"
    )

    def verify_kernel(self) -> None:
        if not self.inputs:
            raise self.fail("combine needs at least one expert output")


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

    def verify_kernel(self) -> None:
        kind = self.kind.data
        if kind not in ELEMENTWISE_KINDS:
            raise self.fail(
                f"unknown elementwise kind '{kind}', expected one of {', '.join(ELEMENTWISE_KINDS)}"
            )
        if len(self.inputs) != ELEMENTWISE_KINDS[kind]:
            raise self.fail(f"'{kind}' takes {ELEMENTWISE_KINDS[kind]} operands, got {len(self.inputs)}")


@irdl_op_definition
class SampleOp(KernelOp):
    """Argmax over vocabulary tiles, EOS detection; produces the CF payload."""

    name = "mesh_kernel.sample"
    eos = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(TokensType)
    assembly_format = _UNARY


@irdl_op_definition
class HandoffOp(KernelOp):
    """Hidden state plus CF payload to the next stage (maybe the next wafer)."""

    name = "mesh_kernel.handoff"
    to_stage = prop_def(IntegerAttr[I64])
    to_wafer = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    @property
    def crosses_wafer(self) -> bool:
        return int_value(self.to_wafer) != self.wafer_index

    def verify_kernel(self) -> None:
        if int_value(self.to_stage) != self.stage_index + 1:
            raise self.fail(
                f"hands off from stage {self.stage_index} to stage {int_value(self.to_stage)}; "
                "a handoff must go to the next stage"
            )


MeshKernel = Dialect(
    "mesh_kernel",
    [
        ProgramOp,
        EmbedOp,
        GemvOp,
        AllReduceOp,
        AttentionOp,
        TopKGateOp,
        DispatchOp,
        ExpertFFNOp,
        CombineOp,
        ElementwiseOp,
        SampleOp,
        HandoffOp,
    ],
    [],
)
