"""Discrete-event GALS simulation of segment IR: the timing core of the interpreter.

What this is
------------
It executes the lowest IR (a coloured `segment.program`), i.e. what the chip
would be configured with, core by core, and reports cycles, stalls and
failures. On its own it models timing and structure (messages carry sizes
and metainfo sizes). Given a `data` plane (`meshrt.runtime.dataplane`,
set up by `meshrt.runtime.serving.serve`) every compute, send and receive
also moves NumPy tensors: each message carries its payload and each core
computes on what it holds. This is the one place where per-core work is
allowed, so it is only meant for tiny models on the test targets (test32,
test16).

Model
-----
Cores. Every core class is expanded to its cores. Each core runs its class's
table (`meshrt.runtime.schedule.flatten`, which the cost model runs too): the
events of each segment's subs in order, then the boundary's
marker sync (if compiled) and reconfigure, and after the last segment the
table loops (back to segment 0 on multi-segment classes); one pass over the
table is one decode step. Subs run in table order, so a sub's `after`
kernels' subs on the same core have always completed before it starts.
Time is integer cycles. Each event costs `ceil(base * speed * jitter)`
cycles (at least 1): `speed` is a per-core factor drawn once from
1 + U(-s, s) with s = `target.speed_spread`, `jitter` is drawn per event from
1 + U(0, j) (default j = s). Every draw is a pure function of the seed, the
core (its router id) and how many draws that core has made
(`meshrt.runtime.counter_rng`), not of the order in which the simulator
visits cores; the event order is total (time, sequence number), so a seed
gives identical results. Base costs:

- `event.compute "op" work N`: N * cost[key], key the cost key the kernel
  kind declares for the op (`meshrt.kernels`; e.g. qk / av / square_sum ->
  fmac). With numerics, an op over KV rows (`ComputeOp.over_kv_rows`:
  attention's qk, exp, av, whose N is the capacity's rows) costs that times
  the share of the core's rows the micro-batch's queries reached
  (`KernelExec.reached`).
- `event.send` / `event.recv`: `send_wavelet` / `recv_wavelet` per 32-bit
  wavelet of data + metainfo (a recv pays per message it gathers).
- `event.meta_resolve` / `event.meta_produce`: local work,
  `meta_*_slot` * slots, slots = the program's micro-batch size.
- each sub pays `task_switch` once when it starts.
- `segment.reconfigure`: `reconfigure` + `reconfigure_route` * (released +
  installed routes).

Flows. Each sender of a class-level flow sends one message per send event to
its targets: `shift` by (dx, dy) to (x + dx, y + dy); `row` / `col` to the
receivers in its row / column; `all` to every receiver. A core never sends to
itself. A recv event completes when it has gathered one message from *each*
sender that targets the core (so an `all` receiver gathers one message per
sender); a second message from the same sender (the next step's) stays
queued for the next recv. On a `routed` flow (expert outputs into combine,
`meshrt.kernels.expert_reduce.routed`) only the senders whose expert region
the step's routing chose send (the routing each core resolved, or with no
numerics the step's counter-based draw); the others inject a one-wavelet
control message that crosses the routers (switch advance, end of flow) but
no core receives, and a recv gathers one message from each chosen sender.

Network. A message travels along its XY route (shift) or XY multicast tree
(row / col / all; copies split where the paths diverge), built once per
sender in one pass over the tree (`meshrt.routing.xy_tree`). Virtual
cut-through: the head crosses a link in `hop_latency_cycles` once the link is
free; the link (router, direction) is then busy for the serialisation time
ceil(bytes / link_bytes_per_cycle) and links are shared by all flows. The
tail reaches a destination core serialisation cycles after the head. This is
computed in closed form when the message is injected (`MeshSim._route`): each
link is reserved then, for the interval the head will hold it (the first gap
of that length at or after the head's arrival), so a link goes to messages in
the order they were injected, and only the deliveries become events.
Cross-wafer flows skip the mesh and use one shared wafer link per wafer pair
(`wafer_link_latency_cycles`, `wafer_link_bytes_per_cycle`).

Streaming (flows marked `streams`, see `meshrt.dialects.event.FlowOp`). A
streaming message is delivered when its head reaches the receiver; its tail
arrives serialisation cycles later. A recv of it starts the core's streaming
stage at max(core ready, head arrival) = s and costs nothing itself; the
stage's latency `lat` and cycles per wavelet `rate` come from
`meshrt.kernels.reduce_tree.stream_stage` (with the reduce op that follows
the recv). If a streaming send follows (after at most that op: a forward),
its message leaves at s + lat, and the core stays busy until its tail
leaves at max(s + wavelets x rate, input tail) + lat (the message's
serialisation is stretched to that); otherwise the op (or the recv, if
none follows) ends there. So a chain costs wavelets + hops + stages x lat,
not a message per hop.

Queues and backpressure. Each core has, per flow, an input queue of
`queue_depth` messages per sender that targets it. A message that finds the
queue full stays parked in its colour's buffer at the destination router and
stalls that colour there until the core consumes a message of the flow. A
message holds its sender's output-queue slot until every copy is in an input
queue or consumed; a send blocks while the core has `out_queue` messages
outstanding (default: the target's user output queues). This is the "waiting
to send" stall.

Routers. Every router (core) applies the colour configuration of its *own*
class's current segment: flow F on colour c is bound at router r iff F is in
the current segment's `routes` list and r is on F's `segment.route ... via`.
Routers on no class's core hold every routed flow that crosses them, all the
time. The check is made for the segment the router is in when a message's
head reaches it, and again for every message still passing through (tail not
yet past, or parked) when the router reconfigures. (With the network in closed
form, a router whose binding never changes is checked at injection; one of a
multi-segment class is checked when it next switches, or at the end of the
run, against the segment it was in at the head's cycle; so with
`stop_on_corruption` the run stops at the first corruption found, not
necessarily the earliest.) A message on a colour the router binds to another
flow (stale) or does not bind at all (missing) is a `CorruptionReport` naming
the message, flow, colour, router, the router's class and segment and the
sender's class and segment; the run stops there (`stop_on_corruption=False`
is a diagnostic mode that records every report and lets the message pass as
if routed, to list all race sites in one run).

Reconfiguration and markers (safe build). A core reaching
`segment.marker_sync i to j over R` takes a snapshot of every message in
flight (sent, not yet delivered) whose route touches R; markers sent behind
them flush the region, so the sync completes `marker_hop` * (Manhattan
distance from the core to the furthest corner of R) cycles after the last of
those messages is delivered. A `segment.reconfigure` first waits until every
message the core sent was delivered, then pays its cost, then switches the
core's router to the next segment.

Route handshakes (safe build; what `insert-route-handshakes` compiles, see
`meshrt.dialects.segment`). Classes switch segments asynchronously, so the
simulator executes the compiled handshakes that keep the step-position
liveness of color-routes true in time:

- install credits: after a `segment.reconfigure ... notify [@F]` switches the
  router, each core of the class sends one credit for F to every sender core
  whose route (tree) crosses its router (itself excepted), arriving
  `hop_latency_cycles` * (Manhattan distance) + 1 cycles later (a control
  message: no colour, no link time, and no event: the sender records when it
  arrives). `grant [@F]` on segment 0 gives those
  credits at cycle 0. A sender core at `await [@T::@F]` (placed before the
  segment's first send of F) in its step s waits until it holds s + 1
  credits of F from every router of class T on its route ("credit" stall).
- route drains: senders mark their last message of each flow in the step
  (end of flow). A `segment.reconfigure ... drain [@F]` first waits, at each
  core, until the end-of-flow messages of every step the router has credited
  (grants + notifies so far) from every sender crossing it have passed it,
  tails included ("route_drain" stall). The count is static: credited steps
  x senders crossing the router.

Unsafe ablation (`safe=False`). Marker syncs and route handshakes are skipped and a reconfigure
waits only until the core's own output queue is empty (the tails of its
messages have left its own router), not for delivery. It exists only to show
that the checks can fail.

Loop-carried flows (the sampler -> embed token flow): a receiver whose recv
comes before the flow's first send in the step order (see
`meshrt.analysis.liveness.step_order`) gets its first step's messages from
the host at cycle 0; from then on step s + 1 consumes what step s sent.

Failures are reported, never hung on: no pending event while some core has
work left is a `DeadlockReport` with the wait-for graph (what every blocked
core waits for: a recv on flow F from which senders, an output-queue slot
held by messages parked at which core, markers waiting for which messages,
the drain of its own messages, an install credit of which flow from which
routers, or a route drain still missing end-of-flow messages from which
senders); `max_cycles` bounds simulated time and `max_seconds` the wall time
of the run (both a `TimeBoundReport`).
"""

