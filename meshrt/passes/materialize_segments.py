"""`materialize-segments`: event tables -> segments that fit a core (§4.3).

For every core class, walk its sub-schedules in table order (Algorithm of
§4.3, steps 1-5):

1. R <- the per-core budget (the target's, tightened by pass options).
2. Append the next sub to the current segment while what the segment binds
   together still fits R. What a segment binds is the sum of its subs'
   demands (colours, queues, route entries, SRAM buffers, control state all
   stay bound until the segment is released), except switch positions, a
   per-colour limit, which take the maximum.
3. On overflow close the segment. If the last kernel the class took part in
   (the closing segment's last sub) is a collective, its all-or-nothing
   completion is already a consistent cut and the boundary is a bare
   `segment.reconfigure`. Otherwise a `segment.marker_sync` precedes it.
4. The reconfiguration releases the flows live at the class's routers in the
   closing segment but not the next and installs the converse (liveness:
   see `meshrt.passes.color_routes`), so transit routes through the class's
   routers change with its segments too.
5. The next segment starts with the sub that overflowed.

A sub whose demand alone exceeds the budget is an error naming the kernel,
role, class, resource, demand and capacity.

The marker-sync region of a boundary is the class's own cores (they take the
cut) united with the routers of every flow released or installed there,
clipped to the mesh of the class's wafer: exactly the compile-time-known
routers whose configuration the boundary changes, never the whole chip.

The table repeats every decode step, so a class with several segments also
has the boundary from its last segment back to segment 0 (`reconfigure N-1
to 0`, with its marker sync when the last segment does not end on a
collective). Classes belong to one wafer, so no boundary crosses wafers.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    i64,
)
from xdsl.ir import Block, Region
from xdsl.passes import ModulePass

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs
from meshrt.dialects.mesh import (
    RESOURCE_FIELDS,
    RESOURCE_NAMES,
    ResourceAttr,
    Resources,
)
from meshrt.frontend.errors import FrontendError
from meshrt.routing import RectSet
from meshrt.targets import Target, target_for


def accumulate(a: Resources, b: Resources) -> Resources:
    """What two sub-schedules bind together: sums, but the max of switch positions."""
    return Resources(*(
        max(getattr(a, f), getattr(b, f)) if f == "switches" else getattr(a, f) + getattr(b, f)
        for f in RESOURCE_FIELDS
    ))


def segment_use(subs: Sequence[ev.SubScheduleOp]) -> Resources:
    use = Resources()
    for s in subs:
        use = accumulate(use, s.demand.value)
    return use


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
    use = Resources()
    for i, sub in enumerate(subs):
        err = sub_too_big(sub, cls, budget)
        if err is not None:
            raise err
        nxt = accumulate(use, sub.demand.value)
        if cur and (i in cuts or nxt.exceeded(budget)):
            segments.append(cur)
            cur, nxt = [], sub.demand.value
        cur.append(sub)
        use = nxt
    segments.append(cur)
    return segments


# ---------------------------------------------------------------------------
# Emitting a class's segments and boundaries
# ---------------------------------------------------------------------------


def _refs(names: Sequence[str]) -> ArrayAttr:
    return ArrayAttr([SymbolRefAttr(n) for n in names])


def marker_region(live, table, names: Sequence[str], mesh: tuple[int, int]) -> RectSet:
    region = table.cores
    for n in names:
        region = region | live.flows[live.flow_index[n]].routers
    return region.clip(*mesh)


def emit_class(op: sg.CoreClassOp, table, live, mesh: tuple[int, int]) -> None:
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


def split_segment(program: sg.ProgramOp, live, clique) -> bool:
    """Split the segment of `clique.owner` where `clique.flows` meet; False if no cut helps.

    This is how `color-routes` hands an overflow back to materialization.
    """
    from meshrt.passes.color_routes import ClassTable, Liveness, arcs_meet, hold_arcs

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


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------


def target_of(given: str | Target | None, op) -> Target:
    """The target `given` (a Target, a bundled name or a path; None: the one
    `op`'s program names); a bad one is a located error."""
    try:
        return target_for(given, op.target.data)
    except FrontendError as e:
        if e.loc is None:
            raise MeshrtError(e.message, op) from e
        raise MeshrtError.located(str(e)) from e


def budget_for(target: Target, overrides: dict[str, int | None], where) -> Resources:
    cap = target.budget()
    vals = {f: getattr(cap, f) for f in RESOURCE_FIELDS}
    for f, v in overrides.items():
        if v is None:
            continue
        if v < 0:
            raise MeshrtError(f"materialize-segments: {f}={v} must be >= 0", where)
        if v > vals[f]:
            raise MeshrtError(
                f"materialize-segments: {f}={v} exceeds the {vals[f]} {RESOURCE_NAMES[f]} "
                f"target {target.name} has per core; overrides may only tighten the budget",
                where,
            )
        vals[f] = v
    return Resources(**vals)


def materialize(schedule: ev.ScheduleOp, target: Target, budget: Resources,
                target_name: str | None = None) -> sg.ProgramOp:
    """The segment program of `schedule` (whose ops it moves into the result)."""
    from meshrt.passes.color_routes import ClassTable, Liveness

    program = sg.ProgramOp.like(
        schedule,
        body=Region(Block()),
        budget=ResourceAttr(budget),
        num_colors=IntegerAttr(target.colors, i64),
        reserved_colors=DenseArrayBase.from_list(i64, list(target.reserved_colors)),
    )
    program.location = schedule.location
    if target_name is not None:
        program.target = StringAttr(target_name)
    block = program.body.block
    for k in schedule.kernels():
        k.detach()
        block.add_op(k)
    flows = schedule.flows()
    for f in flows:
        f.detach()
        block.add_op(f)
    tables = []
    for cls in schedule.core_classes():
        subs = cls.subs()
        segs = cut_table(cls.class_name, subs, budget)
        props = {"sym_name": cls.sym_name, "wafer": cls.wafer, "cores": cls.cores}
        if cls.params is not None:
            props["params"] = cls.params
        new = sg.CoreClassOp.create(properties=props, regions=[Region(Block())])
        new.location = cls.location
        block.add_op(new)
        tables.append(ClassTable(new, cls.class_name, cls.wafer_index,
                                 RectSet.from_cores(cls.cores), segs))
    live = Liveness(program, flows, tables)
    for t in tables:
        emit_class(t.op, t, live, program.mesh_size)
    return program


@dataclass(frozen=True)
class MaterializeSegments(ModulePass):
    """event.schedule -> segment.program: segments, marker syncs, reconfigurations.

    `target` overrides the program's target (a bundled name or a .toml
    path, written into the IR; from Python, also the Target itself, as the
    driver passes it, which keeps the IR's name); `colors`, `iq`, `oq`,
    `routes`, `switches`, `sram`, `ctrl` tighten the per-core budget for
    this run.
    """

    name = "materialize-segments"

    target: str | Target | None = None
    colors: int | None = None
    iq: int | None = None
    oq: int | None = None
    routes: int | None = None
    switches: int | None = None
    sram: int | None = None
    ctrl: int | None = None

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        schedules = require_programs(
            op, ev.ScheduleOp, "materialize-segments needs event IR (an event.schedule); "
            "run synthesize-schedules first")
        overrides = {f: getattr(self, f) for f in RESOURCE_FIELDS}
        for schedule in schedules:
            target = target_of(self.target, schedule)
            budget = budget_for(target, overrides, schedule)
            rename = None if isinstance(self.target, Target) else self.target
            program = materialize(schedule, target, budget, rename)
            op.body.block.insert_op_before(program, schedule)
            schedule.detach()
            schedule.erase()
