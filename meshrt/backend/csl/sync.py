"""How many markers each core waits for at each of its marker syncs.

A class whose segment ends with a `segment.marker_sync` puts one marker (a
control wavelet) on every flow it sent in that segment, right behind its
last message there: colours are FIFO, so the marker arriving means the data
before it has arrived. A class waiting at a marker sync expects one marker
per (flow, sender core) for the flows it received since its previous marker
sync, from every sender that marks that flow. (A switch chain delivers every
sender's marker to every receiver, as the multicast did; relayed flows carry
no markers.) How many senders reach a
receiver depends on the flow's pattern (shift: one; all: every sender; row
/ col: the senders of its row / column), so the count is a per-core value,
given as boxes.
"""

from __future__ import annotations

from collections import defaultdict

from meshrt.backend.csl.model import CoreClass, Program
from meshrt.backend.csl.percore import clip_to
from meshrt.backend.csl.routes import overlay
from meshrt.routing import Box, RectSet, rect_boxes


def _marking_senders(program: Program) -> dict[str, RectSet]:
    marks: dict[str, list[Box]] = defaultdict(list)
    for cls in program.classes:
        synced = {b.source for b in cls.boundaries if b.sync is not None}
        own = cls.rectset()
        for seg in cls.segments:
            if seg.index not in synced:
                continue
            for e in seg.events():
                if e.kind != "send":
                    continue
                f = program.flows[e.flow]
                if f.color is None or _relayed(program, f.name):
                    continue
                marks[f.name].extend((own & RectSet.from_cores(f.op.src)).boxes)
    return {k: RectSet(v) for k, v in marks.items()}


def _relayed(program: Program, name: str) -> bool:
    """A relayed flow (streams.py) needs no markers: its receivers finish the relay
    inside their receive, so nothing of it is in flight after it."""
    from meshrt.backend.csl.streams import RELAY, plans

    plan = plans(program).get(name)
    return plan is not None and plan.scheme == RELAY


def _count_pieces(flow, senders: RectSet) -> list[tuple[Box, int]]:
    """(receiver box, markers from `senders`) for one flow."""
    pattern = flow.op.pattern.data
    dst = [b for r in flow.op.dst.rects for b in rect_boxes(r)]
    if pattern == "shift":
        dx, dy = flow.op.offset
        shifted = RectSet((b[0] + dx, b[1] + dy, b[2] + dx, b[3] + dy) for b in senders.boxes)
        return [(b, 1) for b in (shifted & RectSet(dst)).boxes]
    if pattern == "all":
        n = senders.count
        return [(b, n) for b in RectSet(dst).boxes] if n else []
    out = []
    for s in senders.boxes:
        for d in dst:
            if pattern == "row":
                y0, y1 = max(s[1], d[1]), min(s[3], d[3])
                if y0 < y1:
                    out.append(((d[0], y0, d[2], y1), s[2] - s[0]))
            else:
                x0, x1 = max(s[0], d[0]), min(s[2], d[2])
                if x0 < x1:
                    out.append(((x0, d[1], x1, d[3]), s[3] - s[1]))
    return out


def marker_counts(program: Program) -> dict[tuple[str, int], list[tuple[Box, int]]]:
    """(class name, closing segment index) -> per-core expected markers as boxes."""
    marks = _marking_senders(program)
    out: dict[tuple[str, int], list[tuple[Box, int]]] = {}
    if not marks:
        return out
    for cls in program.classes:
        syncs = [b.source for b in cls.boundaries if b.sync is not None]
        if not syncs:
            continue
        order = [s.index for s in cls.segments]
        for k, src in enumerate(syncs):
            prev = syncs[k - 1] if len(syncs) > 1 else src
            # Segments after the previous sync up to this one (cyclically).
            i = (order.index(prev) + 1) % len(order)
            window = []
            while True:
                window.append(order[i])
                if order[i] == src:
                    break
                i = (i + 1) % len(order)
            received = []
            for seg in cls.segments:
                if seg.index in window:
                    for e in seg.events():
                        if e.kind == "recv" and e.flow in marks and e.flow not in received:
                            received.append(e.flow)
            pieces: list[tuple[Box, frozenset]] = []
            n = 0
            for f in received:
                for box, count in clip_to(_count_pieces(program.flows[f], marks[f]), cls.boxes):
                    n += 1
                    pieces.append((box, frozenset({(n, count)})))
            summed = [(box, sum(v for _, v in lab)) for box, lab in overlay(pieces)]
            out[(cls.name, src)] = summed
    return out


def class_index(classes: list[CoreClass]):
    """A box index over the cores of `classes`: (box, class)."""
    from meshrt.routing import BoxIndex

    return BoxIndex([(b, c) for c in classes for b in c.boxes])
