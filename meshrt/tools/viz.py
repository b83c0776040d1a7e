"""`meshrt viz`: pictures of a compiled model on the mesh (mapping, core classes, routes, load).

    meshrt viz MODEL|IR --target T [--what mapping|classes|routes|load] [-o FILE.png|FILE.svg]
               [--wafer N] [--color C] [--segment S] [--steps N] [--seed S]

MODEL is a .mrt spec or a config.json, compiled for target T as far as the
picture needs (kernel IR for `mapping`, coloured segment IR for the others);
IR is a printed .mlir file at any level, lowered the rest of the way as
`meshrt run` does (its target is the one the IR records; `--target` may give
it, e.g. the target file it was compiled for, and is refused when the IR
exceeds its figures).

- `mapping` (default): every kernel's tiles, coloured by kernel kind and
  labelled where the name fits, with the outline of each pipeline stage.
- `classes`: the core classes of the segment IR, one box per dense piece of
  each class's core set, hatched by the class's number of segments.
- `routes`: the routers of every coloured flow (`segment.route ... via`), one
  colour per hardware colour id; `--color C` keeps the flows on colour C,
  `--segment S` the flows some class holds in its segment S; arrows go from
  senders to receivers when there are few enough flows.
- `load`: runs the interpreter's timing model (`meshrt.runtime.mesh_sim`,
  every core, `--steps` decode steps, asynchrony seed `--seed`) and draws
  each core's busy fraction and waiting fraction (stall cycles / run cycles).
  Only on targets the simulator can run core by core (test32, test16).

One panel per wafer (`--wafer N`: only that one). Drawing grows with the
number of kernels, classes and flows, never with the mesh area (one patch per
box), except `load`, which is per core on the small targets only. The data
behind each picture comes from small pure functions (`mapping_boxes`,
`stage_outlines`, `class_boxes`, `route_segments`, `flow_arrows`,
`load_map`) that the tests check without pixels.

Errors in the input are one located line on stderr and exit 1, like
`meshrt compile` and `meshrt run`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshrt.driver import program_of
from meshrt.kernels import registry
from meshrt.diagnostics import FrontendError
from meshrt.limits import check_memory
from meshrt.tools.common import fail as _fail
from meshrt.tools.common import progress_bar
from meshrt.output import save_figure

WHATS = ("mapping", "classes", "routes", "load")
DEFAULT_STEPS = 8
ARROW_LIMIT = 200  # most flows drawn with a sender -> receiver arrow
DPI = 150



def kind_colors() -> dict[str, str]:
    """Colour of each mesh kernel kind (its VIZ_COLOR), in the order that decides which
    kind names a region several kernels share (lowest VIZ_RANK first)."""
    kinds = sorted(registry.kernels().items(), key=lambda kv: kv[1].VIZ_RANK)
    return {name: op.VIZ_COLOR for name, op in kinds}


class VizError(ValueError):
    """Bad input for a picture; the message has no location (main adds it)."""


# ---------------------------------------------------------------------------
# What is drawn (pure functions of the IR)
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Box:
    """One kernel tile: kernel `label` of `kind` on cores x..x+w-1, y..y+h-1 of `wafer`."""

    label: str
    kind: str
    wafer: int
    x: int
    y: int
    w: int
    h: int
    stage: int = 0
    tile: int = 0  # index among the kernel's tiles (expert regions)
    experts: tuple[int, ...] = ()  # expert_ffn: the experts placed on this tile


@dataclass(frozen=True)
class ClassBox:
    """One dense piece of core class `name`'s core set."""

    name: str
    wafer: int
    segments: int
    x: int
    y: int
    w: int
    h: int
    index: int = 0  # the class's position in the program


@dataclass(frozen=True)
class RouteBox:
    """One dense piece of the routers flow `flow` crosses on hardware colour `color`."""

    flow: str
    color: int
    wafer: int
    x: int
    y: int
    w: int
    h: int


@dataclass(frozen=True)
class Arrow:
    """Flow `flow` from the centre of its senders to the centre of its receivers."""

    flow: str
    color: int
    wafer: int
    x0: float
    y0: float
    x1: float
    y1: float


@dataclass(frozen=True)
class Edge:
    """A piece of a stage outline from (x0, y0) to (x1, y1) (core-grid corners)."""

    wafer: int
    stage: int
    x0: int
    y0: int
    x1: int
    y1: int


@dataclass
class LoadMap:
    """Per-core fractions of a timing run; NaN where no class runs."""

    busy: object  # numpy array (wafers, height, width)
    waiting: object  # numpy array (wafers, height, width): stall cycles / cycles
    cycles: int
    steps: int
    completed: bool
    reports: list[str]
    inflight: int


def _dense_pieces(cores) -> list[tuple[int, int, int, int]]:
    """(x, y, w, h) of the dense boxes of a core set (strided rects cut or bounded)."""
    from meshrt.routing import rect_boxes

    return [(x0, y0, x1 - x0, y1 - y0) for r in cores.rects.data for x0, y0, x1, y1 in rect_boxes(r)]


