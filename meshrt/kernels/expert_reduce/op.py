"""Sums each expert region's output partials along its rows, into the column facing combine."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import I64, ArrayAttr, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects.base import int_value
from meshrt.dialects.graph import ActType
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.kernels.compute import ADD
from meshrt.kernels.expert_reduce.numerics import ExpertReduce
from meshrt.kernels.interface import (
    ACT_BYTES,
    UNARY_FORMAT,
    KernelContext,
    KernelOp,
    ceil_div,
    chain,
    region_tiles,
)


def expert_passes(experts_per_region: int, top_k: int, routed: bool) -> int:
    """Passes of `micro_batch` (token, expert) pairs one expert region runs per step, at
    most: with routing a token visits at most min(experts, top_k) of the region's experts,
    without it (the static build) every token visits every one. A pass's gate|up partials
    and activations are buffered once, whatever the region's number of experts."""
    return min(experts_per_region, top_k) if routed else experts_per_region


def shape_groups(tiles: list[tuple[int, int, int, int]]) -> list[tuple[str, list[int]]]:
    """An expert kernel's tiles (x, y, w, h) by shape, in order of first appearance, each
    group named for its roles and flows (`chain`'s `part`): the routed experts' regions
    (""), then, where theirs differs, the shared experts' ("shared")."""
    by_shape: dict[tuple[int, int], list[int]] = {}
    for i, t in enumerate(tiles):
        by_shape.setdefault(t[2:], []).append(i)
    return [("" if g == 0 else "shared", ids) for g, ids in enumerate(by_shape.values())]


def verify_one_height(op: KernelOp, tiles: list[tuple[int, int, int, int]]) -> None:
    """An expert kernel's regions share one height: their rows hold the same slices of the
    output (expert_ffn's partials, expert_reduce's sums, combine's reads along the rows)."""
    if len({t[3] for t in tiles}) > 1:
        raise op.fail("expert regions must share one height (their rows hold the same "
                      "slices of the output)")


def region_experts(regions: int, placement: Sequence[int], shared: int) -> list[int]:
    """Experts each of an expert kernel's `regions` holds: a routed region those `placement`
    puts on it, a shared expert's region (the last `shared`) its one."""
    counts = [0] * regions
    for r in placement:
        counts[r] += 1
    for r in range(regions - shared, regions):
        counts[r] = 1
    return counts


def group_experts(tiles: list[tuple[int, int, int, int]], held: Sequence[int]) -> list[int]:
    """Per tile, the most experts a region of its shape holds (`shape_groups`): the passes
    and buffers of the roles its shape shares are sized for them."""
    out = [0] * len(tiles)
    for _, ids in shape_groups(tiles):
        n = max(held[i] for i in ids)
        for i in ids:
            out[i] = n
    return out


def expert_tokens(kctx: KernelContext, experts_per_region: int) -> int:
    """(token, expert) pairs one expert region computes per step in a build, at most."""
    return kctx.micro_batch * expert_passes(experts_per_region, kctx.top_k,
                                            "moe_routing" in kctx.dynamism)


def expert_output_bytes(kctx: KernelContext, experts_per_region: int, hidden: int, h: int) -> int:
    """Bytes of one core's expert outputs (or partials) for its rows of an h-row region:
    a vector of its rows per (token, expert) pair of the step."""
    return expert_tokens(kctx, experts_per_region) * ceil_div(hidden, h) * ACT_BYTES


@irdl_op_definition
class ExpertReduceOp(KernelOp):
    """Sums each expert region's output partials along its rows, into one column.

    expert_ffn leaves core (i, j) of a w x h region the partial of output
    rows j from its slice i of the expert width; this kernel streams them
    along each row (one chain per row, every region at once) into column
    `root` (0 or w - 1 of the routed regions: the side facing the combine
    corridor; the shared experts' regions, where their shape is another, root
    on the same side). The root column then holds the region's expert
    outputs split over its rows, and only it sends them on: combine receives
    h messages per routed region, not one per expert core.
    """

    name = "mesh_kernel.expert_reduce"
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    root = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#74c476"
    VIZ_RANK: ClassVar[int] = 1
    COMPUTE: ClassVar[tuple] = (ADD,)
    VALUE_IN_FP32: ClassVar[bool] = True  # per-expert values: the combine sums them
    NUMERICS: ClassVar[type] = ExpertReduce
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True  # only the root column keeps the sums
    TILES_HOLD_OWN_VALUES: ClassVar[bool] = True
    SENDS_ONLY_ROUTED: ClassVar[bool] = True  # only the regions a step routed to send

    def tiles(self) -> list[tuple[int, int, int, int]]:
        return region_tiles(self, self.expert_regions)

    def verify_kernel(self) -> None:
        w = self.tiles()[0][2]
        if int_value(self.root) not in (0, w - 1):
            raise self.fail(f"root must be column 0 or {w - 1} of the {w}-wide expert regions, "
                            f"got {int_value(self.root)}")
        verify_one_height(self, self.tiles())
        regions = self.expert_regions.data
        if self.region.count != sum(r.count for r in regions) or not self.region.covers(
                CoreSetAttr([r for cs in regions for r in cs.rects.data])):
            raise self.fail("region must be the union of the expert regions")

    def experts_per_region(self) -> int:
        producer = self.input.owner
        return producer.experts_per_region() if getattr(producer, "PLACES_EXPERTS", False) else 1

    def tile_value_bytes(self, kctx: KernelContext) -> int:
        h = self.tiles()[0][3]
        return expert_output_bytes(kctx, self.experts_per_region(), self.output.type.width.data, h)

    def roles(self, kctx: KernelContext):
        """A chain along the rows of each region, toward its root column; regions of
        another shape (the shared experts') chain alike, rooted on the same side."""
        msg = self.tile_value_bytes(kctx)
        tiles, root = self.tiles(), int_value(self.root)
        roles, flows = [], []
        for part, ids in shape_groups(tiles):
            w = tiles[ids[0]][2]
            r, f = chain(self, [], "add", msg, [], 0, axis="row", tiles=[tiles[i] for i in ids],
                         relay_back=False, kctx=kctx, root=0 if root == 0 else w - 1, part=part)
            roles += r
            flows += f
        return roles, flows

    def input_share(self, width: int) -> int:
        return width

    def input_layout(self) -> str:
        return "partial"

    def output_layout(self) -> str:
        return "rows"

    def is_collective(self) -> bool:
        return True
