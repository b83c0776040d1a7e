"""Partition role core sets into core classes, without enumerating cores.

Each role of each kernel covers a set of dense rectangles. Cores that belong
to exactly the same roles run the same event table, so they form one core
class. Only rectangles that overlap need cutting: the input is split into
groups of mutually overlapping rectangles (sort and sweep), each group is
cut on its own x and y boundaries (coordinate compression), and the cells
with the same membership are merged back into rectangles. The work grows
with the number of roles and their overlaps, never with mesh area.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence

Rect = tuple[int, int, int, int]  # x, y, w, h


def _overlap(a: Rect, b: Rect) -> bool:
    return a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3] and b[1] < a[1] + a[3]


def _groups(rects: Sequence[Rect]) -> list[list[int]]:
    """Indices of `rects` grouped into connected components of overlap."""
    parent = list(range(len(rects)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    order = sorted(range(len(rects)), key=lambda i: rects[i][0])
    active: list[int] = []
    for i in order:
        x0 = rects[i][0]
        active = [j for j in active if rects[j][0] + rects[j][2] > x0]
        for j in active:
            if _overlap(rects[i], rects[j]):
                parent[find(i)] = find(j)
        active.append(i)
    groups: dict[int, list[int]] = defaultdict(list)
    for i in range(len(rects)):
        groups[find(i)].append(i)
    return list(groups.values())


def _merge_cells(cells: list[Rect]) -> list[Rect]:
    """Merge grid cells into maximal horizontal runs, then stack equal runs."""
    rows: dict[tuple[int, int], list[Rect]] = defaultdict(list)
    for c in cells:
        rows[(c[1], c[3])].append(c)
    runs: list[Rect] = []
    for (y, h), row in rows.items():
        row.sort()
        cur = row[0]
        for c in row[1:]:
            if c[0] == cur[0] + cur[2]:
                cur = (cur[0], y, cur[2] + c[2], h)
            else:
                runs.append(cur)
                cur = c
        runs.append(cur)
    cols: dict[tuple[int, int], list[Rect]] = defaultdict(list)
    for r in runs:
        cols[(r[0], r[2])].append(r)
    merged: list[Rect] = []
    for (x, w), col in cols.items():
        col.sort(key=lambda r: r[1])
        cur = col[0]
        for r in col[1:]:
            if r[1] == cur[1] + cur[3]:
                cur = (x, cur[1], w, cur[3] + r[3])
            else:
                merged.append(cur)
                cur = r
        merged.append(cur)
    return sorted(merged, key=lambda r: (r[1], r[0]))


def partition(members: Sequence[tuple[Rect, Hashable]]) -> list[tuple[list[Rect], frozenset]]:
    """Core classes of `(rect, key)` memberships: (rects of the class, its keys).

    Classes come out in a deterministic order (by their first rectangle).
    """
    rects = [m[0] for m in members]
    classes: dict[frozenset, list[Rect]] = defaultdict(list)
    for group in _groups(rects):
        if len(group) == 1:
            r, key = members[group[0]]
            classes[frozenset([key])].append(r)
            continue
        xs = sorted({v for i in group for v in (rects[i][0], rects[i][0] + rects[i][2])})
        ys = sorted({v for i in group for v in (rects[i][1], rects[i][1] + rects[i][3])})
        xi = {v: n for n, v in enumerate(xs)}
        yi = {v: n for n, v in enumerate(ys)}
        cover: dict[tuple[int, int], set] = defaultdict(set)
        for i in group:
            x, y, w, h = rects[i]
            for cx in range(xi[x], xi[x + w]):
                for cy in range(yi[y], yi[y + h]):
                    cover[(cx, cy)].add(members[i][1])
        by_sig: dict[frozenset, list[Rect]] = defaultdict(list)
        for (cx, cy), keys in cover.items():
            by_sig[frozenset(keys)].append((xs[cx], ys[cy], xs[cx + 1] - xs[cx], ys[cy + 1] - ys[cy]))
        for sig, cells in by_sig.items():
            classes[sig].extend(_merge_cells(cells))
    result = [(sorted(rs, key=lambda r: (r[1], r[0])), sig) for sig, rs in classes.items()]
    result.sort(key=lambda c: (c[0][0][1], c[0][0][0], sorted(map(str, c[1]))))
    return result