def mapping_boxes(module) -> list[Box]:
    """One Box per kernel tile, from mesh_kernel IR (`tiles()`) or from the
    `event.kernel` records of event / segment IR (their region's rects)."""
    from xdsl.utils.exceptions import VerifyException

    from meshrt.dialects import mesh_kernel as mk
    from meshrt.dialects.event import KernelInfoOp

    program = program_of(module)
    out: list[Box] = []

    def add(name: str, kind: str, wafer: int, stage: int, tiles, placement) -> None:
        on: dict[int, list[int]] = {}
        for e, r in enumerate(placement or ()):
            on.setdefault(r, []).append(e)
        for i, (x, y, w, h) in enumerate(tiles):
            out.append(Box(name, kind, wafer, x, y, w, h, stage, i, tuple(on.get(i, ()))))

    if isinstance(program, mk.ProgramOp):
        for k in program.kernels():
            try:
                tiles = k.tiles()
            except VerifyException:  # not one dense rect per tile: draw the region's pieces
                tiles = _dense_pieces(k.region)
            placement = k.expert_placement if k.PLACES_EXPERTS else None
            add(k.kernel_name, k.kernel_kind(), k.wafer_index, k.stage_index, tiles, placement)
        return out
    kernels = [op for op in program.body.block.ops if isinstance(op, KernelInfoOp)]
    if not kernels:
        raise VizError(f"'{program.name}' @{program.program_name} holds no mesh kernels to draw "
                       "(graph IR is lowered first)")
    for k in kernels:
        regions = k.param("expert_regions")
        places = registry.kind(k.kind.data).PLACES_EXPERTS
        if places and regions:
            tiles = [p for r in regions for p in _dense_pieces(r)]
        else:
            tiles = _dense_pieces(k.region)
        add(k.kernel_name, k.kind.data, int(k.param("wafer", 0)), k.stage_index, tiles,
            k.param("placement") if places else None)
    return out


def stage_outlines(boxes: Sequence[Box]) -> list[Edge]:
    """The boundary of each pipeline stage's cores (union of its kernels' tiles)
    as grid-line pieces; cost grows with the number of boxes, not cores."""
    from meshrt.routing import RectSet

    by_stage: dict[tuple[int, int], list] = {}
    for b in boxes:
        by_stage.setdefault((b.wafer, b.stage), []).append((b.x, b.y, b.x + b.w, b.y + b.h))
    out: list[Edge] = []
    for (wafer, stage), bs in sorted(by_stage.items()):
        union = RectSet(bs)
        for x0, y0, x1, y1 in union:
            # each side of each box, minus where the neighbouring cell is inside
            for (sx0, sy0, sx1, sy1), horizontal, at in (
                ((x0, y0 - 1, x1, y0), True, y0),
                ((x0, y1, x1, y1 + 1), True, y1),
                ((x0 - 1, y0, x0, y1), False, x0),
                ((x1, y0, x1 + 1, y1), False, x1),
            ):
                for a0, b0, a1, b1 in RectSet([(sx0, sy0, sx1, sy1)]) - union:
                    if horizontal:
                        out.append(Edge(wafer, stage, a0, at, a1, at))
                    else:
                        out.append(Edge(wafer, stage, at, b0, at, b1))
    return out


def class_boxes(program) -> list[ClassBox]:
    """The dense pieces of every core class's core set (segment IR)."""
    from meshrt.dialects import segment as sg
    from meshrt.routing import RectSet

    program = program_of(program)
    if not isinstance(program, sg.ProgramOp):
        raise VizError(f"core classes need segment IR, got '{program.name}'")
    out: list[ClassBox] = []
    for i, c in enumerate(program.core_classes()):
        n = len(c.segments())
        for x0, y0, x1, y1 in RectSet.from_cores(c.cores):
            out.append(ClassBox(c.class_name, c.wafer_index, n, x0, y0, x1 - x0, y1 - y0, i))
    return out


def max_segments(program) -> int:
    return max((len(c.segments()) for c in program_of(program).core_classes()), default=0)


def live_flows(program, segment: int) -> set[str]:
    """Flows whose routes some class's routers hold in its segment `segment`."""
    out: set[str] = set()
    for c in program_of(program).core_classes():
        segs = c.segments()
        if segment < len(segs):
            out.update(segs[segment].route_names())
    return out