from __future__ import annotations

import gc
import heapq
import time as _time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from meshrt.kernels import registry
from meshrt.kernels.expert_reduce.routed import RoutedSenders, draw, routing_key
from meshrt.kernels.interface import WAVELET_BYTES
from meshrt.kernels.numerics import DataLayoutError
from meshrt.dialects import segment as sg
from meshrt.routing import RectSet, xy_tree
from meshrt.runtime import counter_rng
from meshrt.runtime.schedule import (
    AwaitCredits,
    Compute,
    EnterSegment,
    Instr,
    MarkerSync,
    MetaProduce,
    MetaResolve,
    Notify,
    Reconfigure,
    Recv,
    RouteDrain,
    Send,
    Sub,
    Switch,
    flatten,
)

# Core states.
RUN, W_RECV, W_SEND, W_MARKER, W_DRAIN, DONE, W_CREDIT, W_RDRAIN = range(8)
STATE_NAMES = ("run", "recv", "send", "marker", "drain", "done", "credit", "route-drain")
STALL_NAMES = ("recv", "send", "marker", "drain", "credit", "route_drain")
PROGRESS_EVENTS = 1 << 14  # events between two calls of `run`'s progress callback
# Heap event kinds.
E_RESUME, E_DELIVER, E_MARKER_DONE = range(3)

_DIRS = {(1, 0): 0, (-1, 0): 1, (0, 1): 2, (0, -1): 3}


# ---------------------------------------------------------------------------
# Reports and results
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CorruptionReport:
    """A message met a router whose current segment binds its colour to another flow, or not at all."""

    cycle: int
    message: int
    flow: str
    color: int
    router: tuple[int, int, int]  # (wafer, x, y)
    router_class: str | None
    router_segment: int | None
    sender: tuple[int, int, int]
    sender_class: str
    sender_segment: int
    bound_to: str | None  # the flow the router binds the colour to (None: unbound)
    when: str  # "arrival" or "reconfigure"

    def __str__(self) -> str:
        bound = f"bound to @{self.bound_to}" if self.bound_to else "not bound"
        return (
            f"corruption at cycle {self.cycle}: message #{self.message} of @{self.flow} on colour "
            f"{self.color} at router {self.router[1:]} (wafer {self.router[0]}, class "
            f"@{self.router_class}, segment {self.router_segment}) where the colour is {bound} "
            f"[{self.when}]; sent by {self.sender[1:]} (@{self.sender_class}) in segment "
            f"{self.sender_segment}"
        )


@dataclass(frozen=True)
class WaitEdge:
    core: tuple[int, int, int]
    core_class: str
    waits_for: str  # "recv" | "send" | "marker" | "drain"
    flow: str | None
    on: tuple[tuple[int, int, int], ...]  # cores it waits for
    detail: str


@dataclass(frozen=True)
class DeadlockReport:
    """No event is pending but some core has work left: the wait-for graph."""

    cycle: int
    waits: tuple[WaitEdge, ...]

    def __str__(self) -> str:
        lines = [f"deadlock at cycle {self.cycle}: {len(self.waits)} blocked core(s)"]
        for w in self.waits:
            lines.append(f"  {w.core[1:]} @{w.core_class} waits ({w.waits_for}) {w.detail}")
        return "\n".join(lines)


@dataclass(frozen=True)
class TimeBoundReport:
    cycle: int
    max_cycles: int
    steps_done: int
    # set when the wall-time bound stopped the run (`max_seconds`), not simulated time
    max_seconds: float | None = None

    def __str__(self) -> str:
        if self.max_seconds is not None:
            return (f"time bound: the run reached its wall-time limit of {self.max_seconds:g} s "
                    f"at cycle {self.cycle:,} with {self.steps_done} decode step(s) complete")
        return (
            f"time bound: simulated time reached {self.max_cycles} cycles with "
            f"{self.steps_done} decode step(s) complete"
        )


@dataclass(frozen=True)
class DataReport:
    """A core needed data it did not hold (numerics mode: a table, flow or layout bug)."""

    cycle: int
    core: tuple[int, int, int]
    core_class: str
    message: str

    def __str__(self) -> str:
        return (f"data error at cycle {self.cycle} on core {self.core[1:]} (wafer {self.core[0]}, "
                f"@{self.core_class}): {self.message}")


Report = CorruptionReport | DeadlockReport | TimeBoundReport | DataReport


@dataclass
class SimResult:
    completed: bool
    cycles: int
    steps: int
    step_cycles: list[int]  # cycles of each complete decode step
    stalls: dict[tuple[int, int, int], dict[str, int]]  # core -> {recv, send, marker, drain}
    link_utilisation: dict[str, float]  # mean / max busy fraction over used links
    events: int
    wall_seconds: float
    reports: list[Report]
    messages: int
    seed: int
    safe: bool
    spans: list[tuple[int, int, str, int, int]] | None = None  # (core idx, class idx, name, start, end)
    cores: list[tuple[tuple[int, int, int], str]] = field(default_factory=list)
    clock_hz: float = 1e9

    @property
    def events_per_second(self) -> float:
        return self.events / self.wall_seconds if self.wall_seconds > 0 else float("inf")

    def corruptions(self) -> list[CorruptionReport]:
        return [r for r in self.reports if isinstance(r, CorruptionReport)]

    def deadlocks(self) -> list[DeadlockReport]:
        return [r for r in self.reports if isinstance(r, DeadlockReport)]

    def stall_totals(self) -> dict[str, int]:
        out = dict.fromkeys(STALL_NAMES, 0)
        for s in self.stalls.values():
            for k, v in s.items():
                out[k] = out.get(k, 0) + v
        return out

    def summary(self) -> str:
        status = "complete" if self.completed else "FAILED"
        lines = [
            (f"{status}: {self.steps} step(s) in {self.cycles} cycles "
             f"(per step {self.step_cycles}), {self.messages} messages, {self.events} events "
             f"in {self.wall_seconds:.3f} s ({self.events_per_second:,.0f} events/s)"),
            f"stalls (core-cycles): {self.stall_totals()}; links: "
            + ", ".join(f"{k} {v:.3f}" for k, v in self.link_utilisation.items()),
        ]
        lines += [str(r) for r in self.reports]
        return "\n".join(lines)


# ---------------------------------------------------------------------------
# The simulator
# ---------------------------------------------------------------------------


