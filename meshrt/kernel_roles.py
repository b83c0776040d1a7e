"""The kernel interface `synthesize-schedules` queries (DESIGN, mesh_kernel).

For every mesh kernel: its core roles (each a class-level core set), the
events each role runs (GetCoreSche of Algorithm 1), the kernel's internal
flows, per-role resident state (weights, KV tiles, control tables), whether
the kernel is a collective with all-or-nothing completion, and the two
predicates `receives_dynamism(role)` / `produces_dynamism(role)`.

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

from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import int_value
from meshrt.dialects.event import FlowRole
from meshrt.dialects.mesh import CoreSetAttr, RectAttr

ACT_BYTES = 4  # activations and partial sums travel and sit in buffers as fp32
CF_BYTES_PER_SLOT = 8  # continuous batching payload: request id (4) + status/len (4)
ROUTE_BYTES_PER_CHOICE = 4  # MoE metainfo per token per top-k choice: expert id + weight


def _c(a: float, b: int) -> int:
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


def _rect(x: int, y: int, w: int, h: int) -> CoreSetAttr:
    return CoreSetAttr.of(x, y, w, h)


def input_share(kernel: mk.KernelOp, width: int) -> int:
    """Elements of a `width`-wide input vector each receiving core needs.

    Follows the tiling: reduction dimensions are split over rows, output
    dimensions over columns, elementwise work over the whole region.
    """
    _, _, w, h = kernel.tiles()[0]
    match kernel:
        case mk.GemvOp() | mk.TopKGateOp() | mk.ExpertFFNOp() | mk.ElementwiseOp():
            return _c(width, h)
        case mk.AttentionOp() | mk.SampleOp():
            return _c(width, w)
        case mk.DispatchOp() | mk.CombineOp() | mk.HandoffOp():
            return _c(width, w * h)
        case mk.EmbedOp():
            return 1  # one token id per slot
    return width


# Layouts of a kernel's vector values over its grid (x, y, w, h); the data
# plane of the interpreter (meshrt.runtime.dataplane) follows the same rules.
#   rows     split over the grid's rows, the same in every column
#   cols     split over the columns, the same in every row
#   full     the whole vector on every core that holds it
#   flat     split over all cores, row-major
#   sparse   only the cores that own the data hold it (embedding rows)
#   partial  partial sums, split over the columns (a gemv before its allreduce)


def output_layout(kernel: mk.KernelOp) -> str:
    match kernel:
        case mk.EmbedOp():
            return "sparse"
        case mk.HandoffOp() | mk.DispatchOp():
            return "flat"
        case mk.ElementwiseOp():
            return "rows" if kernel.kind.data == "rmsnorm" else "cols"
        case mk.GemvOp():
            return "partial"
        case mk.AllReduceOp():
            return "cols" if kernel.axis.data == "col" else "rows"
        case mk.AttentionOp():
            return "cols"
        case mk.ExpertFFNOp():
            return "partial"  # rows j of the output, one partial per column
        case mk.CombineOp():
            return "full"  # at the head of the corridor
    return "full"


def input_layout(kernel: mk.KernelOp) -> str:
    match kernel:
        case mk.GemvOp() | mk.TopKGateOp():
            return "rows"
        case mk.ElementwiseOp():
            return "rows" if kernel.kind.data == "rmsnorm" else "cols"
        case mk.AllReduceOp():
            return "partial"
        case mk.SampleOp():
            return "cols"
        case mk.HandoffOp():
            return "flat"
    return "full"


def holds_input(producer: mk.KernelOp, consumer: mk.KernelOp) -> bool:
    """Whether every core of `consumer` that also runs `producer` already holds
    the part of the producer's value it needs (so no flow is needed)."""
    held, need = output_layout(producer), input_layout(consumer)
    px, py, pw, ph = producer.tiles()[0]
    cx, cy, cw, ch = consumer.tiles()[0]
    if held == "cols" and pw == 1 or held == "rows" and ph == 1 or held == "flat" and pw * ph == 1:
        held = "full"
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