def _routes(program, color: int | None, segment: int | None):
    """(route, flow) pairs kept by the filters; VizError when a filter names nothing."""
    from meshrt.dialects import segment as sg

    program = program_of(program)
    if not isinstance(program, sg.ProgramOp):
        raise VizError(f"routes need coloured segment IR, got '{program.name}'")
    flows = {f.flow_name: f for f in program.flows()}
    routes = program.routes()
    if not routes:
        raise VizError(f"@{program.program_name} has no segment.route: the segment IR is not "
                       "coloured yet (run color-routes)")
    used = sorted({r.color_id for r in routes})
    if color is not None and color not in used:
        raise VizError(f"colour {color} carries no flow (colours used: {_ranges(used)})")
    if segment is not None:
        n = max_segments(program)
        if not 0 <= segment < n:
            raise VizError(f"--segment {segment} is out of range: the classes have segments "
                           f"0..{n - 1}")
        live = live_flows(program, segment)
    kept = [(r, flows[r.flow_name]) for r in routes
            if (color is None or r.color_id == color)
            and (segment is None or r.flow_name in live)]
    if not kept:  # both filters name something, but not together
        raise VizError(f"no flow{'' if color is None else f' on colour {color}'} is live in "
                       f"segment {segment}")
    return kept


def route_segments(program, color: int | None = None, segment: int | None = None) -> list[RouteBox]:
    """The routers of every coloured flow (one RouteBox per dense box of its
    `via` set), optionally only colour `color` and / or flows live in `segment`."""
    return [RouteBox(r.flow_name, r.color_id, f.wafer_index, x, y, w, h)
            for r, f in _routes(program, color, segment) for x, y, w, h in _dense_pieces(r.via)]


def flow_arrows(program, color: int | None = None, segment: int | None = None) -> list[Arrow]:
    """One arrow per routed flow, sender-set centre -> receiver-set centre."""
    out: list[Arrow] = []
    for r, f in _routes(program, color, segment):
        sx0, sy0, sx1, sy1 = f.src.extent
        dx0, dy0, dx1, dy1 = f.dst.extent
        a = Arrow(f.flow_name, r.color_id, f.wafer_index, (sx0 + sx1) / 2, (sy0 + sy1) / 2,
                  (dx0 + dx1) / 2, (dy0 + dy1) / 2)
        if (a.x0, a.y0) != (a.x1, a.y1):
            out.append(a)
    return out


SPAN_BYTES = 160  # one traced event: a 5-tuple in the simulator's span list


def load_map_bytes(program, target, steps: int) -> int:
    """Bytes `load_map` keeps for `steps` decode steps, estimated before the
    run: one traced span per instruction of every core's table per step."""
    from meshrt.runtime.schedule import flatten

    per_step = sum(c.cores.count * len(c.instrs) for c in flatten(program_of(program), target).classes)
    return steps * per_step * SPAN_BYTES


def load_map(program, target, steps: int = DEFAULT_STEPS, seed: int = 0,
             progress: Callable[[int], None] | None = None) -> LoadMap:
    """Run `steps` decode steps of the timing model core by core and return each
    core's busy fraction (its run time minus its stall cycles, over the run's
    cycles) and waiting fraction (stall cycles over the run's cycles).

    Pipelined programs run with one micro-batch per stage in flight, as
    `meshrt.runtime.serving` does. `progress(steps done)` is called now and
    then during the run."""
    import numpy as np

    from meshrt.runtime.cost_model import default_in_flight
    from meshrt.runtime.mesh_sim import MeshSim

    program = program_of(program)
    inflight = default_in_flight(program)
    report = None if progress is None else (lambda sim: progress(len(sim.step_end)))
    res = MeshSim(program, target, seed=seed, trace=True, inflight=inflight).run(steps, report)
    width, height = program.mesh_size
    busy = np.full((program.num_wafers, height, width), np.nan)
    waiting = np.full_like(busy, np.nan)
    finish = [0] * len(res.cores)
    for core, _cls, _name, _start, end in res.spans or ():
        finish[core] = max(finish[core], end)
    cycles = max(res.cycles, 1)
    for i, (pos, _cname) in enumerate(res.cores):
        w, x, y = pos
        stalled = sum(res.stalls.get(pos, {}).values())
        ran = min(finish[i], cycles)
        busy[w, y, x] = min(1.0, max(0, ran - stalled) / cycles)
        waiting[w, y, x] = min(1.0, stalled / cycles)
    return LoadMap(busy, waiting, res.cycles, res.steps, res.completed,
                   [str(r) for r in res.reports], inflight)


def _ranges(values: Iterable[int]) -> str:
    vs = sorted(set(values))
    parts, i = [], 0
    while i < len(vs):
        j = i
        while j + 1 < len(vs) and vs[j + 1] == vs[j] + 1:
            j += 1
        parts.append(str(vs[i]) if i == j else f"{vs[i]}-{vs[j]}")
        i = j + 1
    return ", ".join(parts)


# ---------------------------------------------------------------------------
# Drawing
# ---------------------------------------------------------------------------


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