class _Msg:
    __slots__ = (
        "dests",
        "eof",
        "flow",
        "id",
        "left",
        "payload",
        "control",
        "parked_at",
        "seg",
        "sender",
        "ser",
        "tail",
        "tail_src",
        "tree",
        "waiters",
    )

    def __init__(self, mid, flow, sender, seg, ser, left, tree, dests):
        self.id = mid
        self.flow = flow
        self.sender = sender
        self.seg = seg
        self.ser = ser
        self.left = left  # copies not yet delivered
        self.tree = tree
        self.dests = dests
        self.waiters = None  # cores in a marker sync waiting for this message
        self.parked_at = None
        self.tail_src = 0
        self.tail = None  # a streaming message: receiver -> when its tail reaches it
        self.control = False  # a routed flow's advance without data: no core receives it
        self.eof = False  # the sender's last message of the flow in its step
        self.payload = None  # numerics mode: what the message carries


class _Core:
    __slots__ = (
        "await_rs",
        "await_until",
        "await_want",
        "cd",
        "got",
        "cap",
        "cls",
        "draws",
        "credit",
        "eseg",
        "idx",
        "key",
        "inq",
        "marker_lat",
        "marker_wait",
        "oldest",
        "out_tail",
        "outstanding",
        "parked",
        "passing",
        "pc",
        "pos",
        "prog",
        "recv_cost",
        "recv_flow",
        "recv_stage",
        "recv_total",
        "rid",
        "rseg",
        "senders",
        "s_body",
        "s_head",
        "s_start",
        "s_tail",
        "speed",
        "stall",
        "state",
        "step",
        "sub_name",
        "sub_start",
        "t_block",
        "want",
    )

    def __init__(self, idx, rid, pos, cls, prog, speed, key):
        self.idx = idx
        self.key = key  # this core's random stream (counter_rng), draw 0 its speed
        self.draws = 1
        self.rid = rid
        self.pos = pos
        self.cls = cls
        self.prog = prog
        self.pc = 0
        self.step = 0
        self.rseg = 0
        self.eseg = 0
        self.speed = speed
        self.state = RUN
        self.t_block = 0
        self.inq: dict[int, list[_Msg]] = {}
        self.parked: dict[int, deque[_Msg]] = {}
        self.cap: dict[int, int] = {}
        self.outstanding: dict[int, _Msg] = {}
        self.out_tail = 0
        self.want: set[int] | None = None
        self.recv_flow = -1
        self.recv_stage = None
        self.recv_cost = 0.0
        self.recv_total = 0.0
        self.marker_wait = 0
        self.marker_lat = 0
        self.stall = [0, 0, 0, 0, 0, 0]  # recv, send, marker, drain, credit, route drain
        # (flow, router) -> arrival cycle of each install credit it sent this core, in order
        self.credit: dict[tuple[int, int], list[int]] = {}
        self.await_until = 0  # the latest arrival among the credits a wait has found
        self.await_rs: dict[int, tuple[int, ...]] = {}  # pc of an AwaitCredits -> routers awaited
        self.await_want: tuple[int, set[int]] | None = None  # (flow, routers) while W_CREDIT
        # messages crossing this router (multi-segment classes): [head, tail, message,
        # arrival checked]; see MeshSim._route and _switch
        self.passing: list[list] | None = None
        self.senders: dict[int, tuple[int, ...]] = {}
        self.sub_name = ""
        self.sub_start = 0
        self.cd = None  # per-core data (numerics mode)
        self.got: list = []  # messages gathered by the current recv
        # the streaming stage in progress (see the module docstring, "Streaming"):
        # when its output head may leave, when its input tail arrives, its body
        self.s_head = 0
        self.s_start = 0
        self.s_tail = 0
        self.s_body = 0


def _by_sender(m: _Msg) -> int:
    return m.sender


def _tail(m: _Msg, rid: int) -> int:
    """When streaming message m's tail reaches router `rid` (0: it came from the host)."""
    return m.tail.get(rid, 0) if m.tail else 0


