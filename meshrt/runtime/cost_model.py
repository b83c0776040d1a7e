"""Class-level cost model of coloured segment IR: cycles per decode step without simulating cores.

Why
---
The interpreter (`meshrt.runtime.mesh_sim`) runs every core, so it is only
practical on the test targets; a model on full WSE-3 has ~900k cores. The
IR is per core *class*, and so is this model: it reads the same coloured
segment IR and the same target file as the interpreter, runs each class's
table (`meshrt.runtime.schedule.flatten`, the one the interpreter's cores
run, with its base costs) once, and composes the classes into
the critical path of a decode step, the time of every pipeline stage and the
pipeline bottleneck. Work grows with classes x events x steps, never with
cores, so a whole-wafer model costs seconds. `test/unit/test_cost_model.py`
keeps it calibrated: on the examples it must agree with the interpreter's
measured cycles per step within 10 %.

What it computes
----------------
A deterministic discrete-event run at class level. Each class is one virtual
core standing for the *latest* of its cores: its clock after an event is the
time the last of its cores finishes that event. Costs (the interpreter's,
see its module docstring; the base costs come with the schedule):

- compute `work N` of op o: N * cost[o]; metainfo resolve / produce:
  `meta_*_slot` * micro-batch slots; `task_switch` per sub; send / recv:
  `send_wavelet` / `recv_wavelet` per 32-bit wavelet of data + metainfo, a
  recv paying once per message it gathers (one per sender core that targets
  a core of the class, counted from the flow's pattern and core sets).
- the expected value of the interpreter's `ceil(base * speed * jitter)`,
  i.e. base * (1 + jitter / 2) + 1/2: speed factors average out along the
  path.
- a message sent at t reaches a receiver class at t + hops * hop_latency +
  serialisation (bytes / link bytes per cycle) x the flow's messages that
  share its busiest link (`link_load`: a multicast of many senders queues
  on the links into the receivers), hops being the largest Manhattan
  distance between the sender class's and the receiver class's cores the
  pattern connects; across wafers, the shared wafer link
  serialises every sender core's message (latency + bytes / wafer link
  bytes per cycle each). A recv ends at max(block + n * recv, last arrival
  + one recv), as the interpreter's streaming gather does.
- streaming flows (`streams`): a sender's message is ready when its tail
  leaves (a first sender: after its send cost; a forward: when its stage
  ends), and reaches a receiver hops x hop latency later; a streaming recv
  ends at max(block + wavelets x rate, tail arrival) + the stage latency
  (`meshrt.kernels.reduce_tree.stream_stage`), and the fused op and the
  forwarding send cost nothing more, as in the interpreter. A class that
  forwards a streaming shift is timed as the whole chain of every class
  forwarding it (other kernels' roles may cut one chain into classes that
  take turns along it): from its first senders, one hop and one stage per
  further core.
- chains inside a class (a reduction's mid rows, a relay corridor: a shift
  flow the class both receives and sends) are run length L: the last core
  finishes (L - 1) * (work between its recv and its send + hop +
  serialisation + recv) after the first, in closed form.
- marker syncs wait for the messages in flight over their region, then
  `marker_hop` * the class's furthest distance to the region's corners;
  reconfigurations wait for the class's own messages, then cost
  `reconfigure` + `reconfigure_route` per route entry; route handshakes
  (install credits, route drains) wait as compiled; a send waits while the
  class has `out_queue` messages undelivered.
- loop-carried flows (sampler -> embed): the first `in_flight` steps'
  messages come from the host at cycle 0, as the interpreter primes one.

With `in_flight=1` the steady-state cycles per step are the decode step's
latency around the loop, which is what the interpreter measures (it primes
one micro-batch). With `in_flight=stages` every stage holds one micro-batch,
as the mapper sizes KV for, and the steady-state cycles per step are the
pipeline's initiation interval: system throughput is micro-batch / that.

What it leaves out (why it is a model): link contention between different
flows (a recv's own gather cost usually hides it), queue backpressure
(input queues are unbounded here: it changes transients, not steady
states), the per-core speed spread (averaged) and the data itself.

Stages and the critical path: stage boundaries are the sends of handoff
kernels (`event.kernel` of kind `handoff`) and of the loop-carried tokens;
a stage's time is the time between its boundaries in one step, so the
stages add up to the step. The critical path of a step is traced back from
its loop-carried send to the previous step's through the dependency that
bound each event, and is attributed to categories (compute, metainfo,
send/recv, network, task switches, reconfiguration, markers, handshakes)
and to kernels; both add up to the step.

`kernel_scale` re-times a program with some kernels doing k times their
local work (how `meshrt bench` models experts evaluated one after another
instead of in parallel); the test checks it against the interpreter's
per-core slowdown hook.
"""

from __future__ import annotations

import heapq
import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from meshrt.dialects import segment as sg
from meshrt.kernels import registry
from meshrt.kernels.expert_reduce.routed import RoutedSenders
from meshrt.kernels.interface import WAVELET_BYTES, KernelOp, wavelets
from meshrt.routing import Box, RectSet, boxes_intersect, line_count, pattern_routers
from meshrt.runtime.schedule import (
    AwaitCredits,
    ClassSchedule,
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
    extent,
    flatten,
)
from meshrt.shape import in_flight

CATEGORIES = ("compute", "metainfo", "send_recv", "network", "task_switch", "reconfigure",
              "marker", "handshake")
"""What the critical path of a step is spent on."""

_LOCAL = (Sub, Compute, MetaResolve, MetaProduce)
"""Instructions of local work: what a chain core does between its recv and its send."""


