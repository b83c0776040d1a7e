"""The layout file of one wafer: rectangle, tile code, initial routes, exports.

Every core class gets its program with `@set_tile_code` in loops over the
class's rectangles (coordinates and the rectangle's index as comptime
params); cores no class uses run `idle.csl` (memcpy needs code on every core
of the rectangle). Every coloured flow's routers get `@set_color_config` in
loops over boxes of routers configured alike, from the flow's transport
plan (`streams.py`; a switch chain's rows alternate, so its loops step by
two): routers of no class hold their flows for the whole step; a class's
routers start in the configuration of the class's segment 0 (later
segments are installed at run time by the class's own program). Switch-
chain routers get their switch positions; a flow a class holds in segment 0
without a grant starts in teardown (route handshakes, `handshakes.py`).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from meshrt.backend.csl import percore, streams
from meshrt.backend.csl.alloc import switched_colors
from meshrt.backend.csl.handshakes import frozen_at_start
from meshrt.backend.csl.model import CoreClass, Flow, Program
from meshrt.diagnostics import MeshrtError
from meshrt.routing import Box, RectSet, intersecting_pairs


@dataclass
class RouteStats:
    boxes: int = 0
    phased: int = 0  # routers switched between receive and send at run time
    switched: int = 0  # switch-chain routers (serialised senders)
    relayed: int = 0  # relay-line routers
    frozen: int = 0  # routers whose colour starts in teardown
    schemes: dict[str, int] = field(default_factory=dict)  # transport -> flows
    notes: list[str] = field(default_factory=list)


def rectangle(program: Program, wafer: int) -> tuple[int, int]:
    w = h = 1
    for c in program.classes_on(wafer):
        for b in c.boxes:
            w, h = max(w, b[2]), max(h, b[3])
    for f in program.flows_on(wafer):
        for b, _ in f.configs(program.width, program.height):
            w, h = max(w, b[2]), max(h, b[3])
    return w, h


def _fill(call: str, x, y) -> str:
    return call.replace("{x}", str(x)).replace("{y}", str(y))


def _loops(box, call: str, indent: str = "  ") -> list[str]:
    """`call` (with {x} / {y} placeholders) over the routers of `box` (a dense box,
    or a strided one: (x0, y0, x1, y1, sx, sy))."""
    x0, y0, x1, y1 = box[:4]
    sx, sy = (box[4], box[5]) if len(box) == 6 else (1, 1)
    nx, ny = len(range(x0, x1, sx)), len(range(y0, y1, sy))
    if nx == 1 and ny == 1:
        return [indent + _fill(call, x0, y0)]
    out = []
    inner = indent
    if nx > 1:
        out.append(f"{indent}for (@range(i16, {x0}, {x1}, {sx})) |x| {{")
        inner += "  "
    if ny > 1:
        out.append(f"{inner}for (@range(i16, {y0}, {y1}, {sy})) |y| {{")
    body_indent = inner + ("  " if ny > 1 else "")
    out.append(body_indent + _fill(call, "x" if nx > 1 else x0, "y" if ny > 1 else y0))
    if ny > 1:
        out.append(f"{inner}}}")
    if nx > 1:
        out.append(f"{indent}}}")
    return out


def _dirs(ds) -> str:
    return ".{ " + ", ".join(ds) + " }" if ds else ".{}"


def first_use(cls: CoreClass, flow: str) -> str:
    for e in cls.segments[0].events():
        if e.flow == flow:
            return "send" if e.kind in ("send", "produce") else "recv"
    return "recv"


def idle_cores(program: Program, wafer: int) -> RectSet:
    """Cores of the wafer's rectangle that no class uses (they run idle.csl)."""
    W, H = rectangle(program, wafer)
    return RectSet([(0, 0, W, H)]) - RectSet([b for c in program.classes_on(wafer) for b in c.boxes])


def _merge_pieces(pieces: list) -> tuple[list, list]:
    """(dense boxes, strided boxes) covering the same routers with fewer loops: a
    snake's every-other rows (or columns) that class rectangles cut apart join
    again, along their dense axis and along their stride."""
    dense, strided = [], []
    rows = defaultdict(set)  # (x0, x1) -> rows of boxes one row high or stepping by 2 in y
    cols = defaultdict(set)  # (y0, y1) -> columns
    for p in pieces:
        x0, y0, x1, y1, sx, sy = p
        if sx == 1 and (sy == 2 or y1 - y0 == 1):
            rows[(x0, x1)].update(range(y0, y1, sy))
        elif sy == 1 and (sx == 2 or x1 - x0 == 1):
            cols[(y0, y1)].update(range(x0, x1, sx))
        elif sx == 1 and sy == 1:
            dense.append(p[:4])
        else:  # pragma: no cover - pieces step along one axis only
            strided.append(p)
    # Rows: join equal row sets along x, then split them into step-2 runs; columns
    # the same with the axes swapped.
    for lines, across in ((rows, False), (cols, True)):
        by_lines = defaultdict(list)
        for iv, at in lines.items():
            by_lines[frozenset(at)].append(iv)
        for at, ivs in by_lines.items():
            for a, b in _join(ivs):
                for run in _step2_runs(at):
                    lo, hi = run[0], run[-1] + 1
                    if len(run) == 1:
                        dense.append((lo, a, hi, b) if across else (a, lo, b, hi))
                    else:
                        strided.append((lo, a, hi, b, 2, 1) if across else (a, lo, b, hi, 1, 2))
    return dense, strided


