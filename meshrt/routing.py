"""Routes of class-level flows as sets of routers, without enumerating cores.

A router is named by the core it sits on, so a set of routers is a set of
cores. Here such sets are `RectSet`s: disjoint unions of dense boxes in a
canonical form (maximal horizontal bands with identical column runs stacked
into one box), so two sets that hold the same routers compare equal and print
the same. Every operation works on boxes and grows with the number of boxes,
never with the number of cores they cover: a wse3 kernel region of tens of
thousands of cores is one box.

Routes are dimension ordered (XY): a message first travels along its row to
the destination column, then along that column. For a class-level flow the
union over its senders of their routes is computed in closed form per
(sender box, receiver box) pair:

- `shift` by (dx, dy): each sender (x, y) reaches (x + dx, y + dy). The
  X leg of a box of senders is the box stretched by dx along x, the Y leg the
  box moved by dx and stretched by dy along y.
- `row` / `col`: each sender multicasts to the receivers of its own row
  (column). The tree of one sender spans from it to its furthest receivers;
  over a box of senders that is one box per overlapping (sender, receiver)
  box pair, spanning both boxes' columns (rows) on their common rows
  (columns).
- `all`: each sender multicasts to every receiver with an XY tree: along its
  row to every receiver column, then down each receiver column. Per box pair
  that is the sender rows stretched over both boxes' columns, plus the
  receiver columns stretched over both boxes' rows.

All of these are exact for dense boxes. Strided rects (`step sx, sy`) are
cut into their dense columns or rows (or single cores) when that takes at
most `STRIDED_PIECES` boxes, and otherwise over-approximated by their
bounding box; an over-approximated route claims more routers than it uses,
which can only add interference and widen marker-sync regions, never hide a
conflict.

A flow over the wafer-to-wafer link (`cross_wafer`) has no on-mesh route
between its senders and receivers: its route is empty, it takes no colour.
"""

from __future__ import annotations

import itertools
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator, Sequence

from meshrt.dialects.mesh import CoreSetAttr, RectAttr

Box = tuple[int, int, int, int]
"""(x0, y0, x1, y1): the dense box of cores x0 <= x < x1, y0 <= y < y1."""

STRIDED_PIECES = 64
"""Most dense pieces a strided rect is cut into before its bounding box is used."""


def box_of(x: int, y: int, w: int, h: int) -> Box:
    return (x, y, x + w, y + h)


def boxes_intersect(a: Box, b: Box) -> bool:
    return a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3]


def box_intersection(a: Box, b: Box) -> Box | None:
    x0, y0 = max(a[0], b[0]), max(a[1], b[1])
    x1, y1 = min(a[2], b[2]), min(a[3], b[3])
    return (x0, y0, x1, y1) if x0 < x1 and y0 < y1 else None


def box_contains(b: Box, x: int, y: int) -> bool:
    return b[0] <= x < b[2] and b[1] <= y < b[3]


def box_subtract(a: Box, b: Box) -> list[Box]:
    """`a` minus `b` as at most four disjoint boxes."""
    if not boxes_intersect(a, b):
        return [a]
    ax0, ay0, ax1, ay1 = a
    bx0, by0, bx1, by1 = max(a[0], b[0]), max(a[1], b[1]), min(a[2], b[2]), min(a[3], b[3])
    out: list[Box] = []
    if ay0 < by0:
        out.append((ax0, ay0, ax1, by0))
    if by1 < ay1:
        out.append((ax0, by1, ax1, ay1))
    if ax0 < bx0:
        out.append((ax0, by0, bx0, by1))
    if bx1 < ax1:
        out.append((bx1, by0, ax1, by1))
    return out


