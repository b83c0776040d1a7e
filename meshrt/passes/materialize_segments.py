"""`materialize-segments`: event tables -> segments that fit a core (§4.3).

For every core class, cut its sub-schedules, in table order, into segments
whose binding fits the per-core budget (the target's, tightened by the pass
options) and emit them with their boundaries: a `segment.marker_sync` where
the closing segment does not end on a collective, and a
`segment.reconfigure` that releases and installs the flows live at the
class's routers. The algorithm and the boundaries are described in
`meshrt.analysis.segmenting`, liveness in `meshrt.analysis.liveness`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, Region
from xdsl.passes import ModulePass

from meshrt.analysis.liveness import ClassTable, Liveness
from meshrt.analysis.segmenting import cut_table, emit_class
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs
from meshrt.dialects.mesh import RESOURCE_FIELDS, RESOURCE_NAMES, ResourceAttr, Resources
from meshrt.routing import RectSet
from meshrt.targets import Target, target_for


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


def materialize(schedule: ev.ScheduleOp, target: Target, budget: Resources) -> sg.ProgramOp:
    """The segment program of `schedule` (whose ops it moves into the result)."""
    program = sg.ProgramOp.like(
        schedule,
        body=Region(Block()),
        budget=ResourceAttr(budget),
        num_colors=IntegerAttr(target.colors, i64),
        reserved_colors=DenseArrayBase.from_list(i64, list(target.reserved_colors)),
    )
    program.location = schedule.location
    program.stamp_target(target)
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
    path; from Python, also the Target itself, as the driver passes it); the
    IR records the one used (`MappedProgramOp.stamp_target`). `colors`, `iq`, `oq`,
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
        schedules = require_programs(op, self.name, ev.ScheduleOp, hint="synthesize-schedules")
        overrides = {f: getattr(self, f) for f in RESOURCE_FIELDS}
        for schedule in schedules:
            target = target_for(self.target, schedule)
            budget = budget_for(target, overrides, schedule)
            program = materialize(schedule, target, budget)
            op.body.block.insert_op_before(program, schedule)
            schedule.detach()
            schedule.erase()
