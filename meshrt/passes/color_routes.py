"""`color-routes`: XY routes and colours for every flow of a segment program.

Two flows interfere where some router lies on both routes and both are live
there in a common segment of the router's class (the liveness and
interference of `meshrt.analysis.liveness`). Interfering flows get different
colours; all other flows may share one. A flow whose transport chains several
senders through router switches (`meshrt.backend.csl.streams.switch_chained`)
takes only a colour with switch positions (`Target.switch_colors`; on WSE-3
not every colour has them).

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
from meshrt.targets import Target, target_for


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


def switch_chained_flows(program: sg.ProgramOp, palette: list[int], target: Target) -> set[str]:
    """Flows that need a switch-capable colour: those the transport chains
    through router switches, when the target does not have switches on every
    colour of `palette` (WSE-3: `Target.switch_colors`)."""
    if set(palette) <= set(target.switch_colors):
        return set()
    from meshrt.backend.csl.streams import switch_chained

    w, h = program.mesh_size
    return {f.flow_name for f in program.flows() if not f.crosses_wafer and switch_chained(f, w, h)}


def colour_program(program: sg.ProgramOp, *, limit: int | None = None, split: bool = True,
                   max_splits: int | None = None, target: str | Target | None = None) -> int:
    """Colour `program` in place; returns how many segments were split."""
    palette = palette_of(program, limit)
    target = target_for(target, program)
    chained = switch_chained_flows(program, palette, target)
    switch_palette = [c for c in palette if c in target.switch_colors]
    for r in program.routes():
        r.detach()
        r.erase()
    splits = 0
    while True:
        live = liveness_of_program(program)
        edges = live.interference()
        switched = frozenset(i for i, f in enumerate(live.flows) if f.name in chained)
        res = colour_flows(live, edges, palette, switched, switch_palette if chained else None)
        if res.failed is None:
            break
        clique = live.densest(res.failed, edges, res.component)
        failed = live.flows[res.failed]
        if (split and (max_splits is None or splits < max_splits) and clique.owner is not None
                and split_segment(program, live, clique)):
            splits += 1
            continue
        raise MeshrtError(_failure_message(live, failed.name, clique, len(palette), split,
                                           chained, len(switch_palette)), failed.op)
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


def _failure_message(live: Liveness, name: str, clique: Clique, palette: int, split: bool,
                     chained: set[str] = frozenset(), switch_palette: int = 0) -> str:
    order = {f.name: i for i, f in enumerate(live.flows)}
    flows = ", ".join(f"@{n}" for n in sorted(clique.flows, key=order.__getitem__))
    n = len(clique.flows)
    colours = f"{palette} user colour" + ("" if palette == 1 else "s")
    exist = "exists" if palette == 1 else "exist"
    switched = [f for f in clique.flows if f in chained]
    if name in chained and len(switched) > switch_palette:
        msg = (f"cannot colour flow @{name}: switch-chained flows "
               f"{', '.join(f'@{f}' for f in sorted(switched, key=order.__getitem__))} are live "
               f"together at {describe_router(clique)}, but only {switch_palette} of the "
               f"{colours} {'has' if switch_palette == 1 else 'have'} switch positions")
    elif name in chained:
        msg = (f"cannot colour flow @{name}: flows {flows} are live together at "
               f"{describe_router(clique)}, and with the flows they meet elsewhere they need more "
               f"than the {colours} ({switch_palette} with switch positions, which @{name} "
               f"needs: several senders are chained on its colour)")
    elif n > palette:
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
    colours do not suffice; `target` (a bundled name or a .toml path)
    overrides the program's target, whose `switch_colors` the switch-chained
    flows are coloured from.
    """

    name = "color-routes"

    colors: int | None = None
    split: bool = True
    target: str | None = None

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in require_programs(op, self.name, sg.ProgramOp, hint="materialize-segments"):
            colour_program(program, limit=self.colors, split=self.split, target=self.target)