class CostModelError(Exception):
    """The class-level run cannot make progress: the IR deadlocks even at class level."""


def kernels_where(program: sg.ProgramOp, test: Callable[[type[KernelOp]], bool]) -> set[str]:
    """Names of the program's kernels whose kind passes `test` (from its `event.kernel` records)."""
    return {k.kernel_name for k in program.kernels() if test(registry.kind(k.kind.data))}


def kernels_of_kind(program: sg.ProgramOp, kind: str) -> set[str]:
    """Names of the program's kernels of kind `kind`."""
    return kernels_where(program, lambda op: op.kernel_kind() == kind)


# ---------------------------------------------------------------------------
# Geometry of class-level flows (boxes, never cores)
# ---------------------------------------------------------------------------


def _span(a0: int, a1: int, b0: int, b1: int) -> int:
    """Largest |a - b| for a in [a0, a1), b in [b0, b1)."""
    return max(abs(a0 - (b1 - 1)), abs((a1 - 1) - b0))


def _overlap(a0: int, a1: int, b0: int, b1: int) -> bool:
    return a0 < b1 and b0 < a1


def max_hops(senders: RectSet, receivers: RectSet, pattern: str, offset: tuple[int, int]) -> int:
    """Largest number of hops between a sender and a receiver the pattern connects."""
    if pattern == "shift":
        return abs(offset[0]) + abs(offset[1])
    best = 0
    for s in senders:
        for r in receivers:
            if pattern == "row":
                if _overlap(s[1], s[3], r[1], r[3]):
                    best = max(best, _span(s[0], s[2], r[0], r[2]))
            elif pattern == "col":
                if _overlap(s[0], s[2], r[0], r[2]):
                    best = max(best, _span(s[1], s[3], r[1], r[3]))
            else:
                best = max(best, _span(s[0], s[2], r[0], r[2]) + _span(s[1], s[3], r[1], r[3]))
    return best


def messages_per_core(senders: RectSet, receivers: RectSet, pattern: str) -> int:
    """Messages the busiest receiving core gathers per recv from `senders`.

    shift: one; row / col: the sender cores in its row / column; all: every
    sender core. A core never sends to itself, which spares one message only
    where every receiver is also a sender.
    """
    if pattern == "shift":
        return 1
    n = senders.count if pattern == "all" else line_count(senders, receivers, pattern == "row")
    return max(1, n - 1) if senders.covers(receivers) else max(1, n)


def link_load(senders: RectSet, receivers: RectSet, pattern: str) -> int:
    """Messages of one send round that cross the busiest link (XY routes, multicast trees).

    `all`: a sender's copy runs along its row to every receiver column, then
    along each receiver column, so a column link above (below) the lowest
    (highest) receiver carries one copy per sender in the rows above (below)
    it, and a row link one per sender of its row. `row` / `col`: the senders
    of one row / column share it. `shift`: every route is its own.
    """
    if pattern == "shift":
        return 1

    def width(b: Box) -> int:
        return b[2] - b[0]

    def height(b: Box) -> int:
        return b[3] - b[1]

    if pattern in ("row", "col"):
        return max(1, line_count(senders, receivers, pattern == "row"))
    load = max(1, max((width(s) for s in senders), default=1))
    for r in receivers:
        above = sum(width(s) * max(0, min(s[3], r[3] - 1) - s[1]) for s in senders)
        below = sum(width(s) * max(0, s[3] - max(s[1], r[1] + 1)) for s in senders)
        load = max(load, above, below)
    return load


def run_length(cores: RectSet, dx: int, dy: int) -> int:
    """Longest run of cores in `cores` stepping by (dx, dy) along one axis.

    A unit step chains the cores of a box; a longer one (the leads of a
    two-level reduction, S apart) chains boxes one core long along the axis.
    """
    if dx and dy or not (dx or dy):
        return 1
    axis = 1 if dx == 0 else 0  # the coordinate the run advances along
    stride = abs(dy if axis else dx)
    forward = (dy if axis else dx) > 0
    boxes = sorted(cores, key=lambda b: b[axis] if forward else -b[axis + 2])
    run: dict[Box, int] = {}
    for b in boxes:
        length = b[axis + 2] - b[axis] if stride == 1 else 1
        prev = [p for p in run
                if (p[axis + 2] - 1 + stride == b[axis] if forward else p[axis] == b[axis + 2] - 1 + stride)
                and _overlap(p[1 - axis], p[3 - axis], b[1 - axis], b[3 - axis])]
        run[b] = length + max((run[p] for p in prev), default=0)
    return max(run.values(), default=1)


def _shifted(rs: RectSet, dx: int, dy: int) -> RectSet:
    return RectSet((b[0] + dx, b[1] + dy, b[2] + dx, b[3] + dy) for b in rs)


def _bands(rs: RectSet, pattern: str) -> RectSet:
    """The whole rows (row) or columns (col) `rs` occupies, for matching senders."""
    big = 1 << 30
    if pattern == "row":
        return RectSet((-big, b[1], big, b[3]) for b in rs)
    return RectSet((b[0], -big, b[2], big) for b in rs)


# ---------------------------------------------------------------------------
# Class tables
# ---------------------------------------------------------------------------


@dataclass
class _Peer:
    """One sender class of a flow as a receiver class sees it."""

    cls: int
    latency: float  # hops * hop latency + serialisation (mesh flows)
    messages: int  # messages a receiving core gathers from this class per recv