class _Layout:
    """A figure of mesh panels (`grid` rows x columns, each (wafer, title)) laid
    out in inches, a title band on top and a legend band below; knows the
    pixels per core, so labels are only drawn where they fit."""

    def __init__(self, grid: Sequence[Sequence[tuple[int, str]]], width: int, height: int, title: str,
                 legend_rows: int = 0, colorbar: bool = False):
        import textwrap

        plt = _plt()
        rows, cols = len(grid), max(len(r) for r in grid)
        pw = 7.0 if cols == 1 else max(3.2, 13.0 / cols)
        ph = pw * height / width
        cap = 9.0 if rows == 1 else 4.8
        if ph > cap:
            pw, ph = pw * cap / ph, cap
        gap, left, right, rgap = 0.35, 0.45, 0.25 + (0.9 if colorbar else 0.0), 0.45
        fw = left + cols * pw + (cols - 1) * gap + right
        title = "\n".join(textwrap.wrap(title, max(40, int(fw * 72 / (9 * 0.58)))))
        top = 0.5 + 0.17 * title.count("\n")
        bottom = 0.35 + (0.19 * legend_rows + 0.25 if legend_rows else 0.0)
        fh = top + rows * ph + (rows - 1) * rgap + bottom
        self.fig = plt.figure(figsize=(fw, fh), dpi=DPI)
        self.fig.suptitle(title, fontsize=9, y=1 - 0.12 / fh, va="top")
        self.panels: list[tuple[object, int]] = []  # (axes, wafer)
        for r, row in enumerate(grid):
            for c, (wafer, name) in enumerate(row):
                x = (left + c * (pw + gap)) / fw
                y = (bottom + (rows - 1 - r) * (ph + rgap)) / fh
                ax = self.fig.add_axes((x, y, pw / fw, ph / fh))
                ax.set_xlim(0, width)
                ax.set_ylim(height, 0)  # row 0 at the top, as the mesh is numbered
                ax.set_aspect("equal")
                ax.tick_params(labelsize=6, length=2)
                ax.set_facecolor("#f7f7f7")
                ax.set_title(name, fontsize=8, pad=3)
                self.panels.append((ax, wafer))
        self.px_per_core = min(pw * DPI / width, ph * DPI / height)
        self.fh = fh
        self.colorbar_rect = ((fw - right + 0.25) / fw, bottom / fh, 0.15 / fw,
                              (rows * ph + (rows - 1) * rgap) / fh)

    @staticmethod
    def row(wafers: Sequence[int]) -> list[list[tuple[int, str]]]:
        return [[(w, f"wafer {w}") for w in wafers]]

    def legend(self, handles, ncol: int) -> None:
        if handles:
            self.fig.legend(handles=handles, loc="lower center", ncol=ncol, fontsize=6.5,
                            frameon=False, bbox_to_anchor=(0.5, 0.12 / self.fh),
                            handlelength=1.6, columnspacing=1.2)

    def save(self, out: str) -> None:
        plt = _plt()
        try:
            save_figure(self.fig, out, dpi=DPI)
        finally:
            plt.close(self.fig)


def _label_fit(text: str, wpx: float, hpx: float, size: float) -> int | None:
    """Rotation (0 or 90) at which `text` fits a box of wpx x hpx pixels, or None."""
    lines = text.split("\n")
    tw = max(len(s) for s in lines) * size * 0.62 * DPI / 72 + 2
    th = len(lines) * size * 1.25 * DPI / 72 + 1
    if tw <= wpx and th <= hpx:
        return 0
    if tw <= hpx and th <= wpx:
        return 90
    return None


def _label(ax, text: str, x: int, y: int, w: int, h: int, px: float, size: float = 5.5,
           alternatives: Sequence[str] = (), backdrop: bool = False) -> None:
    for t in (text, *alternatives):
        rot = _label_fit(t, w * px, h * px, size)
        if rot is not None:
            bbox = ({"boxstyle": "square,pad=0.1", "facecolor": "white", "edgecolor": "none",
                     "alpha": 0.75} if backdrop else None)
            ax.text(x + w / 2, y + h / 2, t, ha="center", va="center", fontsize=size, rotation=rot,
                    clip_on=True, linespacing=1.0, bbox=bbox)
            return


def _rects(boxes: Iterable[tuple[int, int, int, int]]):
    from matplotlib.patches import Rectangle

    return [Rectangle((x, y), w, h) for x, y, w, h in boxes]


def _collection(ax, boxes, **kw) -> None:
    from matplotlib.collections import PatchCollection

    patches = _rects(boxes)
    if patches:
        ax.add_collection(PatchCollection(patches, match_original=False, **kw))


def _wafer_frame(ax, width: int, height: int) -> None:
    from matplotlib.patches import Rectangle

    ax.add_patch(Rectangle((0, 0), width, height, fill=False, edgecolor="black", linewidth=1.0))


