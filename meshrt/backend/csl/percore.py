"""Per-core values of a class as comptime expressions of its coordinates.

A core class runs one program; what differs between its cores (the route
word of its router for a flow, how many markers it waits for) is a
function of (px, py), the comptime coordinates the layout passes in. The
function is given as disjoint boxes with values and printed as a chain of
`if` expressions over box bounds, so its size grows with the boxes, never
with the cores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from meshrt.routing import Box, BoxIndex, box_intersection


def clip_to(pieces: Iterable[tuple[Box, object]], boxes: Sequence[Box],
            index: BoxIndex | None = None) -> list[tuple[Box, object]]:
    """The pieces cut to the given boxes (the class's cores)."""
    out = []
    pieces = list(pieces)
    if index is None and len(pieces) > 8:
        index = BoxIndex([(b, None) for b in boxes])
    for box, value in pieces:
        cands = index.query(box) if index is not None else range(len(boxes))
        for i in cands:
            c = box_intersection(box, boxes[i])
            if c is not None:
                out.append((c, value))
    return out


def _area(b: Box) -> int:
    return (b[2] - b[0]) * (b[3] - b[1])


def expr(pieces: Sequence[tuple[Box, int]], boxes: Sequence[Box], default: int = 0,
         fmt=str) -> str:
    """A CSL expression of px, py: the piece value at the core, else `default`.

    `pieces` must be disjoint and already clipped to `boxes`.
    """
    pieces = [(b, v) for b, v in pieces if v != default]
    if not pieces:
        return fmt(default)
    total = sum(_area(b) for b in boxes)
    values = {v for _, v in pieces}
    if len(values) == 1 and sum(_area(b) for b, _ in pieces) == total:
        return fmt(pieces[0][1])
    # Group equal values so each value is tested once per box.
    out = fmt(default)
    for box, value in reversed(pieces):
        out = f"if ({_cond(box, boxes)}) {fmt(value)} else {out}"
    return out


def _cond(box: Box, boxes: Sequence[Box]) -> str:
    x0, y0, x1, y1 = box
    ex0 = min(b[0] for b in boxes)
    ey0 = min(b[1] for b in boxes)
    ex1 = max(b[2] for b in boxes)
    ey1 = max(b[3] for b in boxes)
    parts = []
    if x1 - x0 == 1:
        parts.append(f"px == {x0}")
    else:
        if x0 > ex0:
            parts.append(f"px >= {x0}")
        if x1 < ex1:
            parts.append(f"px < {x1}")
    if y1 - y0 == 1:
        parts.append(f"py == {y0}")
    else:
        if y0 > ey0:
            parts.append(f"py >= {y0}")
        if y1 < ey1:
            parts.append(f"py < {y1}")
    return " and ".join(parts) if parts else "true"
