"""`color-routes`: XY routes and colours for every flow of a segment program.

Two flows interfere where some router lies on both routes and both are live
there in a common segment of the router's class (the liveness and
interference of `meshrt.analysis.liveness`). Interfering flows get different
colours; all other flows may share one.

Colouring is DSatur over the interference graph, with an exact backtracking
search per connected component when DSatur runs out of colours. When no
colouring exists the pass either fails, naming the flows and the router
(class, segment and core) that could not be coloured, or, with `split=true`
(the default), hands the overflow back to materialization: the segment of
the router's class in which too many flows meet is split at the sub where
the fewest of them stay live on both sides, and colouring is retried. A
router no split can help (an idle router, or a segment of one sub) is an
error. Nothing is ever coloured silently wrong: `check-segments` re-checks
the result.

Cross-wafer flows use the wafer-to-wafer link, have no on-mesh route between
sender and receiver and get no `segment.route`.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import IntegerAttr, ModuleOp, SymbolRefAttr, i64
from xdsl.passes import ModulePass

from meshrt.analysis.coloring import colour_flows
from meshrt.analysis.liveness import Clique, Liveness, liveness_of_program
from meshrt.analysis.segmenting import split_segment
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs


def describe_router(clique: Clique) -> str:
    x, y = clique.core
    if clique.owner is None:
        return f"idle router ({x}, {y}) on wafer {clique.wafer}"
    return f"router ({x}, {y}) of core class @{clique.owner} in its segment {clique.segment}"


def palette_of(program: sg.ProgramOp, limit: int | None) -> list[int]:
    palette = list(program.user_colors)
    if limit is not None:
        if limit <= 0:
            raise MeshrtError(f"color-routes: colors={limit} leaves no colour to route with", program)
        palette = palette[:limit]
    return palette


def colour_program(program: sg.ProgramOp, *, limit: int | None = None, split: bool = True,
                   max_splits: int | None = None) -> int:
    """Colour `program` in place; returns how many segments were split."""
    palette = palette_of(program, limit)
    for r in program.routes():
        r.detach()
        r.erase()
    splits = 0
    while True:
        live = liveness_of_program(program)
        edges = live.interference()
        res = colour_flows(live, edges, palette)
        if res.failed is None:
            break
        clique = live.densest(res.failed, edges, res.component)
        failed = live.flows[res.failed]
        if (split and (max_splits is None or splits < max_splits) and clique.owner is not None
                and split_segment(program, live, clique)):
            splits += 1
            continue
        raise MeshrtError(_failure_message(live, failed.name, clique, len(palette), split), failed.op)
    block = program.body.block
    for i, f in enumerate(live.flows):
        if i not in res.colours:
            continue
        route = sg.RouteOp.create(properties={
            "flow": SymbolRefAttr(f.name),
            "color": IntegerAttr(res.colours[i], i64),
            "via": f.routers.to_coreset(),
        })
        route.location = f.op.location
        block.add_op(route)
    return splits


def _failure_message(live: Liveness, name: str, clique: Clique, palette: int, split: bool) -> str:
    order = {f.name: i for i, f in enumerate(live.flows)}
    flows = ", ".join(f"@{n}" for n in sorted(clique.flows, key=order.__getitem__))
    n = len(clique.flows)
    colours = f"{palette} user colour" + ("" if palette == 1 else "s")
    exist = "exists" if palette == 1 else "exist"
    if n > palette:
        msg = (f"cannot colour flow @{name}: flows {flows} are live together at "
               f"{describe_router(clique)}, but only {colours} {exist}")
    else:
        msg = (f"cannot colour flow @{name}: flows {flows} are live together at "
               f"{describe_router(clique)}, and with the flows they meet elsewhere they need "
               f"more than the {colours}")
    if split:
        msg += ("; an idle router cannot be reconfigured" if clique.owner is None
                else "; no split of that segment separates them")
    return msg


@dataclass(frozen=True)
class ColorRoutes(ModulePass):
    """Give every flow of each `segment.program` an XY route and a colour.

    Options: `colors=N` colours with only the first N user colours of the
    target; `split=false` fails instead of splitting segments when the
    colours do not suffice.
    """

    name = "color-routes"

    colors: int | None = None
    split: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in require_programs(op, self.name, sg.ProgramOp, hint="materialize-segments"):
            colour_program(program, limit=self.colors, split=self.split)