@dataclass
class _Recv:
    flow: int
    c1: float  # expected cost of receiving one message
    peers: list[_Peer]
    messages: int  # messages gathered per recv, chain included
    primed: int  # host-primed recvs per step (loop-carried flows)
    chain: int = 1  # run length of the class's own chain of this flow
    chain_step: float = 0.0  # cycles each further chain core adds
    chain_parts: dict[str, float] = field(default_factory=dict)
    # a streaming recv: expected stage latency and body (wavelets x cycles per
    # wavelet); `fused`: a fused compute / forward finishes the stage
    stream: tuple[float, float] | None = None
    fused: bool = False


@dataclass
class _Class:
    """A class's schedule as the cost model runs it (segment entries and router
    switches are not timed at class level) with the expected cycles of each
    instruction's own work (a marker sync: its flush latency) and the recvs' specs."""

    name: str
    wafer: int
    cores: RectSet
    instrs: list[Instr] = field(default_factory=list)
    cycles: list[float] = field(default_factory=list)
    recvs: dict[int, _Recv] = field(default_factory=dict)  # index of a Recv -> its spec


@dataclass(frozen=True)
class StageTime:
    """One pipeline stage's share of a decode step (one micro-batch in flight)."""

    index: int
    first_kernel: str
    last_kernel: str
    cycles: float


@dataclass
class StepEstimate:
    """Steady-state timing of a program with `in_flight` micro-batches circulating."""

    in_flight: int
    cycles_per_step: float
    step_cycles: list[float]
    stages: list[StageTime] = field(default_factory=list)
    critical_path: dict[str, float] = field(default_factory=dict)  # category -> cycles
    kernel_path: dict[str, float] = field(default_factory=dict)  # kernel -> cycles on the path
    wall_seconds: float = 0.0


