"""`insert-route-handshakes`: make color-routes' liveness true on an asynchronous mesh.

`color-routes` decides which flows a router holds in which segment of its
class by step *positions* (see `meshrt.analysis.liveness`): as if all
classes switched segments in lockstep. On a GALS mesh they do not: a class
may enter the segment that sends on a flow while a router of another class
on the flow's route is still in its previous segment (the colour is not
bound yet, or still bound to another flow), or may release a pass-through
flow while that flow's traffic is still on its way. This pass compiles two
handshakes into the segment IR (syntax and run-time meaning: the
`meshrt.dialects.segment` docstring) so that the positions become true in
time:

1. Install before use. Let T be a class with several segments whose routers
   hold flow F in some but not all of its segments (a *handshake class* of
   F). Every reconfigure of T that installs F `notify`s it; segment 0 of T
   `grant`s F when T holds it at program start for the first step's traffic
   (the first send position of F, p0, lies no later than the last sub of the
   run of segments 0, 1, ... that hold F; otherwise the hold current at start
   serves the previous step's, host-primed, traffic and the credit comes from
   the next install). Every class that sends F `await`s `@T::@F` on the
   segment holding its first `event.send` of F in the step.
2. Release after traffic. Every reconfigure that releases a flow carrying
   messages (`event.send` somewhere) `drain`s it.

Classes holding F in every segment (including one-segment classes) and idle
routers never reconfigure F and take no part. Flows with no `event.send`
(metainfo only) carry no message and need no handshake.

The pass recomputes the lists from scratch (it is idempotent) and must run
after the last change to segments and routes, i.e. after `color-routes`.
`check-segments` re-derives and proves them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass

from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs
from meshrt.analysis.liveness import Liveness, liveness_of_program


@dataclass
class Handshakes:
    """The handshake lists of one program, keyed by class name."""

    notify: dict[tuple[str, int, int], list[str]] = field(default_factory=dict)
    drain: dict[tuple[str, int, int], list[str]] = field(default_factory=dict)
    grant: dict[str, list[str]] = field(default_factory=dict)
    awaits: dict[tuple[str, int], list[tuple[str, str]]] = field(default_factory=dict)


def message_flows(program: sg.ProgramOp) -> set[str]:
    """Flows some class sends messages on (`event.send`)."""
    out: set[str] = set()
    for c in program.core_classes():
        for seg in c.segments():
            for sub in seg.subs():
                for e in sub.events():
                    if isinstance(e, ev.SendOp):
                        out.add(e.flow_name)
    return out


def first_send_segments(program: sg.ProgramOp) -> dict[str, dict[str, int]]:
    """Class -> flow -> the segment holding the class's first `event.send` of it in the step."""
    out: dict[str, dict[str, int]] = {}
    for c in program.core_classes():
        first: dict[str, int] = {}
        for seg in c.segments():
            for sub in seg.subs():
                for e in sub.events():
                    if isinstance(e, ev.SendOp):
                        first.setdefault(e.flow_name, seg.index_value)
        out[c.class_name] = first
    return out


def derive_handshakes(program: sg.ProgramOp, live: Liveness | None = None) -> Handshakes:
    live = live or liveness_of_program(program)
    msgs = message_flows(program)
    order = {f.name: i for i, f in enumerate(live.flows)}
    hs = Handshakes()
    takers: dict[str, list[str]] = {}  # flow -> handshake classes, in class order
    for t in live.tables:
        n = len(t.segments)
        if n <= 1:
            continue
        conf = live.configured(t.name)
        for i in range(n):
            j = (i + 1) % n
            before, after = set(conf[i]), set(conf[j])
            hs.notify[(t.name, i, j)] = [f for f in conf[j] if f not in before and f in msgs]
            hs.drain[(t.name, i, j)] = [f for f in conf[i] if f not in after and f in msgs]
        held = [set(c) for c in conf]
        partial = sorted({f for c in conf for f in c if f in msgs and not all(f in h for h in held)},
                         key=order.__getitem__)
        grant = []
        for f in partial:
            takers.setdefault(f, []).append(t.name)
            if f not in held[0]:
                continue
            b = 0
            while b + 1 < n and f in held[b + 1]:
                b += 1
            window = live.flows[live.flow_index[f]].window
            last = t.segments[b][-1] if t.segments[b] else None
            if window is not None and last is not None and window[0] <= live.pos[last.kernel_name]:
                grant.append(f)
        hs.grant[t.name] = grant
    for cls, firsts in first_send_segments(program).items():
        for f, s in sorted(firsts.items(), key=lambda kv: order.get(kv[0], 0)):
            for t in takers.get(f, ()):
                hs.awaits.setdefault((cls, s), []).append((t, f))
    return hs


def _refs(names) -> ArrayAttr | None:
    names = list(names)
    return ArrayAttr([SymbolRefAttr(n) for n in names]) if names else None


def _await_refs(pairs) -> ArrayAttr | None:
    pairs = list(pairs)
    return ArrayAttr([SymbolRefAttr(t, [StringAttr(f)]) for t, f in pairs]) if pairs else None


def insert_handshakes(program: sg.ProgramOp) -> Handshakes:
    hs = derive_handshakes(program)
    for c in program.core_classes():
        name = c.class_name
        for seg in c.segments():
            s = seg.index_value
            seg.awaits = _await_refs(hs.awaits.get((name, s), ()))
            seg.grant = _refs(hs.grant.get(name, ()) if s == 0 else ())
        for i, j, _, rec in c.boundaries():
            rec.notify = _refs(hs.notify.get((name, i, j), ()))
            rec.drain = _refs(hs.drain.get((name, i, j), ()))
    return hs


@dataclass(frozen=True)
class InsertRouteHandshakes(ModulePass):
    """Emit the install-credit and drain handshakes (see the module docstring)."""

    name = "insert-route-handshakes"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        programs = require_programs(op, self.name, sg.ProgramOp,
                                    hint="materialize-segments,color-routes")
        for program in programs:
            insert_handshakes(program)