def draw_mapping(program, boxes: Sequence[Box], wafers: Sequence[int], out: str) -> None:
    from matplotlib.collections import LineCollection
    from matplotlib.patches import Patch

    width, height = program.mesh_size
    stages = sorted({(b.wafer, b.stage) for b in boxes})
    kernels = len({b.label for b in boxes})
    title = (f"@{program.program_name} on {program.target.data} ({width} x {height} cores per wafer): "
             f"mapping of {kernels} kernels, {len(stages)} of {program.num_stages} pipeline stages")
    if len(stages) == program.num_stages:
        title = title.replace(f"{len(stages)} of ", "")
    groups: dict[tuple[int, int, int, int, int], list[Box]] = {}
    for b in boxes:  # kernels on the same cores are drawn once, named together
        if b.wafer in wafers:
            groups.setdefault((b.wafer, b.x, b.y, b.w, b.h), []).append(b)
    colors_of = kind_colors()
    rank = {k: i for i, k in enumerate(colors_of)}
    shown = {g: min((b.kind for b in bs), key=rank.__getitem__) for g, bs in groups.items()}
    kinds = [k for k in colors_of if k in shown.values()]
    legend = [Patch(facecolor=colors_of[k], edgecolor="#333333", linewidth=0.4, label=k) for k in kinds]
    legend.append(Patch(facecolor="none", edgecolor="black", linewidth=1.4, linestyle="--",
                        label="pipeline stage"))
    ncol = min(len(legend), 6)
    lay = _Layout(_Layout.row(wafers), width, height, title, legend_rows=math.ceil(len(legend) / ncol))
    outlines = stage_outlines(boxes)
    for ax, w in lay.panels:
        _wafer_frame(ax, width, height)
        order = sorted(((g, bs) for g, bs in groups.items() if g[0] == w), key=lambda kv: -kv[0][3] * kv[0][4])
        colors = [colors_of[shown[g]] for g, _ in order]
        _collection(ax, [g[1:] for g, _ in order], facecolors=colors, edgecolors="#333333",
                    linewidths=0.3, alpha=0.9)
        for (_, x, y, bw, bh), bs in order:
            names = list(dict.fromkeys(b.label for b in bs))
            alts = [f"{names[0]} +{len(names) - 1}"] if len(names) > 1 else []
            experts = sorted({e for b in bs for e in b.experts})
            if any(registry.kind(b.kind).PLACES_EXPERTS for b in bs):
                placed = "E" + ",".join(map(str, experts)) if experts else "no expert"
                names = [f"{names[0]} {placed}"]
                alts = [placed]
            _label(ax, "\n".join(names), x, y, bw, bh, lay.px_per_core, alternatives=alts)
        segs = [((e.x0, e.y0), (e.x1, e.y1)) for e in outlines if e.wafer == w]
        if segs:
            ax.add_collection(LineCollection(segs, colors="black", linewidths=1.4, linestyles="--"))
        for wafer, stage in stages:
            if wafer != w:
                continue
            mine = [b for b in boxes if (b.wafer, b.stage) == (wafer, stage)]
            b = min(mine, key=lambda b: (b.y, b.x))
            pad = 2.5 / lay.px_per_core
            ax.text(b.x + pad, b.y + pad, f"S{stage}", fontsize=6.5, fontweight="bold", ha="left",
                    va="top", color="black",
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white", "edgecolor": "none",
                          "alpha": 0.8})
    lay.legend(legend, ncol)
    lay.save(out)


def _class_colors(n: int) -> list:
    from matplotlib import colormaps

    tab = colormaps["tab20"]
    order = [*range(0, 20, 2), *range(1, 20, 2)]
    return [tab(order[i % 20]) for i in range(n)]


_HATCHES = {1: None, 2: "///", 3: "xxx"}


def draw_classes(program, boxes: Sequence[ClassBox], wafers: Sequence[int], out: str) -> None:
    from matplotlib.patches import Patch

    width, height = program.mesh_size
    classes = {b.index: b for b in boxes}
    per_seg = Counter(b.segments for b in classes.values())
    total_segs = sum(b.segments for b in classes.values())
    title = (f"@{program.program_name} on {program.target.data}: {len(classes)} core classes, "
             f"{total_segs} segments (one box per dense piece of a class, not per core)")
    legend = [Patch(facecolor="white", edgecolor="#333333", hatch=_HATCHES.get(k, "..."),
                    label=f"{k} segment{'s' if k > 1 else ''}: {n} class{'es' if n > 1 else ''}")
              for k, n in sorted(per_seg.items())]
    lay = _Layout(_Layout.row(wafers), width, height, title, legend_rows=1)
    colors = _class_colors(max(classes, default=0) + 1)
    for ax, w in lay.panels:
        _wafer_frame(ax, width, height)
        mine = [b for b in boxes if b.wafer == w]
        for k in sorted({b.segments for b in mine}):
            sel = [b for b in mine if b.segments == k]
            _collection(ax, [(b.x, b.y, b.w, b.h) for b in sel],
                        facecolors=[colors[b.index] for b in sel], edgecolors="#222222",
                        linewidths=0.35, hatch=_HATCHES.get(k, "..."))
        # name each class once, on its largest piece
        biggest: dict[int, ClassBox] = {}
        for b in mine:
            if b.index not in biggest or b.w * b.h > biggest[b.index].w * biggest[b.index].h:
                biggest[b.index] = b
        for b in biggest.values():
            parts = b.name.split(".")
            _label(ax, b.name, b.x, b.y, b.w, b.h, lay.px_per_core, size=5, backdrop=b.segments > 1,
                   alternatives=[".".join(parts[-2:]), parts[-1]] if len(parts) > 2 else parts[-1:])
    lay.legend(legend, len(legend))
    lay.save(out)