class CostModel:
    """Class-level timing of one coloured segment program on one target."""

    def __init__(self, program: sg.ProgramOp, target, *, jitter: float | None = None,
                 out_queue: int | None = None, kernel_scale: dict[str, float] | None = None):
        """`kernel_scale` multiplies the local costs (compute, metainfo, send / recv,
        task switch) of some kernels' subs: what-if studies of a kernel doing k
        times its work, e.g. experts evaluated one after another on one block."""
        self.program = program
        self.target = target
        self.kernel_scale = dict(kernel_scale or {})
        self.costs = dict(target.costs)
        self.slots = program.rows
        self.wafers = program.num_wafers
        self.stages = program.num_stages
        j = target.speed_spread if jitter is None else jitter
        self.factor = 1.0 + j / 2.0  # mean of the interpreter's per-event jitter
        self.out_cap = max(1, out_queue if out_queue is not None else len(target.user_output_queues))
        self._build()

    # -- costs -----------------------------------------------------------
    def expected(self, base: float) -> float:
        """Expected cycles of an event of base cost `base` (see the module docstring)."""
        return base * self.factor + 0.5 if base > 0 else 0.0

    # -- construction ----------------------------------------------------
    def _build(self) -> None:
        from meshrt.analysis.liveness import step_order, tables_of_program

        prog = self.program
        flows = prog.flows()
        self.flow_ops = flows
        pos = step_order(tables_of_program(prog))
        self.kernel_pos = pos
        self.handoff_kernels = kernels_where(prog, lambda op: op.STAGE_BOUNDARY)
        sched = flatten(prog, self.target, pos=pos)
        self.flow_names = list(sched.flows)
        self.classes = [_Class(c.name, c.wafer, c.cores) for c in sched.classes]
        senders: dict[int, list[int]] = defaultdict(list)
        for c in sched.classes:
            for ins in c.instrs:
                if type(ins) is Send and c.index not in senders[ins.flow]:
                    senders[ins.flow].append(c.index)
        self.senders = senders
        self.receivers: dict[int, set[int]] = defaultdict(set)  # flow -> classes receiving it
        for c in sched.classes:
            for ins in c.instrs:
                if type(ins) is Recv:
                    self.receivers[ins.flow].add(c.index)
        self.src = [RectSet.from_cores(f.src) for f in flows]
        self.dst = [RectSet.from_cores(f.dst) for f in flows]
        self.loads: dict[tuple[int, int], int] = {}
        self.routed_senders: dict[int, RoutedSenders] = {}  # routed flow -> its expert regions
        self.routed_share: dict[tuple[int, RectSet], float] = {}  # (flow, senders) -> send share
        self.stream_chains: dict[int, tuple[int, list[_Peer]]] = {}
        self.sending: dict[int, list[tuple[int, RectSet, Box]]] = {}
        self.peers: dict[tuple[int, int, int], list[_Peer]] = {}
        self.hops: dict[tuple[int, int], int] = {}
        self.crossers: dict[tuple[int, int], list[int]] = {}  # (class, flow) -> senders crossing it
        self.sends_per_step: dict[tuple[int, int], int] = {}
        self.grants: dict[tuple[int, int], int] = {}
        self.loop_flows: set[int] = set()
        self.marker_flows: set[int] = set()  # flows whose messages some marker sync waits for
        for c in sched.classes:
            self._build_table(c)
        # latest delivery of a class's message of a flow, over its receivers (markers, drains)
        self.lat_max = {(s, f): max((p.latency for _, p in self._peers_of(f, sender=s)), default=0.0)
                        for f, ss in senders.items() for s in ss}

    def _build_table(self, c: ClassSchedule) -> None:
        """Cost class c's schedule: expected cycles, marker latencies, recv specs."""
        ci = c.index
        cl = self.classes[ci]
        for f in c.grants:
            self.grants[(ci, f)] = 1
        sends_after: dict[int, list[int]] = defaultdict(list)  # flow -> indices of sends
        recvs: list[int] = []  # indices of recvs
        k = 1.0  # the current sub's kernel scale
        scale: dict[int, float] = {}  # index of a Recv -> its sub's kernel scale
        for ins in c.instrs:
            kind = type(ins)
            if kind is EnterSegment or kind is Switch:
                continue
            if (kind is Send or kind is Recv) and ins.routed:
                ins = self._expected_routed(ins, cl.cores if kind is Send else None)
            at = len(cl.instrs)
            cycles = 0.0
            if kind is Sub:
                k = self.kernel_scale.get(ins.kernel, 1.0)
                cycles = self.expected(k * ins.cycles)
            elif kind is Compute and ins.fused:
                cycles = 0.0  # the stage's latency is charged by its recv (see _recv)
            elif kind in _LOCAL:
                cycles = self.expected(k * ins.cycles)
            elif kind is Send:
                sends_after[ins.flow].append(at)
                cycles = self.expected(k * ins.cycles)
            elif kind is Recv:
                if ins.primed:
                    self.loop_flows.add(ins.flow)
                recvs.append(at)
                scale[at] = k
                cycles = self.expected(k * ins.cycles)
            elif kind is MarkerSync:
                self.marker_flows.update(ins.touching)
                cycles = int(self.costs["marker_hop"] * self._corner_distance(cl.cores, ins.box)) + 1
            elif kind is Reconfigure:
                cycles = self.expected(ins.cycles)
            cl.instrs.append(ins)
            cl.cycles.append(cycles)
        # recvs: resolve peers, chains and per-message costs now that the table is known
        for at in recvs:
            ins = cl.instrs[at]
            f = ins.flow
            cl.recvs[at] = spec = self._recv_spec(ci, f, cl.cycles[at], c.primed.get(f, 0), at, sends_after)
            if ins.stage is not None:
                lat, rate = ins.stage
                k = scale[at]
                spec.stream = (self.expected(k * lat), self.expected(k * ins.wavelets * rate))
                spec.fused = ins.fused
                if "network" in spec.chain_parts:  # each further core: its hops and one stage
                    net = spec.chain_parts["network"]
                    spec.chain_step = net + spec.stream[0]
                    spec.chain_parts = {"network": net, "compute": spec.stream[0]}

    def _expected_routed(self, ins, senders: RectSet | None):
        """A send or recv of a routed flow as expected (see
        `meshrt.kernels.expert_reduce.routed`): the share of its senders (`senders`,
        default all of the flow's) that a step routes to send their message, the
        others only a switch advance (one wavelet, which no core receives)."""
        f = ins.flow
        src = self.src[f] if senders is None else self.src[f] & senders
        key = (f, src)
        share = self.routed_share.get(key)
        if share is None:
            rs = self.routed_senders.get(f)
            if rs is None:
                rs = self.routed_senders[f] = RoutedSenders.of(self.program, self.flow_ops[f])
            share = self.routed_share[key] = rs.send_share(src, self.slots)
        if type(ins) is Send:
            return replace(ins, nbytes=round(WAVELET_BYTES + share * (ins.nbytes - WAVELET_BYTES)),
                           cycles=self.costs["send_wavelet"] * (1 + share * (wavelets(ins.nbytes) - 1)))
        return replace(ins, nbytes=max(1, round(share * ins.nbytes)), cycles=share * ins.cycles)

    def _corner_distance(self, cores: RectSet, box: Box) -> int:
        """Largest distance from a core of the class to the furthest corner of the box."""
        x0, y0, x1, y1 = box
        cx0, cy0, cx1, cy1 = extent(cores)
        return _span(cx0, cx1, x0, x1) + _span(cy0, cy1, y0, y1)

    def _peers_of(self, f: int, receiver: int | None = None, sender: int | None = None,
                  nbytes: int | None = None):
        """(receiver class, _Peer) pairs of flow f, optionally for one receiver or sender;
        `nbytes`: the message's size, where it is not the flow's (kernels whose chains
        share a flow send messages of their own sizes on it)."""
        fo = self.flow_ops[f]
        pattern = fo.pattern.data
        off = fo.offset
        tg = self.target
        cross = fo.crosses_wafer
        dw = (fo.wafer_index + 1) % self.wafers if cross else fo.wafer_index
        receivers = [receiver] if receiver is not None else [
            i for i, c in enumerate(self.classes) if c.wafer == dw and c.cores.intersects(self.dst[f])]
        for r in receivers:
            rc = self.classes[r]
            rcores = rc.cores & self.dst[f]
            if not rcores:
                continue
            if pattern == "shift":
                need = _shifted(rcores, -off[0], -off[1])
            elif pattern in ("row", "col"):
                need = _bands(rcores, pattern)
            else:
                need = None
            sending = self._sending(f)
            if need is not None and need:  # only sender classes whose extent meets `need`'s
                nb = extent(need)
                sending = [(s, c) for s, c, b in sending if boxes_intersect(b, nb)]
            else:
                sending = [(s, c) for s, c, _ in sending]
            for s, scores in sending:
                if sender is not None and s != sender:
                    continue
                if need is not None:
                    scores = scores & need
                if not scores:
                    continue
                n = messages_per_core(scores, rcores, pattern)
                if cross:
                    lat = float(tg.wafer_link_latency_cycles)  # plus the shared link, at the send
                elif fo.is_streaming:  # the sender's clock is its tail leaving (see _send)
                    lat = float(max_hops(scores, rcores, pattern, off) * tg.hop_latency_cycles)
                else:
                    hops = max_hops(scores, rcores, pattern, off)
                    ser = math.ceil((nbytes or self._msg_bytes(f)) / tg.link_bytes_per_cycle)
                    lat = float(hops * tg.hop_latency_cycles + ser * self._load(f, r))
                yield r, _Peer(s, lat, n)

    def class_hops(self, a: int, b: int) -> int:
        """Most hops between a core of class a and one of class b (credits travel them)."""
        d = self.hops.get((a, b))
        if d is None:
            d = self.hops[(a, b)] = max_hops(self.classes[a].cores, self.classes[b].cores, "all", (0, 0))
        return d

    def _sending(self, f: int) -> list[tuple[int, RectSet, Box]]:
        """Flow f's sender classes on its wafer: (class, its cores that send f, their extent)."""
        got = self.sending.get(f)
        if got is None:
            w = self.flow_ops[f].wafer_index
            got = self.sending[f] = []
            for s in self.senders.get(f, ()):
                if self.classes[s].wafer == w:
                    cores = self.classes[s].cores & self.src[f]
                    if cores:
                        got.append((s, cores, extent(cores)))
        return got

    def _load(self, f: int, r: int) -> int:
        """Busiest-link load of flow f into receiver class r, over all its sender classes."""
        key = (f, r)
        if key not in self.loads:
            fo = self.flow_ops[f]
            src = RectSet(b for s in self.senders.get(f, ())
                          for b in self.classes[s].cores & self.src[f])
            self.loads[key] = link_load(src, self.classes[r].cores & self.dst[f], fo.pattern.data)
        return self.loads[key]

    def _msg_bytes(self, f: int) -> int:
        return int(self.flow_ops[f].bytes.value.data)

    def _recv_spec(self, ci: int, f: int, c1: float, primed: int, at: int, sends_after) -> _Recv:
        cl = self.classes[ci]
        key = (ci, f, cl.instrs[at].nbytes)
        peers = self.peers.get(key)
        if peers is None:  # a class receives one flow at many points: its peers once
            peers = self.peers[key] = [p for _, p in self._peers_of(f, receiver=ci, nbytes=key[2])]
        spec = _Recv(f, c1, [], 0, primed)
        later = [i for i in sends_after.get(f, ()) if i > at]
        fo = self.flow_ops[f]
        if later and fo.is_streaming and fo.pattern.data == "shift":
            return self._stream_chain(ci, f, spec, at, later)
        for p in peers:
            if p.cls == ci and later and fo.pattern.data == "shift":
                # a chain through the class's own cores: closed form
                dx, dy = fo.offset
                spec.chain = max(1, run_length(cl.cores & self.dst[f], dx, dy))
                work = sum(cl.cycles[i] for i in range(at + 1, later[0]) if type(cl.instrs[i]) in _LOCAL)
                net = p.latency
                spec.chain_step = work + net + c1
                spec.chain_parts = {"compute": work, "network": net, "send_recv": c1}
                spec.messages += 1
            else:
                spec.peers.append(p)
                spec.messages += p.messages
        return spec

    def _stream_chain(self, ci: int, f: int, spec: _Recv, at: int, later: list[int]) -> _Recv:
        """A class forwarding streaming flow f: one closed-form chain over every forwarding class.

        Other kernels' roles may cut one chain into several classes that take
        turns along it; at class level each would wait for the next. So every
        forwarder of f times the whole chain: the stream from its first
        senders (classes that send f without receiving it) through the
        longest run of forwarding cores, one hop and one stage per core (the
        stage's latency is added in `__init__` once it is known).
        """
        if f not in self.stream_chains:  # the same for every forwarder of f: once per flow
            fwd = {s for s in self.senders.get(f, ()) if s in self.receivers[f]}
            cores = RectSet(b for s in fwd for b in self.classes[s].cores & self.dst[f])
            dx, dy = self.flow_ops[f].offset
            heads: dict[int, _Peer] = {}
            for r in sorted(fwd):
                for _, p in self._peers_of(f, receiver=r):
                    if p.cls not in fwd:
                        heads.setdefault(p.cls, p)
            self.stream_chains[f] = (max(1, run_length(cores, dx, dy)), list(heads.values()))
        spec.chain, heads = self.stream_chains[f]
        spec.peers.extend(heads)
        spec.messages += sum(p.messages for p in heads)
        dx, dy = self.flow_ops[f].offset
        net = float(max_hops(RectSet(), RectSet(), "shift", (dx, dy)) * self.target.hop_latency_cycles)
        spec.chain_step = net
        spec.chain_parts = {"network": net}
        return spec

    # -- running -----------------------------------------------------------
    def run(self, steps: int, in_flight: int = 1, record: bool = False) -> _Run:
        return _Run(self, steps, in_flight, record).go()

    def estimate(self, in_flight: int = 1, steps: int | None = None, warmup: int | None = None
                 ) -> StepEstimate:
        """Steady-state cycles per step with `in_flight` micro-batches circulating."""
        import time

        t0 = time.perf_counter()
        warmup = warmup if warmup is not None else in_flight + 2
        steps = steps if steps is not None else warmup + max(in_flight, 3)
        run = self.run(steps, in_flight, record=in_flight == 1)
        ends = run.step_end
        measured = [ends[s] - ends[s - 1] for s in range(warmup, steps)]
        est = StepEstimate(in_flight, sum(measured) / len(measured),
                           [ends[0]] + [ends[s] - ends[s - 1] for s in range(1, steps)])
        if in_flight == 1:
            last = steps - 1
            est.stages = run.stage_times(last)
            est.critical_path, est.kernel_path = run.critical_path(last)
        est.wall_seconds = time.perf_counter() - t0
        return est


