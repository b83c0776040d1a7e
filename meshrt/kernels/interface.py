"""The kernel interface: what a mesh kernel kind answers and the rest of the tree asks.

A kind is one `KernelOp` subclass (its folder's `op.py`), in the style of an
xDSL op interface: the op answers, the passes ask. It gives

- its core roles and the events each role runs (GetCoreSche of Algorithm 1)
  and its internal flows: `roles(kctx)`;
- the layouts of its input and output vectors over its grid
  (`input_layout`, `output_layout`, `input_share`);
- its bytes per core (`footprint`, the one formula the mapper sizes with and
  the roles declare as resident state);
- whether it is a collective (`is_collective`), where its roles receive or
  produce runtime dynamism (`RESOLVES`, `PRODUCES_AT_ROOT`, or the two
  methods), and how its inputs carry metainfo (`ROUTED_INPUTS`, ...);
- its compute ops with their cost keys and CSL bodies (`COMPUTE`, see
  `meshrt.kernels.compute`), and its numerics for the interpreter
  (`NUMERICS`, a `meshrt.kernels.numerics.KernelExec`);
- the graph ops it lowers from (`LOWERS`, `lower`).

`meshrt.kernels.registry` collects the kinds from the folders; the
mesh_kernel dialect, `event.kernel`'s kinds, the data plane, the op costs,
the CSL compute and the viz colours are derived from it.

Tiling convention (shared with the default mapper): on a w x h grid the
reduction dimension (a matmul's input, attention's sequence) is split over
the h rows and the output dimension over the w columns, so reductions run
along columns: edge (top row) -> mid rows -> root (bottom row), and the
result is relayed back up (the paper's Figure 5, turned on its side).

Events are plain tuples here; `synthesize-schedules` turns them into ops.
Two markers stand where the kernel's inputs are received and its outputs
sent, because those flows depend on the neighbouring kernels.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from xdsl.ir import Operation, SSAValue

from meshrt.dialects.base import MappedKernelOp
from meshrt.dialects.mesh import CoreSetAttr, FlowRole, RectAttr

if TYPE_CHECKING:
    from meshrt.kernels.compute import ComputeOp
    from meshrt.kernels.numerics import KernelExec

ACT_BYTES = 4  # activations and partial sums travel and sit in buffers as fp32
CF_BYTES_PER_SLOT = 8  # continuous batching payload: request id (4) + status/len (4)
ROUTE_BYTES_PER_CHOICE = 4  # MoE metainfo per token per top-k choice: expert id + weight
DYNAMISM_ORDER = ("continuous_batching", "moe_routing")  # order resolvers run in


def ceil_div(a: float, b: int) -> int:
    """ceil(a / b) for the tile sizes of a split (b < 1 counts as 1)."""
    return -(-int(a) // max(b, 1))


@dataclass(frozen=True)
class KernelContext:
    """What kernels need to know about the program and the model."""

    micro_batch: int
    slots: int  # request slots a stage holds state for (micro-batch x stages)
    weight_bytes: float
    expert_weight_bytes: float
    kv_bytes: float
    top_k: int
    dynamism: tuple[str, ...]

    @property
    def cf_bytes(self) -> int:
        return self.micro_batch * CF_BYTES_PER_SLOT

    @property
    def route_bytes(self) -> int:
        return self.micro_batch * max(self.top_k, 1) * ROUTE_BYTES_PER_CHOICE


@dataclass(frozen=True)
class FlowSpec:
    name: str
    src: CoreSetAttr
    dst: CoreSetAttr
    pattern: str
    bytes: int
    dx: int | None = None
    dy: int | None = None
    role: FlowRole = field(kw_only=True)
    operand: int | None = field(default=None, kw_only=True)  # with role INPUT: the operand index


# Event tuples: ("recv", flow, bytes[, meta]) ("send", flow, bytes[, meta])
# ("compute", op, work) and the markers ("inputs",) / ("outputs",).
Event = tuple

INPUTS: Event = ("inputs",)
OUTPUTS: Event = ("outputs",)


@dataclass
class Role:
    name: str
    cores: CoreSetAttr
    events: list[Event]
    state_sram: int = 0  # resident bytes per core: weights, KV tiles
    ctrl: int = 0  # control-state bytes per core
    switches: int = 1  # switch positions its colours need (relays choose among 2)
    sends_output: bool = False
    part_of: str | None = None  # the kind's role this one is the part of (split by its senders)

    @property
    def kind_role(self) -> str:
        """The role as the kind declared it (what its dynamism answers are keyed by)."""
        return self.part_of or self.name


@dataclass(frozen=True)
class Footprint:
    """Bytes per core of one tile: resident state (weights, KV) and working buffers."""

    state: float
    buffers: float = 0.0

    @property
    def total(self) -> float:
        return self.state + self.buffers


# Layouts of a kernel's vector values over its grid (x, y, w, h); the data
# plane of the interpreter follows the same rules.
#   rows     split over the grid's rows, the same in every column
#   cols     split over the columns, the same in every row
#   full     the whole vector on every core that holds it
#   flat     split over all cores, row-major
#   sparse   only the cores that own the data hold it (embedding rows)
#   partial  partial sums, split over the columns (a gemv before its allreduce)
LAYOUTS = ("rows", "cols", "full", "flat", "sparse", "partial")

UNARY_FORMAT = "$sym_name `(` $input `)` `on` $region attr-dict `:` type($input) `->` type($output)"
ROUTED_FORMAT = (  # a kernel of a token vector and its routing
    "$sym_name `(` $input `,` $routing `)` `on` $region attr-dict `:` "
    "type($input) `,` type($routing) `->` type($output)"
)


class KernelOp(MappedKernelOp):
    """A mesh kernel instance; subclasses are the kinds (one folder each)."""

    # -- what the kind declares ------------------------------------------
    VIZ_COLOR: ClassVar[str] = "#cccccc"
    VIZ_RANK: ClassVar[int] = 50  # of kernels sharing cores, the lowest rank names them in pictures
    COMPUTE: ClassVar[tuple[ComputeOp, ...]] = ()  # the compute ops its roles run
    NUMERICS: ClassVar[type[KernelExec] | None] = None  # what its events do to data
    LOWERS: ClassVar[tuple[type[Operation], ...]] = ()  # graph ops `lower` accepts
    RESOLVES: ClassVar[frozenset[str]] = frozenset()  # dynamism every role resolves
    PRODUCES_AT_ROOT: ClassVar[frozenset[str]] = frozenset()  # metainfo its root produces
    # How its inputs are wired (synthesize-schedules asks):
    ROUTED_INPUTS: ClassVar[bool] = False  # data inputs carry the MoE routing metainfo
    INPUT_FROM_ROUTING_PRODUCER: ClassVar[bool] = False  # the router forwards its tokens
    CF_ON_INPUTS: ClassVar[bool] = False  # inputs carry the continuous-batching payload
    STAGE_BOUNDARY: ClassVar[bool] = False  # its output enters the next pipeline stage
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = False  # only the sending cores keep the result
    TOKEN_SOURCE: ClassVar[bool] = False  # sends the sampled tokens back to the first stage
    TOKEN_SINK: ClassVar[bool] = False  # receives them
    PLACES_EXPERTS: ClassVar[bool] = False  # has an expert -> region placement
    STATE_DTYPE: ClassVar[str] = "dtype_bytes"  # hparam: bytes per element of its resident state

    @classmethod
    def kernel_kind(cls) -> str:
        return cls.name.split(".", 1)[1]

    # -- geometry ----------------------------------------------------------
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

    # -- the interface (every kind answers) --------------------------------
    def roles(self, kctx: KernelContext) -> tuple[list[Role], list[FlowSpec]]:
        """GetCoreSche for every role, and the kernel's internal flows."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define its roles")

    def input_share(self, width: int) -> int:
        """Elements of a `width`-wide input vector each receiving core needs."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define its input share")

    def input_layout(self) -> str:
        """How each receiving core needs its inputs laid out (one of LAYOUTS)."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define its input layout")

    def output_layout(self) -> str:
        """How the kernel's result is laid out over the cores that hold it (one of LAYOUTS)."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define its output layout")

    def is_collective(self) -> bool:
        """Completion is all-or-nothing (a reduction tree every core joins)."""
        return False

    def receives_dynamism(self, role: str, kctx: KernelContext, stage_entry: bool) -> tuple[str, ...]:
        """Kinds of runtime dynamism `role` must resolve before it runs.

        Every kernel that enters a later stage resolves the continuous
        batching payload arriving with the hidden state; beyond that, what
        the kind declares in RESOLVES.
        """
        return tuple(k for k in DYNAMISM_ORDER if k in kctx.dynamism and (
            k in self.RESOLVES or (k == "continuous_batching" and stage_entry)))

    def produces_dynamism(self, role: str, kctx: KernelContext) -> tuple[str, ...]:
        """Kinds of metainfo `role` produces after its own events."""
        if role != "root":
            return ()
        return tuple(k for k in DYNAMISM_ORDER if k in self.PRODUCES_AT_ROOT and k in kctx.dynamism)

    @classmethod
    def lower(cls, op: Operation, operands: list[SSAValue], make) -> tuple[list[Operation], SSAValue]:
        """The mesh kernels for graph op `op` (one of LOWERS) and the value replacing its result.

        `make(cls, src, operands, result_type, name=..., region=..., **props)`
        builds a kernel op with the graph op's name, region, layer, stage and
        wafer unless overridden. By default the graph op becomes one kernel of
        this kind with the properties `lower_props` gives; kinds that lower to
        several kernels override this.
        """
        k = make(cls, op, operands, op.results[0].type, **cls.lower_props(op))
        return [k], k.results[0]

    @classmethod
    def lower_props(cls, op: Operation) -> dict:
        """The kernel's own properties, read off graph op `op` (for the default `lower`)."""
        return {}