def _step2_runs(values) -> list[list[int]]:
    """Sorted values cut into runs that step by 2."""
    out, cur = [], []
    for v in sorted(values):
        if cur and v - cur[-1] != 2:
            out.append(cur)
            cur = []
        cur.append(v)
    if cur:
        out.append(cur)
    return out


def _join(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for a, b in sorted(intervals):
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


def idle_teardown_colors(program: Program, wafer: int, idle: RectSet, drained: set[str]) -> list[int]:
    """Colours whose end-of-flow teardowns pass idle routers (idle.csl handles them)."""
    out = set()
    for name in drained:
        plan = streams.plans(program).get(name)
        f = program.flows.get(name)
        if plan is None or f is None or f.wafer != wafer:
            continue
        for s, _ in plan.cells:
            bb = streams.sbox_bbox(s)
            if any(streams.sbox_clip(s, b) is not None for b in (idle & RectSet([bb])).boxes):
                out.add(plan.color)
                break
    return sorted(out)


def write_layout(program: Program, wafer: int, arch: str, exports: dict[str, str],
                 stats: RouteStats) -> str:
    classes = program.classes_on(wafer)
    W, H = rectangle(program, wafer)
    holders: dict[str, list[CoreClass]] = defaultdict(list)  # flow -> classes holding it in segment 0
    for c in classes:
        for f in c.segments[0].routes:
            holders[f].append(c)
    idle = idle_cores(program, wafer)
    colors = sorted({f.color for f in program.flows_on(wafer)})
    out: list[str] = []
    add = out.append
    add(f"// meshrt CSL backend: layout of program @{program.name}, wafer {wafer} of {program.wafers}")
    add(f"// arch {arch} (SDK 1.4 syntax), target {program.target}; rectangle {W} x {H}.")
    add(f"// {len(classes)} core class(es), one program file each"
        + (", plus idle.csl for the cores no class uses" if idle else "") + ".")
    add(f"// colours used: {', '.join(map(str, colors)) or 'none'}; memcpy keeps its own "
        f"(reserved: {', '.join(map(str, program.op.reserved))}).")
    add("// Generated; checked for CSL syntax (meshrt csl-lint), not compiled by cslc.")
    add("")
    add(f'const memcpy = @import_module("<memcpy/get_params>", .{{ .width = {W}, .height = {H} }});')
    add("// Switch positions of a switch-chain router (several senders serialised, streams.py):")
    add("// position 0 forwards the chain predecessor, position 1 takes this core's ramp.")
    add(f"const chain_switches = {CHAIN_SWITCHES};")
    add("")
    add("layout {")
    add(f"  @set_rectangle({W}, {H});")
    add("")
    add("  // ---- programs: one file per core class; coordinates and the rectangle index")
    add("  // ---- are the class's comptime parameters")
    for c in classes:
        add(f"  // core class @{c.name}: {c.cores} core(s)")
        for i, b in enumerate(c.boxes):
            extra = "".join(f", .{k} = {v}" for k, v in sorted(c.params.items()))
            call = (f'@set_tile_code({{x}}, {{y}}, "{c.file}", .{{ .memcpy_params = '
                    f"memcpy.get_params({{x}}), .px = {{x}}, .py = {{y}}, .region = {i}{extra} }});")
            out.extend(_loops(b, call))
    if idle:
        add("  // cores of no class: memcpy and pass-through routing only")
        for b in idle.boxes:
            out.extend(_loops(b, '@set_tile_code({x}, {y}, "idle.csl", .{ .memcpy_params = '
                                 'memcpy.get_params({x}), .px = {x}, .py = {y}, .region = 0 });'))
    add("")
    add("  // ---- initial routes: per flow, boxes of routers configured alike")
    seen: dict[int, list[tuple[Box, Flow]]] = defaultdict(list)
    for f in program.flows_on(wafer):
        lines = _flow_routes(program, f, holders.get(f.name, []), idle, stats, seen)
        if lines:
            plan = streams.plans(program).get(f.name)
            add(f"  // @{f.name}: colour {f.color}, pattern {f.op.pattern.data}, "
                f"{plan.scheme if plan else 'unrouted'}")
            out.extend(lines)
    _check_overlaps(seen)
    add("")
    add("  // ---- host-visible symbols")
    for sym in sorted(exports):
        typ = exports[sym]
        if typ.startswith("fn"):
            add(f'  @export_name("{sym}", {typ});')
        else:
            add(f'  @export_name("{sym}", {typ}, true);')
    add('  @export_name("start", fn()void);')
    add("}")
    return "\n".join(out) + "\n"


def _check_overlaps(seen: dict[int, list[tuple[Box, Flow]]]) -> None:
    """Two flows never share a colour at one router in the initial configuration."""
    for color, items in seen.items():
        for i, j in intersecting_pairs(items):
            (a, fa), (b, fb) = items[i], items[j]
            if fa is fb:
                continue
            x0, y0 = max(a[0], b[0]), max(a[1], b[1])
            raise MeshrtError(
                f"colour {color} is configured for both @{fa.name} and @{fb.name} at router "
                f"({x0}, {y0}) of wafer {fb.wafer} in the initial configuration", fb.op)


# Switch-chain routers (streams.py): position 1 takes the ramp; ring mode and
# pop-on-advance as in the SDK's allreduce library. Declared once per layout.
CHAIN_SWITCHES = ".{ .pos1 = .{ .rx = RAMP }, .ring_mode = true, .pop_mode = .{ .pop_on_advance = true } }"
SWITCHES = ".switches = chain_switches"


def _flow_routes(program: Program, f: Flow, holders: list[CoreClass], idle: RectSet,
                 stats: RouteStats, seen: dict[int, list[tuple[Box, Flow]]]) -> list[str]:
    out: list[str] = []
    plan = streams.plans(program).get(f.name)
    if plan is None:
        return out
    stats.schemes[plan.scheme] = stats.schemes.get(plan.scheme, 0) + 1
    groups: dict[tuple, list] = {}
    frozen = {c.name: frozen_at_start(program, c) for c in holders}
    # a class that switch-chains this colour in any segment keeps ring and pop mode on it
    switched = {c.name for c in holders if f.color in switched_colors(program, c)}
    held: dict[int, list[tuple]] = defaultdict(list)  # cell index -> (piece, holder class)
    for cls in holders:
        for c, i in percore.clip_to([(s, i) for i, (s, _) in enumerate(plan.cells)], cls.boxes):
            held[i].append((c, cls))
    for i, (s, cfg) in enumerate(plan.cells):
        bb = streams.sbox_bbox(s)
        parts: list[tuple] = []
        for b in (idle & RectSet([bb])).boxes:
            c = streams.sbox_clip(s, b)
            if c is not None:
                parts.append((c, None))
        for c, cls in parts + held[i]:
            name = cfg.phases[0][0]
            if cls is not None and cfg.phased and name in ("recv", "send"):
                name = first_use(cls, f.name)
            rx, tx = cfg.phase(name) or cfg.initial
            cold = cls is not None and f.name in frozen[cls.name]
            n = streams.sbox_count(c)
            stats.phased += n if cfg.phased else 0
            stats.switched += n if cfg.switch else 0
            stats.relayed += n if name in streams.RELAY_PHASES else 0
            stats.frozen += n if cold else 0
            switch = cfg.switch or (cls is not None and cls.name in switched)
            groups.setdefault((rx, tx, name if cfg.phased else "static", switch, cold), []).append(c)
    # Routers configured alike merge back into few boxes, whatever class they are on.
    for (rx, tx, phase, switch, cold), pieces in groups.items():
        dense, strided = _merge_pieces(pieces)
        for b in list(RectSet(dense).boxes) + strided:
            stats.boxes += 1
            seen[f.color].append((b[:4], f))
            extra = (", " + SWITCHES if switch else "") + (", .teardown = true" if cold else "")
            call = (f"@set_color_config({{x}}, {{y}}, @get_color({f.color}), .{{ .routes = .{{ "
                    f".rx = {_dirs(rx)}, .tx = {_dirs(tx)} }}{extra} }});")
            lines = _loops(b, call)
            notes = []
            if phase != "static":
                notes.append(f"run-time phases: starts in its {phase.replace('_', ' ')} phase")
            if cold:
                notes.append("held in teardown until its class's first install")
            if notes:
                lines[0] += "  // " + "; ".join(notes)
            out.extend(lines)
    if plan.per_line is not None:
        (x0, y0, x1, y1, _, _), (hx0, hy0, hx1, hy1, _, _) = plan.firsts[0], plan.heads[0]
        out.insert(0, f"  // {plan.chain.count} senders switch-chained, {plan.per_line} per line: "
                      f"firsts ({x0}..{x1 - 1}, {y0}..{y1 - 1}), heads ({hx0}..{hx1 - 1}, {hy0}..{hy1 - 1})")
    elif plan.scheme in (streams.CHAIN, streams.RELAY) and plan.chain is not None:
        out.insert(0, f"  // {plan.chain.count} senders switch-chained: first ({plan.first[0]}, {plan.first[1]}), "
                      f"head ({plan.head[0]}, {plan.head[1]})")
    if plan.scheme == streams.RELAY:
        r = plan.relay
        out.insert(0, f"  // relay line: {r.m} receiver(s) from ({r.r0[0]}, {r.r0[1]}) stepping "
                      f"{r.step}, {r.others} other sender(s) chained into its start")
    return out