class _Run:
    """One class-level discrete-event run (see the module docstring)."""

    def __init__(self, model: CostModel, steps: int, in_flight: int, record: bool):
        self.m = model
        self.steps = steps
        self.in_flight = in_flight
        self.record = record
        n = len(model.classes)
        self.t = [0.0] * n
        self.pc = [0] * n
        self.step = [0] * n
        self.sent: dict[tuple[int, int], list[tuple[float, float, int]]] = defaultdict(list)
        self.recvd: dict[tuple[int, int], int] = defaultdict(int)
        self.credits: dict[tuple[int, int], list[float]] = {
            k: [0.0] * v for k, v in model.grants.items()}
        self.outstanding: list[list[float]] = [[] for _ in range(n)]
        self.own_last = [0.0] * n  # latest arrival of the class's own messages
        self.inflight: dict[int, list[tuple[float, float]]] = defaultdict(list)  # flow -> (sent, arrival)
        self.wlink = defaultdict(float)
        self.waiters: dict[tuple, list[int]] = defaultdict(list)
        self.step_end = [0.0] * steps
        # (step, start, end, category, dependency, kernel) of every event, when recording
        self.records: list[list[tuple]] = [[] for _ in range(n)]
        self.cur: list[tuple[str, str]] = [("", "")] * n  # the (kernel, role) each class is in
        self.loop_send: dict[int, tuple[float, int, int]] = {}  # step -> (time, class, record)
        self.handoffs: dict[int, dict[str, float]] = {}  # step -> handoff kernel -> last send

    # -- helpers -------------------------------------------------------------
    def _rec(self, c: int, start: float, end: float, cat: str, jump=None) -> int:
        if not self.record:
            return -1
        r = self.records[c]
        r.append((self.step[c], start, end, cat, jump, self.cur[c][0]))
        return len(r) - 1

    def go(self) -> _Run:
        m = self.m
        heap = self.heap = [(0.0, i) for i in range(len(m.classes))]
        heapq.heapify(heap)
        blocked = set()
        done = 0
        while heap:
            _, c = heapq.heappop(heap)
            blocked.discard(c)
            nxt = self._advance(c)
            if nxt is None:  # blocked: woken by a send or a credit
                blocked.add(c)
            elif nxt < 0:
                done += 1
            else:
                heapq.heappush(heap, (nxt, c))
        if done < len(m.classes):
            names = ", ".join(m.classes[c].name for c in sorted(blocked)[:5])
            raise CostModelError(f"class-level run stalls with {len(blocked)} class(es) blocked: {names}")
        return self

    def _wake(self, key: tuple, t: float) -> None:
        for c in self.waiters.pop(key, ()):
            heapq.heappush(self.heap, (max(t, self.t[c]), c))

    def _advance(self, c: int) -> float | None:
        """Run class c's next instruction; its next time, None if blocked, -1 when done."""
        m = self.m
        cl = m.classes[c]
        pc = self.pc[c]
        ins = cl.instrs[pc]
        k = type(ins)
        t = self.t[c]
        end: float | None
        if k is Sub:
            end = t + cl.cycles[pc]
            self.cur[c] = (ins.kernel, ins.role)
            self._rec(c, t, end, "task_switch")
        elif k is Compute:
            end = t + cl.cycles[pc]
            self._rec(c, t, end, "compute")
        elif k is MetaResolve or k is MetaProduce:
            end = t + cl.cycles[pc]
            self._rec(c, t, end, "metainfo")
        elif k is Send:
            end = self._send(c, ins.flow, ins.nbytes, cl.cycles[pc], t)
        elif k is Recv:
            end = self._recv(c, cl.recvs[pc], t)
        elif k is AwaitCredits:
            end = self._await(c, ins.flow, ins.classes, t)
        elif k is MarkerSync:
            end = self._marker(c, ins.touching, cl.cycles[pc], t)
        elif k is RouteDrain:
            end = self._rdrain(c, ins.flows, t)
        elif k is Reconfigure:
            start = max(t, self.own_last[c])
            end = start + cl.cycles[pc]
            if start > t:
                self._rec(c, t, start, "reconfigure")
            self._rec(c, start, end, "reconfigure")
        elif k is Notify:
            for f in ins.flows:
                self.credits.setdefault((c, f), []).append(t)
                self._wake(("credit", c, f), t)
            end = t
        else:  # EndStep
            s = self.step[c]
            self.step_end[s] = max(self.step_end[s], t)
            self.step[c] = s + 1
            self.pc[c] = 0
            return -1 if s + 1 >= self.steps else t
        if end is None:
            return None
        self.pc[c] += 1
        self.t[c] = end
        return end

    # -- sends and recvs -------------------------------------------------------
    def _send(self, c: int, f: int, nb: int, cost: float, t: float) -> float:
        m = self.m
        out = self.outstanding[c] = [a for a in self.outstanding[c] if a > t]
        if len(out) >= m.out_cap:  # out queue full: wait for the oldest delivery
            t2 = sorted(out)[len(out) - m.out_cap]
            self._rec(c, t, t2, "send_recv")
            t = t2
        fo = m.flow_ops[f]
        if fo.is_streaming:
            # the sender's clock when its tail leaves: a forward's stage ended with its
            # recv; a stream's first sender pushes it at its send rate
            if m.classes[c].instrs[self.pc[c]].forward:
                cost = 0.0
            ready = t + cost
        elif fo.crosses_wafer:
            tg = m.target
            n = (m.classes[c].cores & m.src[f]).count
            start = max(t, self.wlink[fo.wafer_index])
            self.wlink[fo.wafer_index] = start + n * math.ceil(nb / tg.wafer_link_bytes_per_cycle)
            ready = self.wlink[fo.wafer_index]  # the last sender core's message is on the link
        else:
            ready = t
        arrival = ready + m.lat_max.get((c, f), 0.0)
        rec = self._rec(c, t, t + cost, "send_recv")
        if self.record:
            self._boundary(c, f, t, rec)
        self.sent[(c, f)].append((t, ready, rec))
        self.outstanding[c].append(arrival)
        self.own_last[c] = max(self.own_last[c], arrival)
        if f in m.marker_flows:
            self.inflight[f].append((t, arrival))
        self._wake(("msg", c, f), t)
        return t + cost

    def _message(self, s: int, f: int, index: int):
        """(send start, ready, record) of sender s's message `index` of flow f, or None."""
        lst = self.sent.get((s, f))
        if lst is None or index >= len(lst):
            return None
        return lst[index]

    def _recv(self, c: int, spec: _Recv, t: float) -> float | None:
        f = spec.flow
        g = self.recvd[(c, f)]
        index = g - spec.primed * self.in_flight
        last, jump = 0.0, None
        if index >= 0:
            for p in spec.peers:
                msg = self._message(p.cls, f, index)
                if msg is None:
                    self.waiters[("msg", p.cls, f)].append(c)
                    return None
                arrival = msg[1] + p.latency
                if arrival >= last:
                    last, jump = arrival, (p.cls, msg[2], arrival - msg[0])
        self.recvd[(c, f)] = g + 1
        if spec.stream is not None:
            # the tail is in once the core consumed every wavelet; the stage's
            # latency follows (charged here for a fused compute / forward too)
            lat, body = spec.stream
            own = t + body
            first = max(own, last)
            end = first + (spec.chain - 1) * spec.chain_step + lat
            if self.record:
                bound = jump if last > own else None
                extra = {k: v * (spec.chain - 1) for k, v in spec.chain_parts.items()}
                extra["compute"] = extra.get("compute", 0.0) + lat
                self._rec(c, t, end, "send_recv", (bound, 0.0 if bound else body, extra))
            return end
        own = t + spec.messages * spec.c1
        first = max(own, last + spec.c1)
        end = first + (spec.chain - 1) * spec.chain_step
        if self.record:
            bound = jump if last + spec.c1 > own else None
            extra = {k: v * (spec.chain - 1) for k, v in spec.chain_parts.items()}
            self._rec(c, t, end, "send_recv", (bound, spec.c1 if bound else spec.messages * spec.c1, extra))
        return end

    # -- handshakes, markers ---------------------------------------------------
    def _await(self, c: int, f: int, spec: tuple[int, ...], t: float) -> float | None:
        m = self.m
        need = self.step[c]
        ready = t
        for tcls in spec:
            cr = self.credits.get((tcls, f), [])
            if len(cr) <= need:
                self.waiters[("credit", tcls, f)].append(c)
                return None
            granted = (tcls, f) in m.grants and need < m.grants[(tcls, f)]
            d = 0 if granted else m.class_hops(c, tcls)
            ready = max(ready, cr[need] + (0 if granted else d * m.target.hop_latency_cycles + 1))
        if ready > t:
            self._rec(c, t, ready, "handshake")
        return ready

    def _rdrain(self, c: int, flows: tuple[int, ...], t: float) -> float | None:
        """Wait until the last message of each drained flow of the credited step has passed."""
        m = self.m
        ready = t
        for f in flows:
            credited = len(self.credits.get((c, f), ()))
            if credited == 0:
                continue
            for s in self._crossers(c, f):
                per_step = self._sends_per_step(s, f)
                if per_step == 0:
                    continue
                index = credited * per_step - 1
                msg = self._message(s, f, index)
                if msg is None:
                    self.waiters[("msg", s, f)].append(c)
                    return None
                ready = max(ready, msg[1] + m.lat_max.get((s, f), 0.0))
        if ready > t:
            self._rec(c, t, ready, "handshake")
        return ready

    def _crossers(self, c: int, f: int) -> list[int]:
        """Sender classes of f whose routes cross class c's routers."""
        m = self.m
        key = (c, f)
        if key not in m.crossers:
            fo = m.flow_ops[f]
            out = []
            for s in m.senders.get(f, ()):
                if fo.crosses_wafer or m.classes[s].wafer != m.classes[c].wafer:
                    continue
                src = m.classes[s].cores & m.src[f]
                if not src:
                    continue
                routers = pattern_routers(fo.pattern.data, src.to_coreset(), fo.dst, fo.offset)
                if s == c or (routers - src).intersects(m.classes[c].cores):
                    out.append(s)
            m.crossers[key] = out
        return m.crossers[key]

    def _sends_per_step(self, s: int, f: int) -> int:
        m = self.m
        key = (s, f)
        if key not in m.sends_per_step:
            m.sends_per_step[key] = sum(1 for x in m.classes[s].instrs if type(x) is Send and x.flow == f)
        return m.sends_per_step[key]

    def _marker(self, c: int, touching: frozenset[int], lat: float, t: float) -> float:
        last = t
        for f in touching:
            live = self.inflight.get(f)
            if not live:
                continue
            live[:] = [(s, a) for s, a in live if a > t]
            for s, a in live:
                if s <= t:
                    last = max(last, a)
        end = last + lat
        self._rec(c, t, end, "marker")
        return end

    # -- stages and the critical path ----------------------------------------
    def _boundary(self, c: int, f: int, t: float, rec: int) -> None:
        """Note a stage-boundary send: a handoff's egress, or the loop-carried tokens."""
        kernel = self.cur[c][0]
        s = self.step[c]
        if f in self.m.loop_flows:
            if t >= self.loop_send.get(s, (-1.0,))[0]:
                self.loop_send[s] = (t, c, rec)
        elif kernel in self.m.handoff_kernels:
            h = self.handoffs.setdefault(s, {})
            h[kernel] = max(h.get(kernel, t), t)

    def stage_times(self, step: int) -> list[StageTime]:
        """Per-stage cycles of `step`, between boundary sends (they add up to the step)."""
        m = self.m
        handoffs = sorted((t, k) for k, t in self.handoffs.get(step, {}).items())
        edges = ([self.loop_send[step - 1][0]] + [t for t, _ in handoffs]
                 + [self.loop_send[step][0]])
        order = sorted(m.kernel_pos, key=m.kernel_pos.get)
        cuts = [m.kernel_pos[k] for _, k in handoffs]
        out = []
        for i in range(len(edges) - 1):
            lo = cuts[i - 1] + 1 if i > 0 else 0
            hi = cuts[i] if i < len(cuts) else len(order) - 1
            ks = order[lo:hi + 1] or [order[min(lo, len(order) - 1)]]
            out.append(StageTime(i, ks[0], ks[-1], edges[i + 1] - edges[i]))
        return out

    def critical_path(self, step: int) -> tuple[dict[str, float], dict[str, float]]:
        """(cycles per category, cycles per kernel) of the path that sets `step`'s period.

        Walks back from the loop-carried send of `step` through the
        dependency that bound each event, to that send of the step before.
        """
        cats = dict.fromkeys(CATEGORIES, 0.0)
        kernels: dict[str, float] = defaultdict(float)
        _, cls, idx = self.loop_send[step]
        idx -= 1
        while idx >= 0:
            s, start, end, cat, jump, kernel = self.records[cls][idx]
            if s < step:
                break
            if cat == "send_recv" and jump is not None:
                bound, own, extra = jump
                cats["send_recv"] += own
                kernels[kernel] += own + sum(extra.values())
                for k, v in extra.items():
                    cats[k] += v
                if bound is not None:
                    src, rec, net = bound
                    cats["network"] += net
                    kernels[kernel] += net
                    if self.records[src][rec][0] < step:
                        break
                    cls, idx = src, rec - 1
                    continue
            else:
                cats[cat] += end - start
                kernels[kernel] += end - start
            idx -= 1
        return cats, dict(kernels)