def effective_layout(layout: str, w: int, h: int) -> str:
    """`layout` on a w x h grid as the simplest layout that says the same: a split over
    one line is the whole vector, a flat split of one column is a split over its rows."""
    if layout == "cols" and w == 1 or layout == "rows" and h == 1 or layout == "flat" and w * h == 1:
        return "full"
    if layout == "flat" and (w == 1 or h == 1):
        return "rows" if w == 1 else "cols"
    return layout


def holds_input(producer: KernelOp, consumer: KernelOp) -> bool:
    """Whether every core of `consumer` that also runs `producer` already holds
    the part of the producer's value it needs (so no flow is needed)."""
    px, py, pw, ph = producer.tiles()[0]
    cx, cy, cw, ch = consumer.tiles()[0]
    held = effective_layout(producer.output_layout(), pw, ph)
    need = consumer.input_layout()
    if need == "flat":
        need = effective_layout(need, cw, ch)
    if need == "partial":
        return held == "partial" and (px, py, pw, ph) == (cx, cy, cw, ch)
    if held == "full":
        return True
    if held != need:
        return False
    if held == "cols":
        return (px, pw) == (cx, cw)
    if held == "rows":
        return (py, ph) == (cy, ch)
    return held == "flat" and (px, py, pw, ph) == (cx, cy, cw, ch)