def chain(kernel: mk.KernelOp, local: list[Event], reduce_op: str, msg_bytes: int,
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


def _expert_roles(kernel: mk.ExpertFFNOp, kctx: KernelContext) -> tuple[list[Role], list[FlowSpec]]:
    """A SwiGLU expert on every w x h expert region.

    Core (i, j) holds rows j of W_gate and W_up for column i's slice f_i of
    the expert width, and W_down[f_i, rows j]. Phase 1 sums x . W_gate|up
    down each column; the root applies silu(gate) * up and relays a[f_i]
    back up. Phase 2 is local: a[f_i] . W_down[f_i, rows j] is this core's
    partial of output rows j. Every core sends its partial on; combine,
    which sums the weighted expert outputs anyway, sums the columns too, so
    no core needs a fourth queue for a reduction along the rows.
    """
    _, _, w, h = kernel.tiles()[0]
    hidden, f = kernel.input.type.width.data, int_value(kernel.expert_ffn)
    n = kernel.experts_per_region()
    b = kctx.micro_batch
    fi, hj = _c(f, w), _c(hidden, h)
    state = n * 3 * hj * fi * kctx.expert_weight_bytes
    # With routing a region sees only the tokens routed to it; without it
    # (the static build) every expert computes every token.
    tokens = b * min(n, kctx.top_k) if "moe_routing" in kctx.dynamism else b * n
    up = [("compute", "fmac", tokens * hj * 2 * fi)]
    roles, flows = chain(kernel, up, "add", tokens * 2 * fi * ACT_BYTES,
                         [("compute", "silu_mul", tokens * fi)], int(state), outputs_from_root=False)
    for r in roles:
        r.events = [e for e in r.events if e != OUTPUTS] + [("compute", "fmac", tokens * fi * hj), OUTPUTS]
        r.sends_output = True
        r.ctrl = b * kctx.top_k * ROUTE_BYTES_PER_CHOICE  # which tokens are ours
    return roles, flows


def kernel_roles(kernel: mk.KernelOp, kctx: KernelContext) -> tuple[list[Role], list[FlowSpec]]:
    """GetCoreSche for every role of `kernel`, and its internal flows."""
    b = kctx.micro_batch
    match kernel:
        case mk.EmbedOp():
            _, _, w, h = kernel.grid()
            hidden = kernel.output.type.width.data
            vocab = int_value(kernel.vocab)
            state = _c(vocab, h) * _c(hidden, w) * kctx.weight_bytes
            return [Role("token", kernel.region, [INPUTS, ("compute", "embed", b * _c(hidden, w)), OUTPUTS],
                         int(state), ctrl=kctx.slots * 16, sends_output=True)], []
        case mk.GemvOp():
            _, _, w, h = kernel.grid()
            n_in, n_out = kernel.input.type.width.data, kernel.output.type.width.data
            state = _c(n_in, h) * _c(n_out, w) * kctx.weight_bytes
            return [Role("tile", kernel.region,
                         [INPUTS, ("compute", "fmac", b * _c(n_in, h) * _c(n_out, w))], int(state))], []
        case mk.AllReduceOp():
            _, _, w, h = kernel.grid()
            n = kernel.output.type.width.data
            across = h if kernel.axis.data == "row" else w  # the output is split the other way
            return chain(kernel, [], "add", b * _c(n, across) * ACT_BYTES, [], 0, axis=kernel.axis.data)
        case mk.ElementwiseOp():
            _x, _y, w, h = kernel.grid()
            n = kernel.output.type.width.data
            kind = kernel.kind.data
            if kind == "rmsnorm":  # rows layout: sum of squares reduced down each column
                local = [("compute", "square_sum", b * _c(n, h))]
                finish = [("compute", "rsqrt", b)]
                roles, flows = chain(kernel, local, "add", b * ACT_BYTES, finish,
                                     _c(n, h) * ACT_BYTES, outputs_from_root=False)
                for r in roles:
                    r.events.insert(-1, ("compute", "scale", b * _c(n, h)))
                    r.sends_output = True
                    if r.events[-1] != OUTPUTS:
                        r.events.append(OUTPUTS)
                return roles, flows
            return [Role("tile", kernel.region,  # cols layout
                         [INPUTS, ("compute", kind, b * _c(n, w)), OUTPUTS], 0,
                         sends_output=True)], []
        case mk.AttentionOp():
            _, _, w, h = kernel.grid()
            heads, kv = int_value(kernel.heads), int_value(kernel.kv_heads)
            d, seq = int_value(kernel.head_dim), int_value(kernel.max_seq)
            rows = _c(seq, h)
            state = kctx.slots * rows * _c(kv * d, w) * 2 * kctx.kv_bytes
            local = [("compute", "qk", b * rows * _c(heads * d, w)),
                     ("compute", "exp", b * rows * _c(heads, w)),
                     ("compute", "av", b * rows * _c(heads * d, w))]
            msg = b * (_c(heads * d, w) + 2 * _c(heads, w)) * ACT_BYTES  # partial out + max/sum
            roles, flows = chain(kernel, local, "softmax_merge", msg,
                                 [("compute", "normalize", b * _c(heads * d, w))], int(state))
            for r in roles:
                r.ctrl = kctx.slots * 16  # request descriptor table: per-slot lengths
            return roles, flows
        case mk.TopKGateOp():
            _, _, w, h = kernel.grid()
            n_in = kernel.input.type.width.data
            experts = kernel.output.type.experts.data
            state = _c(n_in, h) * _c(experts, w) * kctx.weight_bytes
            # Every core forwards its rows of the tokens it gated (dispatch
            # needs whole tokens), once the routing has been relayed back up.
            return chain(kernel, [("compute", "fmac", b * _c(n_in, h) * _c(experts, w))], "add",
                         b * _c(experts, w) * ACT_BYTES, [("compute", "topk", b * experts)], int(state),
                         outputs_from_root=False)
        case mk.DispatchOp() | mk.CombineOp():
            return _relay_roles(kernel, kctx)
        case mk.ExpertFFNOp():
            return _expert_roles(kernel, kctx)
        case mk.SampleOp():
            # The logits are split over the columns (the same in every row):
            # the bottom row merges its columns' candidates left to right.
            x, y, w, h = kernel.grid()
            vocab = kernel.input.type.width.data
            return chain(kernel, [("compute", "argmax", b * _c(vocab, w))], "argmax_merge",
                         b * 2 * ACT_BYTES, [("compute", "eos_check", b)], 0, axis="row",
                         tiles=[(x, y + h - 1, w, 1)], relay_back=False)
        case mk.HandoffOp():
            return [Role("egress", kernel.region, [INPUTS, OUTPUTS], 0, sends_output=True)], []
    raise ValueError(f"kernel '{kernel.name}' has no roles")


def _relay_roles(kernel: mk.KernelOp, kctx: KernelContext) -> tuple[list[Role], list[FlowSpec]]:
    """Dispatch / combine relays along the corridor's long axis.

    Tokens enter at the head, and every relay core reads the routing
    metainfo to pick a direction: onward along the corridor, or across into
    the expert regions (dispatch); combine runs the same corridor backwards.
    """
    x, y, w, h = kernel.grid()
    k = kernel.kernel_name
    b = kctx.micro_batch
    hidden = kernel.output.type.width.data
    meta = kctx.route_bytes if "moe_routing" in kctx.dynamism else 0
    msg = b * kctx.top_k * _c(hidden, w * h) * ACT_BYTES  # each relay core carries its slice
    along_y = h >= w
    length = h if along_y else w
    backwards = isinstance(kernel, mk.CombineOp)

    def cell(i: int, n: int = 1) -> CoreSetAttr:
        return _rect(x, y + i, w, n) if along_y else _rect(x + i, y, n, h)

    if length == 1:
        return [Role("head", kernel.region, [INPUTS, ("compute", "route", b * kctx.top_k), OUTPUTS],
                     0, ctrl=kctx.route_bytes, switches=2, sends_output=True)], []
    step = -1 if backwards else 1
    dx, dy = (0, step) if along_y else (step, 0)
    hop = f"{k}.hop"
    if backwards:  # combine: expert results enter all along, leave at the head (index 0)
        src, dst = cell(1, length - 1), cell(0, length - 1)
        head, body, tail = cell(0), cell(1, length - 2) if length > 2 else None, cell(length - 1)
        flows = [FlowSpec(hop, src, dst, "shift", msg, dx, dy, role=FlowRole.HOP)]
        roles = [Role("tail", tail, [INPUTS, ("compute", "combine", b * hidden), ("send", hop, msg, meta)],
                      0, ctrl=kctx.route_bytes, switches=2)]
        if body is not None:
            roles.append(Role("relay", body, [INPUTS, ("recv", hop, msg, meta), ("compute", "combine", b * hidden),
                                               ("send", hop, msg, meta)], 0, ctrl=kctx.route_bytes, switches=2))
        roles.append(Role("head", head, [INPUTS, ("recv", hop, msg, meta), ("compute", "combine", b * hidden),
                                         OUTPUTS], 0, ctrl=kctx.route_bytes, switches=2, sends_output=True))
        return roles, flows
    src, dst = cell(0, length - 1), cell(1, length - 1)
    flows = [FlowSpec(hop, src, dst, "shift", msg, dx, dy, role=FlowRole.HOP)]
    roles = [Role("head", cell(0), [INPUTS, ("compute", "route", b * kctx.top_k), ("send", hop, msg, meta), OUTPUTS],
                  0, ctrl=kctx.route_bytes, switches=2, sends_output=True)]
    if length > 2:
        roles.append(Role("relay", cell(1, length - 2), [
            ("recv", hop, msg, meta), ("compute", "route", b * kctx.top_k), ("send", hop, msg, meta), OUTPUTS,
        ], 0, ctrl=kctx.route_bytes, switches=2, sends_output=True))
    roles.append(Role("tail", cell(length - 1), [("recv", hop, msg, meta), ("compute", "route", b * kctx.top_k),
                                                 OUTPUTS], 0, ctrl=kctx.route_bytes, switches=2,
                      sends_output=True))
    return roles, flows


COLLECTIVES = (mk.AllReduceOp, mk.AttentionOp, mk.TopKGateOp, mk.ExpertFFNOp, mk.SampleOp)


def is_collective(kernel: mk.KernelOp) -> bool:
    """Kernels whose completion is all-or-nothing (a reduction tree every core joins)."""
    if isinstance(kernel, mk.ElementwiseOp):
        return kernel.kind.data == "rmsnorm"
    return isinstance(kernel, COLLECTIVES)


def receives_dynamism(kernel: mk.KernelOp, role: str, kctx: KernelContext,
                      stage_entry: bool) -> tuple[str, ...]:
    """Kinds of runtime dynamism `role` of `kernel` must resolve before it runs.

    Continuous batching: the first stage's embed (tokens and CF payload from
    the sampler), every later stage's entry kernels (the payload arrives with
    the hidden state) and attention (per-slot KV lengths). MoE: every relay
    role of dispatch/combine and every expert role.
    """
    kinds: list[str] = []
    if "continuous_batching" in kctx.dynamism and (
        isinstance(kernel, mk.EmbedOp | mk.AttentionOp) or stage_entry
    ):
        kinds.append("continuous_batching")
    if "moe_routing" in kctx.dynamism and isinstance(kernel, mk.DispatchOp | mk.CombineOp | mk.ExpertFFNOp):
        kinds.append("moe_routing")
    return tuple(kinds)


def produces_dynamism(kernel: mk.KernelOp, role: str, kctx: KernelContext) -> tuple[str, ...]:
    """Kinds of metainfo `role` of `kernel` produces after its own events.

    The sampler's root detects EOS and emits the CF payload; the gate's root
    emits routing metainfo ahead of the token data.
    """
    if role != "root":
        return ()
    if isinstance(kernel, mk.SampleOp) and "continuous_batching" in kctx.dynamism:
        return ("continuous_batching",)
    if isinstance(kernel, mk.TopKGateOp) and "moe_routing" in kctx.dynamism:
        return ("moe_routing",)
    return ()
