"""The layout file of one wafer: rectangle, tile code, initial routes, exports.

Every core class gets its program with `@set_tile_code` in loops over the
class's rectangles (coordinates and the rectangle's index as comptime
params); cores no class uses run `idle.csl` (memcpy needs code on every core
of the rectangle). Every coloured flow's routers get `@set_color_config` in
loops over boxes of routers configured alike (`routes.py`): routers of no
class hold their flows for the whole step; a class's routers start in the
configuration of the class's segment 0 (later segments are installed at run
time by the class's own program).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from meshrt.backend.csl.model import CoreClass, Flow, Program
from meshrt.backend.csl.routes import RouterConfig
from meshrt.diagnostics import MeshrtError
from meshrt.routing import Box, RectSet, box_intersection, intersecting_pairs


@dataclass
class RouteStats:
    boxes: int = 0
    merging: int = 0  # routers where several input sides feed one colour
    looping: int = 0  # routers where a side is both input and output
    phased: int = 0  # routers switched between receive and send at run time
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


def _loops(box: Box, call: str, indent: str = "  ") -> list[str]:
    """`call` (with {x} / {y} placeholders) over the routers of `box`."""
    x0, y0, x1, y1 = box
    if x1 - x0 == 1 and y1 - y0 == 1:
        return [indent + _fill(call, x0, y0)]
    out = []
    inner = indent
    if x1 - x0 > 1:
        out.append(f"{indent}for (@range(i16, {x0}, {x1}, 1)) |x| {{")
        inner += "  "
    if y1 - y0 > 1:
        out.append(f"{inner}for (@range(i16, {y0}, {y1}, 1)) |y| {{")
    body_indent = inner + ("  " if y1 - y0 > 1 else "")
    out.append(body_indent + _fill(call, "x" if x1 - x0 > 1 else x0, "y" if y1 - y0 > 1 else y0))
    if y1 - y0 > 1:
        out.append(f"{inner}}}")
    if x1 - x0 > 1:
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
            add(f"  // @{f.name}: colour {f.color}, pattern {f.op.pattern.data}")
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


def _flow_routes(program: Program, f: Flow, holders: list[CoreClass], idle: RectSet,
                 stats: RouteStats, seen: dict[int, list[tuple[Box, Flow]]]) -> list[str]:
    out: list[str] = []
    groups: dict[tuple, list[Box]] = {}
    loops = 0
    for box, cfg in f.configs(program.width, program.height):
        parts: list[tuple[Box, RouterConfig, str]] = []
        for b in (idle & RectSet([box])).boxes:
            parts.append((b, cfg, "static"))
        for cls in holders:
            for cbox in cls.boxes:
                b = box_intersection(box, cbox)
                if b is not None:
                    phase = first_use(cls, f.name) if cfg.phased else "static"
                    parts.append((b, cfg, phase))
        for b, c, phase in parts:
            if phase == "recv":
                rx, tx = c.recv_phase()
            elif phase == "send":
                rx, tx = c.send_phase()
            else:
                rx, tx = c.static()
            n = (b[2] - b[0]) * (b[3] - b[1])
            stats.phased += n if c.phased else 0
            stats.merging += n if c.merges else 0
            stats.looping += n if c.loops else 0
            if c.loops:
                loops += n
            groups.setdefault((rx, tx, phase), []).append(b)
    # Routers configured alike merge back into few boxes, whatever class they are on.
    for (rx, tx, phase), boxes in groups.items():
        for b in RectSet(boxes).boxes:
            stats.boxes += 1
            seen[f.color].append((b, f))
            call = (f"@set_color_config({{x}}, {{y}}, @get_color({f.color}), .{{ .routes = .{{ "
                    f".rx = {_dirs(rx)}, .tx = {_dirs(tx)} }} }});")
            lines = _loops(b, call)
            if phase != "static":
                lines[0] += "  // run-time phases: starts in its " + phase + " phase"
            out.extend(lines)
    if loops:
        out.insert(0, f"  // WARNING: {loops} router(s) of this flow send wavelets back towards a side "
                      "they accept them from (several senders on one colour; see docs/csl-backend.md)")
    return out
