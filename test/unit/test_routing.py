"""Class-level XY routes and rect-set algebra against core-by-core definitions."""

import time

from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.dialects.mesh import CoreSetAttr, RectAttr
from meshrt.routing import (
    BoxIndex,
    RectSet,
    box_of,
    boxes_intersect,
    intersecting_pairs,
    pattern_routers,
    reference_routers,
    xy_path,
    xy_tree,
)


def cores_of(rs: RectSet) -> set[tuple[int, int]]:
    return {(x, y) for x0, y0, x1, y1 in rs for y in range(y0, y1) for x in range(x0, x1)}


boxes = st.builds(
    lambda x, y, w, h: box_of(x, y, w, h),
    st.integers(0, 12), st.integers(0, 12), st.integers(1, 6), st.integers(1, 6),
)
box_lists = st.lists(boxes, max_size=6)


def dense_cores(rects):
    return CoreSetAttr([RectAttr(*r) for r in rects])


dense_rect = st.tuples(st.integers(0, 10), st.integers(0, 10), st.integers(1, 5), st.integers(1, 5))
strided_rect = st.tuples(
    st.integers(0, 10), st.integers(0, 10), st.integers(1, 4), st.integers(1, 4),
    st.integers(1, 3), st.integers(1, 3),
)


# -- rect sets -----------------------------------------------------------------


@given(box_lists)
def test_rectset_is_canonical_and_disjoint(bs):
    rs = RectSet(bs)
    want = cores_of(RectSet()) | {c for b in bs for c in cores_of(RectSet([b]))}
    assert cores_of(rs) == want
    assert rs.count == len(want)  # disjoint boxes
    assert RectSet(reversed(bs)) == rs  # canonical: order does not matter
    assert RectSet(rs.boxes) == rs


@given(box_lists, box_lists)
def test_rectset_algebra(a, b):
    A, B = RectSet(a), RectSet(b)
    assert cores_of(A | B) == cores_of(A) | cores_of(B)
    assert cores_of(A & B) == cores_of(A) & cores_of(B)
    assert cores_of(A - B) == cores_of(A) - cores_of(B)
    assert A.intersects(B) == bool(cores_of(A) & cores_of(B))
    assert A.covers(B) == (cores_of(B) <= cores_of(A))


@given(box_lists)
def test_rectset_coreset_round_trip(bs):
    rs = RectSet(bs)
    if rs:
        cs = rs.to_coreset()
        assert set(cs.cores()) == cores_of(rs)
        assert RectSet.from_cores(cs) == rs


@given(st.lists(strided_rect, min_size=1, max_size=3))
def test_strided_cores_are_covered(rects):
    cs = CoreSetAttr([RectAttr(*r) for r in rects])
    assert set(cs.cores()) <= cores_of(RectSet.from_cores(cs))


def test_big_strided_rect_is_over_approximated_by_its_box():
    cs = CoreSetAttr(RectAttr(0, 0, 300, 300, 2, 2))  # 90,000 cores, never enumerated
    rs = RectSet.from_cores(cs)
    assert rs.boxes == ((0, 0, 599, 599),)


# -- routes ----------------------------------------------------------------------


@settings(max_examples=150)
@given(st.lists(dense_rect, min_size=1, max_size=2), st.integers(-4, 4), st.integers(-4, 4))
def test_shift_route_is_the_union_of_xy_paths(src, dx, dy):
    src = [(x + 4, y + 4, w, h) for x, y, w, h in src]
    s = dense_cores(src)
    d = dense_cores([(x + dx, y + dy, w, h) for x, y, w, h in src])
    got = pattern_routers("shift", s, d, (dx, dy))
    assert cores_of(got) == reference_routers("shift", s, d, (dx, dy))


@settings(max_examples=150)
@given(st.sampled_from(["row", "col", "all"]),
       st.lists(dense_rect, min_size=1, max_size=2), st.lists(dense_rect, min_size=1, max_size=2))
def test_multicast_trees_are_the_union_of_xy_paths(pattern, src, dst):
    s, d = dense_cores(src), dense_cores(dst)
    assert cores_of(pattern_routers(pattern, s, d)) == reference_routers(pattern, s, d)


@settings(max_examples=100)
@given(st.sampled_from(["row", "col", "all"]),
       st.lists(strided_rect, min_size=1, max_size=2), st.lists(strided_rect, min_size=1, max_size=2))
def test_strided_routes_cover_every_xy_path(pattern, src, dst):
    s = CoreSetAttr([RectAttr(*r) for r in src])
    d = CoreSetAttr([RectAttr(*r) for r in dst])
    assert reference_routers(pattern, s, d) <= cores_of(pattern_routers(pattern, s, d))


@settings(max_examples=300, deadline=None)
@given(st.tuples(st.integers(0, 7), st.integers(0, 7)),
       st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=12, unique=True))
def test_xy_tree_is_the_union_of_xy_paths_in_route_order(src, targets):
    """One pass over the tree gives what merging the routes one by one gives,
    down to the order of each router's next routers (the interpreter's event order)."""
    merged: dict = {}
    for t in targets:
        path = xy_path(src, t)
        for a, b in zip(path, path[1:]):
            kids = merged.setdefault(a, [])
            if b not in kids:
                kids.append(b)
    assert xy_tree(src, targets) == merged


def test_xy_path_goes_along_the_row_first():
    assert xy_path((0, 0), (2, 1)) == [(0, 0), (1, 0), (2, 0), (2, 1)]
    assert xy_path((3, 3), (3, 1)) == [(3, 3), (3, 2), (3, 1)]


def test_routes_of_big_regions_do_not_enumerate_cores():
    # wse3-sized: an "all" flow from a 700 x 1000 region to a 60 x 1100 column block.
    s = CoreSetAttr(RectAttr(0, 0, 700, 1000))
    d = CoreSetAttr(RectAttr(700, 0, 60, 1100))
    t = time.perf_counter()
    rs = pattern_routers("all", s, d)
    assert time.perf_counter() - t < 0.05
    assert rs.boxes == ((0, 0, 760, 1000), (700, 1000, 760, 1100))
    assert rs.count == 760 * 1000 + 60 * 100


def test_row_multicast_reaches_only_rows_with_receivers():
    s = CoreSetAttr(RectAttr(3, 1, 1, 4))
    d = CoreSetAttr(RectAttr(0, 2, 4, 1))
    assert pattern_routers("row", s, d).boxes == ((0, 2, 4, 3),)


# -- spatial helpers ------------------------------------------------------------------


@given(st.lists(boxes, max_size=12))
def test_intersecting_pairs_matches_brute_force(bs):
    items = [(b, i) for i, b in enumerate(bs)]
    got = set(intersecting_pairs(items))
    want = {(i, j) for i in range(len(bs)) for j in range(i + 1, len(bs)) if boxes_intersect(bs[i], bs[j])}
    assert got == want


@given(st.lists(boxes, max_size=12), boxes)
def test_box_index_query_matches_brute_force(bs, q):
    idx = BoxIndex([(b, i) for i, b in enumerate(bs)], cell=4)
    assert idx.query(q) == [i for i, b in enumerate(bs) if boxes_intersect(b, q)]
