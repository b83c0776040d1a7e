"""Proving a segment program safe to install, re-derived from the segment IR.

`check_program` trusts neither the recorded `use` nor the passes' own
bookkeeping and returns every violation, each with the op it is located at.
For a `segment.program`:

1. Messages: every flow's sends and receives balance class by class over
   a step, as the interpreter pairs them (`meshrt.analysis.balance`): a
   duplicated or deleted `event.send` / `event.recv` names the flow, the
   classes and their counts.
2. Capacity: for every core class and segment, what its subs bind together
   (sum of demands, max of switch positions) fits the class's budget and
   the target's per-core capacity, and the recorded `use` does not
   understate it.
3. Colours: every live, routed flow (see the liveness definition in
   `meshrt.analysis.liveness`) has exactly one `segment.route`, on a user
   colour, whose routers cover the flow's XY route; and no router carries
   two live flows on one colour. The second check is done pair by pair over
   flows that share a colour: where their routers intersect, every core
   class owning part of the intersection must hold the two flows in
   disjoint sets of segments, and no part may lie on an idle router (the
   segments are recomputed from the definition position by position, not
   with the passes' arc arithmetic).
4. Boundaries: a class with n > 1 segments has the boundaries 0 to 1, ...,
   n-2 to n-1 and n-1 to 0 (the table repeats every decode step); every
   boundary whose closing segment does not end on a collective has a marker
   sync whose region covers the class's cores and the routers of every flow
   the boundary releases or installs, and stays off part of the mesh; each
   segment's `routes` are exactly the flows live at the class's routers, and
   each reconfigure releases and installs exactly the difference; no class
   holds a route of another wafer.
5. Route handshakes (see `meshrt.dialects.segment` and
   `meshrt.passes.insert_route_handshakes`), re-derived from the liveness
   above: at every boundary, each installed flow that carries messages
   (`event.send`) is `notify`d (its install credit exists) and each released
   one is `drain`ed (the router keeps it until its traffic passed); every
   class that sends a flow awaits, on the segment of its first send of it in
   the step, the credit of every class that holds the flow in some but not
   all of its segments, and awaits no credit nobody sends; segment 0 grants
   exactly the flows it holds for the first step's traffic. Programs that
   state no handshake at all are lockstep programs and skip this part unless
   `handshakes=true` (the `segments` pipeline's setting); `handshakes=false`
   never checks it.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from xdsl.ir import Operation

from meshrt.analysis.balance import check_balance
from meshrt.analysis.liveness import (
    ClassTable,
    StageSets,
    flow_refs,
    flow_window,
    step_order,
    tables_of_program,
)
from meshrt.analysis.segmenting import segment_use
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import segment as sg
from meshrt.dialects.mesh import RESOURCE_NAMES
from meshrt.routing import BoxIndex, RectSet, flow_routers, intersecting_pairs
from meshrt.targets import Target


@dataclass
class Problem:
    """One violation: a message and the op it is located at."""

    message: str
    op: Operation | None


def _hold_sets(table: ClassTable, pos: dict[str, int], k: int) -> list[set[int]]:
    """Per segment, the positions at which the class may hold it (the definition, directly)."""
    segs = table.segments
    n = len(segs)
    if n <= 1 or any(not s for s in segs):
        return [set(range(k)) for _ in segs]
    ends = [pos[s[-1].kernel_name] for s in segs]
    firsts = [pos[s[0].kernel_name] for s in segs]
    out: list[set[int]] = []
    for s in range(n):
        held = set()
        prev_end = ends[s - 1] - (k if s == 0 else 0)
        t = prev_end + 1 if firsts[s] > prev_end else firsts[s]
        while t <= ends[s]:
            held.add(t % k)
            t += 1
        out.append(held)
    return out


def _window_set(window, k: int) -> set[int]:
    if window is None:
        return set()
    start, length = window
    return {(start + i) % k for i in range(min(length, k - 1) + 1)}


def _states_handshakes(program: sg.ProgramOp) -> bool:
    for c in program.core_classes():
        for seg in c.segments():
            if seg.awaits is not None or seg.grant is not None:
                return True
        for _, _, _, rec in c.boundaries():
            if rec.notify is not None or rec.drain is not None:
                return True
    return False


def check_program(program: sg.ProgramOp, target: Target | None,
                  handshakes: bool | None = None) -> list[Problem]:
    """Every violation in `program` (see the module docstring); `target` None skips the
    target-capacity check, `handshakes` as the `check-segments` option."""
    problems: list[Problem] = []

    def add(msg: str, op: Operation | None) -> None:
        problems.append(Problem(msg, op))

    mesh = program.mesh_size
    w, h = mesh
    tables = tables_of_program(program)
    classes = {c.class_name: c for c in program.core_classes()}
    flows = {f.flow_name: f for f in program.flows()}
    cap = target.budget() if target is not None else None

    # -- 1. messages --------------------------------------------------------
    for imbalance in check_balance(program, tables):
        add(imbalance.message, imbalance.op)

    # -- 2. capacity -------------------------------------------------------
    for cls in program.core_classes():
        budget = cls.effective_budget()
        for seg in cls.segments():
            use = segment_use(list(seg.subs()))
            for what, limit in (("budget", budget), ("target capacity", cap)):
                if limit is None:
                    continue
                over = use.exceeded(limit)
                if over:
                    res, d, c = over[0]
                    add(f"segment {seg.index_value} of core class @{cls.class_name} binds {d} "
                        f"{RESOURCE_NAMES[res]}, over its {what} of {c}", seg)
            under = [f for f, d, _ in use.exceeded(seg.use.value)]
            if under:
                add(f"segment {seg.index_value} of core class @{cls.class_name} records use "
                    f"<{seg.use}> below what its subs bind (<{use.attr()}>)", seg)

    # -- liveness, recomputed ------------------------------------------------
    try:
        pos = step_order(tables)
    except MeshrtError as e:
        add(e.message, e.op)
        return problems
    k = max(len(pos), 1)
    refs = flow_refs(tables, pos)
    windows = {n: _window_set(flow_window(refs.get(n, ()), k), k) for n in flows}
    holds = {t.name: _hold_sets(t, pos, k) for t in tables}
    xy = {n: flow_routers(f) for n, f in flows.items()}
    stages = StageSets.of(program, tables)

    seg_cache: dict[tuple[str, str], set[int]] = {}

    def live_segs(cls: str, flow: str) -> set[int]:
        key = (cls, flow)
        if key not in seg_cache:
            win = windows[flow]
            if win and stages.apart(cls, flow):  # another stage's flow passing through
                seg_cache[key] = set(range(len(holds[cls])))
            else:
                seg_cache[key] = {s for s, held in enumerate(holds[cls]) if held & win}
        return seg_cache[key]

    # -- 3. colours --------------------------------------------------------
    routes: dict[str, list[sg.RouteOp]] = defaultdict(list)
    for r in program.routes():
        routes[r.flow_name].append(r)
    palette = set(program.user_colors)
    for name, f in flows.items():
        live = bool(windows[name]) and bool(xy[name])
        rs = routes.get(name, [])
        if live and not rs:
            add(f"flow @{name} is live but has no segment.route", f)
        if len(rs) > 1:
            add(f"flow @{name} has {len(rs)} routes", rs[1])
        for r in rs:
            if r.color_id not in palette:
                add(f"route of @{name} uses colour {r.color_id}, not a user colour", r)
            if not RectSet.from_cores(r.via).covers(xy[name]):
                add(f"route of @{name} via <{r.via}> misses routers of its XY route <{xy[name]}>", r)
    by_colour: dict[tuple[int, int], list[sg.RouteOp]] = defaultdict(list)
    for name, rs in routes.items():
        if name in flows and windows[name]:
            by_colour[(flows[name].wafer_index, rs[0].color_id)].append(rs[0])
    by_wafer = defaultdict(list)
    for t in tables:
        by_wafer[t.wafer].append(t)
    via = {r.flow_name: RectSet.from_cores(r.via) for rs in by_colour.values() for r in rs}
    for (wafer, colour), rs in by_colour.items():
        items = [(box, i) for i, r in enumerate(rs) for box in via[r.flow_name]]
        pairs = sorted({
            (min(items[a][1], items[b][1]), max(items[a][1], items[b][1]))
            for a, b in intersecting_pairs(items) if items[a][1] != items[b][1]
        })
        for i, j in pairs:
            a, b = rs[i], rs[j]
            common = via[a.flow_name] & via[b.flow_name]
            clash = _clash(a.flow_name, b.flow_name, common, by_wafer[wafer], live_segs)
            if clash is not None:
                add(f"flows @{a.flow_name} and @{b.flow_name} are both live on colour {colour} "
                    f"at {clash}", b)

    # -- 4. boundaries -------------------------------------------------------
    flow_order = list(flows)
    route_index = {
        wafer: BoxIndex([(b, n) for n in flow_order if flows[n].wafer_index == wafer and windows[n]
                         for b in xy[n]])
        for wafer in {t.wafer for t in tables}
    }
    confs: dict[str, list[list[str]]] = {}
    for t in tables:
        cls = classes[t.name]
        n = len(t.segments)
        expected = [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if n > 1 else [])
        found = {(a, b): (sync, rec) for a, b, sync, rec in cls.boundaries()}
        conf: list[list[str]] = [[] for _ in range(n)]
        confs[t.name] = conf
        idx = route_index[t.wafer]
        crossing = {idx.items[i][1] for b in t.cores for i in idx.query(b)}
        for f in sorted(crossing, key=flow_order.index):
            for s in live_segs(t.name, f):
                conf[s].append(f)
        for seg, want in zip(cls.segments(), conf):
            if seg.routes is not None and seg.route_names() != want:
                add(f"segment {seg.index_value} of core class @{t.name} lists routes "
                    f"[{', '.join('@' + x for x in seg.route_names())}] but the flows live at its "
                    f"routers are [{', '.join('@' + x for x in want)}]", seg)
            for x in seg.route_names():
                if x in flows and flows[x].wafer_index != t.wafer:
                    add(f"segment {seg.index_value} of core class @{t.name} (wafer {t.wafer}) holds "
                        f"route @{x} of wafer {flows[x].wafer_index}", seg)
        for i, j in expected:
            if (i, j) not in found:
                add(f"core class @{t.name} has no boundary {i} to {j}", cls)
                continue
            sync, rec = found[(i, j)]
            release = set(conf[i]) - set(conf[j])
            install = set(conf[j]) - set(conf[i])
            got_rel = {r.root_reference.data for r in rec.release.data}
            got_ins = {r.root_reference.data for r in rec.install.data}
            if got_rel != release or got_ins != install:
                add(f"reconfigure {i} to {j} of core class @{t.name} must release "
                    f"[{_names(release, flows)}] and install [{_names(install, flows)}]", rec)
            closing = t.segments[i]
            if closing and closing[-1].is_collective:
                continue
            if sync is None:
                add(f"boundary {i} to {j} of core class @{t.name} does not end on a collective "
                    f"but has no marker sync", rec)
                continue
            over = RectSet.from_cores(sync.over)
            need = t.cores
            for f in sorted(got_rel | got_ins | release | install):
                if f in xy:
                    need = need | xy[f]
            need = need.clip(w, h)
            if not over.covers(need):
                add(f"marker sync {i} to {j} of core class @{t.name} over <{sync.over}> misses "
                    f"<{need - over}> of the routers its reconfiguration touches", sync)
            if over.clip(w, h).count >= w * h and w * h > 1:
                add(f"marker sync {i} to {j} of core class @{t.name} spans the whole chip", sync)

    # -- 5. route handshakes ----------------------------------------------------
    if handshakes is False or (handshakes is None and not _states_handshakes(program)):
        return problems
    sends: dict[str, list[int]] = defaultdict(list)  # flow -> positions of its event.send
    first_seg: dict[str, dict[str, int]] = {}  # class -> flow -> segment of its first send
    for t in tables:
        firsts: dict[str, int] = {}
        for si, seg in enumerate(t.segments):
            for sub in seg:
                for e in sub.events():
                    if e.name == "event.send":
                        sends[e.flow_name].append(pos[sub.kernel_name])
                        firsts.setdefault(e.flow_name, si)
        first_seg[t.name] = firsts
    takers: dict[str, list[str]] = defaultdict(list)
    for t in tables:
        cls = classes[t.name]
        conf = confs[t.name]
        n = len(conf)
        if n <= 1:
            continue
        held = [set(c) for c in conf]
        for i, j, _, rec in cls.boundaries():
            if not (0 <= i < n and 0 <= j < n):
                continue
            notify, drain = set(rec.notify_names()), set(rec.drain_names())
            for f in conf[j]:
                if f in sends and f not in held[i] and f not in notify:
                    add(f"reconfigure {i} to {j} of core class @{t.name} installs @{f} but does not "
                        f"notify its senders (no install credit before their first send)", rec)
            for f in conf[i]:
                if f in sends and f not in held[j] and f not in drain:
                    add(f"reconfigure {i} to {j} of core class @{t.name} releases @{f} but does not "
                        f"drain it (its traffic may still be passing)", rec)
            for f in sorted(notify - {x for x in conf[j] if x in sends and x not in held[i]}):
                add(f"reconfigure {i} to {j} of core class @{t.name} notifies @{f}, which it does "
                    f"not install or which carries no message", rec)
        grant_want = []
        for f in flow_order:
            if f not in sends or not any(f in h for h in held) or all(f in h for h in held):
                continue
            takers[f].append(t.name)
            if f not in held[0]:
                continue
            b = 0
            while b + 1 < n and f in held[b + 1]:
                b += 1
            if t.segments[b] and min(sends[f]) <= pos[t.segments[b][-1].kernel_name]:
                grant_want.append(f)
        seg0 = cls.segments()[0]
        got = seg0.grant_names()
        if set(got) != set(grant_want):
            add(f"segment 0 of core class @{t.name} grants [{_names(got, flows)}] at program start "
                f"but holds [{_names(grant_want, flows)}] for the first step's traffic", seg0)
    for t in tables:
        cls = classes[t.name]
        segops = cls.segments()
        stated = [set(seg.await_pairs()) for seg in segops]
        for f, si in first_seg[t.name].items():
            for owner in takers.get(f, ()):
                if (owner, f) not in stated[si]:
                    add(f"segment {si} of core class @{t.name} sends @{f} without awaiting the "
                        f"install credit of @{owner} (missing await @{owner}::@{f})", segops[si])
        for seg, pairs in zip(segops, stated):
            for owner, f in sorted(pairs):
                if owner not in takers.get(f, ()):
                    add(f"segment {seg.index_value} of core class @{t.name} awaits a credit of @{f} "
                        f"that @{owner} never sends", seg)
    return problems


def _names(names, flows) -> str:
    order = list(flows)
    return ", ".join("@" + n for n in sorted(names, key=order.index))


def _clash(fa: str, fb: str, common: RectSet, tables: list[ClassTable], live_segs) -> str | None:
    """Where two same-coloured flows are live at one router, or None."""
    if not common:
        return None
    rest = common
    for t in tables:
        part = common & t.cores
        if not part:
            continue
        rest = rest - t.cores
        shared = live_segs(t.name, fa) & live_segs(t.name, fb)
        if shared:
            x, y = part.first_core()
            return f"router ({x}, {y}) of core class @{t.name} in segment {min(shared)}"
    if rest:
        x, y = rest.first_core()
        return f"idle router ({x}, {y})"
    return None
