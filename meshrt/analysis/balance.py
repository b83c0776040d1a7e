"""Message balance: over a step, every flow's sends and receives pair up class by class.

How the interpreter matches them (`meshrt.runtime.mesh_sim`, built from
`meshrt.runtime.schedule.flatten`): every core of a class runs the class's
table once per decode step. A sender core of flow F (a core of F's `src`
that belongs to some class) sends one message per `event.send` of F to each
of its targets:

- `shift` by (dx, dy): the core at (x + dx, y + dy);
- `row` / `col`: the receivers (cores of F's `dst`) in its row / column;
- `all`: every receiver (a multicast);

never to itself, and only to cores of some class (on the next wafer for a
`cross_wafer` flow). A receiver core's `event.recv` of F completes when it
has gathered one message from *each* sender that targets it; a sender's next
message waits for the next recv. Receives the host primes (a loop-carried
flow, `meshrt.analysis.liveness.host_primed`) take the first step's messages
from the host, and from then on step s + 1 consumes what step s sent.

So a step is balanced iff, for every flow F, every class A with a sender
core of F and every class B with a core that one of A's senders targets,

    sends_A(F) == recvs_B(F)            (events of F in one pass of the table)

Several sender classes gathered by one recv give one equation each, as does
each receiver class of a multicast; priming changes no count. A core never
sends to itself: a class whose cores are senders and receivers of F (a
value some of its cores hold already) takes its own part in place, and its
receive still counts once per send (A = B above). A surplus on
either side leaves messages queued that the next step's receive takes (the
data arrives a step late, then the queues fill), a shortfall leaves a
receive waiting forever. Three events match nothing at all (the interpreter
runs them as no-ops, so nothing else would notice): a receive of F in a
class no sender of F targets, a send of F in a class with no core in F's
`src`, and a send of F whose senders target no core of any class.

Classes and flows are rect sets: the pairs are found rectangle by rectangle,
never core by core (strided rects of more than `STRIDED_LIMIT` cores are
approximated by their bounding box).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from xdsl.ir import Operation

from meshrt.analysis.liveness import ClassTable
from meshrt.dialects import event as ev
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.routing import BoxIndex, RectSet, rect_boxes

STRIDED_LIMIT = 4096
"""Most cores of a strided rect taken one by one; larger ones use their bounding box."""


@dataclass
class Imbalance:
    """One unmatched pairing: a message and the op it is located at."""

    message: str
    op: Operation


@dataclass
class _Uses:
    """The events of one flow in one class's table, in table order."""

    sends: list[ev.SendOp] = field(default_factory=list)
    recvs: list[ev.RecvOp] = field(default_factory=list)


def _boxes(cores: CoreSetAttr) -> RectSet:
    return RectSet(b for r in cores.rects for b in rect_boxes(r, STRIDED_LIMIT))


def _targets(flow: ev.FlowOp, senders: RectSet, dst: RectSet) -> RectSet:
    """The cores the `senders` of `flow` send to (themselves included, see the module docstring)."""
    pattern = flow.pattern.data
    if pattern == "shift":
        dx, dy = flow.offset
        return RectSet((x0 + dx, y0 + dy, x1 + dx, y1 + dy) for x0, y0, x1, y1 in senders)
    if pattern == "all":
        return dst if senders else RectSet()
    if not dst:
        return RectSet()
    ex0 = min(b[0] for b in dst)
    ey0 = min(b[1] for b in dst)
    ex1 = max(b[2] for b in dst)
    ey1 = max(b[3] for b in dst)
    if pattern == "row":
        bands = RectSet((ex0, y0, ex1, y1) for _, y0, _, y1 in senders)
    else:  # col
        bands = RectSet((x0, ey0, x1, ey1) for x0, _, x1, _ in senders)
    return dst & bands


def check_balance(program, tables: Sequence[ClassTable]) -> list[Imbalance]:
    """Every unmatched pairing of sends and receives in `program` (see the module docstring).

    `program` is a `segment.program` (or an `event.schedule`), `tables` its class tables."""
    uses: dict[str, dict[str, _Uses]] = defaultdict(dict)  # flow -> class -> its events
    for t in tables:
        for sub in t.subs():
            for e in sub.events():
                if isinstance(e, ev.SendOp):
                    uses[e.flow_name].setdefault(t.name, _Uses()).sends.append(e)
                elif isinstance(e, ev.RecvOp):
                    uses[e.flow_name].setdefault(t.name, _Uses()).recvs.append(e)
    by_name = {t.name: t for t in tables}
    order = {t.name: i for i, t in enumerate(tables)}
    index: dict[int, BoxIndex] = {}
    for wafer in {t.wafer for t in tables}:
        index[wafer] = BoxIndex([(b, t) for t in tables if t.wafer == wafer for b in t.cores])
    wafers = max(program.num_wafers, 1)
    out: list[Imbalance] = []
    none = _Uses()

    for flow in program.flows():
        name = flow.flow_name
        used = uses.get(name, {})
        w = flow.wafer_index
        dw = (w + 1) % wafers if flow.crosses_wafer else w
        src, dst = _boxes(flow.src), _boxes(flow.dst)

        def classes_meeting(cores: RectSet, wafer: int) -> list[ClassTable]:
            idx = index.get(wafer)
            if idx is None:
                return []
            found = {idx.items[i][1].name for b in cores for i in idx.query(b)}
            return sorted((by_name[n] for n in found), key=lambda t: order[t.name])

        targeted: set[str] = set()
        for a in classes_meeting(src, w):
            senders = a.cores & src
            if not senders:
                continue  # only the bounding boxes met
            targets = _targets(flow, senders, dst)
            sends = used.get(a.name, none).sends
            reaches = False
            for b in classes_meeting(targets, dw):
                reached = b.cores & targets
                if not reached:
                    continue
                reaches = True
                targeted.add(b.name)
                recvs = used.get(b.name, none).recvs
                if len(sends) == len(recvs):
                    continue
                surplus = sends[-1] if len(sends) > len(recvs) else recvs[-1]
                out.append(Imbalance(
                    f"flow @{name}: class @{a.name} sends {len(sends)} per step, its receivers in "
                    f"class @{b.name} receive {len(recvs)}", surplus))
            if sends and not reaches:
                out.append(Imbalance(
                    f"flow @{name}: class @{a.name} sends {len(sends)} per step, but its senders "
                    f"target no core of any class", sends[-1]))
        for cname, u in sorted(used.items(), key=lambda kv: order.get(kv[0], 0)):
            t = by_name.get(cname)
            if t is None:
                continue
            if u.recvs and cname not in targeted:
                out.append(Imbalance(
                    f"flow @{name}: class @{cname} receives {len(u.recvs)} per step, but no sender "
                    f"of the flow targets its cores", u.recvs[-1]))
            if u.sends and (t.wafer != w or not (t.cores & src)):
                out.append(Imbalance(
                    f"flow @{name}: class @{cname} sends {len(u.sends)} per step, but none of its "
                    f"cores is a sender of the flow (senders <{flow.src}> on wafer {w})",
                    u.sends[-1]))
    return out
