"""Colouring the interference graph of `meshrt.analysis.liveness`.

DSatur over the interference graph, with an exact backtracking search per
connected component when DSatur runs out of colours (see `colour_flows`).
Some flows may take only part of the palette: a flow whose transport chains
several senders through router switches needs a colour with switch
positions, which not every colour of every target has (WSE-3).
The `color-routes` pass turns the result into `segment.route`s, or splits a
segment when no colouring exists.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from meshrt.analysis.liveness import Liveness, Witness

class _Budget(Exception):
    pass


Palettes = Callable[[int], Sequence[int]]


def dsatur(nodes: Sequence[int], adj: dict[int, set[int]], palette: Palettes,
           order: dict[int, int]) -> tuple[dict[int, int], int | None]:
    """Greedy DSatur: (colouring, first node that could not be coloured or None).

    Picks the node with the most distinct neighbour colours (then the most
    neighbours, then the earliest) and gives it the lowest free colour of
    its palette (`palette(node)`).
    """
    colour: dict[int, int] = {}
    sat: dict[int, set[int]] = {v: set() for v in nodes}
    heap = [(0, -len(adj[v]), order[v], v) for v in nodes]
    heapq.heapify(heap)
    while heap:
        neg_sat, _, _, v = heapq.heappop(heap)
        if v in colour or -neg_sat != len(sat[v]):
            continue  # coloured already, or a stale entry
        free = [c for c in palette(v) if c not in sat[v]]
        if not free:
            return colour, v
        c = free[0]
        colour[v] = c
        for u in adj[v]:
            if u not in colour and c not in sat[u]:
                sat[u].add(c)
                heapq.heappush(heap, (-len(sat[u]), -len(adj[u]), order[u], u))
    return colour, None


def exact_colouring(nodes: Sequence[int], adj: dict[int, set[int]], palette: Sequence[int],
                    order: dict[int, int], limit: int = 20_000,
                    allowed: Callable[[int], Sequence[int]] | None = None) -> dict[int, int] | None:
    """A proper colouring of `nodes` by backtracking, or None (none found within `limit` steps).

    Colours are palette indices opened in order (a node may take a used index
    or the next unused one), which removes the symmetric search branches.
    `allowed(node)`, when given, restricts a node to some of the palette's
    colours; the colours are then not interchangeable and every index is tried.
    """
    if len(nodes) > 500:  # deeper than the search (and Python's stack) should go
        return None
    col: dict[int, int] = {}
    # per node, how many of its coloured neighbours hold each colour (kept as nodes are
    # coloured and uncoloured: the search's hot loop reads only its size and keys)
    sat: dict[int, dict[int, int]] = {v: {} for v in nodes}
    steps = 0
    p = len(palette)

    def pick() -> int | None:
        """The uncoloured node with the most distinct neighbour colours, then the most
        neighbours, then the earliest."""
        best, key = None, None
        for v in nodes:
            if v in col:
                continue
            k = (len(sat[v]), len(adj[v]), -order[v])
            if key is None or k > key:
                best, key = v, k
        return best

    def assign(v: int, c: int) -> None:
        col[v] = c
        for u in adj[v]:
            s = sat[u]
            s[c] = s.get(c, 0) + 1

    def unassign(v: int) -> None:
        c = col.pop(v)
        for u in adj[v]:
            s = sat[u]
            if s[c] == 1:
                del s[c]
            else:
                s[c] -= 1

    def go() -> bool:
        nonlocal steps
        steps += 1
        if steps > limit:
            raise _Budget
        v = pick()
        if v is None:
            return True
        used = sat[v]
        top = max(col.values(), default=-1)
        if allowed is None:
            tries: Sequence[int] = range(min(top + 2, p))
        else:
            ok = set(allowed(v))
            tries = [i for i in range(p) if palette[i] in ok]
        for c in tries:
            if c in used:
                continue
            assign(v, c)
            if go():
                return True
            unassign(v)
        return False

    try:
        return {v: palette[c] for v, c in col.items()} if go() else None
    except _Budget:
        return None


def greedy_clique(nodes: Sequence[int], adj: dict[int, set[int]]) -> list[int]:
    """A large clique of the graph on `nodes`: from each node, its neighbours taken in
    order of degree (most first, then index) where adjacent to all taken so far; the
    largest found. A clique larger than the palette proves no colouring exists (the exact
    search could only exhaust its budget)."""
    best: list[int] = []
    for v in nodes:
        clique = [v]
        for u in sorted(adj[v], key=lambda u: (-len(adj[u]), u)):
            if all(u in adj[w] for w in clique):
                clique.append(u)
        if len(clique) > len(best):
            best = clique
    return best


@dataclass
class ColourResult:
    colours: dict[int, int] = field(default_factory=dict)
    failed: int | None = None  # flow index that could not be coloured
    component: list[int] = field(default_factory=list)


def colour_flows(live: Liveness, edges: dict[tuple[int, int], list[Witness]],
                 palette: Sequence[int], switched: frozenset[int] = frozenset(),
                 switch_palette: Sequence[int] | None = None) -> ColourResult:
    """Colours of the routed flows of `live` from `palette`; the flows in
    `switched` (indices) only from `switch_palette` (when given)."""
    nodes = [i for i, f in enumerate(live.flows) if f.routed]
    narrow = switch_palette is not None and set(palette) - set(switch_palette)
    if narrow:
        switch_palette = [c for c in palette if c in set(switch_palette)]

    def colours_of(v: int) -> Sequence[int]:
        return switch_palette if narrow and v in switched else palette

    adj: dict[int, set[int]] = {v: set() for v in nodes}
    for i, j in edges:
        adj[i].add(j)
        adj[j].add(i)
    order = {v: v for v in nodes}
    # connected components, coloured one by one
    seen: set[int] = set()
    result = ColourResult()
    for v in nodes:
        if v in seen:
            continue
        comp, stack = [], [v]
        seen.add(v)
        while stack:
            u = stack.pop()
            comp.append(u)
            for w in adj[u]:
                if w not in seen:
                    seen.add(w)
                    stack.append(w)
        comp.sort()
        col, failed = dsatur(comp, adj, colours_of, order)
        if failed is not None:
            # A router where more flows meet than there are colours settles it, and so
            # does any larger clique of flows; otherwise search exhaustively (within a
            # step budget).
            clique = live.densest(failed, edges, comp)
            restricted = narrow and any(u in switched for u in comp)
            infeasible = (len(clique.flows) > len(palette)
                          or len(greedy_clique(comp, adj)) > len(palette))
            exact = None if infeasible else exact_colouring(
                comp, adj, palette, order, allowed=colours_of if restricted else None)
            if exact is None:
                result.failed, result.component = failed, comp
                return result
            col = exact
        result.colours.update(col)
    return result