def _hw_colors():
    from matplotlib import colormaps

    tab = colormaps["tab20"]
    return [tab(i) for i in (*range(0, 20, 2), *range(1, 20, 2))]


def draw_routes(program, routes: Sequence[RouteBox], arrows: Sequence[Arrow], wafers: Sequence[int],
                out: str, color: int | None, segment: int | None) -> None:
    from matplotlib.patches import FancyArrowPatch, Patch

    width, height = program.mesh_size
    palette = _hw_colors()
    flows_by_color: dict[int, set[str]] = {}
    for r in routes:
        flows_by_color.setdefault(r.color, set()).add(r.flow)
    nflows = len({r.flow for r in routes})
    which = []
    if color is not None:
        which.append(f"colour {color}")
    if segment is not None:
        which.append(f"live in segment {segment}")
    draw_arrows = len(arrows) <= ARROW_LIMIT
    title = (f"@{program.program_name} on {program.target.data}: routes of {nflows} flows"
             + (f" ({', '.join(which)})" if which else "")
             + ("" if color is not None else
                f" on {len(flows_by_color)} colour{'s' if len(flows_by_color) > 1 else ''}")
             + ("" if draw_arrows or not arrows else f"; arrows omitted (> {ARROW_LIMIT} flows)"))
    legend = [Patch(facecolor=palette[c % len(palette)], alpha=0.8,
                    label=f"colour {c}: {len(fs)} flow{'s' if len(fs) > 1 else ''}")
              for c, fs in sorted(flows_by_color.items())]
    ncol = min(len(legend), 6)
    lay = _Layout(_Layout.row(wafers), width, height, title, legend_rows=math.ceil(len(legend) / ncol))
    ctx = class_boxes(program)
    for ax, w in lay.panels:
        _wafer_frame(ax, width, height)
        # the core classes as a faint backdrop (per class box, not per core)
        _collection(ax, [(b.x, b.y, b.w, b.h) for b in ctx if b.wafer == w], facecolors="#e6e6e6",
                    edgecolors="#bbbbbb", linewidths=0.3)
        mine = [r for r in routes if r.wafer == w]
        cols = [palette[r.color % len(palette)] for r in mine]
        _collection(ax, [(r.x, r.y, r.w, r.h) for r in mine], facecolors=cols, edgecolors="none",
                    alpha=0.3 if len(mine) <= 12 else 0.08)
        # each colour's frames inset by its own number of pixels, so routes of
        # several colours over the same routers stay apart
        inset = [min((1.0 + 1.6 * (r.color % 8)) / lay.px_per_core, 0.45 * min(r.w, r.h)) for r in mine]
        _collection(ax, [(r.x + d, r.y + d, r.w - 2 * d, r.h - 2 * d) for r, d in zip(mine, inset)],
                    facecolors="none", edgecolors=cols, linewidths=0.9)
        if draw_arrows:
            for a in arrows:
                if a.wafer == w:
                    ax.add_patch(FancyArrowPatch((a.x0, a.y0), (a.x1, a.y1), arrowstyle="-|>",
                                                 mutation_scale=6, linewidth=0.6,
                                                 color=palette[a.color % len(palette)]))
    lay.legend(legend, ncol)
    lay.save(out)