# ---------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------


@dataclass
class CostEstimate:
    """What `meshrt bench` needs of one compiled program."""

    model: str
    target: str
    micro_batch: int
    stages: int
    wafers: int
    dynamism: tuple[str, ...]
    clock_hz: float
    latency: StepEstimate  # one micro-batch in flight: the decode step
    pipelined: StepEstimate  # `in_flight` micro-batches in flight: the initiation interval

    @property
    def in_flight(self) -> int:
        return self.pipelined.in_flight

    @property
    def tpot_cycles(self) -> float:
        """Cycles between two tokens of one request with `in_flight` micro-batches circulating."""
        return max(self.latency.cycles_per_step, self.in_flight * self.pipelined.cycles_per_step)

    @property
    def bottleneck_stage(self) -> StageTime | None:
        return max(self.latency.stages, key=lambda s: s.cycles, default=None)

    def user_tokens_per_s(self) -> float:
        return self.clock_hz / self.tpot_cycles

    def system_tokens_per_s(self) -> float:
        return self.micro_batch * self.clock_hz / self.pipelined.cycles_per_step


def default_in_flight(program: sg.ProgramOp) -> int:
    """Micro-batches circulating in steady state: one per stage when the program pipelines.

    The mapper sizes every attention's KV for micro-batch x stages request
    slots only with `micro_batch_pipeline`; without it one batch is in flight.
    """
    return in_flight(program.num_stages, program.dynamism_kinds)