def _canonical(boxes: Iterable[Box]) -> tuple[Box, ...]:
    """The union of `boxes` as canonical disjoint boxes.

    Cut the plane at every box's top and bottom edge; in each band merge the
    covered column intervals; stack consecutive bands whose intervals are
    equal. Work is O(bands x boxes), independent of the area covered.
    """
    bs = [b for b in boxes if b[0] < b[2] and b[1] < b[3]]
    if not bs:
        return ()
    if len(bs) == 1:
        return (bs[0],)
    ys = sorted({b[1] for b in bs} | {b[3] for b in bs})
    bs.sort(key=lambda b: b[1])
    active: list[Box] = []
    nxt = 0
    bands: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    for ya, yb in itertools.pairwise(ys):
        while nxt < len(bs) and bs[nxt][1] <= ya:
            active.append(bs[nxt])
            nxt += 1
        active = [b for b in active if b[3] > ya]
        if not active:
            continue
        ivs = sorted((b[0], b[2]) for b in active)
        merged: list[tuple[int, int]] = []
        for x0, x1 in ivs:
            if merged and x0 <= merged[-1][1]:
                if x1 > merged[-1][1]:
                    merged[-1] = (merged[-1][0], x1)
            else:
                merged.append((x0, x1))
        key = tuple(merged)
        if bands and bands[-1][1] == ya and bands[-1][2] == key:
            bands[-1] = (bands[-1][0], yb, key)
        else:
            bands.append((ya, yb, key))
    return tuple((x0, ya, x1, yb) for ya, yb, ivs in bands for x0, x1 in ivs)


class RectSet:
    """A set of routers (cores) as canonical disjoint dense boxes."""

    __slots__ = ("boxes", "_bands")

    def __init__(self, boxes: Iterable[Box] = ()):
        self.boxes: tuple[Box, ...] = _canonical(boxes)
        self._bands: tuple | None = None

    def _band_index(self) -> tuple:
        """(tops, bottoms, bands): the canonical boxes by band, each band (y0, y1, x0s,
        x1s) with its boxes' x ranges in order (bands are disjoint and go down the
        mesh; a band's boxes are disjoint and go along it), for intersections by
        bisection instead of box against box."""
        if self._bands is None:
            bands: list[tuple[int, int, list[int], list[int]]] = []
            for x0, y0, x1, y1 in self.boxes:
                if not bands or bands[-1][0] != y0:
                    bands.append((y0, y1, [], []))
                bands[-1][2].append(x0)
                bands[-1][3].append(x1)
            self._bands = ([b[0] for b in bands], [b[1] for b in bands], bands)
        return self._bands

    # -- construction ----------------------------------------------------
    @staticmethod
    def of(x: int, y: int, w: int, h: int) -> RectSet:
        return RectSet([box_of(x, y, w, h)])

    @staticmethod
    def from_cores(cores: CoreSetAttr) -> RectSet:
        return RectSet(b for r in cores.rects for b in rect_boxes(r))

    # -- algebra -----------------------------------------------------------
    def __or__(self, other: RectSet) -> RectSet:
        return RectSet(self.boxes + other.boxes)

    def __and__(self, other: RectSet) -> RectSet:
        few, many = sorted((self, other), key=lambda r: len(r.boxes))
        tops, bottoms, bands = many._band_index()
        out = []
        for a in few.boxes:
            # the bands a spans, then the boxes of each that a spans
            for y0, y1, x0s, x1s in bands[bisect_right(bottoms, a[1]):bisect_left(tops, a[3])]:
                for k in range(bisect_right(x1s, a[0]), bisect_left(x0s, a[2])):
                    out.append((max(a[0], x0s[k]), max(a[1], y0), min(a[2], x1s[k]), min(a[3], y1)))
        return RectSet(out)

    def __sub__(self, other: RectSet) -> RectSet:
        pieces = list(self.boxes)
        for b in other.boxes:
            pieces = [p for a in pieces for p in box_subtract(a, b)]
        return RectSet(pieces)

    def clip(self, width: int, height: int) -> RectSet:
        return self & RectSet([(0, 0, width, height)])

    def intersects(self, other: RectSet) -> bool:
        return any(boxes_intersect(a, b) for a in self.boxes for b in other.boxes)

    def contains(self, x: int, y: int) -> bool:
        return any(box_contains(b, x, y) for b in self.boxes)

    def covers(self, other: RectSet) -> bool:
        return not (other - self)

    # -- views -------------------------------------------------------------
    def __bool__(self) -> bool:
        return bool(self.boxes)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RectSet) and self.boxes == other.boxes

    def __hash__(self) -> int:
        return hash(self.boxes)

    def __iter__(self) -> Iterator[Box]:
        return iter(self.boxes)

    @property
    def count(self) -> int:
        return sum((b[2] - b[0]) * (b[3] - b[1]) for b in self.boxes)

    def first_core(self) -> tuple[int, int]:
        b = self.boxes[0]
        return b[0], b[1]

    def to_coreset(self) -> CoreSetAttr:
        if not self.boxes:
            raise ValueError("an empty router set has no core-set form")
        return CoreSetAttr([RectAttr(x0, y0, x1 - x0, y1 - y0) for x0, y0, x1, y1 in self.boxes])

    def __str__(self) -> str:
        return ", ".join(f"({x0}, {y0}, {x1 - x0}, {y1 - y0})" for x0, y0, x1, y1 in self.boxes)

    def __repr__(self) -> str:
        return f"RectSet<{self}>"


