"""What each core class executes in one decode step: segment IR flattened into typed instructions.

A core class's `segment.core_class` holds segments of subs of events, and
boundaries (marker sync, reconfigure) between segments. Both timing engines
run the same flat table per class, one pass per decode step: the
interpreter (`meshrt.runtime.mesh_sim`, every core of the class runs it) and
the cost model (`meshrt.runtime.cost_model`, one virtual core per class).
`flatten` builds those tables once, with the facts both need derived here:

- base cycles of the local work, by the target's cost table (what the
  interpreter's `ceil(base * speed * jitter)` and the cost model's expected
  value start from): compute `work N` of op o costs N * cost[o]
  (`op_cycles`: cost[o] is the target's cost of the key o's kernel kind
  declares, `meshrt.kernels`, or the op's own price formula over several
  keys and the kernel's parameters), metainfo resolve /
  produce `meta_*_slot` * micro-batch slots, a sub `task_switch`, send /
  recv `send_wavelet` / `recv_wavelet` per 32-bit wavelet of data +
  metainfo, a reconfigure `reconfigure` + `reconfigure_route` per released
  and installed route;
- flows by index (`Schedule.flows`), classes by index (`Schedule.classes`);
- streaming stages (`event.flow ... streams`): a recv of a streaming flow,
  the reduce op right after it (fused: it runs on the passing wavelets) and a
  streaming send right after that (a forward) form one stage, timed by
  `meshrt.kernels.reduce_tree.stream_stage`;
- the last send of each flow in the step (end of flow, what route drains
  count), the receives the host primes (loop-carried flows), the flows a
  class is granted at program start;
- per marker sync its region, the region's bounding box and the flows whose
  routes touch it.

A class's table, in order: per segment `EnterSegment`, then per sub `Sub`
followed by the sub's events (`Compute`, `MetaResolve`, `MetaProduce`,
`Send` with an `AwaitCredits` before the segment's first send of a flow it
must await, `Recv`); then the segment's boundary, if any: `MarkerSync`
(compiled in the safe build), `RouteDrain`, `Reconfigure`, `Switch`,
`Notify`; and last `EndStep`, after which the table loops. With
`handshakes=False` (the interpreter's unsafe ablation) the route handshakes
(`AwaitCredits`, `RouteDrain`, `Notify`, grants) are left out.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import ClassVar

from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.analysis.liveness import host_primed
from meshrt.kernels import registry
from meshrt.kernels.interface import WAVELET_BYTES, wavelets  # noqa: F401 (re-exported)
from meshrt.kernels.reduce_tree import stream_stage
from meshrt.routing import Box, RectSet



# ---------------------------------------------------------------------------
# Instructions
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EnterSegment:
    """The class starts segment `index` (its messages are sent in it)."""

    index: int


@dataclass(frozen=True, slots=True)
class Sub:
    """A sub-schedule of `kernel` in `role` starts: one task switch."""

    kernel: str
    role: str
    cycles: float  # task_switch


@dataclass(frozen=True, slots=True)
class Compute:
    """`event.compute`: `work` elements of op `op`, local work of `kernel`."""

    kernel: str
    op: str
    work: int
    cycles: float  # op_cycles(op, work)
    # fused into the streaming recv before it (see `Recv.stage`): the op runs on
    # the wavelets as they pass; `forwards`: a streaming send forwards its result
    fused: bool = False
    forwards: bool = False


@dataclass(frozen=True, slots=True)
class _Metainfo:
    flow: int
    kind: str  # the metainfo's kind (`event.meta_*` kind)
    cycles: float  # meta_*_slot * slots


@dataclass(frozen=True, slots=True)
class MetaResolve(_Metainfo):
    """`event.meta_resolve`: parse the metainfo that came with `flow`."""

    op: ClassVar[str] = "meta_resolve"


@dataclass(frozen=True, slots=True)
class MetaProduce(_Metainfo):
    """`event.meta_produce`: build the metainfo that rides the next send on `flow`."""

    op: ClassVar[str] = "meta_produce"


@dataclass(frozen=True, slots=True)
class Send:
    """`event.send`: one message of `nbytes` (data + `meta` bytes of metainfo) on `flow`."""

    flow: int
    nbytes: int
    meta: int
    cycles: float  # send_wavelet per wavelet
    last: bool  # the class's last send of the flow in the step (end of flow)
    forward: bool = False  # forwards the stream the sub just received (see `Recv.stage`)
    routed: bool = False  # sent only in steps routed to the sender's experts (see event.flow)


@dataclass(frozen=True, slots=True)
class Recv:
    """`event.recv`: one message of `nbytes` from each sender that targets the core."""

    flow: int
    nbytes: int
    cycles: float  # recv_wavelet per wavelet, per message gathered
    primed: bool  # the host sends the first step's messages (a loop-carried flow)
    # A streaming flow's recv: (latency, cycles per wavelet) of its stage
    # (`meshrt.kernels.reduce_tree.stream_stage`, with the reduce op that follows
    # it, if any) and the message's wavelets. `fused`: a compute and/or a
    # streaming send follow, which finish the stage; otherwise the recv does.
    stage: tuple[float, float] | None = None
    wavelets: int = 0
    fused: bool = False
    routed: bool = False  # only the senders a step routed to send (see event.flow)


@dataclass(frozen=True, slots=True)
class AwaitCredits:
    """Route handshake: wait for this step's install credit of `flow` from the routers of `classes`."""

    flow: int
    classes: tuple[int, ...]  # class indices, sorted


