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
along columns toward a root at the column's centre, streaming through
two-level trees (`chain`, `meshrt.kernels.reduce_tree`), and the result is
multicast back along the column (the paper's Figure 5, turned on its side).

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
    from meshrt.kernels.pe import Bodies
    from meshrt.kernels.compute import ComputeOp
    from meshrt.kernels.reduce_tree import StreamCosts
    from meshrt.kernels.numerics import KernelExec

ACT_BYTES = 4  # fp32: partial sums travel so, and buffers hold activations so
WAVELET_BYTES = 4  # one fabric wavelet carries 32 bits: an fp32 value or two 16-bit ones
CF_BYTES_PER_SLOT = 8  # continuous batching payload: request id (4) + status/len (4)
CF_CHUNK_ROW_BYTES = 4  # ... and in a chunked program each row's KV slot (2) and phase (2)
ROUTE_BYTES_PER_CHOICE = 8  # MoE metainfo per token per choice: expert id (i32) + gate weight (f32)
DYNAMISM_ORDER = ("continuous_batching", "moe_routing")  # order resolvers run in


def wavelets(nbytes: int) -> int:
    """Wavelets of a message of `nbytes` (sends and receives are costed and emitted so)."""
    return -(-int(nbytes) // WAVELET_BYTES)


def ceil_div(a: float, b: int) -> int:
    """ceil(a / b) for the tile sizes of a split (b < 1 counts as 1)."""
    return -(-int(a) // max(b, 1))


def cf_row_bytes(chunk: int) -> int:
    """Continuous-batching payload a row of a micro-batch carries: its request and status,
    and where rows are not slots (a prefill chunk > 1) its KV slot and phase."""
    return CF_BYTES_PER_SLOT + (CF_CHUNK_ROW_BYTES if chunk > 1 else 0)


@dataclass(frozen=True)
class KernelContext:
    """What kernels need to know about the program and the model."""

    micro_batch: int  # token rows a micro-batch carries: its slots x the prefill chunk
    slots: int  # request slots a stage holds state for (micro-batch x stages)
    weight_bytes: float
    expert_weight_bytes: float
    kv_bytes: float
    top_k: int
    dynamism: tuple[str, ...]
    # the target's streaming costs (reduction trees are planned with them; None: one chain per side)
    stream: StreamCosts | None = None
    reduce_group: int = 0  # force reduction groups of this size (1: none); 0: the plan chooses
    reduce_tree: str = "chain"  # "chain": roots at the line's end; "tree": the plan may centre them
    quant_block: tuple[int, int] | None = None  # fp8's scale block (the model's), None per tensor
    shared_experts: int = 0  # always-on experts of each MoE layer: every token's extra choices
    shared_expert_gate: bool = False  # ... each scaled by sigmoid(x w_sg), which the gate computes
    act_bytes: int = ACT_BYTES  # bytes an element of a kernel's value travels in (`meshrt.activations`)
    chunk: int = 1  # prompt tokens a prefilling slot feeds a step (`micro_batch` // chunk slots)

    @property
    def in_hand(self) -> int:
        """Request slots a micro-batch serves (its rows over the chunk)."""
        return self.micro_batch // self.chunk

    def stored_bytes(self, fmt: str | None, plain: float) -> float:
        """Bytes per weight of a kernel whose matrices are stored as `fmt` (its `weights`
        property; None: `plain` floats)."""
        from meshrt.quant import bytes_per_weight

        return bytes_per_weight(fmt, self.quant_block) if fmt else plain

    @property
    def cf_bytes(self) -> int:
        return self.micro_batch * cf_row_bytes(self.chunk)

    @property
    def route_bytes(self) -> int:
        """MoE metainfo per micro-batch: each token's top-k choices and its shared experts
        (id and weight each)."""
        return self.micro_batch * (max(self.top_k, 1) + self.shared_experts) * ROUTE_BYTES_PER_CHOICE


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
    streams: bool = field(default=False, kw_only=True)  # partials stream wavelet by wavelet (see event.flow)


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
    switches: int = 1  # switch positions its colours need (a switch-chained sender: 2, see synthesize-schedules)
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
#   partial  partial sums the allreduce after the kernel completes (a gemv's, the embedding's)
LAYOUTS = ("rows", "cols", "full", "flat", "partial")

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
    ATTENDS_KV: ClassVar[bool] = False  # keeps a KV cache that grows with the context
    TILES_HOLD_OWN_VALUES: ClassVar[bool] = False  # each tile holds a value of its own (an expert's)
    # With MoE routing, a tile's outputs travel only in steps that routed a token to it
    # (the flows of its outputs are `routed`, see event.flow)
    SENDS_ONLY_ROUTED: ClassVar[bool] = False
    # its value is partial sums or per-expert values, summed further on: it travels in
    # fp32, not in the model's activation format (`value_bytes`; the interpreter rounds
    # every other kernel's value where a consumer reads it)
    VALUE_IN_FP32: ClassVar[bool] = False

    @classmethod
    def kernel_kind(cls) -> str:
        return cls.name.split(".", 1)[1]

    @classmethod
    def pe_bodies(cls, info, micro_batch: int, hp, tile: tuple[int, int, int, int]) -> Bodies | None:
        """The compute bodies (`meshrt.kernels.pe.Bodies`) of kernel `info` (its
        `event.kernel` record) on `tile` (x, y, w, h), one of its region's rectangles:
        what the interpreter executes and the CSL prints for its compute ops. None: the
        kind has none (yet) there, and its compute is its numerics' and its ComputeOps'
        CSL."""
        return None

    @classmethod
    def up_carries_value(cls, info) -> bool:
        """Whether what a chain of kernel `info` sends back up is the kernel's value (a
        reduction's result) rather than something its cores compute the value from (a
        norm's inverse RMS)."""
        return True

    @classmethod
    def sends_value(cls, info, role) -> str:
        """The kernel whose value a send of kernel `info` on a flow of `role` carries:
        its own, unless the kind passes another on (the gate: the tokens it gated)."""
        return info.kernel_name

    @classmethod
    def message_buffer(cls, info, hp, role, send: bool) -> str | None:
        """The buffer of kernel `info`'s PE bodies (`hp`: the program's hparams) that a
        message on a flow of `role` (a `FlowRole`) is sent from (`send`) or received
        into, where it is not a working array (x, y, p): candidates or token ids in
        32-bit words, an attention's partial softmax. None: the default
        (meshrt.backend.csl.values)."""
        return None

    @classmethod
    def writes_own(cls, info, hp, op: str) -> bool:
        """Whether compute op `op` of kernel `info` writes only arrays of the kernel's own
        (its PE bodies' state and messages), none of the working arrays."""
        return False

    @classmethod
    def reads_in_place(cls, info, op: str) -> bool:
        """Whether compute op `op`'s body reads its operand wherever the core holds it (it
        writes none of the working arrays x, y, p), so the program need not copy the
        operand into x first."""
        return False

    @classmethod
    def operands_read(cls, info, op: str) -> int:
        """How many of kernel `info`'s operands compute op `op` reads where the core holds
        them (`meshrt.backend.csl.values`): the first for an op that reads its input (its
        body reads x), none for the others."""
        return 1 if any(c.name == op and c.reads_input for c in cls.COMPUTE) else 0

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

    def result_cores(self) -> CoreSetAttr:
        """The cores that keep the kernel's result where it does not leave from its
        senders only (HOLDS_RESULT_AT_OUTPUTS): its region."""
        return self.region

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

    def holds_all_tokens(self) -> bool:
        """Whether each core holding the result holds it for every token of the micro-batch
        (a kernel splitting the tokens over groups of its cores does not: its consumers
        gather, never read it in place)."""
        return True

    def is_collective(self) -> bool:
        """Completion is all-or-nothing (a reduction tree every core joins)."""
        return False

    def value_bytes(self, kctx: KernelContext) -> int:
        """Bytes per element of the value this kernel hands its consumers."""
        return ACT_BYTES if self.VALUE_IN_FP32 else kctx.act_bytes

    def tile_value_bytes(self, kctx: KernelContext) -> int:
        """Bytes each sending core of a TILES_HOLD_OWN_VALUES kind sends: its own value,
        whatever the receiver's share (the receivers of its tiles' values gather them)."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define the bytes of its tiles' values")

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


def region_tiles(op: KernelOp, regions: ArrayAttr) -> list[tuple[int, int, int, int]]:
    """(x, y, w, h) of every expert region of `op`, each one dense rectangle."""
    out = []
    for cores in regions.data:
        rects = cores.rects.data
        if len(rects) != 1 or not rects[0].is_unit_step():
            raise op.fail(f"needs one dense rectangle per tile, got {cores}")
        r = rects[0]
        out.append((r.x.data, r.y.data, r.w.data, r.h.data))
    return out


def effective_layout(layout: str, w: int, h: int) -> str:
    """`layout` on a w x h grid as the simplest layout that says the same: a split over
    one line is the whole vector, a flat split of one column is a split over its rows."""
    if layout == "cols" and w == 1 or layout == "rows" and h == 1 or layout == "flat" and w * h == 1:
        return "full"
    if layout == "flat" and (w == 1 or h == 1):
        return "rows" if w == 1 else "cols"
    return layout


def held_share(width: int, layout: str, w: int, h: int) -> int:
    """Values of a `width` vector one core holds where it is laid out as `layout` ("rows",
    "cols" or "full") on a w x h grid: what a core of a gathering line sends, one multicast
    of which every receiver keeps its part."""
    if layout == "full":
        return width
    return ceil_div(width, h if layout == "rows" else w)


def holds_input(producer: KernelOp, consumer: KernelOp) -> bool:
    """Whether every core of `consumer` that also runs `producer` already holds
    the part of the producer's value it needs (so no flow is needed)."""
    if not producer.holds_all_tokens():
        return False
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


@dataclass(frozen=True)
class Gather:
    """An all-gather a `chain` runs before its reduction, on the same line and tree:
    every core runs `local` (which leaves it its own slice of a value), the slices
    stream to the root combined by `merge` (disjoint slices: their union), and the
    root multicasts the whole back, so every core holds it before the reduction's
    own `local`. Its flows are the reduction's with `.gather` in their names."""

    local: list[Event]
    merge: str
    msg_bytes: int


def chain(kernel: KernelOp, local: list[Event], reduce_op: str, msg_bytes: int,
          finish: list[Event], state: int, outputs_from_root: bool = True, axis: str = "col",
          tiles: list[tuple[int, int, int, int]] | None = None, relay_back: bool = True,
          kctx: KernelContext | None = None, root: int | None = None,
          gather: Gather | None = None, part: str = "",
          relay: bool = False, back_bytes: int | None = None) -> tuple[list[Role], list[FlowSpec]]:
    """Roles and flows of a streaming reduction down each column (or along each row) of the tiles.

    Every core runs `local`; partials stream toward the root at the centre of
    the line and are combined with `reduce_op` as they pass, in the two-level
    tree `meshrt.kernels.reduce_tree.ReduceTree.plan` chooses for the line
    (groups reduce in parallel into their leads, then the leads into the
    root); the root runs `finish`, then the result is multicast along the
    line so every core holds it (unless `relay_back` is off: then only the
    root does). Roles: `edge` (the far end of a group: sends its partial),
    `mid` (receives, adds, forwards), `lead` (a group's root: adds its
    group's stream, then adds it into the leads' stream), `root`; the cores
    after the root (side b, streaming toward -1) take the same names with
    `_r`. A kernel with several same-shaped tiles (the expert regions of a
    layer) repeats the pattern in each, with one role set for all of them;
    `tiles` restricts the chain to part of the kernel's region. `kctx`
    brings the target's stream costs and a forced group size, if any; `root`
    puts the root at that end of the line (0 or n - 1: one chain toward the
    cores the result goes to next) instead of where the plan would. `gather`
    runs an all-gather on the same tree first (see `Gather`). `part` names one of
    several chains of a kernel (its tiles of another shape): its roles are
    `{part}_edge`, ..., its flows `{kernel}.{part}.up`, ... `relay`: the result goes
    back core by core (each core passes on what it received) even where a multicast
    could reach the line: a segmented reduction, whose cores keep only what their
    segment's root sent (`attention.layout`).
    `back_bytes`: the size of what goes back (default `msg_bytes`: the
    reduced value; less where the root's `finish` makes it smaller).
    """
    from meshrt.kernels.reduce_tree import ReduceTree

    tiles = tiles if tiles is not None else kernel.tiles()
    k = f"{kernel.kernel_name}.{part}" if part else kernel.kernel_name
    named = (lambda role: f"{part}_{role}") if part else (lambda role: role)
    along_row = axis == "row"
    n = tiles[0][2] if along_row else tiles[0][3]  # cores along the reduction
    step = (1, 0) if along_row else (0, 1)

    def rows(first: int, count: int) -> list[RectAttr]:
        """Positions first..first+count-1 along the reduction, in every tile."""
        if along_row:
            return [RectAttr(tx + first, ty, count, th) for tx, ty, _, th in tiles]
        return [RectAttr(tx, ty + first, tw, count) for tx, ty, tw, _ in tiles]

    def at(positions) -> CoreSetAttr:
        """The cores at `positions` along the line, in every tile (runs merged)."""
        ps = sorted(set(positions))
        rects: list[RectAttr] = []
        i = 0
        while i < len(ps):
            j = i
            while j + 1 < len(ps) and ps[j + 1] == ps[j] + 1:
                j += 1
            rects += rows(ps[i], j - i + 1)
            i = j + 1
        return CoreSetAttr(sorted(rects, key=lambda r: (r.y.data, r.x.data)))

    first = list(gather.local) if gather is not None else []
    if n == 1:
        return [Role(named("root"), at([0]), [INPUTS, *first, *local, *finish, OUTPUTS], state,
                     sends_output=True)], []
    n_wavelets = wavelets(msg_bytes)
    stream = kctx.stream if kctx is not None else None
    op_cost = None
    if stream is not None:  # the reduce op's cycles per wavelet (its work is one element per wavelet)
        key = next(c.cost for c in type(kernel).COMPUTE if c.name == reduce_op)
        op_cost = stream.op_costs.get(key)
    if root is not None:
        if root not in (0, n - 1):
            raise ValueError(f"a forced root sits at an end of the line (0 or {n - 1}), not {root}")
        tree = ReduceTree(n, root)
    else:
        tree = ReduceTree.plan(n, n_wavelets, stream, kctx.reduce_group if kctx is not None else 0,
                               op_cost, centre=kctx is not None and kctx.reduce_tree == "tree")
    c = tree.root
    # a multicast along the line reaches only this tile's cores unless tiles share lines
    spans = sorted((t[1], t[1] + t[3]) if along_row else (t[0], t[0] + t[2]) for t in tiles)
    multicast = not relay and all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))
    flows: list[FlowSpec] = []

    def phase(tag: str, op_name: str, msg: int, relays: bool, back_msg: int):
        """One streaming pass over the tree: its flows go into `flows`; returns the events of
        each non-root position (side, d) and of the root, between its local work and what
        it does after the pass."""
        up = f"{k}{tag}.up"
        op = [("compute", op_name, msg // 4)]
        at_pos: dict[tuple[str, int], list[Event]] = {}
        root_in: list[Event] = []
        root_back: list[Event] = []
        relay_sends: list[Event] = []  # the root's first hops of the relays (tiles sharing lines)
        for side, sfx, sign in (("a", "", 1), ("b", "_r", -1)):
            m = tree.side_length(side)
            if not m:
                continue
            down, across, relay = f"{k}{tag}.down{sfx}", f"{k}{tag}.across{sfx}", f"{k}{tag}.up{sfx}"
            dx, dy = step[0] * sign, step[1] * sign
            members = [d for lo, hi in tree.groups(side) for d in range(lo, hi + 1)]
            leads = tree.leads(side)
            pos = tree.position
            if members:
                src = at(pos(side, d) for d in members)
                flows.append(FlowSpec(down, src, at(pos(side, d) + sign for d in members), "shift",
                                      msg, dx, dy, role=FlowRole.DOWN, streams=True))
            if leads:
                s = tree.group
                flows.append(FlowSpec(across, at(pos(side, d) for d in leads),
                                      at(pos(side, d) + sign * s for d in leads), "shift", msg,
                                      dx * s, dy * s, role=FlowRole.DOWN, streams=True))
            if relays and not multicast:
                flows.append(FlowSpec(relay, at(pos(side, d) for d in range(0, m)),
                                      at(pos(side, d) for d in range(1, m + 1)), "shift", back_msg,
                                      -dx, -dy, role=FlowRole.UP, streams=True))

            def back(d: int) -> list[Event]:
                if not relays:
                    return []
                if multicast:
                    return [("recv", up, back_msg)]
                return [("recv", relay, back_msg)] + ([("send", relay, back_msg)] if d < m else [])

            for lo, hi in tree.groups(side):
                for d in range(lo, hi + 1):
                    if d == hi:
                        at_pos[side, d] = [("send", down, msg), *back(d)]
                    else:
                        at_pos[side, d] = [("recv", down, msg), *op, ("send", down, msg), *back(d)]
            for d in leads:
                own = [("recv", down, msg), *op] if d + 1 <= m and d + 1 in members else []
                farther = [("recv", across, msg), *op] if d + tree.group <= m else []
                at_pos[side, d] = [*own, *farther, ("send", across, msg), *back(d)]
            if 1 in members:
                root_in += [("recv", down, msg), *op]
            if leads:
                root_back += [("recv", across, msg), *op]
            if relays and not multicast:
                relay_sends.append(("send", relay, back_msg))
        sends = relay_sends if not multicast else ([("send", up, back_msg)] if relays else [])
        if relays and multicast:
            flows.append(FlowSpec(up, at([c]), at(p for p in range(n) if p != c),
                                  "row" if along_row else "col", back_msg, role=FlowRole.UP, streams=True))
        return at_pos, root_in + root_back, sends

    before: dict[tuple[str, int], list[Event]] = {}
    root_first = list(first)
    if gather is not None:
        g_pos, g_in, g_sends = phase(".gather", gather.merge, gather.msg_bytes, True, gather.msg_bytes)
        before = {key: first + ev for key, ev in g_pos.items()}
        root_first += g_in + g_sends
    at_pos, root_in, sends = phase("", reduce_op, msg_bytes, relay_back,
                                   msg_bytes if back_bytes is None else back_bytes)
    out = [OUTPUTS] if not outputs_from_root else []
    by_events: dict[tuple, tuple[str, list[int], list[Event]]] = {}

    def add_role(name: str, pos: int, events: list[Event]) -> None:
        name = named(name)
        key = (name.split(".")[0], repr(events))
        if key not in by_events:
            same = sum(1 for nm, _, _ in by_events.values() if nm.split(".")[0] == name)
            by_events[key] = (name if not same else f"{name}.{same}", [], events)
        by_events[key][1].append(pos)

    for side, sfx in (("a", ""), ("b", "_r")):
        m = tree.side_length(side)
        if not m:
            continue
        for lo, hi in tree.groups(side):
            for d in range(lo, hi + 1):
                add_role(f"edge{sfx}" if d == hi else f"mid{sfx}", tree.position(side, d),
                         [INPUTS, *before.get((side, d), []), *local, *at_pos[side, d], *out])
        for d in tree.leads(side):
            add_role(f"lead{sfx}", tree.position(side, d),
                     [INPUTS, *before.get((side, d), []), *local, *at_pos[side, d], *out])
    roles = [Role(name, at(ps), events, state, sends_output=not outputs_from_root)
             for name, ps, events in by_events.values()]
    roles.append(Role(named("root"), at([c]), [INPUTS, *root_first, *local, *root_in, *finish,
                                               *sends, OUTPUTS], state, sends_output=True))
    return roles, flows


def _intersect(a: CoreSetAttr, b: CoreSetAttr) -> CoreSetAttr | None:
    """The cores of both (unit-step rectangles, as `chain` builds them), or None."""
    rects = []
    for r in a.rects.data:
        for s in b.rects.data:
            x0, y0, x1, y1 = r.extent
            u0, v0, u1, v1 = s.extent
            lo_x, lo_y, hi_x, hi_y = max(x0, u0), max(y0, v0), min(x1, u1), min(y1, v1)
            if lo_x < hi_x and lo_y < hi_y:
                rects.append(RectAttr(lo_x, lo_y, hi_x - lo_x, hi_y - lo_y))
    return CoreSetAttr(sorted(rects, key=lambda r: (r.y.data, r.x.data))) if rects else None


def in_sequence(first: list[Role], then: list[Role], before: list[Event]) -> list[Role]:
    """Roles of cores that run `before`, then their part of chain `first` (its markers
    dropped: e.g. a reduction along the rows), then their part of chain `then` (down the
    columns): one role per pair of roles that share cores, named `{then}_{first}`, with
    `then`'s state and output."""
    out = []
    for a in first:
        mid = [e for e in a.events if e not in (INPUTS, OUTPUTS)]
        for b in then:
            cores = _intersect(a.cores, b.cores)
            if cores is None:
                continue
            if b.events[0] != INPUTS:
                raise ValueError(f"role {b.name} does not start at its inputs")
            out.append(Role(f"{b.name}_{a.name}", cores, [INPUTS, *before, *mid, *b.events[1:]],
                            b.state_sram, b.ctrl, b.switches, b.sends_output, b.part_of))
    return out