def estimate(program: sg.ProgramOp, target, *, in_flight: int | None = None) -> CostEstimate:
    """Cost-model timing of `program` on `target` (a Target or its name)."""
    if isinstance(target, str):
        from meshrt.targets import load_target

        target = load_target(target)
    model = CostModel(program, target)
    latency = model.estimate(1)
    n = default_in_flight(program) if in_flight is None else in_flight
    pipelined = latency if n == 1 else model.estimate(n)
    return CostEstimate(program.program_name, target.name, program.micro_batch_size,
                        program.num_stages, program.num_wafers, program.dynamism_kinds,
                        target.clock_hz, latency, pipelined)


def measured_cycles_per_step(program: sg.ProgramOp, target, *, seeds: Sequence[int] = (0, 1, 2),
                             steps: int = 4, warmup: int = 1) -> float:
    """The interpreter's mean cycles per decode step after warm-up, over seeds."""
    from meshrt.runtime.mesh_sim import simulate

    vals = []
    for seed in seeds:
        res = simulate(program, target, steps=steps, seed=seed)
        if not res.completed:
            raise CostModelError(f"the interpreter did not complete seed {seed}: "
                                 + (str(res.reports[0]).splitlines()[0] if res.reports else "?"))
        vals.extend(res.step_cycles[warmup:])
    return sum(vals) / len(vals)