@dataclass(frozen=True, slots=True)
class MarkerSync:
    """`segment.marker_sync src to dst over region`: flush the messages in flight over `region`."""

    src: int
    dst: int
    region: RectSet
    box: Box  # the region's bounding box (x0, y0, x1, y1), exclusive
    touching: frozenset[int]  # flows rebound at the boundary whose routes touch the region


@dataclass(frozen=True, slots=True)
class RouteDrain:
    """Route handshake: wait until the end-of-flow messages of `flows` have passed the router."""

    flows: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Reconfigure:
    """`segment.reconfigure src to dst`: wait for the own messages, then rewrite `routes` entries."""

    src: int
    dst: int
    routes: int  # released + installed routes
    cycles: float  # reconfigure + reconfigure_route * routes


@dataclass(frozen=True, slots=True)
class Switch:
    """The reconfiguration is done: the router takes segment `segment`'s colour configuration."""

    segment: int


@dataclass(frozen=True, slots=True)
class Notify:
    """Route handshake: send install credits of `flows` to the senders crossing the router."""

    flows: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class EndStep:
    """The decode step is done: the table starts over."""


Instr = (EnterSegment | Sub | Compute | MetaResolve | MetaProduce | Send | Recv | AwaitCredits
         | MarkerSync | RouteDrain | Reconfigure | Switch | Notify | EndStep)


# ---------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ClassSchedule:
    """One core class's table for one decode step."""

    index: int
    name: str
    wafer: int
    cores: RectSet
    instrs: tuple[Instr, ...]
    grants: tuple[int, ...]  # flows whose install credit the class holds at program start
    primed: Mapping[int, int]  # flow -> host-primed recvs per step

    def count(self, kind: type) -> int:
        """Instructions of one kind in the table."""
        return sum(1 for i in self.instrs if type(i) is kind)


@dataclass(frozen=True, slots=True)
class Schedule:
    """Every core class's table, in the program's class order; flows by index."""

    flows: tuple[str, ...]
    flow_index: Mapping[str, int]
    classes: tuple[ClassSchedule, ...]


def op_cycles(costs: Mapping[str, float], op: str, work: int, param) -> float:
    """Cycles of one `event.compute` of op `op` with `work` elements, by the target's costs.

    The op's own formula (`ComputeOp.cycles`): `work x` its cost key, or its
    `price`; `param(key)` reads the computing kernel's parameters.
    """
    return registry.compute_op(op).cycles(costs, work, param)


def _no_params(key: str, default=None):
    """The parameters of a kernel the program has no `event.kernel` for: none."""
    return default