def chain(kernel: KernelOp, local: list[Event], reduce_op: str, msg_bytes: int,
          finish: list[Event], state: int, outputs_from_root: bool = True, axis: str = "col",
          tiles: list[tuple[int, int, int, int]] | None = None, relay_back: bool = True,
          ) -> tuple[list[Role], list[FlowSpec]]:
    """Roles and flows of a reduction down each column (or along each row) of the tiles.

    Every core runs `local`; partials travel down the column (edge -> mid ->
    root) and are combined with `reduce_op`; the root runs `finish`, then the
    result is relayed back up so every core holds it (unless `relay_back` is
    off: then only the root does). A kernel with several same-shaped tiles
    (the expert regions of a layer) repeats the pattern in each, with one
    role set for all of them; `tiles` restricts the chain to part of the
    kernel's region.
    """
    tiles = tiles if tiles is not None else kernel.tiles()
    k = kernel.kernel_name
    along_row = axis == "row"
    h = tiles[0][2] if along_row else tiles[0][3]  # cores along the reduction
    step = (1, 0) if along_row else (0, 1)

    def rows(first: int, count: int) -> CoreSetAttr:
        """Positions first..first+count-1 along the reduction, in every tile."""
        if along_row:
            return CoreSetAttr([RectAttr(tx + first, ty, count, th) for tx, ty, _, th in tiles])
        return CoreSetAttr([RectAttr(tx, ty + first, tw, count) for tx, ty, tw, _ in tiles])

    if h == 1:
        return [Role("root", rows(0, 1), [INPUTS, *local, *finish, OUTPUTS],
                     state, sends_output=True)], []
    down, up = f"{k}.down", f"{k}.up"
    flows = [FlowSpec(down, rows(0, h - 1), rows(1, h - 1), "shift", msg_bytes, *step, role=FlowRole.DOWN)]
    if relay_back:
        flows.append(FlowSpec(up, rows(1, h - 1), rows(0, h - 1), "shift", msg_bytes, -step[0], -step[1],
                              role=FlowRole.UP))
    back_edge = [("recv", up, msg_bytes)] if relay_back else []
    back_mid = [("recv", up, msg_bytes), ("send", up, msg_bytes)] if relay_back else []
    back_root = [("send", up, msg_bytes)] if relay_back else []
    out = [OUTPUTS] if not outputs_from_root else []
    roles = [
        Role("edge", rows(0, 1),
             [INPUTS, *local, ("send", down, msg_bytes), *back_edge, *out], state,
             sends_output=not outputs_from_root),
    ]
    if h > 2:
        roles.append(Role("mid", rows(1, h - 2), [
            INPUTS, *local, ("recv", down, msg_bytes), ("compute", reduce_op, msg_bytes // 4),
            ("send", down, msg_bytes), *back_mid, *out,
        ], state, sends_output=not outputs_from_root))
    roles.append(Role("root", rows(h - 1, 1), [
        INPUTS, *local, ("recv", down, msg_bytes), ("compute", reduce_op, msg_bytes // 4),
        *finish, *back_root, OUTPUTS,
    ], state, sends_output=True))
    return roles, flows