def draw_load(program, load: LoadMap, classes: Sequence[ClassBox], wafers: Sequence[int], out: str,
              seed: int) -> None:
    import numpy as np
    from matplotlib import colormaps

    width, height = program.mesh_size
    status = "" if load.completed else " -- run did NOT complete"
    title = (f"@{program.program_name} on {program.target.data}: per-core load over {load.steps} decode "
             f"steps ({load.cycles:,} cycles, seed {seed}, {load.inflight} micro-batch"
             f"{'es' if load.inflight > 1 else ''} in flight){status}")
    names = ("busy fraction", "waiting fraction (stall cycles / cycles)")
    if len(wafers) == 1:  # side by side
        grid = [[(wafers[0], f"wafer {wafers[0]}: {n}") for n in names]]
    else:  # one row per quantity
        grid = [[(w, f"wafer {w}: {n}") for w in wafers] for n in names]
    lay = _Layout(grid, width, height, title, colorbar=True)
    cmap = colormaps["viridis"].with_extremes(bad="#dddddd")
    im = None
    for ax, w in lay.panels:
        data = load.busy if "busy" in ax.get_title() else load.waiting
        im = ax.imshow(np.ma.masked_invalid(data[w]), cmap=cmap, vmin=0.0, vmax=1.0,
                       extent=(0, width, height, 0), interpolation="nearest", origin="upper")
        _collection(ax, [(b.x, b.y, b.w, b.h) for b in classes if b.wafer == w],
                    facecolors="none", edgecolors="white", linewidths=0.4)
        _wafer_frame(ax, width, height)
    cax = lay.fig.add_axes(lay.colorbar_rect)
    cb = lay.fig.colorbar(im, cax=cax)
    cb.ax.tick_params(labelsize=6)
    cb.set_label("fraction of the run's cycles (the rest is idle: before a core's first and "
                 "after its last step; grey: no class)", fontsize=6)
    lay.save(out)


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL|IR", help="a .mrt spec, a config.json or printed IR (.mlir)")
    from meshrt.targets import available_targets

    p.add_argument("--target", metavar="T",
                   help=f"target to compile MODEL for: {', '.join(available_targets())} or a "
                        ".toml file; IR carries its own")
    p.add_argument("--what", choices=WHATS, default="mapping", metavar="WHAT",
                   help=f"picture: {', '.join(WHATS)} (default mapping)")
    p.add_argument("-o", dest="output", metavar="FILE",
                   help="FILE.png or FILE.svg (default: MODEL-WHAT.png in the current directory)")
    p.add_argument("--wafer", type=int, metavar="N", help="draw only wafer N")
    p.add_argument("--color", type=int, metavar="C", help="routes: only the flows on colour C")
    p.add_argument("--segment", type=int, metavar="S", help="routes: only the flows live in segment S")
    p.add_argument("--steps", type=int, metavar="N",
                   help=f"load: decode steps, at least 1 (default {DEFAULT_STEPS}; refused when "
                        "the trace would not fit this machine's memory)")
    p.add_argument("--seed", type=int, metavar="S", help="load: asynchrony seed, 0 or more (default 0)")


class _Failed(Exception):
    """A complete one-line diagnostic."""


def _check_args(args: argparse.Namespace) -> str:
    """Command-line checks that need no compilation; returns the output path."""
    me = "meshrt viz: error:"
    for flag, v, applies in (("--color", args.color, ("routes",)), ("--segment", args.segment, ("routes",)),
                             ("--steps", args.steps, ("load",)), ("--seed", args.seed, ("load",))):
        if v is not None and args.what not in applies:
            raise _Failed(f"{me} {flag} only applies to --what {' / '.join(applies)}")
    for flag, v in (("--wafer", args.wafer), ("--color", args.color), ("--segment", args.segment),
                    ("--seed", args.seed)):
        if v is not None and v < 0:
            raise _Failed(f"{me} {flag} must be at least 0, got {v}")
    if args.steps is not None and args.steps < 1:
        raise _Failed(f"{me} --steps must be at least 1, got {args.steps}")
    out = args.output or f"{Path(args.model).stem}-{args.what}.png"
    if Path(out).suffix.lower() not in (".png", ".svg"):
        raise _Failed(f"{out}: error: the picture is written as PNG or SVG: name a .png or .svg file")
    parent = Path(out).parent
    if not parent.is_dir():
        raise _Failed(f"{out}: error: cannot write output: no such directory '{parent}'")
    if not os.access(parent, os.W_OK) or (Path(out).exists() and not os.access(out, os.W_OK)):
        raise _Failed(f"{out}: error: cannot write output: permission denied")
    if Path(out).is_dir():
        raise _Failed(f"{out}: error: cannot write output: it is a directory")
    if not args.model.endswith(".mlir") and not args.target:
        raise _Failed(f"{me} --target is required to compile {args.model} (IR carries its own target)")
    return out


def _check_simulable(target, name: str) -> None:
    from meshrt.tools.common import INTERPRETER_MAX_CORES

    if target.cores > INTERPRETER_MAX_CORES:
        raise _Failed(f"meshrt viz: error: --what load simulates every core, which only works on "
                      f"targets of at most {INTERPRETER_MAX_CORES:,} cores; {name} has "
                      f"{target.cores:,} per wafer (use test32 or test16)")


def _target(name: str, where: str):
    from meshrt import driver
    from meshrt.frontend.errors import FrontendError

    try:
        return driver.load_target(name)
    except FrontendError as e:
        line = str(e)
        raise _Failed(line if ": error: " in line else f"{where}: {line}") from None