def flatten(program: sg.ProgramOp, target, *, handshakes: bool = True,
            pos: dict[str, int] | None = None) -> Schedule:
    """The tables of `program`'s core classes, costed by `target`'s cost table.

    `handshakes=False` leaves the route handshakes out (the unsafe ablation);
    `pos` is the program's `step_order`, when the caller has it.
    """

    costs = target.costs
    slots = program.rows
    names = tuple(f.flow_name for f in program.flows())
    fidx = {n: i for i, n in enumerate(names)}
    via = {r.flow_name: RectSet.from_cores(r.via) for r in program.routes()}
    flow_via = [via.get(n, RectSet()) for n in names]
    classes = program.core_classes()
    cidx = {c.class_name: i for i, c in enumerate(classes)}
    primed_recvs = host_primed(program, pos)
    ts = costs["task_switch"]
    params = {k.kernel_name: k.param for k in program.kernels()}
    streaming = {f.flow_name for f in program.flows() if f.is_streaming}
    routed = {f.flow_name for f in program.flows() if f.is_routed}
    out = []
    for ci, c in enumerate(classes):
        instrs: list[Instr] = []
        primed: dict[int, int] = defaultdict(int)
        bounds = {b[0]: b for b in c.boundaries()}
        grant: tuple[int, ...] = ()
        for seg in c.segments():
            s = seg.index_value
            instrs.append(EnterSegment(s))
            awaiting: dict[int, set[int]] = defaultdict(set)
            if handshakes:
                for cname, fname in seg.await_pairs():
                    awaiting[fidx[fname]].add(cidx[cname])
                if s == 0:
                    grant = tuple(fidx[n] for n in seg.grant_names())
            for sub in seg.subs():
                kernel = sub.kernel_name
                instrs.append(Sub(kernel, sub.role_name, ts))
                events = sub.events()
                fused, forward = _stream_stages(events, streaming)
                for i, e in enumerate(events):
                    if isinstance(e, ev.ComputeOp):
                        work = e.work.value.data
                        instrs.append(Compute(kernel, e.op.data, work,
                                              op_cycles(costs, e.op.data, work,
                                                        params.get(kernel, _no_params)),
                                              i in fused, i + 1 in forward))
                    elif isinstance(e, ev.SendOp):
                        f = fidx[e.flow_name]
                        meta = e.meta.value.data
                        nb = e.num_bytes + meta
                        if f in awaiting:
                            instrs.append(AwaitCredits(f, tuple(sorted(awaiting.pop(f)))))
                        instrs.append(Send(f, nb, meta, wavelets(nb) * costs["send_wavelet"], False,
                                           i in forward, e.flow_name in routed))
                    elif isinstance(e, ev.RecvOp):
                        f = fidx[e.flow_name]
                        nb = e.num_bytes + e.meta.value.data
                        host = (kernel, e.flow_name) in primed_recvs
                        if host:
                            primed[f] += 1
                        stage = None
                        if e.flow_name in streaming:
                            nxt = events[i + 1] if i + 1 < len(events) else None
                            op = 0.0
                            if i + 1 in fused and isinstance(nxt, ev.ComputeOp):
                                op = op_cycles(costs, nxt.op.data, nxt.work.value.data,
                                               params.get(kernel, _no_params)) / max(wavelets(nb), 1)
                            stage = stream_stage(costs["recv_wavelet"], costs["send_wavelet"], op)
                        instrs.append(Recv(f, nb, wavelets(nb) * costs["recv_wavelet"], host, stage,
                                           wavelets(nb), i + 1 in fused or i + 1 in forward,
                                           e.flow_name in routed))
                    elif isinstance(e, ev.MetaResolveOp):
                        instrs.append(MetaResolve(fidx[e.flow_name], e.kind.data,
                                                  costs["meta_resolve_slot"] * slots))
                    elif isinstance(e, ev.MetaProduceOp):
                        instrs.append(MetaProduce(fidx[e.flow_name], e.kind.data,
                                                  costs["meta_produce_slot"] * slots))
            b = bounds.get(s)
            if b is None:
                continue
            src, dst, sync, reconf = b
            if sync is not None:
                region = RectSet.from_cores(sync.over)
                # Only the flows the boundary rebinds need flushing: a message of a flow
                # bound on both sides is unaffected (and may be one the class receives
                # only after the boundary, parked at its own router).
                changed = {fidx[x] for x in reconf.rebound_names()}
                touching = frozenset(f for f in changed if flow_via[f].intersects(region))
                instrs.append(MarkerSync(src, dst, region, extent(region), touching))
            dr = tuple(fidx[x] for x in reconf.drain_names()) if handshakes else ()
            if dr:
                instrs.append(RouteDrain(dr))
            n = len(reconf.release.data) + len(reconf.install.data)
            instrs.append(Reconfigure(src, dst, n, costs["reconfigure"] + costs["reconfigure_route"] * n))
            instrs.append(Switch(dst))
            nt = tuple(fidx[x] for x in reconf.notify_names()) if handshakes else ()
            if nt:
                instrs.append(Notify(nt))
        instrs.append(EndStep())
        # senders mark their last message of each flow in the step (end of flow)
        last = {ins.flow: i for i, ins in enumerate(instrs) if type(ins) is Send}
        for i in last.values():
            instrs[i] = replace(instrs[i], last=True)
        out.append(ClassSchedule(ci, c.class_name, c.wafer_index, RectSet.from_cores(c.cores),
                                 tuple(instrs), grant, dict(primed)))
    return Schedule(names, fidx, tuple(out))


def _stream_stages(events, streaming: set[str]) -> tuple[set[int], set[int]]:
    """Indices of the computes fused into a streaming recv, and of the sends forwarding one.

    A recv of a streaming flow, then (optionally) one compute, then a send
    on a streaming flow: the compute runs on the passing wavelets, the send
    forwards them.
    """
    fused: set[int] = set()
    forward: set[int] = set()
    for i, e in enumerate(events):
        if not (isinstance(e, ev.RecvOp) and e.flow_name in streaming):
            continue
        j = i + 1
        if j < len(events) and isinstance(events[j], ev.ComputeOp):
            fused.add(j)
            j += 1
        if j < len(events) and isinstance(events[j], ev.SendOp) and events[j].flow_name in streaming:
            forward.add(j)
            if j == i + 1:
                fused.add(j)  # a relay: the send itself finishes the stage
    return fused, forward


def extent(rs: RectSet) -> Box:
    """The bounding box (x0, y0, x1, y1) of a non-empty set, exclusive."""
    b = list(rs)
    return min(x[0] for x in b), min(x[1] for x in b), max(x[2] for x in b), max(x[3] for x in b)
