"""Per-router colour configurations of class-level flows, as boxes.

A flow's XY routes (or multicast trees, `meshrt.routing`) pass through each
router in at most a few ways: a wavelet enters from one side (or the ramp)
and leaves on some sides (or the ramp). Every router of a dense box of
routers that the flow crosses "the same way" gets the same
`@set_color_config`, so the layout emits one loop per such box, never one
call per core.

For each (sender box, receiver box) pair the routers are cut at the pair's
critical coordinates (box edges, shifted edges, each +-1); within one cell of
that grid every condition below is constant, so one representative router
decides the cell. The cells of all pairs are then overlaid (a band sweep)
and the contributions at each router united: a Cerebras router sends a
wavelet accepted from any of its input sides to all of its output sides, so
the union is what the hardware does. Where several senders' trees meet,
the union would merge streams on one colour (and WSE-3 takes a colour from
one side only), so `streams.py` keeps these unions for single senders and
disjoint shifts and routes several senders along a switch chain.

A contribution is a pair (rx, tx): "wavelets entering from rx leave towards
tx". Keeping pairs rather than the plain union lets the emitter see routers
that both inject (rx = RAMP) and deliver (tx = RAMP) on one colour: a core in
the middle of a reduction chain receives from its upstream neighbour and
later sends to its downstream one. Such a router is *phased*: the program
switches its own router between the receive and the send configuration at
run time (a static union would loop the core's own wavelets back).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

from meshrt.routing import Box, RectSet, rect_boxes

RAMP, NORTH, SOUTH, EAST, WEST = "RAMP", "NORTH", "SOUTH", "EAST", "WEST"
DIRS = (RAMP, NORTH, SOUTH, EAST, WEST)


Pair = tuple[str, str]
Label = frozenset[Pair]


@dataclass(frozen=True)
class RouterConfig:
    """What one router does with one colour for one flow."""

    pairs: Label

    @cached_property
    def rx(self) -> tuple[str, ...]:
        return tuple(d for d in DIRS if any(p[0] == d for p in self.pairs))

    @cached_property
    def tx(self) -> tuple[str, ...]:
        return tuple(d for d in DIRS if any(p[1] == d for p in self.pairs))

    @cached_property
    def send_tx(self) -> tuple[str, ...]:
        return tuple(d for d in DIRS if (RAMP, d) in self.pairs)

    @cached_property
    def phased(self) -> bool:
        """Injects and delivers on the same colour: needs run-time phases."""
        return bool(self.send_tx) and any(rx != RAMP and tx == RAMP for rx, tx in self.pairs)

    def send_phase(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return (RAMP,), self.send_tx

    def recv_phase(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        rest = [p for p in self.pairs if p[0] != RAMP]
        return (tuple(d for d in DIRS if any(p[0] == d for p in rest)),
                tuple(d for d in DIRS if any(p[1] == d for p in rest)))

    def static(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.rx, self.tx

    @cached_property
    def merges(self) -> bool:
        """Several input sides on one colour: streams interleave wavelet by wavelet."""
        rx, _ = self.recv_phase() if self.phased else self.static()
        return len(rx) > 1

    @cached_property
    def loops(self) -> bool:
        """A side that is both an input and an output (other than the ramp)."""
        rx, tx = self.recv_phase() if self.phased else self.static()
        return any(d in tx for d in rx if d != RAMP)


# ---------------------------------------------------------------------------
# Contributions at one router, per pattern, from one sender box
# ---------------------------------------------------------------------------


def _vertical_tx(x: int, y: int, r: Box) -> list[str]:
    """Output sides at (x, y) on a receiver column of box r (x inside r's columns)."""
    out = []
    if r[3] - 1 > y:
        out.append(SOUTH)
    if r[1] < y:
        out.append(NORTH)
    if r[1] <= y < r[3]:
        out.append(RAMP)
    return out


def _all_pairs(x: int, y: int, s: Box, r: Box) -> set[Pair]:
    """Every sender of s multicasts to every receiver of r (XY tree)."""
    a0, b0, a1, b1 = s
    c0, d0, c1, d1 = r
    out: set[Pair] = set()
    in_rcols = c0 <= x < c1
    if a0 <= x < a1 and b0 <= y < b1:  # the sender itself
        tx = []
        if c1 - 1 > x:
            tx.append(EAST)
        if c0 < x:
            tx.append(WEST)
        if in_rcols:
            tx += _vertical_tx(x, y, r)
        out.update((RAMP, t) for t in tx)
    if b0 <= y < b1:  # on a sender's row, away from it
        if a0 < x and c1 - 1 >= x:  # a sender to the west reaches further east
            tx = [EAST] if c1 - 1 > x else []
            if in_rcols:
                tx += _vertical_tx(x, y, r)
            out.update((WEST, t) for t in tx)
        if a1 - 1 > x and c0 <= x:
            tx = [WEST] if c0 < x else []
            if in_rcols:
                tx += _vertical_tx(x, y, r)
            out.update((EAST, t) for t in tx)
    if in_rcols:  # down / up a receiver column from another row
        if b0 < y and d1 - 1 >= y:
            tx = ([SOUTH] if d1 - 1 > y else []) + ([RAMP] if d0 <= y < d1 else [])
            out.update((NORTH, t) for t in tx)
        if b1 - 1 > y and d0 <= y:
            tx = ([NORTH] if d0 < y else []) + ([RAMP] if d0 <= y < d1 else [])
            out.update((SOUTH, t) for t in tx)
    return out


def _row_pairs(x: int, y: int, s: Box, r: Box) -> set[Pair]:
    """Every sender multicasts to the receivers of its own row."""
    a0, b0, a1, b1 = s
    c0, d0, c1, d1 = r
    out: set[Pair] = set()
    if not (b0 <= y < b1 and d0 <= y < d1):
        return out
    here = [RAMP] if c0 <= x < c1 else []
    if a0 <= x < a1:
        tx = ([EAST] if c1 - 1 > x else []) + ([WEST] if c0 < x else []) + here
        out.update((RAMP, t) for t in tx)
    if a0 < x and c1 - 1 >= x:
        out.update((WEST, t) for t in ([EAST] if c1 - 1 > x else []) + here)
    if a1 - 1 > x and c0 <= x:
        out.update((EAST, t) for t in ([WEST] if c0 < x else []) + here)
    return out


def _col_pairs(x: int, y: int, s: Box, r: Box) -> set[Pair]:
    """Every sender multicasts to the receivers of its own column."""
    a0, b0, a1, b1 = s
    c0, d0, c1, d1 = r
    out: set[Pair] = set()
    if not (a0 <= x < a1 and c0 <= x < c1):
        return out
    here = [RAMP] if d0 <= y < d1 else []
    if b0 <= y < b1:
        tx = ([SOUTH] if d1 - 1 > y else []) + ([NORTH] if d0 < y else []) + here
        out.update((RAMP, t) for t in tx)
    if b0 < y and d1 - 1 >= y:
        out.update((NORTH, t) for t in ([SOUTH] if d1 - 1 > y else []) + here)
    if b1 - 1 > y and d0 <= y:
        out.update((SOUTH, t) for t in ([NORTH] if d0 < y else []) + here)
    return out


def _overlaps(lo: int, hi: int, a: int, b: int) -> bool:
    """[lo, hi) meets [a, b)."""
    return max(lo, a) < min(hi, b)


def _shift_pairs(x: int, y: int, s: Box, dx: int, dy: int) -> set[Pair]:
    """Every sender (sx, sy) sends to (sx + dx, sy + dy) along its XY route."""
    a0, b0, a1, b1 = s
    out: set[Pair] = set()
    turn = SOUTH if dy > 0 else NORTH if dy < 0 else RAMP
    if a0 <= x < a1 and b0 <= y < b1:
        first = EAST if dx > 0 else WEST if dx < 0 else SOUTH if dy > 0 else NORTH
        out.add((RAMP, first))
    if dx and b0 <= y < b1:  # X leg
        if dx > 0:
            if _overlaps(x - dx, x, a0, a1):
                if _overlaps(x - dx + 1, x, a0, a1):
                    out.add((WEST, EAST))
                if a0 <= x - dx < a1:
                    out.add((WEST, turn))
        else:
            if _overlaps(x + 1, x - dx + 1, a0, a1):
                if _overlaps(x + 1, x - dx, a0, a1):
                    out.add((EAST, WEST))
                if a0 <= x - dx < a1:
                    out.add((EAST, turn))
    if dy and a0 <= x - dx < a1:  # Y leg on the receivers' column
        if dy > 0:
            if _overlaps(y - dy, y, b0, b1):
                if _overlaps(y - dy + 1, y, b0, b1):
                    out.add((NORTH, SOUTH))
                if b0 <= y - dy < b1:
                    out.add((NORTH, RAMP))
        else:
            if _overlaps(y + 1, y - dy + 1, b0, b1):
                if _overlaps(y + 1, y - dy, b0, b1):
                    out.add((SOUTH, NORTH))
                if b0 <= y - dy < b1:
                    out.add((SOUTH, RAMP))
    return out


# ---------------------------------------------------------------------------
# Cells of one pair, overlay of all pairs
# ---------------------------------------------------------------------------


def _cuts(edges: Iterable[int], lo: int, hi: int) -> list[int]:
    pts = {lo, hi}
    for e in edges:
        for v in (e - 1, e, e + 1):
            if lo < v < hi:
                pts.add(v)
    return sorted(pts)


def _pair_cells(fn, bound: Box, xs_edges: Sequence[int], ys_edges: Sequence[int],
                route: Sequence[Box]) -> list[tuple[Box, Label]]:
    """Cells of the pair's cut grid inside its route boxes, with their pairs."""
    x0, y0, x1, y1 = bound
    xs = _cuts(xs_edges, x0, x1)
    ys = _cuts(ys_edges, y0, y1)
    out = []
    for ya, yb in itertools.pairwise(ys):
        rows = [r for r in route if r[1] <= ya < r[3]]
        if not rows:
            continue
        for xa, xb in itertools.pairwise(xs):
            if not any(r[0] <= xa < r[2] for r in rows):
                continue
            pairs = fn(xa, ya)
            if pairs:
                out.append(((xa, ya, xb, yb), frozenset(pairs)))
    return out


def overlay(pieces: Sequence[tuple[Box, Label]]) -> list[tuple[Box, Label]]:
    """Disjoint boxes whose label is the union of the labels covering them.

    Sweeps horizontal bands between consecutive y edges; within a band a
    second sweep along x keeps a count per (rx, tx) pair of the pieces
    covering the current interval. Equal neighbouring intervals and bands
    are merged. Work grows with the pieces, never with the area they cover.
    """
    if not pieces:
        return []
    if len(pieces) == 1:
        return list(pieces)
    ys = sorted({p[0][1] for p in pieces} | {p[0][3] for p in pieces})
    order = sorted(range(len(pieces)), key=lambda i: pieces[i][0][1])
    active: list[int] = []
    nxt = 0
    bands: list[tuple[int, int, tuple[tuple[int, int, Label], ...]]] = []
    for ya, yb in itertools.pairwise(ys):
        changed = False
        while nxt < len(order) and pieces[order[nxt]][0][1] <= ya:
            active.append(order[nxt])
            nxt += 1
            changed = True
        kept = [i for i in active if pieces[i][0][3] > ya]
        changed = changed or len(kept) != len(active)
        active = kept
        if not active:
            continue
        if not changed and bands and bands[-1][1] == ya:
            bands[-1] = (bands[-1][0], yb, bands[-1][2])  # same pieces: same band
            continue
        events: list[tuple[int, int, int]] = []  # (x, +1 / -1, piece)
        for i in active:
            b = pieces[i][0]
            events.append((b[0], 1, i))
            events.append((b[2], -1, i))
        events.sort()
        counts: dict[Pair, int] = {}
        segs: list[tuple[int, int, Label]] = []
        k = 0
        prev_x = None
        while k < len(events):
            x = events[k][0]
            if prev_x is not None and x > prev_x:
                lab = frozenset(p for p, c in counts.items() if c > 0)
                if lab:
                    if segs and segs[-1][1] == prev_x and segs[-1][2] == lab:
                        segs[-1] = (segs[-1][0], x, lab)
                    else:
                        segs.append((prev_x, x, lab))
            while k < len(events) and events[k][0] == x:
                _, d, i = events[k]
                for pair in pieces[i][1]:
                    counts[pair] = counts.get(pair, 0) + d
                k += 1
            prev_x = x
        key = tuple(segs)
        if bands and bands[-1][1] == ya and bands[-1][2] == key:
            bands[-1] = (bands[-1][0], yb, key)
        elif segs:
            bands.append((ya, yb, key))
    return [((xa, ya, xb, yb), lab) for ya, yb, segs in bands for xa, xb, lab in segs]


def flow_router_configs(flow, width: int, height: int) -> list[tuple[Box, RouterConfig]]:
    """Boxes of routers with one configuration each, for an on-mesh flow."""
    if flow.crosses_wafer:
        return []
    pattern = flow.pattern.data
    # The union of the trees depends on the sets, not on how they are cut into
    # rects: canonical boxes (expert regions side by side merge into one).
    senders = list(RectSet(b for r in flow.src.rects for b in rect_boxes(r)).boxes)
    receivers = list(RectSet(b for r in flow.dst.rects for b in rect_boxes(r)).boxes)
    pieces: list[tuple[Box, Label]] = []
    if pattern == "shift":
        dx, dy = flow.offset
        for s in senders:
            bound = (min(s[0], s[0] + dx), min(s[1], s[1] + dy),
                     max(s[2], s[2] + dx), max(s[3], s[3] + dy))
            fn = (lambda s_: lambda x, y: _shift_pairs(x, y, s_, dx, dy))(s)
            legs = [(min(s[0], s[0] + dx), s[1], max(s[2], s[2] + dx), s[3]),
                    (s[0] + dx, min(s[1], s[1] + dy), s[2] + dx, max(s[3], s[3] + dy))]
            pieces += _pair_cells(fn, bound, (s[0], s[2], s[0] + dx, s[2] + dx),
                                  (s[1], s[3], s[1] + dy, s[3] + dy), legs)
    else:
        pair_fn = {"all": _all_pairs, "row": _row_pairs, "col": _col_pairs}[pattern]
        for s in senders:
            for r in receivers:
                if pattern == "row" and not _overlaps(s[1], s[3], r[1], r[3]):
                    continue
                if pattern == "col" and not _overlaps(s[0], s[2], r[0], r[2]):
                    continue
                bound = (min(s[0], r[0]), min(s[1], r[1]), max(s[2], r[2]), max(s[3], r[3]))
                fn = (lambda s_, r_: lambda x, y: pair_fn(x, y, s_, r_))(s, r)
                legs = [(min(s[0], r[0]), s[1], max(s[2], r[2]), s[3]),
                        (r[0], min(s[1], r[1]), r[2], max(s[3], r[3]))]
                pieces += _pair_cells(fn, bound, (s[0], s[2], r[0], r[2]), (s[1], s[3], r[1], r[3]), legs)
    clip = (0, 0, width, height)
    out = []
    for box, lab in overlay(pieces):
        x0, y0 = max(box[0], clip[0]), max(box[1], clip[1])
        x1, y1 = min(box[2], clip[2]), min(box[3], clip[3])
        if x0 < x1 and y0 < y1:
            out.append(((x0, y0, x1, y1), RouterConfig(lab)))
    return out


def reference_pairs(pattern: str, senders: Iterable[tuple[int, int]],
                    receivers: Iterable[tuple[int, int]], offset: tuple[int, int] = (0, 0)
                    ) -> dict[tuple[int, int], set[Pair]]:
    """Core-by-core (rx, tx) pairs of XY trees: the definition the box code implements.

    Enumerates cores, so only for tests on small sets.
    """
    receivers = list(receivers)
    out: dict[tuple[int, int], set[Pair]] = {}

    def add(r, rx, tx):
        out.setdefault(r, set()).add((rx, tx))

    for s in senders:
        if pattern == "shift":
            targets = [(s[0] + offset[0], s[1] + offset[1])]
        elif pattern == "row":
            targets = [t for t in receivers if t[1] == s[1]]
        elif pattern == "col":
            targets = [t for t in receivers if t[0] == s[0]]
        else:
            targets = receivers
        for t in targets:
            path = [s]
            x, y = s
            while x != t[0]:
                x += 1 if t[0] > x else -1
                path.append((x, y))
            while y != t[1]:
                y += 1 if t[1] > y else -1
                path.append((x, y))
            for i, r in enumerate(path):
                if i == 0:
                    rx = RAMP
                else:
                    px, py = path[i - 1]
                    rx = WEST if px < r[0] else EAST if px > r[0] else NORTH if py < r[1] else SOUTH
                if i == len(path) - 1:
                    tx = RAMP
                else:
                    nx, ny = path[i + 1]
                    tx = EAST if nx > r[0] else WEST if nx < r[0] else SOUTH if ny > r[1] else NORTH
                add(r, rx, tx)
    return out