def line_relay_obstacle(senders: RectSet, receivers: RectSet) -> str | None:
    """Why a gather of several `senders` on one colour whose receivers include some of
    them cannot run as a relay along the receivers (each receiver passes the stream on),
    or None when it can: every receiver must be a sender, and the receivers one line. A
    router forwards a colour one way, so no other overlap of senders and receivers has a
    route (`synthesize_schedules` sends those through one sender first)."""
    if (senders & receivers) != receivers or len(receivers.boxes) != 1:
        return ("its receivers are partly senders; the relay needs every receiver to be a "
                "sender and the receivers to form one box")
    x0, y0, x1, y1 = receivers.boxes[0]
    if x1 - x0 > 1 and y1 - y0 > 1:
        return ("its receivers are also its senders and do not form one line (the relay "
                "runs along a line)")
    return None


def line_count(senders: RectSet, receivers: RectSet, along_rows: bool) -> int:
    """Most sender cores in one row (column) that holds a receiver."""
    lo, hi = (1, 3) if along_rows else (0, 2)

    def size(b: Box) -> int:  # cores of box b in one of its rows (columns)
        return b[2] - b[0] if along_rows else b[3] - b[1]

    best = 0
    for r in receivers:
        for line in {r[lo]} | {s[lo] for s in senders if r[lo] <= s[lo] < r[hi]}:
            best = max(best, sum(size(s) for s in senders if s[lo] <= line < s[hi]))
    return best


def rect_boxes(r: RectAttr, limit: int = STRIDED_PIECES) -> list[Box]:
    """Dense boxes covering rect `r`: exact, or its bounding box if too many."""
    x, y, w, h, sx, sy = r.tuple
    if sx == 1 and sy == 1:
        return [box_of(x, y, w, h)]
    xs = [(x, x + w)] if sx == 1 else [(x + i * sx, x + i * sx + 1) for i in range(w)]
    ys = [(y, y + h)] if sy == 1 else [(y + j * sy, y + j * sy + 1) for j in range(h)]
    if len(xs) * len(ys) > limit:
        x0, y0, x1, y1 = r.extent
        return [(x0, y0, x1, y1)]
    return [(xa, ya, xb, yb) for ya, yb in ys for xa, xb in xs]


def _core_boxes(cores: CoreSetAttr) -> list[Box]:
    return [b for r in cores.rects for b in rect_boxes(r)]


def shift_route(senders: Sequence[Box], dx: int, dy: int) -> list[Box]:
    out: list[Box] = []
    for x0, y0, x1, y1 in senders:
        out.append((min(x0, x0 + dx), y0, max(x1, x1 + dx), y1))  # X leg
        out.append((x0 + dx, min(y0, y0 + dy), x1 + dx, max(y1, y1 + dy)))  # Y leg
    return out


def row_route(senders: Sequence[Box], receivers: Sequence[Box]) -> list[Box]:
    out: list[Box] = []
    for s in senders:
        for r in receivers:
            ya, yb = max(s[1], r[1]), min(s[3], r[3])
            if ya < yb:
                out.append((min(s[0], r[0]), ya, max(s[2], r[2]), yb))
    return out


