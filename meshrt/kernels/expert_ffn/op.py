"""SwiGLU FFNs of one MoE layer's experts, all expert regions in one kernel."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, ArrayAttr, DenseArrayBase, IntegerAttr, StringAttr, UnitAttr
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.base import int_value
from meshrt.dialects.graph import ActType, RoutingType, verify_weights
from meshrt.dialects.mesh import CoreSetAttr, FlowRole
from meshrt.kernels.combine.op import CombineOp
from meshrt.quant import packed_format
from meshrt.shape import HParams
from meshrt.kernels.compute import ADD, DEQUANT, FMAC, SILU_MUL, ComputeOp, fmac_csl
from meshrt.kernels.dispatch.op import DispatchOp
from meshrt.kernels.expert_ffn import pe
from meshrt.kernels.expert_ffn.numerics import ExpertFFN
from meshrt.kernels.expert_reduce.op import (
    ExpertReduceOp,
    expert_output_bytes,
    expert_tokens,
    group_experts,
    region_experts,
    shape_groups,
    verify_one_height,
)
from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    OUTPUTS,
    ROUTED_FORMAT,
    Footprint,
    KernelContext,
    KernelOp,
    ceil_div,
    chain,
    region_tiles,
)


FMAC_DOWN = ComputeOp("fmac_down", "fmac", fmac_csl)
"""Phase 2 of a pass: the activations times W_down, this core's output partial."""


def root_facing(corridor: CoreSetAttr, tiles: list[tuple[int, int, int, int]]) -> int:
    """Column of each w-wide expert region on the side facing `corridor`: w - 1 if the
    corridor lies east of the regions' middle, else 0."""
    x0, _, x1, _ = corridor.extent
    lo, hi = min(t[0] for t in tiles), max(t[0] + t[2] for t in tiles)
    return tiles[0][2] - 1 if x0 + x1 >= lo + hi else 0


