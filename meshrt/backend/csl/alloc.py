"""Per-class allocation of colours, queues, task IDs and DSD registers.

Everything a core class's program binds is allocated here, within the
target's limits, and every shortage is a `MeshrtError` that names the class,
the resource, the demand and the capacity; nothing is ever dropped or
shared silently.

- Colours come from `segment.route` (colour-routes already kept them off
  the target's reserved ones, which are memcpy's); here they are only
  counted: the route entries one router holds in one segment must fit.
- Queues: on wse3 input and output queues are bound to a colour
  (`@initialize_queue`); on wse2 the fabric DSD names the colour and a
  queue is bound to nothing (the SDK's task-ID docs initialise queues on
  WSE-3 only), so a wse2 class never rebinds. On wse3 a class keeps a queue
  on the same colour across segments when it can; when a segment needs a
  colour and no queue is free, a queue whose colour that segment does not
  use is rebound at the boundary (after the drain), through a register the
  SDK does not document (UNVERIFIED, see docs/csl-backend.md). A segment
  that needs more queues at once than the target has is an error. A relay
  line (streams.py) sends and receives its flow during the receive, so
  that segment takes an output queue for it too.
- Task IDs: data tasks take the colour's ID on wse2 and the input queue's
  ID on wse3; local tasks come from the activatable IDs (0..30 on wse2, not
  a colour this class receives or routes; 8..30 on wse3); the marker
  control task shares one ID program-wide, since a marker's payload names
  the task on the receiving core. All of them avoid the target's reserved
  IDs (memcpy's) and the system tasks 29 (teardown, which runs the route
  handshakes' teardown handlers) and 30 (timer), as the SDK docs ask.
- Switches: a switch-chained flow (streams.py) needs switch positions on
  its colour; on wse3 only colours 0-9, 12, 13, 16, 17, 20, 21 have them,
  and another colour is an error.
- DSD registers: the fabric transfers use explicitly allocated DSRs (one
  dest/src1 pair for receives plus a src0 for receives that add, one
  dest/src1 pair for sends) so that the count is ours and checkable; compute
  DSD operations use compiler-assigned ones.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrt.backend.csl.model import CoreClass, Program
from meshrt.diagnostics import MeshrtError
from meshrt.targets import Target

ACTIVATABLE = range(0, 31)  # local task IDs, and control-task entry points (5-bit field; 31 = none)
SYSTEM_TASK_IDS = frozenset({29, 30})  # teardown task, timer task (SDK docs: avoid them)
WSE3_DATA_TASK_IDS = range(0, 8)  # wse3: data task IDs are the input queues'
# Explicit DSR IDs the backend hands out per DSR file. Public SDK code uses
# IDs up to 7; ID 0 is left to the compiler and the libraries.
DSR_IDS = range(1, 8)


def switched_colors(program: Program, cls: CoreClass) -> list[int]:
    """Colours with switch-chain positions at some router of `cls` in some segment: their
    ring and pop modes are set at comptime there (the SDK's allreduce library sets them
    once; a run-time install changes only the positions)."""
    from meshrt.backend.csl import percore, streams

    plans = streams.plans(program)
    return sorted({plans[f].color for seg in cls.segments for f in seg.routes
                   if f in plans and plans[f].switched
                   and any(c.switch for _, c in percore.clip_to(plans[f].cells, cls.boxes))})


@dataclass
class QueuePlan:
    """Queue <-> colour bindings of one class across its segments."""

    initial: dict[int, int] = field(default_factory=dict)  # queue -> colour bound in comptime
    per_segment: list[dict[int, int]] = field(default_factory=list)  # colour -> queue, per segment
    rebinds: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # boundary dest -> (queue, colour)
    peak: int = 0

    def queue(self, segment: int, color: int) -> int:
        return self.per_segment[segment][color]

    @property
    def used(self) -> list[int]:
        return sorted({q for m in self.per_segment for q in m.values()})

    @property
    def rebind_count(self) -> int:
        return sum(len(v) for v in self.rebinds.values())


@dataclass
class ClassAlloc:
    cls: CoreClass
    colors_per_segment: list[list[int]]
    colors: list[int]  # distinct colours over all segments
    iq: QueuePlan
    oq: QueuePlan
    data_tasks: dict[int, int]  # wse2: colour -> task id; wse3: queue -> task id
    step_task: int
    marker_task: int | None
    dsr_rx: int
    dsr_tx: int
    sram_bytes: int = 0  # filled in by the program emitter
    # host-visible arrays (memcpy): symbol -> (elements per core, CSL type), filled in by the program emitter
    symbols: dict[str, tuple[int, str]] = field(default_factory=dict)
    rows: list[tuple[str, str, str, str]] = field(default_factory=list)
    switched: list[int] = field(default_factory=list)  # colours with switch-chain positions here
    teardown: list[int] = field(default_factory=list)  # colours with a teardown handler here


@dataclass
class Limits:
    arch: str
    target: Target
    user_colors: tuple[int, ...]
    iq: tuple[int, ...]
    oq: tuple[int, ...]
    task_ids: frozenset[int]

    @property
    def oq_color_bound(self) -> bool:
        return self.arch == "wse3"


def limits(program: Program, target: Target, arch: str) -> Limits:
    user = tuple(c for c in range(int(program.op.num_colors.value.data)) if c not in program.op.reserved)
    ids = frozenset(range(target.task_ids)) - frozenset(target.reserved_task_ids)
    return Limits(arch, target, user, target.user_input_queues, target.user_output_queues, ids)


def _fail(cls: CoreClass, resource: str, demand: int, cap: int, lim: Limits, detail: str = ""):
    what = f"core class @{cls.name} needs {demand} {resource} but {lim.arch} on target " \
           f"{lim.target.name} has {cap}"
    raise MeshrtError(what + (f" ({detail})" if detail else ""), cls.op)


def _segment_colors(cls: CoreClass, program: Program, kinds: tuple[str, ...],
                    relayed: set[str] = frozenset()) -> list[list[int]]:
    """Colours the class's events of `kinds` use, per segment. `relayed`: flows
    this class relays (sends during its receive; its own send only stages)."""
    out = []
    sending = "send" in kinds
    for seg in cls.segments:
        cols = set()
        for e in seg.events():
            if e.flow is None:
                continue
            hit = e.kind in kinds
            if sending and e.flow in relayed:
                hit = e.kind == "recv"
            if hit:
                c = program.flows[e.flow].color
                if c is not None:
                    cols.add(c)
        out.append(sorted(cols))
    return out


def plan_queues(cls: CoreClass, seg_colors: list[list[int]], queues: tuple[int, ...],
                color_bound: bool, what: str, lim: Limits) -> QueuePlan:
    plan = QueuePlan()
    for s, cols in enumerate(seg_colors):
        if len(cols) > len(queues):
            _fail(cls, f"{what}s at once", len(cols), len(queues), lim,
                  f"segment {cls.segments[s].index} uses colours {', '.join(map(str, cols))}; "
                  f"user {what}s are {', '.join(map(str, queues)) or 'none'}")
        plan.peak = max(plan.peak, len(cols))
    if not color_bound:  # any free queue will do, segment by segment
        plan.per_segment = [dict(zip(cols, queues[:len(cols)], strict=True)) for cols in seg_colors]
        return plan
    current: dict[int, int] = {}  # queue -> colour it is bound to now
    last_use: dict[int, int] = {}
    for s, cols in enumerate(seg_colors):
        mapping: dict[int, int] = {}
        for c in cols:
            for q, bound in current.items():
                if bound == c:
                    mapping[c] = q
        for c in cols:
            if c in mapping:
                continue
            free = [q for q in queues if q not in current]
            if free:  # never bound: bind in comptime
                q = free[0]
                plan.initial[q] = c
            else:  # rebind a queue this segment does not use, least recently used first
                busy = set(mapping.values())
                spare = sorted((q for q in current if q not in busy), key=lambda q: last_use.get(q, -1))
                q = spare[0]
                plan.rebinds.setdefault(s, []).append((q, c))
            current[q] = c
            mapping[c] = q
        for q in mapping.values():
            last_use[q] = s
        plan.per_segment.append(mapping)
    # The table loops: the closing boundary restores the comptime bindings.
    restore = [(q, plan.initial[q]) for q in sorted(current) if current[q] != plan.initial.get(q)]
    if restore and len(seg_colors) > 1:
        plan.rebinds.setdefault(0, []).extend(restore)
    return plan


def marker_task_id(program: Program, lim: Limits) -> int | None:
    """One control-task ID for marker syncs, free on every core of the program."""
    if not any(b.sync is not None for c in program.classes for b in c.boundaries):
        return None
    taken = {f.color for f in program.flows.values() if f.color is not None}
    cands = [t for t in ACTIVATABLE if t in lim.task_ids and t not in taken and t not in SYSTEM_TASK_IDS]
    if lim.arch == "wse3":
        cands = [t for t in cands if t not in WSE3_DATA_TASK_IDS]
    if not cands:
        raise MeshrtError(
            f"no task ID is left for the marker-sync control task on target {lim.target.name} "
            f"({lim.arch}): IDs 0..30 are all reserved, system (29, 30), data-task or routed-colour IDs",
            program.op)
    return max(cands)


def allocate(cls: CoreClass, program: Program, lim: Limits, marker: int | None) -> ClassAlloc:
    routes = []
    for seg in cls.segments:
        cols = sorted({program.flows[f].color for f in seg.routes
                       if f in program.flows and program.flows[f].color is not None})
        if len(cols) > len(lim.user_colors):
            _fail(cls, "colours at once", len(cols), len(lim.user_colors), lim,
                  f"segment {seg.index} routes {len(cols)} coloured flows")
        bad = [c for c in cols if c not in lim.user_colors]
        if bad:
            raise MeshrtError(f"core class @{cls.name}: colour {bad[0]} is reserved on target "
                              f"{lim.target.name} (memcpy's) or out of range", cls.op)
        routes.append(cols)
    colors = sorted({c for cols in routes for c in cols})
    from meshrt.backend.csl import percore, streams

    plans = streams.plans(program)
    receives = {e.flow for seg in cls.segments for e in seg.events() if e.kind == "recv"}
    relayed = {f for f in receives if f in plans and plans[f].scheme == streams.RELAY}
    switched = switched_colors(program, cls)
    bad = [c for c in switched if c not in lim.target.switch_colors]
    if bad:
        flows = sorted(f for seg in cls.segments for f in seg.routes
                       if f in plans and plans[f].color == bad[0] and plans[f].switched)
        raise MeshrtError(
            f"core class @{cls.name}: flow @{flows[0]} is switch-chained (several senders) on "
            f"colour {bad[0]}, which has no switch positions on target {lim.target.name} "
            f"(switch-capable: {', '.join(map(str, lim.target.switch_colors))})", cls.op)
    rx_cols = _segment_colors(cls, program, ("recv", "resolve"))
    tx_cols = _segment_colors(cls, program, ("send",), relayed)
    iq = plan_queues(cls, rx_cols, lim.iq, lim.oq_color_bound, "input queue", lim)
    oq = plan_queues(cls, tx_cols, lim.oq, lim.oq_color_bound, "output queue", lim)

    # Data tasks: the metainfo headers that resolvers parse wavelet by wavelet.
    data: dict[int, int] = {}
    for s, seg in enumerate(cls.segments):
        for e in seg.events():
            if e.kind != "resolve":
                continue
            c = program.flows[e.flow].color
            if c is None:
                continue  # across the wafer link: the host hands it over
            key = c if lim.arch == "wse2" else iq.queue(s, c)
            tid = key
            if tid not in lim.task_ids or (lim.arch == "wse3" and tid not in WSE3_DATA_TASK_IDS):
                raise MeshrtError(
                    f"core class @{cls.name}: the metainfo data task on "
                    f"{'colour' if lim.arch == 'wse2' else 'input queue'} {key} needs task ID {tid}, "
                    f"which target {lim.target.name} reserves or does not have", cls.op)
            data[key] = tid
    taken = set(data.values()) | ({marker} if marker is not None else set()) | SYSTEM_TASK_IDS
    if lim.arch == "wse2":
        taken |= set(colors)  # a routed colour's ID activates its data task on wse2
        local_range = [t for t in ACTIVATABLE]
    else:
        local_range = [t for t in ACTIVATABLE if t not in WSE3_DATA_TASK_IDS]
    local = [t for t in local_range if t in lim.task_ids and t not in taken]
    if not local:
        _fail(cls, "local task IDs", 1, 0, lim,
              f"activatable IDs {local_range[0]}..{local_range[-1]} are reserved, system (29, 30), "
              f"data-task{', colour' if lim.arch == 'wse2' else ''} or marker IDs")
    needs_dsrs = 2
    if needs_dsrs > len(DSR_IDS):  # pragma: no cover - DSR_IDS is a constant
        _fail(cls, "DSD register pairs", needs_dsrs, len(DSR_IDS), lim)
    alloc = ClassAlloc(cls, routes, colors, iq, oq, data, local[0], marker, DSR_IDS[0], DSR_IDS[1])
    alloc.switched = switched
    from meshrt.backend.csl.handshakes import teardown_colors

    alloc.teardown = sorted(teardown_colors(program)[cls.name])
    if alloc.teardown and 29 in lim.target.reserved_task_ids:
        raise MeshrtError(
            f"core class @{cls.name} needs the teardown task (ID 29) for the route handshakes on "
            f"colours {', '.join(map(str, alloc.teardown))}, but target {lim.target.name} reserves it",
            cls.op)
    return alloc


def report_rows(a: ClassAlloc, lim: Limits) -> list[tuple[str, str, str, str]]:
    """(resource, use, capacity, detail) rows of a class's allocation."""
    def ids(xs) -> str:
        return ", ".join(map(str, xs)) if xs else "-"

    peak_colors = max((len(c) for c in a.colors_per_segment), default=0)
    rows = [
        ("colours", str(peak_colors), str(len(lim.user_colors)),
         f"ids {ids(a.colors)} over {len(a.colors_per_segment)} segment(s)"),
        ("input queues", str(a.iq.peak), str(len(lim.iq)),
         f"ids {ids(a.iq.used)}" + (f", {a.iq.rebind_count} rebind(s)" if a.iq.rebind_count else "")),
        ("output queues", str(a.oq.peak), str(len(lim.oq)),
         f"ids {ids(a.oq.used)}" + (f", {a.oq.rebind_count} rebind(s)" if a.oq.rebind_count else "")),
        ("data task ids", str(len(a.data_tasks)), "-",
         f"{'colour' if lim.arch == 'wse2' else 'queue'} ids {ids(sorted(a.data_tasks.values()))}"),
        ("local task ids", "1", str(len([t for t in ACTIVATABLE if t in lim.task_ids and t not in SYSTEM_TASK_IDS])),
         f"id {a.step_task}"),
        ("control task ids", "1" if a.marker_task is not None else "0", "-",
         f"id {a.marker_task} (marker, program-wide)" if a.marker_task is not None else "-"),
        ("DSRs (dest/src0/src1)", "2/1/2", f"{len(DSR_IDS)}/{len(DSR_IDS)}/{len(DSR_IDS)}",
         f"ids {a.dsr_rx}, {a.dsr_tx} (src0: {a.dsr_rx}, receives that add)"),
        ("SRAM bytes", str(a.sram_bytes), str(lim.target.usable_sram_bytes), "arrays of the program"),
    ]
    cap = len([c for c in lim.user_colors if c in lim.target.switch_colors])
    if a.switched or cap < len(lim.user_colors):
        rows.append(("switch colours", str(len(a.switched)), str(cap),
                     f"ids {ids(a.switched)} (switch-chained senders)"))
    if a.teardown:
        rows.append(("teardown handlers", str(len(a.teardown)), "-",
                     f"colours {ids(a.teardown)} (system task 29)"))
    if a.cls.handshakes:
        c = a.cls
        drains = sum(len(b.drain) for b in c.boundaries)
        notifies = sum(len(b.notify) for b in c.boundaries)
        awaits = sum(len(s.awaits) for s in c.segments)
        grants = sum(len(s.grants) for s in c.segments)
        rows.append(("route handshakes", str(c.handshakes), "-",
                     f"emitted: {drains} drain, {notifies} notify, {grants} grant, {awaits} await "
                     "(teardown; docs/csl-backend.md)"))
    return rows


def format_table(rows: list[tuple[str, ...]], prefix: str = "") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = []
    for r in rows:
        cells = [r[0].ljust(widths[0])] + [c.rjust(widths[i]) for i, c in enumerate(r[1:-1], 1)] + [r[-1]]
        out.append((prefix + "  ".join(cells)).rstrip())
    return out
