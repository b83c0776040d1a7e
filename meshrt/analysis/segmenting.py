"""Cutting core class tables into segments, and the segment IR of a class.

What a segment binds (`SegmentUse`, `segment_use`) and the greedy cut of a
class's table into segments that fit a per-core budget (`cut_table`, §4.3):

1. R <- the per-core budget (the target's, tightened by pass options).
2. Append the next sub to the current segment while what the segment binds
   together still fits R. What a segment binds is its subs' demands
   together (colours, queues, route entries, SRAM buffers, control state all
   stay bound until the segment is released): the distinct flows its subs
   use, each one colour, queue and route entry however many subs use it,
   the sum of SRAM and control state, and the maximum of switch positions,
   a per-colour limit (`SegmentUse`).
3. On overflow close the segment. If the last kernel the class took part in
   (the closing segment's last sub) is a collective, its all-or-nothing
   completion is already a consistent cut and the boundary is a bare
   `segment.reconfigure`. Otherwise a `segment.marker_sync` precedes it.
4. The reconfiguration releases the flows live at the class's routers in the
   closing segment but not the next and installs the converse (liveness:
   see `meshrt.analysis.liveness`), so transit routes through the class's
   routers change with its segments too.
5. The next segment starts with the sub that overflowed.

A sub whose demand alone exceeds the budget is an error naming the kernel,
role, class, resource, demand and capacity.

`emit_class` builds a `segment.core_class` body (steps 3 and 4) from a cut
table and the liveness. The marker-sync region of a boundary is the class's
own cores (they take the cut) united with the routers of every flow
released or installed there, clipped to the mesh of the class's wafer:
exactly the compile-time-known routers whose configuration the boundary
changes, never the whole chip.

The table repeats every decode step, so a class with several segments also
has the boundary from its last segment back to segment 0 (`reconfigure N-1
to 0`, with its marker sync when the last segment does not end on a
collective). Classes belong to one wafer, so no boundary crosses wafers.

`split_segment` is how `color-routes` hands a colour overflow back to
materialization: it cuts one segment of a class in two and re-emits the
class.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from xdsl.dialects.builtin import ArrayAttr, IntegerAttr, SymbolRefAttr, i64
from xdsl.ir import Block, Region

from meshrt.analysis.liveness import ClassTable, Clique, Liveness, arcs_meet, hold_arcs
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.mesh import RESOURCE_FIELDS, RESOURCE_NAMES, ResourceAttr, Resources
from meshrt.routing import RectSet


def accumulate(a: Resources, b: Resources) -> Resources:
    """What two sub-schedules bind together: sums, but the max of switch positions."""
    return Resources(*(
        max(getattr(a, f), getattr(b, f)) if f == "switches" else getattr(a, f) + getattr(b, f)
        for f in RESOURCE_FIELDS
    ))


def _sub_flows(sub: ev.SubScheduleOp) -> tuple[frozenset[str], frozenset[str]]:
    """(flows the sub receives on, flows it sends on)."""
    recvs = frozenset(e.flow_name for e in sub.events() if isinstance(e, ev.RecvOp))
    sends = frozenset(e.flow_name for e in sub.events() if isinstance(e, ev.SendOp))
    return recvs, sends


class SegmentUse:
    """What a run of sub-schedules binds together (step 2 above): the sum of their
    demands, but a flow that several of them use (kernels whose chains share a route)
    binds its colour, input or output queue and route entry once; switch positions
    take the maximum."""

    def __init__(self) -> None:
        self.recvs: frozenset[str] = frozenset()
        self.sends: frozenset[str] = frozenset()
        self.total = Resources()
        self.shared = Resources()  # what `total` counts more than once

    def with_sub(self, sub: ev.SubScheduleOp) -> SegmentUse:
        nxt = SegmentUse()
        r, s = _sub_flows(sub)
        again = len((self.recvs | self.sends) & (r | s))
        nxt.recvs, nxt.sends = self.recvs | r, self.sends | s
        nxt.total = accumulate(self.total, sub.demand.value)
        nxt.shared = self.shared + Resources(colors=again, iq=len(self.recvs & r),
                                             oq=len(self.sends & s), routes=again)
        return nxt

    @property
    def resources(self) -> Resources:
        t, d = self.total, self.shared
        return replace(t, colors=t.colors - d.colors, iq=t.iq - d.iq, oq=t.oq - d.oq,
                       routes=t.routes - d.routes)


def segment_use(subs: Sequence[ev.SubScheduleOp]) -> Resources:
    use = SegmentUse()
    for s in subs:
        use = use.with_sub(s)
    return use.resources


def sub_too_big(sub: ev.SubScheduleOp, cls: str, budget: Resources) -> MeshrtError | None:
    over = sub.demand.value.exceeded(budget)
    if not over:
        return None
    res, demand, cap = over[0]
    return MeshrtError(
        f"sub-schedule of kernel @{sub.kernel_name} role \"{sub.role_name}\" in core class "
        f"@{cls} needs {demand} {RESOURCE_NAMES[res]}, capacity {cap}",
        sub,
    )


def cut_table(cls: str, subs: Sequence[ev.SubScheduleOp], budget: Resources,
              cuts: frozenset[int] = frozenset()) -> list[list[ev.SubScheduleOp]]:
    """Greedy first-fit segmentation; `cuts` are sub indices that must start a segment."""
    segments: list[list[ev.SubScheduleOp]] = []
    cur: list[ev.SubScheduleOp] = []
    use = SegmentUse()
    for i, sub in enumerate(subs):
        err = sub_too_big(sub, cls, budget)
        if err is not None:
            raise err
        nxt = use.with_sub(sub)
        if cur and (i in cuts or nxt.resources.exceeded(budget)):
            segments.append(cur)
            cur, nxt = [], SegmentUse().with_sub(sub)
        cur.append(sub)
        use = nxt
    segments.append(cur)
    return segments


# ---------------------------------------------------------------------------
# Emitting a class's segments and boundaries
# ---------------------------------------------------------------------------


def _refs(names: Sequence[str]) -> ArrayAttr:
    return ArrayAttr([SymbolRefAttr(n) for n in names])


def marker_region(live: Liveness, table: ClassTable, names: Sequence[str], mesh: tuple[int, int]) -> RectSet:
    region = table.cores
    for n in names:
        region = region | live.flows[live.flow_index[n]].routers
    return region.clip(*mesh)


def emit_class(op: sg.CoreClassOp, table: ClassTable, live: Liveness, mesh: tuple[int, int]) -> None:
    """(Re)build the body of `op` from `table.segments` and the liveness `live`."""
    block = op.body.block
    for sub in table.subs():
        if sub.parent is not None:
            sub.detach()
    for old in list(block.ops):
        old.detach()
        old.erase()
    conf = live.configured(table.name)
    segs = table.segments
    n = len(segs)

    def boundary(i: int, j: int) -> None:
        last = segs[i][-1] if segs[i] else None
        loc = last.location if last is not None else op.location
        before, after = conf[i], conf[j]
        release = [f for f in before if f not in set(after)]
        install = [f for f in after if f not in set(before)]
        if last is None or not last.is_collective:
            region = marker_region(live, table, release + install, mesh)
            w, h = mesh
            if region.count >= w * h and w * h > 1:
                raise MeshrtError(
                    f"core class @{table.name}: the marker sync for boundary {i} to {j} would span "
                    f"the whole {w} x {h} mesh (the released and installed routes cover it)",
                    last if last is not None else op,
                )
            sync = sg.MarkerSyncOp.create(properties={
                "from": IntegerAttr(i, i64), "to": IntegerAttr(j, i64), "over": region.to_coreset(),
            })
            sync.location = loc
            block.add_op(sync)
        rec = sg.ReconfigureOp.create(properties={
            "from": IntegerAttr(i, i64), "to": IntegerAttr(j, i64),
            "release": _refs(release), "install": _refs(install),
        })
        rec.location = loc
        block.add_op(rec)

    for i, subs in enumerate(segs):
        if i > 0:
            boundary(i - 1, i)
        seg = sg.SegmentOp.create(
            properties={
                "index": IntegerAttr(i, i64),
                "use": ResourceAttr(segment_use(subs)),
                "routes": _refs(conf[i]),
            },
            regions=[Region(Block(list(subs))) if subs else Region()],
        )
        seg.location = subs[0].location if subs else op.location
        block.add_op(seg)
    if n > 1:
        boundary(n - 1, 0)


def split_segment(program: sg.ProgramOp, live: Liveness, clique: Clique) -> bool:
    """Split the segment of `clique.owner` where `clique.flows` meet; False if no cut helps.

    This is how `color-routes` hands an overflow back to materialization.
    """
    table = live.by_class[clique.owner]
    s = clique.segment
    seg = table.segments[s]
    if len(seg) < 2:
        return False
    windows = [live.flows[live.flow_index[n]].window for n in clique.flows]
    positions = [[live.pos[x.kernel_name] for x in sg_] for sg_ in table.segments]
    best: tuple[tuple[int, int, int], int] | None = None
    for i in range(1, len(seg)):
        trial = positions[:s] + [positions[s][:i], positions[s][i:]] + positions[s + 1:]
        holds = hold_arcs(trial, live.k)
        c1 = sum(1 for w in windows if w is not None and arcs_meet(holds[s], w, live.k))
        c2 = sum(1 for w in windows if w is not None and arcs_meet(holds[s + 1], w, live.k))
        key = (max(c1, c2), c1 + c2, abs(len(seg) - 2 * i))
        if best is None or key < best[0]:
            best = (key, i)
    assert best is not None
    if best[0][0] >= len(clique.flows):
        return False
    i = best[1]
    tables = []
    for t in live.tables:
        if t.name == table.name:
            t = ClassTable(t.op, t.name, t.wafer, t.cores,
                           t.segments[:s] + [seg[:i], seg[i:]] + t.segments[s + 1:])
        tables.append(t)
    new_live = Liveness(program, program.flows(), tables)
    emit_class(table.op, new_live.by_class[table.name], new_live, program.mesh_size)
    return True