def col_route(senders: Sequence[Box], receivers: Sequence[Box]) -> list[Box]:
    out: list[Box] = []
    for s in senders:
        for r in receivers:
            xa, xb = max(s[0], r[0]), min(s[2], r[2])
            if xa < xb:
                out.append((xa, min(s[1], r[1]), xb, max(s[3], r[3])))
    return out


def all_route(senders: Sequence[Box], receivers: Sequence[Box]) -> list[Box]:
    out: list[Box] = []
    for s in senders:
        for r in receivers:
            out.append((min(s[0], r[0]), s[1], max(s[2], r[2]), s[3]))  # along sender rows
            out.append((r[0], min(s[1], r[1]), r[2], max(s[3], r[3])))  # down receiver columns
    return out


def pattern_routers(
    pattern: str,
    src: CoreSetAttr,
    dst: CoreSetAttr,
    offset: tuple[int, int] = (0, 0),
) -> RectSet:
    """Routers that a class-level flow's XY routes / multicast trees cross."""
    senders = _core_boxes(src)
    if pattern == "shift":
        return RectSet(shift_route(senders, *offset))
    receivers = _core_boxes(dst)
    if pattern == "row":
        return RectSet(row_route(senders, receivers))
    if pattern == "col":
        return RectSet(col_route(senders, receivers))
    if pattern == "all":
        return RectSet(all_route(senders, receivers))
    raise ValueError(f"unknown flow pattern '{pattern}'")


def flow_routers(flow) -> RectSet:
    """Routers of an `event.flow` on its sender wafer (empty across the wafer link)."""
    if flow.crosses_wafer:
        return RectSet()
    return pattern_routers(flow.pattern.data, flow.src, flow.dst, flow.offset)


def xy_path(src: tuple[int, int], dst: tuple[int, int]) -> list[tuple[int, int]]:
    """The routers of one XY route, core by core (for tests of small cases)."""
    (x, y), (tx, ty) = src, dst
    path = [(x, y)]
    while x != tx:
        x += 1 if tx > x else -1
        path.append((x, y))
    while y != ty:
        y += 1 if ty > y else -1
        path.append((x, y))
    return path


def xy_tree(src: tuple[int, int], targets: Sequence[tuple[int, int]]
            ) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """The XY multicast tree from `src` to `targets`: router -> next routers.

    The union of the XY routes (along the source's row, then down or up each
    target's column), built in one pass over the tree rather than route by
    route. A router's next routers come in the order of the first target
    (in `targets` order) whose route takes them, as merging the routes one
    by one would list them.
    """
    sx, sy = src
    first: dict[int, int] = {}  # column -> index of its first target
    lo: dict[int, int] = {}  # column -> least target y; first target above / below the row
    hi: dict[int, int] = {}
    up: dict[int, int] = {}
    down: dict[int, int] = {}
    for i, (tx, ty) in enumerate(targets):
        first.setdefault(tx, i)
        lo[tx] = min(lo.get(tx, ty), ty)
        hi[tx] = max(hi.get(tx, ty), ty)
        if ty < sy:
            up.setdefault(tx, i)
        elif ty > sy:
            down.setdefault(tx, i)
    if not first:
        return {}
    cols = sorted(first)
    # along the row: the edge x -> x +- 1 is first taken by the first target beyond it
    right: dict[int, int] = {}
    left: dict[int, int] = {}
    best = None
    for x in reversed(cols):
        if x <= sx:
            break
        best = first[x] if best is None else min(best, first[x])
        right[x] = best
    best = None
    for x in cols:
        if x >= sx:
            break
        best = first[x] if best is None else min(best, first[x])
        left[x] = best
    tree: dict[tuple[int, int], list[tuple[int, int]]] = {}
    # first target index beyond x along the row, for every router of the row span
    reach_r = [(x, right[x]) for x in sorted(right)]
    reach_l = [(x, left[x]) for x in sorted(left, reverse=True)]

    def row_kids(x: int, nxt_r: int | None, nxt_l: int | None) -> None:
        kids = []
        if nxt_r is not None:
            kids.append((nxt_r, (x + 1, sy)))
        if nxt_l is not None:
            kids.append((nxt_l, (x - 1, sy)))
        if x in down:
            kids.append((down[x], (x, sy + 1)))
        if x in up:
            kids.append((up[x], (x, sy - 1)))
        if kids:
            kids.sort(key=lambda k: k[0])
            tree[(x, sy)] = [k[1] for k in kids]

    # routers of the row right of the source (and the source itself), then left of it
    k = 0
    for x in range(sx, (reach_r[-1][0] if reach_r else sx) + 1):
        while k < len(reach_r) and reach_r[k][0] <= x:
            k += 1
        nxt_r = reach_r[k][1] if k < len(reach_r) else None
        nxt_l = None
        if x == sx and reach_l:
            nxt_l = reach_l[0][1] if reach_l[0][0] < sx else None
        row_kids(x, nxt_r, nxt_l)
    k = 0
    for x in range(sx - 1, (reach_l[-1][0] if reach_l else sx) - 1, -1):
        while k < len(reach_l) and reach_l[k][0] >= x:
            k += 1
        row_kids(x, None, reach_l[k][1] if k < len(reach_l) else None)
    # down and up each target column, one next router per router
    for tx in cols:
        for y in range(sy + 1, hi[tx]):
            tree[(tx, y)] = [(tx, y + 1)]
        for y in range(sy - 1, lo[tx], -1):
            tree[(tx, y)] = [(tx, y - 1)]
    return tree