class MeshSim:
    """One simulation of a coloured segment program on a target (see the module docstring)."""

    def __init__(self, program: sg.ProgramOp, target, *, seed: int = 0, safe: bool = True,
                 jitter: float | None = None, queue_depth: int = 2, out_queue: int | None = None,
                 max_cycles: int = 50_000_000, max_seconds: float | None = None,
                 trace: bool = False, stop_on_corruption: bool = True,
                 speed_scale: Callable[[tuple[int, int, int]], float] | None = None,
                 data=None, inflight: int = 1):
        self.program = program
        # numerics mode: a meshrt.runtime.dataplane.DataPlane moves tensors in the messages
        self.data = data
        # micro-batches in flight: the host primes the loop-carried flows this many times
        self.inflight = max(1, inflight)
        # extra per-core slowdown on top of the seeded factor, by (wafer, x, y):
        # how placement studies model slower regions
        self.speed_scale = speed_scale
        self.target = target
        self.seed = seed
        self.safe = safe
        self.jitter = target.speed_spread if jitter is None else jitter
        self.queue_depth = max(1, queue_depth)
        self.out_cap = max(1, out_queue if out_queue is not None else len(target.user_output_queues))
        self.max_cycles = max_cycles
        self.max_seconds = max_seconds
        self.trace = trace
        self.stop_on_corruption = stop_on_corruption
        self.W, self.H = program.mesh_size
        self.wafers = program.num_wafers
        self.costs = dict(target.costs)
        self.slots = program.rows
        self._build()

    # -- construction ----------------------------------------------------
    def _rid(self, w: int, x: int, y: int) -> int:
        return (w * self.H + y) * self.W + x

    def _build(self) -> None:
        prog = self.program
        flows = prog.flows()
        self.flow_names = [f.flow_name for f in flows]
        fidx = {n: i for i, n in enumerate(self.flow_names)}
        self.flow_ops = flows
        self.flow_streams = [f.is_streaming for f in flows]
        routes = {r.flow_name: r for r in prog.routes()}
        self.flow_color = [routes[n].color_id if n in routes else -1 for n in self.flow_names]
        self.flow_via = [RectSet.from_cores(routes[n].via) if n in routes else RectSet()
                         for n in self.flow_names]
        classes = prog.core_classes()
        self.class_names = [c.class_name for c in classes]
        # Routers are keyed by id (wafer, y, x) -> int; only routers that hold a
        # core or a route are stored, so a large mesh costs nothing extra.
        self.router_class: dict[int, int] = {}
        self.router_core: dict[int, _Core] = {}

        # the class tables (route handshakes in the safe build only)
        sched = flatten(prog, self.target, handshakes=self.safe)
        self.class_progs: list[tuple[Instr, ...]] = [cs.instrs for cs in sched.classes]
        prime = [cs.primed for cs in sched.classes]  # class -> flow -> host-primed recvs per step
        grants = [cs.grants for cs in sched.classes]
        drains = [{f for ins in cs.instrs if type(ins) is RouteDrain for f in ins.flows}
                  for cs in sched.classes]
        # per class and pc: whether the compute there has numerics (asked once, at build)
        self.numeric: list[tuple[bool, ...]] = [
            tuple(type(ins) is Compute and self.data is not None and self.data.computes(ins.kernel, ins.op)
                  for ins in cs.instrs) for cs in sched.classes]
        # ... and whether its cost follows the KV rows its queries reach (attention's loops)
        self.over_kv_rows: list[tuple[bool, ...]] = [
            tuple(num and registry.compute_op(ins.op).over_kv_rows for ins, num in zip(cs.instrs, nums))
            for cs, nums in zip(sched.classes, self.numeric)]

        # cores
        self.cores: list[_Core] = []
        spread = self.target.speed_spread
        for ci, c in enumerate(classes):
            w = c.wafer_index
            for x, y in c.cores.cores():
                rid = self._rid(w, x, y)
                key = counter_rng.stream_key(self.seed, rid)
                speed = 1.0 + spread * (2.0 * counter_rng.unit(key, 0) - 1.0)
                if self.speed_scale is not None:
                    speed *= self.speed_scale((w, x, y))
                core = _Core(len(self.cores), rid, (w, x, y), ci, self.class_progs[ci], speed, key)
                if self.data is not None:
                    core.cd = self.data.core_data((w, x, y))
                self.cores.append(core)
                self.router_class[rid] = ci
                self.router_core[rid] = core
                if len(c.segments()) > 1:
                    core.passing = []

        # per router, per segment: colour -> flow bound there
        self.bind: dict[int, list[dict[int, int]]] = {}
        idle_bind: dict[int, dict[int, int]] = {}
        for f, via in enumerate(self.flow_via):
            col = self.flow_color[f]
            w = self.flow_ops[f].wafer_index
            for x0, y0, x1, y1 in via:
                for y in range(y0, y1):
                    for x in range(x0, x1):
                        rid = self._rid(w, x, y)
                        if rid not in self.router_class:
                            idle_bind.setdefault(rid, {})[col] = f
        for rid, b in idle_bind.items():
            self.bind[rid] = [b]
        for ci, c in enumerate(classes):
            seg_routes = [[fidx[n] for n in seg.route_names()] for seg in c.segments()]
            for core in self.cores:
                if core.cls != ci:
                    continue
                w, x, y = core.pos
                per_seg = []
                for fl in seg_routes:
                    b = {}
                    for f in fl:
                        if self.flow_ops[f].wafer_index == w and self.flow_via[f].contains(x, y):
                            b[self.flow_color[f]] = f
                    per_seg.append(b)
                self.bind[core.rid] = per_seg

        # flow endpoints: per sender core its targets (and tree), per receiver its senders
        self.send_plan: dict[tuple[int, int], tuple[dict[int, tuple[int, ...]], frozenset[int], bool]] = {}
        senders_of: dict[tuple[int, int], list[int]] = defaultdict(list)
        # routed flows: the expert regions that send them, each sender's region, the draws
        self.routed: dict[int, tuple[RoutedSenders, int]] = {}
        self.routed_region: dict[tuple[int, int], int] = {}
        self.drawn: dict[tuple[int, int], frozenset[int]] = {}
        for f, fo in enumerate(flows):
            if fo.is_routed:
                rs = RoutedSenders.of(prog, fo)
                self.routed[f] = (rs, routing_key(self.seed, fo.kernel.root_reference.data))
                for sx, sy in fo.src.cores():
                    self.routed_region[(self._rid(fo.wafer_index, sx, sy), f)] = rs.region_at(sx, sy)
        for f, fo in enumerate(flows):
            w = fo.wafer_index
            dw = (w + 1) % self.wafers if fo.crosses_wafer else w  # the last wafer feeds the first
            pattern = fo.pattern.data
            dx, dy = fo.offset
            # receivers that hold a core, in order, and by row / column for line patterns
            receivers = [r for r in fo.dst.cores() if self._rid(dw, *r) in self.router_core]
            receiving = set(receivers)
            by_line: dict[int, list[tuple[int, int]]] = defaultdict(list)
            if pattern in ("row", "col"):
                for r in receivers:
                    by_line[r[1] if pattern == "row" else r[0]].append(r)
            for sx, sy in fo.src.cores():
                src_rid = self._rid(w, sx, sy)
                if src_rid not in self.router_core:
                    continue
                if pattern == "shift":
                    targets = [(sx + dx, sy + dy)]
                    targets = [t for t in targets if self._rid(dw, *t) in self.router_core]
                elif pattern in ("row", "col"):
                    targets = by_line.get(sy if pattern == "row" else sx, [])
                else:
                    targets = receivers
                if dw == w and (sx, sy) in receiving:
                    targets = [t for t in targets if t != (sx, sy)]
                dests = frozenset(self._rid(dw, *t) for t in targets)
                tree: dict[int, tuple[int, ...]] = {}
                if not fo.crosses_wafer:
                    rid = self._rid
                    tree = {rid(w, *a): tuple(rid(w, *b) for b in kids)
                            for a, kids in xy_tree((sx, sy), targets).items()}
                self.send_plan[(src_rid, f)] = (tree, dests, fo.crosses_wafer)
                for d in dests:
                    senders_of[(d, f)].append(src_rid)
        for (rid, f), ss in senders_of.items():
            core = self.router_core[rid]
            core.senders[f] = tuple(ss)
            core.cap[f] = self.queue_depth * len(ss)

        # route handshakes: who crosses which router, what each sender awaits
        self.crossers: dict[tuple[int, int], list[_Core]] = defaultdict(list)
        self.granted: dict[tuple[int, int], int] = defaultdict(int)
        self.eof_watch: dict[tuple[int, int], list[int]] = {}
        if self.safe:
            nodes_of: dict[tuple[int, int], set[int]] = {}
            for (src, f), (tree, _, _) in self.send_plan.items():
                nodes = set(tree)
                for kids in tree.values():
                    nodes.update(kids)
                nodes.discard(src)
                nodes_of[(src, f)] = nodes
                for r in nodes:
                    self.crossers[(r, f)].append(self.router_core[src])
            for core in self.cores:
                for pc, ins in enumerate(core.prog):
                    if type(ins) is AwaitCredits:
                        nodes = nodes_of.get((core.rid, ins.flow), ())
                        core.await_rs[pc] = tuple(sorted(
                            r for r in nodes if self.router_class.get(r) in ins.classes))
                for f in drains[core.cls]:
                    self.eof_watch[(core.rid, f)] = [0, 0]
                for f in grants[core.cls]:
                    self.granted[(core.rid, f)] = 1
                    for s in self.crossers.get((core.rid, f), ()):
                        s.credit.setdefault((f, core.rid), []).append(0)
        for core in self.cores:
            for f, n in prime[core.cls].items():
                for g in range(n * self.inflight):
                    for s in core.senders.get(f, ()):
                        m = _Msg(-1, f, s, 0, 0, 1, None, None)
                        if self.data is not None:
                            m.payload = self.data.host_prime(core.cd, self.flow_names[f], g)
                        core.inq.setdefault(f, []).append(m)
                core.cap[f] = max(core.cap.get(f, 0),
                                  max(self.queue_depth, n * self.inflight) * len(core.senders.get(f, ())))

    # -- running ---------------------------------------------------------
    def run(self, steps: int = 1, progress: Callable[[MeshSim], None] | None = None) -> SimResult:
        """Simulate `steps` decode steps (or until `stop` is set); `progress`
        is called every PROGRESS_EVENTS events with the simulator (its `now`,
        `step_end`), e.g. to draw a progress bar."""
        self.steps = steps
        heap: list = []
        self.heap = heap
        self.seq = 0
        self.now = 0
        self.reports: list[Report] = []
        self.stop = False
        self.done = 0
        self.msg_count = 0
        self.in_transit: dict[int, _Msg] = {}  # message id -> message on the fabric
        self.link_busy: dict[int, list[list[int]]] = {}  # link -> reserved [start, end), sorted
        self.walks: dict[tuple[int, int], tuple] = {}  # (sender router, flow) -> `_walk`
        self.link_used: dict[int, int] = defaultdict(int)
        self.wlink_busy: dict[int, int] = defaultdict(int)
        self.step_end: list[int] = []  # latest end of each decode step over all cores
        self.spans: list | None = [] if self.trace else None
        push = heapq.heappush
        for core in self.cores:
            push(heap, (0, self.seq, E_RESUME, core, None))
            self.seq += 1
        t0 = _time.perf_counter()
        ncores = len(self.cores)
        # The tables built so far live as long as the run: keep them out of the
        # cyclic collector's scans, and scan what the run allocates less often (its
        # messages and bookkeeping are freed by reference counting); the scans
        # otherwise cost a fifth of the run.
        gc.freeze()
        thresholds = gc.get_threshold()
        gc.set_threshold(max(thresholds[0], 100_000), *thresholds[1:])
        try:
            n_events = self._events(heap, ncores, t0, progress)
        finally:
            gc.set_threshold(*thresholds)
            gc.unfreeze()
        wall = _time.perf_counter() - t0
        if not self.stop:
            self._check_arrivals()
        # arrival checks at multi-segment routers run when the router next switches (or
        # now), so list the corruptions by the cycle they happened at
        self.reports.sort(key=lambda r: (0, r.cycle) if isinstance(r, CorruptionReport) else (1, 0))
        if not heap and self.done < ncores and not self.stop and not self.reports:
            self.reports.append(self._deadlock())
        completed = self.done == ncores and not self.reports
        end = self.now if not completed else max(self.step_end)
        step_cycles = []
        prev = 0
        for s in range(self._steps_done()):
            step_cycles.append(self.step_end[s] - prev)
            prev = self.step_end[s]
        used = [u for u in self.link_used.values() if u]
        span = max(end, 1)
        util = {
            "mean": min(1.0, sum(used) / len(used) / span) if used else 0.0,
            "max": min(1.0, max(used) / span) if used else 0.0,
            "links": float(len(used)),
        }
        return SimResult(
            completed=completed,
            cycles=end,
            steps=self._steps_done(),
            step_cycles=step_cycles,
            stalls={c.pos: dict(zip(STALL_NAMES, c.stall)) for c in self.cores},
            link_utilisation=util,
            events=n_events,
            wall_seconds=wall,
            reports=self.reports,
            messages=self.msg_count,
            seed=self.seed,
            safe=self.safe,
            spans=self.spans,
            cores=[(c.pos, self.class_names[c.cls]) for c in self.cores],
            clock_hz=self.target.clock_hz,
        )

    def _events(self, heap: list, ncores: int, t0: float, progress) -> int:
        """The event loop of `run`: how many events it took."""
        pop = heapq.heappop
        n_events = 0
        max_cycles, max_seconds = self.max_cycles, self.max_seconds
        advance = self._advance
        deliver = self._deliver
        while heap:
            t, _, kind, a, b = pop(heap)
            if t > max_cycles:
                self.now = max_cycles
                self.reports.append(TimeBoundReport(max_cycles, max_cycles, self._steps_done()))
                break
            self.now = t
            n_events += 1
            if kind == E_RESUME:
                advance(a, t)
            elif kind == E_DELIVER:
                deliver(a, b, t)
            else:  # E_MARKER_DONE
                a.pc += 1
                a.state = RUN
                advance(a, t)
            if self.stop or self.done == ncores:
                break
            if not n_events % PROGRESS_EVENTS:
                if progress is not None:
                    progress(self)
                if max_seconds is not None and _time.perf_counter() - t0 > max_seconds:
                    self.reports.append(TimeBoundReport(t, max_cycles, self._steps_done(),
                                                        max_seconds))
                    break
        return n_events

    def _steps_done(self) -> int:
        return min(c.step for c in self.cores) if self.cores else 0

    def _cost(self, core: _Core, base: float) -> int:
        u = counter_rng.unit(core.key, core.draws)
        core.draws += 1
        c = base * core.speed * (1.0 + self.jitter * u)
        return int(c) + 1 if c > 0 else 0

    def _at(self, t: int, kind: int, a, b=None) -> None:
        heapq.heappush(self.heap, (t, self.seq, kind, a, b))
        self.seq += 1

    def _span(self, core: _Core, name: str, start: int, end: int) -> None:
        self.spans.append((core.idx, core.cls, name, start, end))

    # -- cores -------------------------------------------------------------
    def _advance(self, core: _Core, t: int) -> None:
        prog = core.prog
        while True:
            ins = prog[core.pc]
            k = type(ins)
            if k is Compute:
                extra = 0
                base = ins.cycles
                if self.numeric[core.cls][core.pc]:
                    r = self._data(core, t, self.data.compute, ins.op)
                    if r is None:
                        return
                    extra = r if r is not True else 0  # host work (a static batch refill)
                    if self.over_kv_rows[core.cls][core.pc]:  # the context reached, not the capacity
                        share = self._data(core, t, self.data.reached, ins.op)
                        if share is None:
                            return
                        base *= share
                if ins.fused:  # on the passing wavelets: the stage's timing
                    if ins.forwards:  # the forwarding send finishes the stage
                        if self.spans is not None:
                            self._span(core, ins.op, t, t)
                        core.pc += 1
                        continue
                    c = max(t + core.s_body, core.s_tail) + core.s_head - t + extra
                else:
                    c = self._cost(core, base) + extra
                if self.spans is not None:
                    self._span(core, ins.op, t, t + c)
                core.pc += 1
                self._at(t + c, E_RESUME, core)
                return
            if k is MetaResolve or k is MetaProduce:
                c = self._cost(core, ins.cycles)
                if self.spans is not None:
                    self._span(core, ins.op, t, t + c)
                core.pc += 1
                self._at(t + c, E_RESUME, core)
                return
            if k is Recv:
                f = ins.flow
                want = set(core.senders.get(f, ()))
                if ins.routed:  # only the regions this step routed to send
                    regions = self._routed_regions(core, f)
                    if regions is None:
                        return
                    want = {s for s in want if self.routed_region[(s, f)] in regions}
                q = core.inq.get(f)
                got = 0
                tail = t
                if q and want:
                    i = 0
                    while i < len(q) and want:
                        m = q[i]
                        if m.sender in want:
                            want.discard(m.sender)
                            del q[i]
                            got += 1
                            tail = max(tail, _tail(m, core.rid))
                            if core.cd is not None:
                                core.got.append(m)
                            self._unpark(core, f, t)
                        else:
                            i += 1
                if not want:
                    if core.cd is not None and not self._received(core, f, t):
                        return
                    if ins.stage is not None:
                        self._stream_in(core, ins, t, tail)
                        return
                    c = self._cost(core, ins.cycles * (got if ins.routed else max(got, 1)))
                    if self.spans is not None:
                        self._span(core, "recv " + self.flow_names[f], t, t + c)
                    core.pc += 1
                    self._at(t + c, E_RESUME, core)
                    return
                core.want = want
                core.recv_flow = f
                core.recv_stage = ins if ins.stage is not None else None
                core.recv_cost = ins.cycles
                core.recv_total = ins.cycles * got
                core.state = W_RECV
                core.t_block = t
                return
            if k is Send:
                if len(core.outstanding) >= self.out_cap:
                    core.state = W_SEND
                    core.t_block = t
                    return
                f = ins.flow
                start = core.s_tail  # (a forward) its input's tail, then its own head
                if ins.forward and t < core.s_start + core.s_head:
                    self._at(core.s_start + core.s_head, E_RESUME, core)
                    return
                payload = None
                if core.cd is not None:
                    payload = self._data(core, t, self.data.send, self.flow_names[f], ins.meta)
                    if payload is None:
                        return
                if ins.forward:
                    tail_out = max(core.s_start + core.s_body, start) + core.s_head
                    self._inject(core, f, ins.nbytes, t, ins.last, payload, tail_out - t)
                    c = max(tail_out - t, 1)
                elif ins.routed and not self._routed_here(core, f):
                    if self.stop:
                        return
                    # no token chose this region: only its switch advance (and end of
                    # flow) passes the routers; no core receives anything
                    self._inject(core, f, WAVELET_BYTES, t, ins.last, None, control=True)
                    c = self._cost(core, self.costs["send_wavelet"])
                else:
                    self._inject(core, f, ins.nbytes, t, ins.last, payload)
                    c = self._cost(core, ins.cycles)
                if self.spans is not None:
                    self._span(core, "send " + self.flow_names[f], t, t + c)
                core.pc += 1
                self._at(t + c, E_RESUME, core)
                return
            if k is Sub:
                if core.cd is not None:
                    self.data.sub(core.cd, ins.kernel)
                c = self._cost(core, ins.cycles)
                if self.spans is not None:
                    if core.sub_name:
                        self._span(core, core.sub_name, core.sub_start, t)
                    core.sub_name = f"{ins.kernel} {ins.role}"
                    core.sub_start = t
                core.pc += 1
                self._at(t + c, E_RESUME, core)
                return
            if k is EnterSegment:
                core.eseg = ins.index
                core.pc += 1
                continue
            if k is MarkerSync:
                if not self.safe:
                    core.pc += 1
                    continue
                x0, y0, x1, y1 = ins.box
                x1 -= 1
                y1 -= 1
                touch = ins.touching
                _, x, y = core.pos
                lat = int(self.costs["marker_hop"] * (max(abs(x - x0), abs(x - x1))
                                                       + max(abs(y - y0), abs(y - y1)))) + 1
                n = 0
                for m in self.in_transit.values():
                    if m.flow in touch:
                        if m.waiters is None:
                            m.waiters = [core]
                        else:
                            m.waiters.append(core)
                        n += 1
                core.t_block = t
                core.marker_lat = lat
                if n == 0:
                    core.stall[2] += lat
                    if self.spans is not None:
                        self._span(core, "marker sync", t, t + lat)
                    core.state = W_MARKER
                    self._at(t + lat, E_MARKER_DONE, core)
                    return
                core.marker_wait = n
                core.state = W_MARKER
                return
            if k is Reconfigure:
                if self.safe:
                    if core.outstanding:
                        core.state = W_DRAIN
                        core.t_block = t
                        return
                elif core.out_tail > t:
                    core.stall[3] += core.out_tail - t
                    self._at(core.out_tail, E_RESUME, core)
                    return
                c = self._cost(core, ins.cycles)
                if self.spans is not None:
                    self._span(core, f"reconfigure {ins.src}->{ins.dst}", t, t + c)
                core.pc += 1
                self._at(t + c, E_RESUME, core)
                return
            if k is Switch:
                self._switch(core, ins.segment, t)
                if self.stop:
                    return
                core.pc += 1
                continue
            if k is AwaitCredits:
                # install credits of this step from every awaited router on the route
                f = ins.flow
                need = core.step + 1
                credit = core.credit
                want = set()
                until = t
                for r in core.await_rs[core.pc]:
                    got = credit.get((f, r))
                    if got is None or len(got) < need:
                        want.add(r)
                    elif got[need - 1] > until:
                        until = got[need - 1]
                core.t_block = t
                core.state = W_CREDIT
                if want:  # a Notify still to come sends it (see below)
                    core.await_want = (f, want)
                    core.await_until = until
                    return
                if until > t:  # sent, still on its way
                    self._wake(core, until, 4)
                    return
                core.state = RUN
                core.pc += 1
                continue
            if k is Notify:
                lat = self.target.hop_latency_cycles
                _, x, y = core.pos
                for f in ins.flows:
                    key = (core.rid, f)
                    self.granted[key] += 1
                    for s in self.crossers.get(key, ()):
                        # a control message: its arrival is known now, so it is no event
                        d = abs(s.pos[1] - x) + abs(s.pos[2] - y)
                        self._credit(s, f, core.rid, t + lat * d + 1, t)
                core.pc += 1
                continue
            if k is RouteDrain:
                # every credited step's last message of each flow has passed this router
                tail = t
                for f in ins.flows:
                    key = (core.rid, f)
                    w = self.eof_watch[key]
                    if w[0] < self.granted.get(key, 0) * len(self.crossers.get(key, ())):
                        core.state = W_RDRAIN
                        core.t_block = t
                        core.await_want = (f, set())
                        return
                    tail = max(tail, w[1])
                if tail > t:
                    core.stall[5] += tail - t
                    self._at(tail, E_RESUME, core)
                    return
                core.pc += 1
                continue
            # EndStep
            if core.cd is not None:
                self.data.end_step(core.cd)
            if core.step == len(self.step_end):
                self.step_end.append(t)
            elif t > self.step_end[core.step]:
                self.step_end[core.step] = t
            core.step += 1
            if core.step >= self.steps:
                if self.spans is not None and core.sub_name:
                    self._span(core, core.sub_name, core.sub_start, t)
                core.state = DONE
                self.done += 1
                return
            core.pc = 0

    def _wake(self, core: _Core, t: int, slot: int) -> None:
        core.stall[slot] += t - core.t_block
        core.state = RUN
        self._at(t, E_RESUME, core)

    # -- network -------------------------------------------------------------
    def _inject(self, core: _Core, f: int, nbytes: int, t: int, eof: bool = False,
                payload=None, ser_min: int = 0, control: bool = False) -> None:
        plan = self.send_plan.get((core.rid, f))
        self.msg_count += 1
        if plan is None or not plan[1]:
            return  # nobody to send to
        tree, dests, cross = plan
        tg = self.target
        if cross:
            ser = -(-nbytes // tg.wafer_link_bytes_per_cycle)
        else:
            ser = max(-(-nbytes // tg.link_bytes_per_cycle), ser_min)
        m = _Msg(self.msg_count, f, core.rid, core.eseg, ser, len(dests), tree, dests)
        m.eof = eof
        m.payload = payload
        if control:
            m.control = True
        self.in_transit[m.id] = m
        core.outstanding[m.id] = m
        m.tail_src = t + ser
        core.out_tail = max(core.out_tail, m.tail_src)
        if cross:
            w = core.pos[0]
            start = max(t, self.wlink_busy[w])
            self.wlink_busy[w] = start + ser
            arrive = start + ser + tg.wafer_link_latency_cycles
            for d in sorted(dests):
                self._at(arrive, E_DELIVER, m, d)
        else:
            self._route(m, core.rid, t)

    def _check(self, m: _Msg, rid: int, t: int, when: str) -> bool:
        binds = self.bind.get(rid)
        f = m.flow
        col = self.flow_color[f]
        if binds is None:
            bound = None
            seg = None
        else:
            core = self.router_core.get(rid)
            seg = core.rseg if core is not None else 0
            bound = binds[seg].get(col)
            if bound == f:
                return True
        sender = self.router_core[m.sender]
        core = self.router_core.get(rid)
        w = rid // (self.W * self.H)
        rr = rid % (self.W * self.H)
        self.reports.append(CorruptionReport(
            cycle=t, message=m.id, flow=self.flow_names[f], color=col,
            router=(w, rr % self.W, rr // self.W),
            router_class=self.class_names[core.cls] if core is not None else None,
            router_segment=seg if core is not None else None,
            sender=sender.pos, sender_class=self.class_names[sender.cls], sender_segment=m.seg,
            bound_to=self.flow_names[bound] if bound is not None else None, when=when))
        if not self.stop_on_corruption:
            return True  # diagnostic mode: record, and let the message pass as if routed
        self.stop = True
        return False

    def _route(self, m: _Msg, src: int, t: int) -> None:
        """The message's way through the mesh, in closed form at injection.

        Walking its tree from the sender: the head reaches a router at h, takes
        each outgoing link at the first start >= h where the link is free for
        the serialisation time (the link is reserved then, for that interval),
        and reaches the next router `hop_latency_cycles` later. Only the
        deliveries become events. A router whose binding never changes (an idle
        router, or a core of a one-segment class) binds the flow or not once
        and for all (`_walk`: only one that does not is checked, at the head's
        arrival cycle); a router of a multi-segment class records the message
        in its `passing` list and `_switch` checks it against the segment the
        router is in when the head arrives.
        """
        key = (src, m.flow)
        walk = self.walks.get(key)
        if walk is None:
            walk = self.walks[key] = self._walk(src, m.flow, m.tree, m.dests)
        ser = m.ser
        streams = self.flow_streams[m.flow]
        lat = self.target.hop_latency_cycles
        busy, used, now = self.link_busy, self.link_used, self.now
        heads = [0] * len(walk)
        for i, (rid, parent, link, dest, core, check) in enumerate(walk):
            if parent < 0:
                h = t
            else:
                ph = heads[parent]
                if ph < 0:  # beyond a router that stopped it
                    heads[i] = -1
                    continue
                booked = busy.get(link)
                if booked is None or booked[-1][1] <= now:
                    busy[link] = [[ph, ph + ser]]
                    start = ph
                else:
                    if booked[0][1] <= now:  # drop what ended (every later start is >= now)
                        k = 1
                        while booked[k][1] <= now:
                            k += 1
                        del booked[:k]
                    if booked[-1][1] <= ph:
                        booked.append([ph, ph + ser])
                        start = ph
                    else:
                        start = self._reserve(booked, ph, ser)
                used[link] += ser
                h = start + lat
            heads[i] = h
            if core is not None:
                core.passing.append([h, h + ser, m, False])
                if m.eof and rid != src:
                    w = self.eof_watch.get((rid, m.flow))
                    if w is not None:
                        w[0] += 1
                        w[1] = max(w[1], h + ser)
                        if core.state == W_RDRAIN:  # it waits until that tail has passed
                            core.await_want = None
                            self._wake(core, t, 5)
            elif check and not self._check(m, rid, h, "arrival"):
                heads[i] = -1
                continue
            if dest:
                if streams:  # a stream is received from its head on
                    if m.tail is None:
                        m.tail = {}
                    m.tail[rid] = h + ser
                    self._at(h, E_DELIVER, m, rid)
                else:
                    self._at(h + ser, E_DELIVER, m, rid)

    def _walk(self, src: int, f: int, tree: dict[int, tuple[int, ...]], dests: frozenset[int]):
        """A send plan's tree in walking order (every router after the one before it):
        (router, index of the router before it or -1, link into it, a destination?,
        its core if it belongs to a multi-segment class, must its binding be checked?)."""
        col, W = self.flow_color[f], self.W
        out: list[tuple] = []
        todo = [(src, -1, -1)]
        while todo:
            rid, parent, link = todo.pop()
            core = self.router_core.get(rid)
            multi = core if core is not None and core.passing is not None else None
            binds = self.bind.get(rid)
            check = multi is None and (binds is None or binds[0].get(col) != f)
            here = len(out)
            out.append((rid, parent, link, rid in dests, multi, check))
            for nxt in reversed(tree.get(rid, ())):
                d = nxt - rid
                todo.append((nxt, here, rid * 4 + (0 if d == 1 else 1 if d == -1 else 2 if d == W else 3)))
        return tuple(out)

    @staticmethod
    def _reserve(booked: list[list[int]], t: int, ser: int) -> int:
        """Reserve a link for `ser` cycles from the first start >= t where it is free
        between its reservations `booked` (sorted, disjoint); returns that start."""
        if ser <= 0:
            return t
        start = t
        at = len(booked)
        for k, (a, b) in enumerate(booked):
            if start + ser <= a:
                at = k
                break
            if b > start:
                start = b
        booked.insert(at, [start, start + ser])
        return start

    def _check_arrivals(self, core: _Core | None = None, upto: int | None = None) -> None:
        """Arrival checks of the messages whose heads reached a multi-segment
        class's router by `upto` (default: now), in the segment it is in; of
        `core`'s router only, or of every router (the end of a run)."""
        upto = self.now if upto is None else upto
        for c in (core,) if core is not None else self.cores:
            if c.passing is None:
                continue
            for e in c.passing:
                if not e[3] and e[0] <= upto:
                    e[3] = True
                    if not self._check(e[2], c.rid, e[0], "arrival"):
                        return

    def _deliver(self, m: _Msg, rid: int, t: int) -> None:
        if m.control:  # a routed flow's advance without data: no core receives it
            self._delivered(m, t)
            return
        core = self.router_core[rid]
        f = m.flow
        if core.state == W_RECV and core.recv_flow == f and m.sender in core.want:
            self._consume(core, m, t)
            self._delivered(m, t)
            return
        q = core.inq.setdefault(f, [])
        if len(q) < core.cap.get(f, self.queue_depth):
            q.append(m)
            self._delivered(m, t)
            return
        m.parked_at = rid
        core.parked.setdefault(f, deque()).append(m)

    def _consume(self, core: _Core, m: _Msg, t: int) -> None:
        core.want.discard(m.sender)
        core.recv_total += core.recv_cost
        if core.cd is not None:
            core.got.append(m)
        if not core.want:
            if core.cd is not None and not self._received(core, core.recv_flow, t):
                return
            if core.recv_stage is not None:
                core.stall[0] += t - core.t_block
                ins = core.recv_stage
                core.want = None
                core.recv_flow = -1
                core.recv_stage = None
                core.state = RUN
                self._stream_in(core, ins, t, _tail(m, core.rid), waited=core.t_block)
                return
            c_last = self._cost(core, core.recv_cost)
            end = max(t + c_last, core.t_block + self._cost(core, core.recv_total))
            core.stall[0] += t - core.t_block
            if self.spans is not None:
                self._span(core, "wait " + self.flow_names[core.recv_flow], core.t_block, t)
            core.want = None
            core.recv_flow = -1
            core.state = RUN
            core.pc += 1
            self._at(end, E_RESUME, core)

    def _stream_in(self, core: _Core, ins: Recv, t: int, tail: int, waited: int | None = None) -> None:
        """A streaming recv starts at t (the input's head is here); its tail arrives at `tail`.

        The stage's latency and body (wavelets x cycles per wavelet) are drawn
        once; a fused compute or a forwarding send finishes the stage, else the
        recv does: when the last wavelet is in and through the stage.
        """
        lat, rate = ins.stage
        core.s_start = t
        core.s_tail = tail
        core.s_head = self._cost(core, lat)
        core.s_body = self._cost(core, ins.wavelets * rate)
        end = t if ins.fused else max(t + core.s_body, tail) + core.s_head
        if self.spans is not None:  # a recv that blocked shows as its wait, as any recv's does
            name = ("recv " if waited is None else "wait ") + self.flow_names[ins.flow]
            self._span(core, name, t if waited is None else waited, end)
        core.pc += 1
        self._at(end, E_RESUME, core)

    # -- routed flows (meshrt.kernels.expert_reduce.routed) -----------------
    def _routed_regions(self, core: _Core, f: int) -> frozenset[int] | None:
        """The expert regions that send data on routed flow f in the core's current step
        (senders and receivers ask alike): by the routing the core resolved and the
        placement its step runs with (numerics; live recalibration may move experts),
        else by the step's draw. None (and the run stops) where numerics have no routing."""
        rs, key = self.routed[f]
        shared = range(rs.routed_regions, len(rs.regions))
        if core.cd is not None:
            route = core.cd.route
            if route is None:
                self.reports.append(DataReport(self.now, core.pos, self.class_names[core.cls],
                                               f"@{self.flow_names[f]}: no routing resolved"))
                self.stop = True
                return None
            placement = self.data.placement(rs.layer, core.cd.step, rs.placement)
            # (ids past the routed experts are the shared ones, already in)
            return frozenset(placement[e] for e in map(int, route.ids.ravel())
                             if e < rs.experts).union(shared)
        got = self.drawn.get((f, core.step))
        if got is None:
            got = self.drawn[(f, core.step)] = frozenset(
                rs.placement[e] for slot in range(self.slots)
                for e in draw(key, core.step, slot, rs.experts, rs.top_k)).union(shared)
        return got

    def _routed_here(self, core: _Core, f: int) -> bool:
        """Whether the core's expert region sends data on routed flow f this step."""
        regions = self._routed_regions(core, f)
        return regions is not None and self.routed_region[(core.rid, f)] in regions

    # -- numerics ----------------------------------------------------------
    def _data(self, core: _Core, t: int, hook, *args):
        """Run a data-plane hook; a layout error becomes a report and stops the run."""
        try:
            r = hook(core.cd, *args)
        except DataLayoutError as e:
            self.reports.append(DataReport(t, core.pos, self.class_names[core.cls], str(e)))
            self.stop = True
            return None
        return True if r is None else r

    def _received(self, core: _Core, f: int, t: int) -> bool:
        # senders in a fixed order, so gathers merge the same way on every seed
        got = core.got
        if len(got) > 1:
            got.sort(key=_by_sender)
        core.got = []
        return self._data(core, t, self.data.recv, self.flow_names[f], [m.payload for m in got]) is not None

    def _unpark(self, core: _Core, f: int, t: int) -> None:
        pk = core.parked.get(f)
        if pk:
            m = pk.popleft()
            m.parked_at = None
            core.inq[f].append(m)
            self._delivered(m, t)

    def _delivered(self, m: _Msg, t: int) -> None:
        m.left -= 1
        if m.left:
            return
        del self.in_transit[m.id]
        sender = self.router_core[m.sender]
        del sender.outstanding[m.id]
        if sender.state == W_SEND:
            self._wake(sender, t, 1)
        elif sender.state == W_DRAIN and not sender.outstanding:
            self._wake(sender, t, 3)
        if m.waiters:
            for c in m.waiters:
                c.marker_wait -= 1
                if c.marker_wait == 0 and c.state == W_MARKER:
                    c.stall[2] += t + c.marker_lat - c.t_block
                    if self.spans is not None:
                        self._span(c, "marker sync", c.t_block, t + c.marker_lat)
                    self._at(t + c.marker_lat, E_MARKER_DONE, c)

    def _credit(self, core: _Core, f: int, rid: int, arrive: int, t: int) -> None:
        """Router `rid` sends `core` an install credit of flow `f` at `t`, arriving at
        `arrive`; a wait that now has all its credits resumes when the last arrives."""
        got = core.credit.setdefault((f, rid), [])
        got.append(arrive)
        if core.state == W_CREDIT and core.await_want is not None:
            wf, want = core.await_want
            if wf == f and rid in want and len(got) >= core.step + 1:
                want.discard(rid)
                core.await_until = max(core.await_until, got[core.step])
                if not want:
                    core.await_want = None
                    self._wake(core, max(core.await_until, t), 4)

    def _switch(self, core: _Core, seg: int, t: int) -> None:
        if core.passing is not None:
            self._check_arrivals(core, t)  # heads that arrived in the segment it leaves
            if self.stop:
                return
        core.rseg = seg
        if core.passing is None:
            return
        # keep what still passes (tail not yet past) and heads still to come
        live = [e for e in core.passing if not e[3] or (e[1] > t and e[2].left)]
        core.passing = live
        for e in live:
            if e[3] and not self._check(e[2], core.rid, t, "reconfigure"):
                return
        for pk in core.parked.values():
            for m in pk:
                # a cross-wafer message arrived by the wafer link, on no colour of this mesh
                if self.flow_color[m.flow] >= 0 and not self._check(m, core.rid, t, "reconfigure"):
                    return

    # -- deadlock ------------------------------------------------------------
    def _deadlock(self) -> DeadlockReport:
        waits: list[WaitEdge] = []
        pos = lambda rid: self.router_core[rid].pos
        for c in self.cores:
            if c.state == DONE:
                continue
            cname = self.class_names[c.cls]
            if c.state == W_RECV:
                fl = self.flow_names[c.recv_flow]
                on = tuple(sorted(pos(s) for s in c.want))
                waits.append(WaitEdge(c.pos, cname, "recv", fl, on,
                                      f"recv @{fl} from {', '.join(str(p[1:]) for p in on)}"))
            elif c.state in (W_SEND, W_DRAIN):
                blocked = sorted({pos(m.parked_at) for m in c.outstanding.values()
                                  if m.parked_at is not None})
                fl = self.flow_names[next(iter(c.outstanding.values())).flow] if c.outstanding else None
                what = "send" if c.state == W_SEND else "drain"
                waits.append(WaitEdge(c.pos, cname, what, fl, tuple(blocked),
                                      f"{len(c.outstanding)} own message(s) undelivered "
                                      f"(parked at {', '.join(str(p[1:]) for p in blocked) or '-'})"))
            elif c.state == W_MARKER:
                ms = [m for m in self.in_transit.values() if m.waiters and c in m.waiters]
                on = tuple(sorted({pos(m.parked_at) for m in ms if m.parked_at is not None}))
                waits.append(WaitEdge(c.pos, cname, "marker", None, on,
                                      f"marker sync waits for {c.marker_wait} message(s) "
                                      f"({', '.join('@' + self.flow_names[m.flow] for m in ms[:4])})"))
            elif c.state == W_CREDIT:
                f, want = c.await_want
                fl = self.flow_names[f]
                on = tuple(sorted(pos(r) for r in want))
                waits.append(WaitEdge(c.pos, cname, "credit", fl, on,
                                      f"install credit of @{fl} for step {c.step} from "
                                      f"{', '.join(str(p[1:]) for p in on)}"))
            elif c.state == W_RDRAIN:
                f = c.await_want[0]
                fl = self.flow_names[f]
                key = (c.rid, f)
                seen = self.eof_watch[key][0]
                need = self.granted.get(key, 0) * len(self.crossers.get(key, ()))
                on = tuple(sorted(s.pos for s in self.crossers.get(key, ())))
                waits.append(WaitEdge(c.pos, cname, "route-drain", fl, on,
                                      f"release of @{fl}: {seen} of {need} end-of-flow message(s) "
                                      f"passed, senders {', '.join(str(p[1:]) for p in on)}"))
            else:
                waits.append(WaitEdge(c.pos, cname, STATE_NAMES[c.state], None, (), "?"))
        return DeadlockReport(self.now, tuple(waits))


def simulate(program: sg.ProgramOp, target, *, steps: int = 2, **kw) -> SimResult:
    """Run `steps` decode steps of `program` on `target` (a Target or its name)."""
    if isinstance(target, str):
        from meshrt.targets import load_target

        target = load_target(target)
    return MeshSim(program, target, **kw).run(steps)