def _load(args: argparse.Namespace, level: str, target):
    """(program to draw, its Target): MODEL compiled for `target` to `level`
    ('kernels' or 'segments'), or IR lowered as far as needed (its own target
    unless --target, which must be one the IR is compiled for)."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError

    model = args.model
    is_ir = driver.is_ir(model)
    try:
        if is_ir:
            module = driver.read_ir(model)
            top = program_of(module)
            given = target is not None
            target = driver.target_of(top, target)
            if args.what == "load" and not given:
                _check_simulable(target, target.name)
            if level == "kernels":
                if top.name == "graph.model":
                    driver.lower(module, "kernels", target)
            elif top.name == "segment.program" and args.what != "classes" and not top.routes():
                raise _Failed(f"{model}: error: --what {args.what} needs coloured segment IR, and "
                              f"@{top.program_name} has no segment.route (run color-routes and "
                              "insert-route-handshakes, or give the model or higher-level IR)")
            elif top.name != "segment.program" or args.what != "classes":
                # classes need no colouring; routes and load run the checked, coloured IR
                driver.lower(module, "segments", target)
            return program_of(module), target
        return program_of(driver.compile(model, target, level)), target
    except _Failed:
        raise
    except VizError as e:
        raise _Failed(f"{model}: error: {e}") from None
    except FrontendError as e:
        line = str(e)
        raise _Failed(line if ": error: " in line else f"meshrt viz: {line}") from None
    except MeshrtError as e:
        # IR keeps its source locations; compiled IR has none, so name the model
        if is_ir or (e.op is None and e.filename is None and ": error: " in e.message):
            raise _Failed(str(e)) from None
        raise _Failed(f"{model}: error: {e.message}") from None
    except Exception as e:  # a pass failing on valid input is a bug: still one line
        if os.environ.get("MESHRT_TRACEBACK"):
            raise
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise _Failed(f"{model}: error: lowering to {level} failed: {first} "
                      "(set MESHRT_TRACEBACK=1 for details)") from None


def main(args: argparse.Namespace) -> int:
    try:
        return _main(args)
    except _Failed as e:
        return _fail(str(e))
    except Exception as e:  # a bug on valid input: still one line
        if os.environ.get("MESHRT_TRACEBACK"):
            raise
        return _fail(f"{args.model}: error: meshrt viz: internal error: {type(e).__name__}: {e} "
                     "(set MESHRT_TRACEBACK=1 for details)")


def _main(args: argparse.Namespace) -> int:
    import numpy as np

    out = _check_args(args)
    target = _target(args.target, "meshrt viz") if args.target else None
    if args.what == "load" and target is not None:
        _check_simulable(target, target.name)
    t0 = time.perf_counter()
    program, target = _load(args, "kernels" if args.what == "mapping" else "segments", target)
    t_compile = time.perf_counter() - t0
    where = args.model
    if args.wafer is not None and args.wafer >= program.num_wafers:
        raise _Failed(f"{where}: error: --wafer {args.wafer} is out of range: "
                      f"@{program.program_name} has wafers 0..{program.num_wafers - 1}")
    wafers = [args.wafer] if args.wafer is not None else list(range(program.num_wafers))
    t1 = time.perf_counter()
    try:
        if args.what == "mapping":
            boxes = [b for b in mapping_boxes(program) if b.wafer in wafers]
            draw_mapping(program, boxes, wafers, out)
            what = f"{len({b.label for b in boxes})} kernels"
        elif args.what == "classes":
            boxes = [b for b in class_boxes(program) if b.wafer in wafers]
            draw_classes(program, boxes, wafers, out)
            what = f"{len({b.index for b in boxes})} core classes"
        elif args.what == "routes":
            routes = [r for r in route_segments(program, args.color, args.segment) if r.wafer in wafers]
            if not routes:
                raise VizError(f"no routed flow{'' if args.color is None else f' on colour {args.color}'}"
                               f"{'' if args.segment is None else f' live in segment {args.segment}'} "
                               f"is on wafer {args.wafer}")
            arrows = [a for a in flow_arrows(program, args.color, args.segment) if a.wafer in wafers]
            draw_routes(program, routes, arrows, wafers, out, args.color, args.segment)
            what = f"{len({r.flow for r in routes})} routed flows"
        else:
            steps = args.steps or DEFAULT_STEPS
            seed = args.seed or 0
            check_memory(load_map_bytes(program, target, steps),
                         f"the per-core trace of {steps:,} decode steps", "lower --steps", where)
            with progress_bar("simulating", steps) as update:
                load = load_map(program, target, steps, seed, None if update is None else
                                lambda done: update(done, f"{done:,} / {steps:,} decode steps"))
            draw_load(program, load, class_boxes(program), wafers, out, seed)
            cores = int((~np.isnan(load.busy)).sum())
            what = f"busy / waiting of {cores} cores over {load.steps} steps"
            if not load.completed:
                print(f"wrote {out} ({args.what}: {what}); the run did not complete: "
                      f"{load.reports[0] if load.reports else 'stopped'}", file=sys.stderr)
                return 1
    except VizError as e:
        raise _Failed(f"{where}: error: {e}") from None
    except FrontendError as e:  # e.g. more memory than this machine has
        raise _Failed(str(e)) from None
    except OSError as e:
        raise _Failed(f"{out}: error: cannot write output: {e.strerror or e}") from None
    t_draw = time.perf_counter() - t1
    print(f"wrote {out} ({args.what}: {what} of @{program.program_name} on "
          f"{program.target.data}, {len(wafers)} wafer panel{'s' if len(wafers) > 1 else ''}; "
          f"compile {t_compile:.1f} s, {'simulate and ' if args.what == 'load' else ''}draw "
          f"{t_draw:.1f} s)")
    return 0

