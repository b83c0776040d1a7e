"""Liveness of the flows of a segment program, and where flows interfere.

These definitions are shared by `materialize-segments` (which derives each
segment's `routes` and each boundary's `release` / `install` lists from
them), `color-routes` (which colours by them), `insert-route-handshakes`
and `check-segments` (which re-derives and checks them). `host_primed`, the
receives whose first step's messages come from the host, is shared by the
interpreter, the cost model and the CSL backend.

Step order. The kernels get positions 0..K-1: a topological order of the
edges "k runs before k' in some core class's table" and the `after` guards,
ties broken by first appearance (class by class, sub by sub). A sub of
kernel k runs at position pos(k). The step repeats every decode step, so
positions are cyclic: after K-1 comes 0 of the next step. Tables that order
two kernels differently are an error.

Flow window. The window W(F) of flow F is the cyclic arc of positions that
starts at the earliest sub that sends on F (`event.send`,
`event.meta_produce`) and runs forward just far enough to reach every sub
that references F (its receivers: `event.recv`, `event.meta_resolve`). The
sampler's control payload, sent at the end of a step and received by the
first stage at the start of the next, has a window that wraps. A flow no sub
references is dead: it has no window, no route and no colour.

Segment hold. A core class reconfigures right after the last sub of a
segment, so its routers hold the configuration of segment s over the arc
H_s that starts just after the previous segment's last sub (or at segment
s's first sub, when both share a position) and ends at segment s's last sub.
Segment 0's arc starts after the last segment of the previous step. A class
with one segment, and every router on no class's core (an idle router, which
has no table to reconfigure it), holds one configuration for the whole step.

Live. Flow F is live at a router of class T in T's segments
segs_T(F) = { s : H_s meets W(F) }, and T's segment s `routes` list holds
every flow live in it at one of T's routers (its own flows and the flows
passing through). A flow is live at an idle router throughout the step. For
a flow's own sender and receiver classes this is exactly the segments that
contain a sub using it.

Pipelines. With micro-batches in flight, a class works on one micro-batch
while the flows of other pipeline stages carry others, so positions relate
a transit flow to the class's segments only within one stage. A flow passing
through the routers of a class none of whose kernels is in a stage of the
flow's senders or receivers (the sampled tokens crossing the middle layers
back to the embedding) is live in every segment of that class: releasing it
at a boundary would make the class drain, each step, the message of a
micro-batch stages behind its own, and so run the whole pipeline one
micro-batch at a time.

Interference. Two flows interfere iff some router lies on both routes
(rect-set intersection of their XY routes / multicast trees, see
`meshrt.routing`) and both are live there in a common segment of the
router's class (always, at an idle router). Interfering flows get different
colours; all other flows may share one. A colour is thus bound to different
flows in different segments of the same router and is rebound by the
`segment.reconfigure` between them (release the old flow, install the new).
Since a router never holds two live flows on one colour, the route entries
one router holds at once never exceed the user colours.

Asynchrony. Holds and windows are arcs of step positions, i.e. they describe
classes switching in lockstep. On the GALS mesh classes switch when they
get there, so this liveness is made true in time by the route handshakes
that `insert-route-handshakes` compiles after colouring (install credits
before a sender's first use, drains before a router's release; see
`meshrt.passes.insert_route_handshakes`), and `check-segments` proves them.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from xdsl.ir import Operation

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.base import MappedProgramOp
from meshrt.routing import (
    Box,
    BoxIndex,
    RectSet,
    box_contains,
    box_intersection,
    box_subtract,
    flow_routers,
    intersecting_pairs,
)
from meshrt.shape import in_flight

SEND_EVENTS = (ev.SendOp, ev.MetaProduceOp)

Arc = tuple[int, int]
"""(start, length): the cyclic positions start, start + 1, ..., start + length (mod K)."""


def arcs_meet(a: Arc, b: Arc, k: int) -> bool:
    return (b[0] - a[0]) % k <= a[1] or (a[0] - b[0]) % k <= b[1]


def arc_positions(a: Arc, k: int) -> list[int]:
    return [(a[0] + i) % k for i in range(min(a[1], k - 1) + 1)]


# ---------------------------------------------------------------------------
# Step order, windows, holds
# ---------------------------------------------------------------------------


@dataclass
class ClassTable:
    """A core class and its table cut into segments (lists of subs)."""

    op: Operation  # event.core_class or segment.core_class
    name: str
    wafer: int
    cores: RectSet
    segments: list[list[ev.SubScheduleOp]]

    def subs(self) -> list[ev.SubScheduleOp]:
        return [s for seg in self.segments for s in seg]


def step_order(tables: Sequence[ClassTable]) -> dict[str, int]:
    """Kernel -> position in the step (see the module docstring)."""
    first: dict[str, int] = {}
    succ: dict[str, set[str]] = defaultdict(set)
    edge_op: dict[tuple[str, str], Operation] = {}

    def node(k: str) -> None:
        if k not in first:
            first[k] = len(first)

    for t in tables:
        prev: str | None = None
        for sub in t.subs():
            k = sub.kernel_name
            for dep in sub.after.data:
                d = dep.root_reference.data
                node(d)
                if d != k:
                    succ[d].add(k)
                    edge_op.setdefault((d, k), sub)
            node(k)
            if prev is not None and prev != k:
                succ[prev].add(k)
                edge_op.setdefault((prev, k), sub)
            prev = k
    indeg = dict.fromkeys(first, 0)
    for bs in succ.values():
        for b in bs:
            indeg[b] += 1
    heap = [(first[k], k) for k, d in indeg.items() if d == 0]
    heapq.heapify(heap)
    pos: dict[str, int] = {}
    while heap:
        _, k = heapq.heappop(heap)
        pos[k] = len(pos)
        for b in succ.get(k, ()):
            indeg[b] -= 1
            if indeg[b] == 0:
                heapq.heappush(heap, (first[b], b))
    if len(pos) < len(first):
        cycle = _find_cycle([k for k in first if k not in pos], succ)
        op = edge_op.get((cycle[0], cycle[1]))
        raise MeshrtError(
            "core class tables and guards order kernels in a cycle: "
            + " -> ".join(f"@{k}" for k in cycle)
            + "; every table must follow one step order",
            op,
        )
    return pos


def _find_cycle(nodes: list[str], succ: dict[str, set[str]]) -> list[str]:
    left = set(nodes)
    start = nodes[0]
    path = [start]
    seen = {start: 0}
    cur = start
    while True:
        nxt = min(b for b in succ.get(cur, ()) if b in left)
        if nxt in seen:
            return path[seen[nxt]:] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)
        cur = nxt


def flow_refs(tables: Sequence[ClassTable], pos: dict[str, int]) -> dict[str, list[tuple[int, bool]]]:
    """Flow name -> (position, is_send) of every sub event that uses it."""
    refs: dict[str, list[tuple[int, bool]]] = defaultdict(list)
    for t in tables:
        for sub in t.subs():
            p = pos[sub.kernel_name]
            for e in sub.events():
                if isinstance(e, ev.FlowEventOp):
                    refs[e.flow_name].append((p, isinstance(e, SEND_EVENTS)))
    return refs


def flow_window(refs: Sequence[tuple[int, bool]], k: int) -> Arc | None:
    if not refs:
        return None
    sends = [p for p, is_send in refs if is_send]
    start = min(sends) if sends else min(p for p, _ in refs)
    return (start, max((p - start) % k for p, _ in refs))


def hold_arcs(positions: Sequence[Sequence[int]], k: int) -> list[Arc]:
    """Hold arc of every segment, given the positions of its subs."""
    n = len(positions)
    full = (0, max(k - 1, 0))
    if n <= 1 or any(not p for p in positions):
        return [full] * n
    ends = [p[-1] for p in positions]
    arcs: list[Arc] = []
    for s in range(n):
        b, e = positions[s][0], ends[s]
        if s == 0:
            start = ends[-1] + 1 - k
        else:
            start = ends[s - 1] + 1 if b > ends[s - 1] else b
        length = e - start
        arcs.append(full if length >= k - 1 else (start % k, length))
    return arcs


@dataclass(frozen=True)
class StageSets:
    """The pipeline stages of each class's kernels and of each flow's senders and
    receivers, when micro-batches pipeline (empty otherwise): see "Pipelines" above."""

    of_class: dict[str, frozenset[int]]
    of_flow: dict[str, frozenset[int]]

    @staticmethod
    def of(program: MappedProgramOp, tables: Sequence[ClassTable]) -> StageSets:
        if in_flight(program.num_stages, program.dynamism_kinds) <= 1:
            return StageSets({}, {})
        stage = {k.kernel_name: k.stage_index for k in program.kernels()}
        of_class, of_flow = defaultdict(set), defaultdict(set)
        for t in tables:
            for sub in t.subs():
                s = stage.get(sub.kernel_name)
                if s is None:
                    raise MeshrtError(f"core class @{t.name} runs kernel @{sub.kernel_name}, "
                                      "which has no event.kernel record", sub)
                of_class[t.name].add(s)
                for e in sub.events():
                    if isinstance(e, ev.FlowEventOp):
                        of_flow[e.flow_name].add(s)
        return StageSets({c: frozenset(v) for c, v in of_class.items()},
                         {f: frozenset(v) for f, v in of_flow.items()})

    def apart(self, cls: str, flow: str) -> bool:
        """Whether `flow` only passes through `cls` from stages none of its kernels is in
        (a class that sends or receives on a flow always shares a stage with it)."""
        return bool(self.of_class) and self.of_class.get(cls, frozenset()).isdisjoint(
            self.of_flow.get(flow, ()))


# ---------------------------------------------------------------------------
# The analysis
# ---------------------------------------------------------------------------


@dataclass
class Piece:
    flow: int  # index into Liveness.flows
    owner: str | None  # class name, or None for idle routers
    box: Box
    segs: frozenset[int]


@dataclass
class FlowInfo:
    op: ev.FlowOp
    name: str
    wafer: int
    routers: RectSet
    window: Arc | None

    @property
    def routed(self) -> bool:
        return self.window is not None and bool(self.routers)


@dataclass
class Witness:
    """Where two flows meet: a router box of one owner and the common segments."""

    owner: str | None
    box: Box
    segs: frozenset[int]


@dataclass
class Clique:
    """Flows live together at one router in one segment of its class."""

    owner: str | None
    wafer: int
    core: tuple[int, int]
    segment: int
    flows: list[str]


class Liveness:
    """Windows, holds, per-segment route sets and the interference graph."""

    def __init__(self, program: MappedProgramOp, flows: Sequence[ev.FlowOp],
                 tables: Sequence[ClassTable]):
        self.program = program
        self.tables = list(tables)
        self.by_class = {t.name: t for t in self.tables}
        self.pos = step_order(self.tables)
        self.k = max(len(self.pos), 1)
        refs = flow_refs(self.tables, self.pos)
        self.flows = [
            FlowInfo(f, f.flow_name, f.wafer_index, flow_routers(f), flow_window(refs.get(f.flow_name, ()), self.k))
            for f in flows
        ]
        self.flow_index = {f.name: i for i, f in enumerate(self.flows)}
        self.stages = StageSets.of(program, self.tables)
        self.holds = {
            t.name: hold_arcs([[self.pos[s.kernel_name] for s in seg] for seg in t.segments], self.k)
            for t in self.tables
        }
        self._pieces: list[Piece] | None = None
        self._by_owner: dict[str | None, list[Piece]] | None = None

    # -- liveness ----------------------------------------------------------
    def segs(self, cls: str, flow: int) -> frozenset[int]:
        w = self.flows[flow].window
        if w is None:
            return frozenset()
        holds = self.holds[cls]
        if self.stages.apart(cls, self.flows[flow].name):
            return frozenset(range(len(holds)))  # another stage's flow passing through
        return frozenset(s for s, h in enumerate(holds) if arcs_meet(h, w, self.k))

    @property
    def pieces(self) -> list[Piece]:
        if self._pieces is None:
            self._pieces = self._compute_pieces()
        return self._pieces

    def _compute_pieces(self) -> list[Piece]:
        by_wafer: dict[int, list[tuple[Box, str]]] = defaultdict(list)
        for t in self.tables:
            for b in t.cores:
                by_wafer[t.wafer].append((b, t.name))
        index = {w: BoxIndex(items) for w, items in by_wafer.items()}
        pieces: list[Piece] = []
        for i, f in enumerate(self.flows):
            if not f.routed:
                continue
            idx = index.get(f.wafer)
            seg_cache: dict[str, frozenset[int]] = {}
            for b in f.routers:
                rest = [b]
                for j in idx.query(b) if idx is not None else ():
                    cbox, cls = idx.items[j]
                    inter = box_intersection(b, cbox)
                    assert inter is not None
                    if cls not in seg_cache:
                        seg_cache[cls] = self.segs(cls, i)
                    pieces.append(Piece(i, cls, inter, seg_cache[cls]))
                    rest = [p for r in rest for p in box_subtract(r, cbox)]
                for r in rest:
                    pieces.append(Piece(i, None, r, frozenset({0})))
        return pieces

    def configured(self, cls: str) -> list[list[str]]:
        """Per segment of `cls`, the flows live at its routers (in flow order)."""
        n = len(self.by_class[cls].segments)
        sets: list[set[int]] = [set() for _ in range(n)]
        for p in self.pieces_of_class().get(cls, ()):
            for s in p.segs:
                sets[s].add(p.flow)
        return [[self.flows[i].name for i in sorted(s)] for s in sets]

    def pieces_of_class(self) -> dict[str | None, list[Piece]]:
        if self._by_owner is None:
            out: dict[str | None, list[Piece]] = defaultdict(list)
            for p in self.pieces:
                out[p.owner].append(p)
            self._by_owner = out
        return self._by_owner

    # -- interference --------------------------------------------------------
    def interference(self) -> dict[tuple[int, int], list[Witness]]:
        """(i, j) with i < j -> where flows i and j meet while both are live."""
        edges: dict[tuple[int, int], list[Witness]] = defaultdict(list)
        by_wafer: dict[int, list[Piece]] = defaultdict(list)
        for p in self.pieces:
            by_wafer[self.flows[p.flow].wafer].append(p)
        for ps in by_wafer.values():
            items = [(p.box, p) for p in ps]
            for a, b in intersecting_pairs(items):
                pa, pb = ps[a], ps[b]
                if pa.flow == pb.flow:
                    continue
                box = box_intersection(pa.box, pb.box)
                assert box is not None
                if pa.owner != pb.owner:  # overlapping classes: be conservative
                    common = frozenset({0})
                    owner = pa.owner
                elif pa.owner is None:
                    common, owner = frozenset({0}), None
                else:
                    common, owner = pa.segs & pb.segs, pa.owner
                    if not common:
                        continue
                key = (min(pa.flow, pb.flow), max(pa.flow, pb.flow))
                edges[key].append(Witness(owner, box, common))
        return edges

    def densest(self, flow: int, edges: dict[tuple[int, int], list[Witness]],
                among: Iterable[int] | None = None) -> Clique:
        """The router (and segment) where most flows live together with `flow`."""
        allowed = set(among) if among is not None else None
        meets: list[tuple[int, Witness]] = []
        for (i, j), ws in edges.items():
            if flow in (i, j):
                other = j if i == flow else i
                if allowed is None or other in allowed:
                    meets.extend((other, w) for w in ws)
        f = self.flows[flow]
        best: Clique | None = None
        best_key: tuple[int, ...] | None = None
        by_owner: dict[str | None, list[tuple[int, Witness]]] = defaultdict(list)
        for other, w in meets:
            by_owner[w.owner].append((other, w))
        for owner, ms in by_owner.items():
            # The deepest point of a set of boxes has some box's x0 and some
            # box's y0; beyond a few hundred candidates, try box corners only.
            xs = sorted({w.box[0] for _, w in ms})
            ys = sorted({w.box[1] for _, w in ms})
            points = ([(x, y) for y in ys for x in xs] if len(xs) * len(ys) <= 400
                      else sorted({(w.box[0], w.box[1]) for _, w in ms}, key=lambda p: (p[1], p[0])))
            segs = sorted(set().union(*(w.segs for _, w in ms)))
            for x, y in points:
                for s in segs:
                    live = sorted({o for o, w in ms if s in w.segs and box_contains(w.box, x, y)})
                    if not live:
                        continue
                    key = (len(live), -y, -x)
                    if best_key is None or key > best_key:
                        best_key = key
                        names = [f.name] + [self.flows[o].name for o in live]
                        best = Clique(owner, f.wafer, (x, y), s, names)
        if best is None:
            x, y = f.routers.first_core()
            best = Clique(None, f.wafer, (x, y), 0, [f.name])
        return best


def tables_of_program(program: sg.ProgramOp) -> list[ClassTable]:
    return [
        ClassTable(c, c.class_name, c.wafer_index, RectSet.from_cores(c.cores),
                   [seg.subs() for seg in c.segments()])
        for c in program.core_classes()
    ]


def host_primed(program: sg.ProgramOp, pos: dict[str, int] | None = None) -> set[tuple[str, str]]:
    """(kernel, flow) of the receives the host primes: a loop-carried flow (the
    sampled tokens back to the first stage) is received by a kernel earlier in
    the step order than the flow's first sender, so its first step's messages
    come from the host (one per micro-batch in flight). The CSL backend's
    programs take the same receives from host-loaded buffers. `pos`: the
    program's `step_order`, when the caller has it."""
    pos = pos if pos is not None else step_order(tables_of_program(program))
    classes = list(program.core_classes())
    first: dict[str, int] = {}  # flow -> step position of its first sender (or metainfo producer)
    for c in classes:
        for seg in c.segments():
            for sub in seg.subs():
                for e in sub.events():
                    if isinstance(e, ev.SendOp | ev.MetaProduceOp):
                        first[e.flow_name] = min(first.get(e.flow_name, 1 << 30), pos[sub.kernel_name])
    return {(sub.kernel_name, e.flow_name)
            for c in classes for seg in c.segments() for sub in seg.subs() for e in sub.events()
            if isinstance(e, ev.RecvOp) and pos[sub.kernel_name] < first.get(e.flow_name, -1)}


def liveness_of_program(program: sg.ProgramOp) -> Liveness:
    return Liveness(program, program.flows(), tables_of_program(program))