@irdl_op_definition
class ExpertFFNOp(KernelOp):
    """SwiGLU FFNs of one MoE layer's experts, all expert regions in one kernel.

    Expert `e` runs on `expert_regions[placement[e]]`; the last
    `shared_experts` regions hold the shared experts, one each, which every
    token visits. The routed experts' regions share one shape and the shared
    experts' one (their own: sized for one expert, not for a routed region's
    group; all of one height), so the roles (and core classes) of each shape
    are shared: IR size does not grow with the number of experts.
    """

    name = "mesh_kernel.expert_ffn"
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    placement = prop_def(DenseArrayBase)
    expert_ffn = prop_def(IntegerAttr[I64])
    shared_experts = opt_prop_def(IntegerAttr[I64])  # the last regions, one each (absent: 0)
    weights = opt_prop_def(StringAttr)  # the experts stored quantized (`meshrt.quant`)
    decoded = opt_prop_def(UnitAttr)  # ... and held decoded (`graph.packed_format`)
    input = operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = ROUTED_FORMAT

    VIZ_COLOR: ClassVar[str] = "#4daf4a"
    VIZ_RANK: ClassVar[int] = 0
    COMPUTE: ClassVar[tuple] = (FMAC, ADD, SILU_MUL, FMAC_DOWN, *DEQUANT.values())
    VALUE_IN_FP32: ClassVar[bool] = True  # per-expert values: the combine sums them
    NUMERICS: ClassVar[type] = ExpertFFN
    LOWERS: ClassVar[tuple] = (graph.MoEExpertsOp,)
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True  # tokens turn from the corridor into the expert regions
    PLACES_EXPERTS: ClassVar[bool] = True
    TILES_HOLD_OWN_VALUES: ClassVar[bool] = True

    @property
    def expert_placement(self) -> tuple[int, ...]:
        return tuple(self.placement.get_values())

    def tiles(self) -> list[tuple[int, int, int, int]]:
        """(x, y, w, h) of every expert region: the routed experts' (one shape), then the
        shared experts' (one shape, maybe another)."""
        return region_tiles(self, self.expert_regions)

    @property
    def packed(self) -> str | None:
        """The format the cores hold the expert tiles in (None: floats)."""
        return packed_format(self.weights.data if self.weights is not None else None, self.decoded)

    def held_weight_bytes(self, kctx: KernelContext) -> float:
        """SRAM bytes per weight as held: packed codes and scales, the model's floats
        where they are decoded at load, else the model's expert bytes."""
        if self.packed:
            return kctx.stored_bytes(self.packed, kctx.expert_weight_bytes)
        return kctx.weight_bytes if self.decoded else kctx.expert_weight_bytes

    @property
    def shared(self) -> int:
        """Shared experts: the last regions hold them, one each."""
        return int_value(self.shared_experts) if self.shared_experts is not None else 0

    def experts_per_region(self) -> int:
        return max(region_experts(len(self.expert_regions.data), self.expert_placement,
                                  self.shared))

    def verify_kernel(self) -> None:
        verify_weights(self)
        rt = self.routing.type
        assert isinstance(rt, RoutingType)
        place = self.expert_placement
        regions = self.expert_regions.data
        if len(place) != rt.experts.data:
            raise self.fail(f"placement lists {len(place)} experts, routing selects among {rt.experts.data}")
        routed = len(regions) - self.shared
        if not 0 <= self.shared < len(regions):
            raise self.fail(f"{self.shared} shared experts need as many of the {len(regions)} "
                            "expert regions (the last ones) and leave none for the routed")
        bad = [r for r in place if not 0 <= r < routed]
        if bad:
            raise self.fail(f"placement names expert regions {sorted(set(bad))}, but only "
                            f"{routed} hold routed experts")
        tiles = self.tiles()
        for what, part in (("routed", tiles[:routed]), ("shared", tiles[routed:])):
            shapes = {t[2:] for t in part}
            if len(shapes) > 1:
                raise self.fail(f"the {what} experts' regions must share one shape, got "
                                f"{sorted(shapes)}")
        verify_one_height(self, tiles)
        if self.region.count != sum(r.count for r in regions) or not self.region.covers(
            CoreSetAttr([r for cs in regions for r in cs.rects.data])
        ):
            raise self.fail("region must be the union of the expert regions")

    @staticmethod
    def footprint(group: int, hidden: int, expert_ffn: int, weight_bytes: float, micro_batch: int,
                  pairs: int, w: int, h: int, bias: bool = False, value_bytes: float = 4,
                  bodies: bool = False) -> Footprint:
        """Core (i, j) holds rows j of W_gate and W_up for column i's slice of the
        expert width, and W_down[slice i, rows j], for each of the `group`
        experts of its region, and buffers for the `micro_batch` tokens' input
        rows, one pass's gate|up partials and activations (`micro_batch` pairs a
        pass, `expert_passes`) and the output partials of the step's `pairs`.
        Computed as PE bodies (`bodies`, `pe.in_pe`): their arrays (`pe.py`),
        the biases and the experts' ids resident beside the tiles (in the
        model's floats of `value_bytes`); a neighbour's partial arrives in the
        program's p, the sub-schedule's message buffer (counted there)."""
        fi, hj = ceil_div(expert_ffn, w), ceil_div(hidden, h)
        weights = group * 3 * hj * fi * weight_bytes
        if not bodies:  # the kind's CSL bodies (16-bit, packed experts), which hold no biases
            return Footprint(weights, ACT_BYTES * (micro_batch * hj + pairs * hj + micro_batch * 3 * fi))
        bufs = [b for b in pe.expert_buffers(group, micro_batch, hj, fi, pairs, bias)
                if b.name not in (*pe.WEIGHTS, "p")]
        return Footprint(weights + value_bytes * sum(b.elems for b in bufs if b.resident),
                         ACT_BYTES * sum(b.elems for b in bufs if not b.resident))

    def roles(self, kctx: KernelContext):
        """A SwiGLU expert on every w x h expert region, in passes.

        A region computes its step's (token, expert) pairs `micro_batch` at a
        time (`expert_passes`: the pairs routed to it, or in the static build
        every token on every expert it holds). A pass: phase 1 sums
        x . W_gate|up down each column; the root applies silu(gate) * up and
        relays a[f_i] back up. Phase 2 is local: a[f_i] . W_down[f_i, rows j]
        is this core's partial of output rows j for the pass's pairs. After
        the last pass `expert_reduce` (the next kernel, on the same cores)
        sums the partials of all pairs along the rows.
        """
        tiles = self.tiles()
        held = group_experts(tiles, region_experts(len(tiles), self.expert_placement, self.shared))
        hidden, f = self.input.type.width.data, int_value(self.expert_ffn)
        b = kctx.micro_batch
        fmt = self.packed
        roles, flows = [], []
        for part, ids in shape_groups(tiles):  # the routed regions, the shared ones
            _, _, w, h = tiles[ids[0]]
            n = held[ids[0]]
            fi, hj = ceil_div(f, w), ceil_div(hidden, h)
            pairs = expert_tokens(kctx, n)
            state = self.footprint(n, hidden, f, self.held_weight_bytes(kctx), b, pairs, w, h,
                                   self.has_bias(), kctx.weight_bytes,
                                   pe.computes_in_pe(fmt, kctx.weight_bytes, kctx.expert_weight_bytes)).state
            # held packed: each expert a pass's tokens visit has its tiles decoded where used
            visited = min(n, b)
            decode_up = [("compute", DEQUANT[fmt].name, visited * hj * 2 * fi)] if fmt else []
            decode_down = [("compute", DEQUANT[fmt].name, visited * fi * hj)] if fmt else []
            up = [*decode_up, ("compute", "fmac", b * hj * 2 * fi)]
            # the gate|up partials go down each column, the activations (half) come back
            rs, fs = chain(self, up, "add", b * 2 * fi * ACT_BYTES,
                           [("compute", "silu_mul", b * fi)], int(state), outputs_from_root=False,
                           tiles=[tiles[i] for i in ids], kctx=kctx, part=part,
                           back_bytes=b * fi * ACT_BYTES)
            for r in rs:
                assert r.events[0] == INPUTS and r.events[-1] == OUTPUTS, r.events
                one = [*r.events[1:-1], *decode_down, ("compute", "fmac_down", b * fi * hj)]
                r.events = [INPUTS, *one * (pairs // b), OUTPUTS]
                r.ctrl = kctx.route_bytes  # which tokens are ours
            roles += rs
            flows += fs
        return roles, flows

    def has_bias(self) -> bool:
        """Whether the routed experts have biases (the program's `expert_bias`)."""
        program = self.parent_op()
        return getattr(program, "hparams", None) is not None and bool(HParams.of(program).int("expert_bias"))

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return pe.bodies_for(info, micro_batch, hp, tile)

    @classmethod
    def writes_own(cls, info, hp, op):
        # a pass's partials, activations and pair table; fmac_down writes the output (y)
        return op != "fmac_down" and pe.in_pe(info, hp)

    @classmethod
    def message_buffer(cls, info, hp, role, send):
        if not pe.in_pe(info, hp):
            return None
        if role is FlowRole.DOWN and send:  # the gate|up partials down each column (into p)
            return "gu"
        if role is FlowRole.UP:  # the activations relayed back up
            return "a"
        return None

    def tile_value_bytes(self, kctx: KernelContext) -> int:
        h = self.tiles()[0][3]
        return expert_output_bytes(kctx, self.experts_per_region(), self.input.type.width.data, h)

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][3])

    def input_layout(self) -> str:
        return "rows"  # core (i, j) reads input rows j: along its row from a corridor split the same way

    def output_layout(self) -> str:
        return "partial"  # rows j of the output, one partial per column

    def is_collective(self) -> bool:
        return True

    @classmethod
    def lower(cls, op, operands, make):
        """graph.moe_experts -> dispatch + expert_ffn (all expert regions) + expert_reduce
        (each region's rows into the column facing the corridor) + combine."""
        act, routing = operands
        rt = op.results[0].type
        dispatch = make(DispatchOp, op, [act, routing], rt, name=f"{op.kernel_name}.dispatch",
                        expert_regions=op.expert_regions)
        union = CoreSetAttr([r for cs in op.expert_regions.data for r in cs.rects.data])
        shared = int_value(op.shared_experts)
        experts = make(cls, op, [dispatch.results[0], routing], rt,
                       name=f"{op.kernel_name}.experts", region=union,
                       expert_regions=op.expert_regions, placement=op.placement,
                       expert_ffn=op.expert_ffn, **({"shared_experts": shared} if shared else {}),
                       **({"weights": op.weights} if op.weights is not None else {}),
                       **({"decoded": op.decoded} if op.decoded is not None else {}))
        root = root_facing(op.region, region_tiles(op, op.expert_regions))
        reduce = make(ExpertReduceOp, op, [experts.results[0]], rt, name=f"{op.kernel_name}.reduce",
                      region=union, expert_regions=op.expert_regions, root=root)
        combine = make(CombineOp, op, [reduce.results[0], routing], rt,
                       name=f"{op.kernel_name}.combine")
        return [dispatch, experts, reduce, combine], combine.results[0]
