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

from dataclasses import dataclass

from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import int_value
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


def chain(kernel: mk.KernelOp, local: list[Event], reduce_op: str, msg_bytes: int,
          finish: list[Event], state: int, outputs_from_root: bool = True, axis: str = "col"
          ) -> tuple[list[Role], list[FlowSpec]]:
    """Roles and flows of a reduction down each column (or along each row) of the tiles.

    Every core runs `local`; partials travel down the column (edge -> mid ->
    root) and are combined with `reduce_op`; the root runs `finish`, then the
    result is relayed back up so every core holds it. A kernel with several
    same-shaped tiles (the expert regions of a layer) repeats the pattern in
    each, with one role set for all of them.
    """
    tiles = kernel.tiles()
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
    flows = [
        FlowSpec(down, rows(0, h - 1), rows(1, h - 1), "shift", msg_bytes, *step),
        FlowSpec(up, rows(1, h - 1), rows(0, h - 1), "shift", msg_bytes, -step[0], -step[1]),
    ]
    out = [OUTPUTS] if not outputs_from_root else []
    roles = [
        Role("edge", rows(0, 1),
             [INPUTS, *local, ("send", down, msg_bytes), ("recv", up, msg_bytes), *out], state,
             sends_output=not outputs_from_root),
    ]
    if h > 2:
        roles.append(Role("mid", rows(1, h - 2), [
            INPUTS, *local, ("recv", down, msg_bytes), ("compute", reduce_op, msg_bytes // 4),
            ("send", down, msg_bytes), ("recv", up, msg_bytes), ("send", up, msg_bytes), *out,
        ], state, sends_output=not outputs_from_root))
    roles.append(Role("root", rows(h - 1, 1), [
        INPUTS, *local, ("recv", down, msg_bytes), ("compute", reduce_op, msg_bytes // 4),
        *finish, ("send", up, msg_bytes), OUTPUTS,
    ], state, sends_output=True))
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
            if kind == "rmsnorm":  # sum of squares reduced down the columns
                local = [("compute", "square_sum", b * _c(n, h * w))]
                finish = [("compute", "rsqrt", b)]
                roles, flows = chain(kernel, local, "add", b * ACT_BYTES, finish,
                                     _c(n, h * w) * ACT_BYTES, outputs_from_root=False)
                for r in roles:
                    r.events.insert(-1, ("compute", "scale", b * _c(n, h * w)))
                    r.sends_output = True
                    if r.events[-1] != OUTPUTS:
                        r.events.append(OUTPUTS)
                return roles, flows
            return [Role("tile", kernel.region,
                         [INPUTS, ("compute", kind, b * _c(n, h * w)), OUTPUTS], 0,
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
            return chain(kernel, [("compute", "fmac", b * _c(n_in, h) * _c(experts, w))], "add",
                         b * _c(experts, w) * ACT_BYTES, [("compute", "topk", b * experts)], int(state))
        case mk.DispatchOp() | mk.CombineOp():
            return _relay_roles(kernel, kctx)
        case mk.ExpertFFNOp():
            _, _, w, h = kernel.tiles()[0]
            hidden, f = kernel.input.type.width.data, int_value(kernel.expert_ffn)
            n = kernel.experts_per_region()
            state = n * (_c(hidden, h) * _c(2 * f, w) + _c(f, h) * _c(hidden, w)) * kctx.expert_weight_bytes
            tokens = b * min(n, kctx.top_k)
            local = [("compute", "fmac", tokens * (_c(hidden, h) * _c(2 * f, w) + _c(f, h) * _c(hidden, w))),
                     ("compute", "silu_mul", tokens * _c(f, h))]
            roles, flows = chain(kernel, local, "add", tokens * _c(hidden, w) * ACT_BYTES, [], int(state))
            for r in roles:
                r.ctrl = b * kctx.top_k * ROUTE_BYTES_PER_CHOICE  # which tokens are ours
            return roles, flows
        case mk.SampleOp():
            _, _, w, h = kernel.grid()
            vocab = kernel.input.type.width.data
            return chain(kernel, [("compute", "argmax", b * _c(vocab, w))], "argmax_merge",
                         b * 2 * ACT_BYTES, [("compute", "eos_check", b)], 0)
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
        flows = [FlowSpec(hop, src, dst, "shift", msg, dx, dy)]
        roles = [Role("tail", tail, [INPUTS, ("compute", "combine", b * hidden), ("send", hop, msg, meta)],
                      0, ctrl=kctx.route_bytes, switches=2)]
        if body is not None:
            roles.append(Role("relay", body, [INPUTS, ("recv", hop, msg, meta), ("compute", "combine", b * hidden),
                                               ("send", hop, msg, meta)], 0, ctrl=kctx.route_bytes, switches=2))
        roles.append(Role("head", head, [INPUTS, ("recv", hop, msg, meta), ("compute", "combine", b * hidden),
                                         OUTPUTS], 0, ctrl=kctx.route_bytes, switches=2, sends_output=True))
        return roles, flows
    src, dst = cell(0, length - 1), cell(1, length - 1)
    flows = [FlowSpec(hop, src, dst, "shift", msg, dx, dy)]
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
