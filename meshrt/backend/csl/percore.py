"""Per-core values of a class as comptime expressions of its coordinates.

A core class runs one program; what differs between its cores (its router's
route for a flow, how many markers it waits for) is a
function of (px, py), the comptime coordinates the layout passes in. The
function is given as disjoint boxes with values and printed as a chain of
`if` expressions over box bounds, so its size grows with the boxes, never
with the cores.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from meshrt.routing import Box, BoxIndex, box_intersection

# A piece's box may be strided, (x0, y0, x1, y1, sx, sy) with steps of 1 or 2
# (the rows of a switch chain's snake alternate); see streams.SBox.


def clip_to(pieces: Iterable[tuple[Box, object]], boxes: Sequence[Box],
            index: BoxIndex | None = None) -> list[tuple[Box, object]]:
    """The pieces cut to the given boxes (the class's cores), in piece order and,
    within a piece, in box order. A strided piece stays strided (streams.SBox)."""
    from meshrt.backend.csl.streams import sbox_clip

    out: list[tuple[Box, object]] = []
    if not boxes:
        return out
    pieces = list(pieces)
    if index is None and len(pieces) > 8:
        index = BoxIndex([(b, None) for b in boxes])
    # the boxes' bounding box first: most pieces of a long flow miss a class entirely
    bx0, by0 = min(b[0] for b in boxes), min(b[1] for b in boxes)
    bx1, by1 = max(b[2] for b in boxes), max(b[3] for b in boxes)
    for box, value in pieces:
        x0, y0, x1, y1 = dense = box[:4]
        if x0 >= bx1 or bx0 >= x1 or y0 >= by1 or by0 >= y1:
            continue
        cands = index.query(dense) if index is not None else range(len(boxes))
        for i in cands:
            c = sbox_clip(box, boxes[i]) if len(box) == 6 else box_intersection(dense, boxes[i])
            if c is not None:
                out.append((c, value))
    return out


def _area(b: Box) -> int:
    if len(b) == 6:
        return len(range(b[0], b[2], b[4])) * len(range(b[1], b[3], b[5]))
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
    x0, y0, x1, y1 = box[:4]
    sx, sy = (box[4], box[5]) if len(box) == 6 else (1, 1)
    if sx > 1 and len(range(x0, x1, sx)) == 1:
        sx, x1 = 1, x0 + 1
    if sy > 1 and len(range(y0, y1, sy)) == 1:
        sy, y1 = 1, y0 + 1
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
    if sx > 1 and x1 - x0 > 1:
        parts.append(f"(px - {x0}) % {sx} == 0")
    if sy > 1 and y1 - y0 > 1:
        parts.append(f"(py - {y0}) % {sy} == 0")
    return " and ".join(parts) if parts else "true"


def branch(pieces: Sequence[tuple[Box, object]], boxes: Sequence[Box], stmt, default) -> list[str]:
    """Statements that run `stmt(value)` on the cores of each piece, `default` elsewhere.

    `stmt` returns a statement or a list of them; `default` is a statement,
    a list, or None (nothing). Conditions are comptime (px, py), so the
    compiler keeps one arm per core.
    """
    def lines(v) -> list[str]:
        out = stmt(v) if v is not _DEFAULT else default
        if out is None:
            return []
        return [out] if isinstance(out, str) else list(out)

    groups: dict[object, list[Box]] = {}
    for box, value in pieces:
        groups.setdefault(value, []).append(box)
    covered = sum(_area(b) for b, _ in pieces)
    total = sum(_area(b) for b in boxes)
    if len(groups) == 1 and covered == total:
        return lines(next(iter(groups)))
    if not groups:
        return lines(_DEFAULT)
    out: list[str] = []
    for i, (value, bs) in enumerate(groups.items()):
        cond = " or ".join(f"({_cond(b, boxes)})" if len(bs) > 1 else _cond(b, boxes) for b in bs)
        out.append(("if" if i == 0 else "} else if") + f" ({cond}) {{")
        out += ["  " + line for line in lines(value)]
    rest = lines(_DEFAULT) if covered < total else []
    if rest:
        out.append("} else {")
        out += ["  " + line for line in rest]
    out.append("}")
    return out


_DEFAULT = object()