def reference_routers(pattern: str, src: CoreSetAttr, dst: CoreSetAttr,
                      offset: tuple[int, int] = (0, 0)) -> set[tuple[int, int]]:
    """Core-by-core union of XY paths: the definition `pattern_routers` implements.

    Enumerates cores, so only for tests on small sets.
    """
    out: set[tuple[int, int]] = set()
    receivers = list(dst.cores())
    for s in src.cores():
        if pattern == "shift":
            targets = [(s[0] + offset[0], s[1] + offset[1])]
        elif pattern == "row":
            targets = [r for r in receivers if r[1] == s[1]]
        elif pattern == "col":
            targets = [r for r in receivers if r[0] == s[0]]
        else:
            targets = receivers
        for t in targets:
            out.update(xy_path(s, t))
    return out


class BoxIndex:
    """A uniform-grid index of boxes for intersection queries."""

    def __init__(self, items: Sequence[tuple[Box, object]], cell: int | None = None):
        self.items = list(items)
        if cell is None:
            if self.items:
                # the median box's span: a cell as large as the largest box would put
                # most items in every cell a query visits
                spans = sorted(max(b[2] - b[0], b[3] - b[1]) for b, _ in self.items)
                cell = max(8, min(256, spans[len(spans) // 2]))
            else:
                cell = 8
        self.cell = cell
        self.grid: dict[tuple[int, int], list[int]] = {}
        for i, (b, _) in enumerate(self.items):
            for key in self._cells(b):
                self.grid.setdefault(key, []).append(i)

    def _cells(self, b: Box) -> Iterator[tuple[int, int]]:
        c = self.cell
        for gy in range(b[1] // c, (b[3] - 1) // c + 1):
            for gx in range(b[0] // c, (b[2] - 1) // c + 1):
                yield gx, gy

    def query(self, b: Box) -> list[int]:
        """Indices of the items whose box intersects `b`, in index order."""
        seen: set[int] = set()
        for key in self._cells(b):
            for i in self.grid.get(key, ()):
                if i not in seen and boxes_intersect(self.items[i][0], b):
                    seen.add(i)
        return sorted(seen)


def intersecting_pairs(items: Sequence[tuple[Box, object]]) -> Iterator[tuple[int, int]]:
    """Index pairs (i < j) of items whose boxes intersect (sweep along x)."""
    order = sorted(range(len(items)), key=lambda i: items[i][0][0])
    active: list[int] = []
    for i in order:
        b = items[i][0]
        active = [j for j in active if items[j][0][2] > b[0]]
        for j in active:
            a = items[j][0]
            if a[1] < b[3] and b[1] < a[3]:
                yield (min(i, j), max(i, j))
        active.append(i)
