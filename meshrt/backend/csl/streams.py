"""How each coloured flow's wavelets travel: the transport plan of a flow.

Wavelets of one colour that meet at a router interleave wavelet by wavelet,
and on WSE-3 a colour's router configuration accepts one input direction
only (`color_config.reset_routes`: "In WSE3, if rx is an array, it must
have a single element"). The XY multicast union of several senders'
trees is therefore not a route the hardware can run. Each flow gets one of
four transports, all with a single input side per router and position:

- ``tree``: one sender: its XY multicast tree, as `routes.py` computes it.
- ``shift``: each sender to its own target along disjoint XY paths; a core
  that receives and sends on the colour (a reduction chain) switches its
  own router between a receive and a send phase. A shift whose paths share
  a router input is a compile error.
- ``chain``: several senders, no receiver among them (the ``all`` gathers:
  a combine corridor receiving from every expert core). The senders are
  serialised along a *switch chain*, the scheme of the SDK's allreduce
  library: a snake through the sender boxes (s_0, s_1, ..., s_{n-1}); every
  chain router forwards its predecessor's stream (position 0, rx from the
  predecessor) and takes its own core's message in position 1 (rx RAMP).
  s_k sends its message, then one control wavelet whose two switch commands
  advance its own router (back to position 0) and the next one (to position
  1, so s_{k+1} may inject). Colours are FIFO, so s_{k+1}'s router only
  takes its ramp after all of s_0..s_k's wavelets passed it: the stream
  leaves the chain head s_{n-1} message after message, never interleaved,
  and the head's XY multicast tree carries it to every receiver (a single
  source: exact). Every chain and tree router lies on the flow's original
  union, so no other flow's colour is touched.
- ``relay``: several senders that include receivers (the stage hand-off
  gathers: every hand-off core holds a slice of the embedding and needs
  all the others). The receivers must form one line inside the senders.
  The senders outside the line (if any) are switch-chained into one end of
  the line; along the line the cores relay in software: a forward pass
  (r_i receives what r_0..r_{i-1} and the chain sent, then sends all of it
  plus its own message on to r_{i+1}) and a backward pass (r_i receives
  r_{i+1}..r_{m-1}'s messages and relays them plus its own to r_{i-1}).
  Each hop is one sender to one neighbour, the core switching its own
  router between the four phases.

Besides the router configurations a plan gives the per-core values the
programs need, as pieces over boxes (`SBox`: boxes that may step by two
along one axis, so that a snake's alternating rows cost a constant number
of pieces): the chain role of each sender, the messages each receiver takes
per receive, the relay index, and the number of teardown (end-of-flow)
wavelets of one step that cross each router (see program.py, route
handshakes).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from meshrt.backend.csl.routes import (
    EAST,
    NORTH,
    RAMP,
    SOUTH,
    WEST,
    RouterConfig,
    flow_router_configs,
)
from meshrt.diagnostics import MeshrtError
from meshrt.routing import Box, RectSet, line_count, line_relay_obstacle, rect_boxes

TREE, SHIFT, CHAIN, RELAY = "tree", "shift", "chain", "relay"

# Chain roles of a sender core (per-core value).
ROLE_MIDDLE, ROLE_FIRST, ROLE_HEAD = 0, 1, 2

OPPOSITE = {EAST: WEST, WEST: EAST, NORTH: SOUTH, SOUTH: NORTH}

# A box of routers that may step by two along x or y: (x0, y0, x1, y1, sx, sy).
SBox = tuple[int, int, int, int, int, int]


def sbox(b: Box, sx: int = 1, sy: int = 1) -> SBox:
    return (b[0], b[1], b[2], b[3], sx, sy)


def as_sbox(b) -> SBox:
    return b if len(b) == 6 else sbox(b)


def sbox_cells(s: SBox) -> Iterator[tuple[int, int]]:
    x0, y0, x1, y1, sx, sy = as_sbox(s)
    for x in range(x0, x1, sx):
        for y in range(y0, y1, sy):
            yield x, y


def sbox_count(s: SBox) -> int:
    x0, y0, x1, y1, sx, sy = as_sbox(s)
    return len(range(x0, x1, sx)) * len(range(y0, y1, sy))


def sbox_bbox(s: SBox) -> Box:
    x0, y0, x1, y1, _, _ = as_sbox(s)
    return (x0, y0, x1, y1)


def _clip_axis(a0: int, a1: int, step: int, b0: int, b1: int) -> tuple[int, int] | None:
    lo, hi = max(a0, b0), min(a1, b1)
    if step > 1 and (lo - a0) % step:
        lo += step - (lo - a0) % step
    if lo >= hi:
        return None
    # Tighten the end to one past the last cell on the lattice.
    last = lo + (hi - 1 - lo) // step * step
    return lo, last + 1


def sbox_clip(s, b: Box) -> SBox | None:
    """The cells of `s` inside the dense box `b`, on the same lattice."""
    x0, y0, x1, y1, sx, sy = as_sbox(s)
    cx = _clip_axis(x0, x1, sx, b[0], b[2])
    cy = _clip_axis(y0, y1, sy, b[1], b[3])
    if cx is None or cy is None:
        return None
    return norm((cx[0], cy[0], cx[1], cy[1], sx, sy))


def norm(s) -> SBox:
    """A strided box whose axis holds one cell steps by 1 on it (so dense pieces merge)."""
    x0, y0, x1, y1, sx, sy = as_sbox(s)
    if sx > 1 and x1 - x0 <= sx:
        sx, x1 = 1, x0 + 1
    if sy > 1 and y1 - y0 <= sy:
        sy, y1 = 1, y0 + 1
    return (x0, y0, x1, y1, sx, sy)


@dataclass(frozen=True)
class Cfg:
    """One router's configuration for one flow.

    phases: (name, rx, tx), the first one is what the layout configures;
    more than one means the core switches its own router at run time
    (``recv`` / ``send`` of a shift, the four relay phases). switch: a chain
    router, position 1 = rx RAMP, ring mode, pop on advance.
    """

    phases: tuple[tuple[str, tuple[str, ...], tuple[str, ...]], ...]
    switch: bool = False

    @property
    def phased(self) -> bool:
        return len(self.phases) > 1

    @property
    def initial(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        return self.phases[0][1], self.phases[0][2]

    def phase(self, name: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
        for n, rx, tx in self.phases:
            if n == name:
                return rx, tx
        return None

    def names(self) -> tuple[str, ...]:
        return tuple(n for n, _, _ in self.phases)


@dataclass
class Relay:
    """The relay line of a ``relay`` flow: r_i = r0 + i * step, i < m."""

    r0: tuple[int, int]
    step: tuple[int, int]
    m: int
    others: int  # senders outside the line (switch-chained into r_0)
    fwd: str  # direction from r_i to r_{i+1}
    entry: str | None  # side of r_0 the chain's stream enters from

    def index_expr(self) -> str:
        """CSL expression of px, py: this core's index on the line."""
        (x0, y0), (dx, dy) = self.r0, self.step
        if dx:
            return f"(px - {x0})" if dx > 0 else f"({x0} - px)"
        return f"(py - {y0})" if dy > 0 else f"({y0} - py)"

    def cell(self, i: int) -> tuple[int, int]:
        return self.r0[0] + i * self.step[0], self.r0[1] + i * self.step[1]


@dataclass
class FlowPlan:
    name: str
    scheme: str
    cells: list[tuple[SBox, Cfg]]
    senders: int
    color: int
    first: tuple[int, int] | None = None  # the sender that closes a step with a teardown
    head: tuple[int, int] | None = None  # chain head (feeds the tree / the relay line)
    chain: RectSet | None = None  # chain routers
    relay: Relay | None = None
    order: list[tuple[Box, str, tuple[int, int]]] = field(default_factory=list)  # chain snakes
    # line chains (a `row` / `col` flow with several senders per line): every line's
    # first senders and heads, and the messages each receiver takes per receive
    firsts: list[SBox] = field(default_factory=list)
    heads: list[SBox] = field(default_factory=list)
    per_line: int | None = None

    @property
    def switched(self) -> bool:
        return any(c.switch for _, c in self.cells)

    def roles(self) -> list[tuple[SBox, int]]:
        """Chain role per sender core (ROLE_MIDDLE elsewhere)."""
        out = [(b, ROLE_FIRST) for b in self.firsts] + [(b, ROLE_HEAD) for b in self.heads]
        if self.first is not None and self.chain is not None and not self.firsts:
            out.append((sbox((self.first[0], self.first[1], self.first[0] + 1, self.first[1] + 1)), ROLE_FIRST))
        if self.head is not None and self.head != self.first and not self.heads:
            out.append((sbox((self.head[0], self.head[1], self.head[0] + 1, self.head[1] + 1)), ROLE_HEAD))
        return out

    def td_counts(self) -> list[tuple[SBox, int]]:
        """Teardown wavelets of one step that cross each router (when the flow is drained)."""
        cached = self.__dict__.get("_td")
        if cached is None:
            cached = self.__dict__["_td"] = self._td_counts()
        return cached

    def _td_counts(self) -> list[tuple[SBox, int]]:
        if self.scheme in (TREE, CHAIN):
            return [(s, 1) for s, _ in self.cells]
        if self.scheme == SHIFT:
            return [(s, len(c.phases) if c.phased else 1) for s, c in self.cells]
        out = []
        for s, c in self.cells:
            names = c.names()
            if self.relay is not None and names[0] in RELAY_PHASES:
                out.append((s, len(names)))
            else:
                out.append((s, 1))
        return out

    def recv_counts(self) -> list[tuple[SBox, int]] | int:
        """Messages each receiver takes per receive event (relay: see `Relay`)."""
        return self.messages

    @property
    def messages(self) -> int:
        """Messages each receiver takes per receive event: a chain's senders (of its line)."""
        if self.scheme != CHAIN:
            return 1
        return self.per_line if self.per_line is not None else self.senders


RELAY_PHASES = ("fwd_recv", "fwd_send", "bwd_recv", "bwd_send")


# ---------------------------------------------------------------------------
# Snakes: one box traversed row by row or column by column
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Snake:
    box: Box
    orient: str  # "rows": x varies fastest; "cols": y varies fastest
    start: tuple[int, int]

    def _frame(self):
        x0, y0, x1, y1 = self.box
        if self.orient == "rows":
            return (x0, x1, y0, y1, self.start[0], self.start[1])
        return (y0, y1, x0, x1, self.start[1], self.start[0])

    def _xy(self, u: int, v: int) -> tuple[int, int]:
        return (u, v) if self.orient == "rows" else (v, u)

    def _dir(self, axis: str, sign: int) -> str:
        # axis u or v in the frame; rows: u = x, v = y; cols: u = y, v = x
        horizontal = (axis == "u") == (self.orient == "rows")
        if horizontal:
            return EAST if sign > 0 else WEST
        return SOUTH if sign > 0 else NORTH

    @property
    def count(self) -> int:
        x0, y0, x1, y1 = self.box
        return (x1 - x0) * (y1 - y0)

    def geometry(self):
        u0, u1, v0, v1, us, vs = self._frame()
        U, V = u1 - u0, v1 - v0
        du0 = 1 if us == u0 else -1
        dv = 1 if vs == v0 else -1
        ue = u1 - 1 if us == u0 else u0
        return u0, u1, v0, v1, us, vs, ue, U, V, du0, dv

    def index(self, x: int, y: int) -> int:
        u0, u1, v0, v1, us, vs, ue, U, V, du0, dv = self.geometry()
        u, v = (x, y) if self.orient == "rows" else (y, x)
        i = (v - vs) * dv
        du = du0 if i % 2 == 0 else -du0
        j = (u - us) * du if i % 2 == 0 else (u - ue) * du
        return i * U + j

    def cell(self, k: int) -> tuple[int, int]:
        u0, u1, v0, v1, us, vs, ue, U, V, du0, dv = self.geometry()
        i, j = divmod(k, U)
        v = vs + i * dv
        u = us + j * du0 if i % 2 == 0 else ue - j * du0
        return self._xy(u, v)

    @property
    def first(self) -> tuple[int, int]:
        return self.cell(0)

    @property
    def last(self) -> tuple[int, int]:
        return self.cell(self.count - 1)

    def pieces(self) -> list[tuple[SBox, str | None, str | None]]:
        """(cells, rx, tx) along the snake; rx of the first cell and tx of the
        last are None (the chain around it decides)."""
        u0, u1, v0, v1, us, vs, ue, U, V, du0, dv = self.geometry()
        prev_row = OPPOSITE[self._dir("v", dv)]  # side a row's first cell hears its predecessor on
        next_row = self._dir("v", dv)
        out: list[tuple[tuple[int, int, int, int, int], str | None, str | None]] = []

        def rows(parity: int, lo: int, hi: int):
            """Rows i in [lo, hi] with i % 2 == parity, as a (vmin, vmax+1, step) range."""
            first = lo + ((parity - lo) % 2)
            if first > hi:
                return None
            last = hi - ((hi - parity) % 2)
            vs_, ve_ = vs + first * dv, vs + last * dv
            step = 2 if last > first else 1
            return min(vs_, ve_), max(vs_, ve_) + 1, step

        def add(ua: int, ub: int, r, rx, tx):
            # u range [ua, ub] inclusive in either order, rows r
            if r is None or ua is None:
                return
            lo, hi = min(ua, ub), max(ua, ub)
            out.append(((lo, hi + 1, r[0], r[1], r[2]), rx, tx))

        last_i = V - 1
        for parity in (0, 1):
            du = du0 if parity == 0 else -du0
            start = us if parity == 0 else ue
            end = ue if parity == 0 else us
            along, back = self._dir("u", du), OPPOSITE[self._dir("u", du)]
            if U == 1:
                # every cell both starts and ends its row
                lo = 1
                hi = last_i - 1
                add(start, start, rows(parity, lo, hi), prev_row, next_row)
                continue
            # row starts (rows >= 1)
            add(start, start, rows(parity, 1, last_i), prev_row, along)
            # interiors
            if U >= 3:
                add(start + du, end - du, rows(parity, 0, last_i), back, along)
            # row ends (not the last row)
            add(end, end, rows(parity, 0, last_i - 1), back, next_row)
        # first cell: row 0 start, tx along the row (or to the next row)
        fx = us
        if U == 1:
            out.append(((fx, fx + 1, vs, vs + 1, 1), None, next_row if V > 1 else None))
        else:
            out.append(((fx, fx + 1, vs, vs + 1, 1), None, self._dir("u", du0)))
            # last row's end
        lu, lv = (self.last[0], self.last[1]) if self.orient == "rows" else (self.last[1], self.last[0])
        if not (U == 1 and V == 1):
            if U == 1:
                rx_last = prev_row
            else:
                du_last = du0 if last_i % 2 == 0 else -du0
                rx_last = OPPOSITE[self._dir("u", du_last)]
                # The last row's end was not covered above; the last row's
                # start (when V > 1) and interior were.
            out.append(((lu, lu + 1, lv, lv + 1, 1), rx_last, None))
        else:
            # single cell: first == last
            out[-1] = (out[-1][0], None, None)
        # Frame -> (x, y) strided boxes.
        res = []
        for (ua, ub, va, vb, vstep), rx, tx in out:
            if self.orient == "rows":
                res.append(((ua, va, ub, vb, 1, vstep), rx, tx))
            else:
                res.append(((va, ua, vb, ub, vstep, 1), rx, tx))
        return res


# Frame of a box side: (u, v) with u along the side and v growing toward it.
_SIDE_DIRS = {
    SOUTH: {"+u": EAST, "-u": WEST, "+v": SOUTH, "-v": NORTH},
    NORTH: {"+u": EAST, "-u": WEST, "+v": NORTH, "-v": SOUTH},
    EAST: {"+u": SOUTH, "-u": NORTH, "+v": EAST, "-v": WEST},
    WEST: {"+u": SOUTH, "-u": NORTH, "+v": WEST, "-v": EAST},
}
_FLIP = {"+u": "-u", "-u": "+u", "+v": "-v", "-v": "+v"}


def _side_frame(box: Box, side: str):
    """(W, H, to_abs) of `box` seen from `side`: u along the side, v toward it."""
    x0, y0, x1, y1 = box
    if side in (SOUTH, NORTH):
        W, H = x1 - x0, y1 - y0
        if side == SOUTH:
            return W, H, lambda u, v: (x0 + u, y0 + v)
        return W, H, lambda u, v: (x0 + u, y1 - 1 - v)
    W, H = y1 - y0, x1 - x0
    if side == EAST:
        return W, H, lambda u, v: (x0 + v, y0 + u)
    return W, H, lambda u, v: (x1 - 1 - v, y0 + u)


@dataclass(frozen=True)
class Strip:
    """The two rows of a box along one side, traversed so that the path ends
    at column c of the row next to the side (the snakes can only end in a
    corner). Columns on one side of c are zigzagged, the others covered by a
    U turn; `west` picks the side (low u) the zigzag takes."""

    box: Box  # the two rows (absolute)
    side: str
    c: int
    west: bool

    @property
    def orient(self) -> str:
        return f"strip-{self.side.lower()}"

    @property
    def start(self) -> tuple[int, int]:
        return self.first

    def _geo(self):
        W, H, to_abs = _side_frame(self.box, self.side)
        assert H == 2
        k = self.c if self.west else W - 1 - self.c
        s0 = 0 if k % 2 == 0 else 1  # row the zigzag starts on (0 = far row t, 1 = near row b)
        return W, to_abs, k, s0

    @property
    def count(self) -> int:
        W, _, _, _ = self._geo()
        return 2 * W

    def _col(self, j: int) -> int:
        """u of the j-th zigzag column."""
        W, _, _, _ = self._geo()
        return j if self.west else W - 1 - j

    @property
    def first(self) -> tuple[int, int]:
        W, to_abs, k, s0 = self._geo()
        if k:
            return to_abs(self._col(0), s0)
        return to_abs(self.c, 0)

    @property
    def last(self) -> tuple[int, int]:
        _, to_abs, _, _ = self._geo()
        return to_abs(self.c, 1)

    def frame_pieces(self):
        """(u cells, v, rx side, tx move) in frame terms; u cells = (lo, hi, step)."""
        W, _, k, s0 = self._geo()
        fwd, back = ("+u", "-u") if self.west else ("-u", "+u")
        out = []
        other = 1 - s0
        to_other = {0: "+v", 1: "-v"}  # move from row r to the other row

        def cols(parity: int):
            js = [j for j in (parity, parity + 2) if j < k]
            if not js:
                return None
            last = k - 1 if (k - 1) % 2 == parity else k - 2
            a, b = self._col(parity), self._col(last)
            return (min(a, b), max(a, b) + 1, 2 if last > parity else 1)

        # zigzag: column j enters on row r_j (s0 for even j) and leaves on the other row
        for parity, r in ((0, s0), (1, other)):
            cs = cols(parity)
            if cs is None:
                continue
            # entering cells (skip j = 0: the chain decides its rx)
            if parity == 0:
                lo, hi, st = cs
                if k > 2:
                    a = self._col(2)
                    b = self._col(k - 1 if (k - 1) % 2 == 0 else k - 2)
                    out.append(((min(a, b), max(a, b) + 1, 2), r, back, to_other[r]))
                out.append(((self._col(0), self._col(0) + 1, 1), r, None, to_other[r]))
            else:
                out.append((cs, r, back, to_other[r]))
            # leaving cells: hear the other row, move on along u
            out.append((cs, 1 - r, _FLIP[to_other[r]], fwd))
        # U turn over the columns from c to the far end (away from the zigzag)
        far = W - 1 if self.west else 0
        span = sorted((self.c, far))
        inner = [u for u in range(span[0], span[1] + 1) if u not in (self.c, far)]
        # far row t: from c to far along fwd
        rx_c = back if k else None
        if self.c == far:
            out.append(((self.c, self.c + 1, 1), 0, rx_c, "+v"))
            out.append(((self.c, self.c + 1, 1), 1, "-v", None))
            return out
        out.append(((self.c, self.c + 1, 1), 0, rx_c, fwd))
        if inner:
            out.append(((inner[0], inner[-1] + 1, 1), 0, back, fwd))
            out.append(((inner[0], inner[-1] + 1, 1), 1, fwd, back))
        out.append(((far, far + 1, 1), 0, back, "+v"))
        out.append(((far, far + 1, 1), 1, "-v", back))
        out.append(((self.c, self.c + 1, 1), 1, fwd, None))
        return out

    def pieces(self) -> list[tuple[SBox, str | None, str | None]]:
        dirs = _SIDE_DIRS[self.side]
        _, to_abs, _, _ = self._geo()
        res = []
        for (lo, hi, st), v, rx, tx in self.frame_pieces():
            a = to_abs(lo, v)
            b = to_abs(hi - 1, v)
            x0, x1 = min(a[0], b[0]), max(a[0], b[0]) + 1
            y0, y1 = min(a[1], b[1]), max(a[1], b[1]) + 1
            sx = st if self.side in (SOUTH, NORTH) else 1
            sy = st if self.side in (EAST, WEST) else 1
            res.append(((x0, y0, x1, y1, sx, sy), dirs[rx] if rx else None, dirs[tx] if tx else None))
        return res


def _edge_chains(box: Box, union: RectSet) -> Iterator[list]:
    """Chains through one box that end in the middle of the side facing the
    receivers: a snake over all but the two rows along that side, then a
    `Strip` over those two rows ending next to a receiver."""
    x0, y0, x1, y1 = box
    for side in (SOUTH, NORTH, EAST, WEST):
        W, H, to_abs = _side_frame(box, side)
        if H < 2:
            continue
        # Strip rows (absolute box) and the rest.
        a, b = to_abs(0, H - 2), to_abs(W - 1, H - 1)
        sbox_ = (min(a[0], b[0]), min(a[1], b[1]), max(a[0], b[0]) + 1, max(a[1], b[1]) + 1)
        rest = None
        if H > 2:
            a, b = to_abs(0, 0), to_abs(W - 1, H - 3)
            rest = (min(a[0], b[0]), min(a[1], b[1]), max(a[0], b[0]) + 1, max(a[1], b[1]) + 1)
        step = {SOUTH: (0, 1), NORTH: (0, -1), EAST: (1, 0), WEST: (-1, 0)}[side]
        rest_snakes = _snakes(rest) if rest is not None else []
        for c in range(W):
            cx, cy = to_abs(c, H - 1)
            if not union.contains(cx + step[0], cy + step[1]):
                continue
            for west in (True, False):
                st = Strip(sbox_, side, c, west)
                if rest is None:
                    yield [st]
                    continue
                for sn in rest_snakes:
                    if _adjacent(sn.last, st.first):
                        yield [sn, st]
                        break


def _snakes(box: Box) -> list[Snake]:
    x0, y0, x1, y1 = box
    out = []
    for orient in ("rows", "cols"):
        for sx in (x0, x1 - 1):
            for sy in (y0, y1 - 1):
                out.append(Snake(box, orient, (sx, sy)))
    # Degenerate boxes repeat; keep the first of each traversal.
    seen, uniq = set(), []
    for s in out:
        key = tuple(s.cell(k) for k in range(min(s.count, 3))) + (s.last,)
        if key not in seen:
            seen.add(key)
            uniq.append(s)
    return uniq


def _adjacent(a: tuple[int, int], b: tuple[int, int]) -> str | None:
    dx, dy = b[0] - a[0], b[1] - a[1]
    return {(1, 0): EAST, (-1, 0): WEST, (0, 1): SOUTH, (0, -1): NORTH}.get((dx, dy))


def _chains(boxes: Sequence[Box]) -> Iterator[list[Snake]]:
    """Every chain of snakes through the boxes whose consecutive ends touch."""
    for perm in itertools.permutations(boxes):
        options = [_snakes(b) for b in perm]
        for combo in itertools.product(*options):
            if all(_adjacent(combo[i].last, combo[i + 1].first) for i in range(len(combo) - 1)):
                yield list(combo)


class _Single:
    """A one-sender flow for `flow_router_configs`."""

    def __init__(self, pattern, src: tuple[int, int], dst, offset=(0, 0)):
        from xdsl.dialects.builtin import StringAttr

        from meshrt.dialects.mesh import CoreSetAttr, RectAttr

        self.pattern = StringAttr(pattern)
        self.src = CoreSetAttr([RectAttr(src[0], src[1], 1, 1)])
        self.dst = dst
        self.offset = offset
        self.crosses_wafer = False


_T = {EAST: SOUTH, SOUTH: EAST, WEST: NORTH, NORTH: WEST, RAMP: RAMP}


def _coreset(boxes):
    from meshrt.dialects.mesh import CoreSetAttr, RectAttr

    return CoreSetAttr([RectAttr(b[0], b[1], b[2] - b[0], b[3] - b[1]) for b in boxes])


def _trees(head: tuple[int, int], receivers: RectSet, width: int, height: int):
    """The XY and the YX multicast tree from `head` to the receivers."""
    xy = flow_router_configs(_Single("all", head, _coreset(receivers.boxes)), width, height)
    yield xy
    t = _Single("all", (head[1], head[0]), _coreset([(b[1], b[0], b[3], b[2]) for b in receivers.boxes]))
    yx = []
    for (x0, y0, x1, y1), cfg in flow_router_configs(t, height, width):
        pairs = frozenset((_T[a], _T[b]) for a, b in cfg.pairs)
        yx.append(((y0, x0, y1, x1), RouterConfig(pairs)))
    yield yx


def _tree_cells(cfgs: list[tuple[Box, RouterConfig]]) -> list[tuple[SBox, Cfg]]:
    out = []
    for box, cfg in cfgs:
        rx, tx = cfg.static()
        out.append((sbox(box), Cfg((("static", rx, tx),))))
    return out


def _chain_cells(snakes: list[Snake], head_tx: tuple[str, ...], link=None) -> list[tuple[SBox, Cfg]]:
    """The chain routers of the snakes; `link(a, b)`: the side of cell a facing the next
    snake's first cell b (default: b is a's neighbour)."""
    link = link or _adjacent
    out = []
    for i, sn in enumerate(snakes):
        for s, rx, tx in sn.pieces():
            if rx is None:
                rx = RAMP if i == 0 else OPPOSITE[link(snakes[i - 1].last, sn.first)]
            if tx is None:
                txs = head_tx if i == len(snakes) - 1 else (link(sn.last, snakes[i + 1].first),)
            else:
                txs = (tx,)
            out.append((norm(s), Cfg((("static", (rx,), tuple(txs)),), switch=True)))
    return out


def _fail(flow, what: str):
    from xdsl.ir import Operation

    op = flow.op if isinstance(flow.op, Operation) else None
    raise MeshrtError(f"the CSL backend cannot route flow @{flow.name} exactly: {what}", op)


def plan_flow(flow, width: int, height: int) -> FlowPlan:
    """The transport plan of one on-mesh coloured flow."""
    op = flow.op
    pattern = op.pattern.data
    senders = RectSet(b for r in op.src.rects for b in rect_boxes(r))
    receivers = RectSet(b for r in op.dst.rects for b in rect_boxes(r))
    n = senders.count
    if pattern == "shift":
        cells = []
        for box, cfg in flow.configs(width, height):
            ramp = [p for p in cfg.pairs if p[0] == RAMP]
            other = [p for p in cfg.pairs if p[0] != RAMP]
            if len(ramp) > 1 or len(other) > 1:
                _fail(flow, f"shift by {tuple(op.offset)} makes the paths of several senders share "
                      f"router ({box[0]}, {box[1]}) ({len(cfg.pairs)} streams on one colour)")
            if ramp and other:
                phases = (("recv", (other[0][0],), (other[0][1],)), ("send", (RAMP,), (ramp[0][1],)))
            else:
                rx, tx = cfg.static()
                phases = (("static", rx, tx),)
            cells.append((sbox(box), Cfg(phases)))
        return FlowPlan(flow.name, SHIFT, cells, n, flow.color)
    if n <= 1:
        return FlowPlan(flow.name, TREE, _tree_cells(flow.configs(width, height)), n, flow.color,
                        first=senders.first_core() if n else None)
    if pattern in ("row", "col"):
        if line_count(senders, senders, pattern == "row") <= 1:  # the trees are disjoint
            return FlowPlan(flow.name, TREE, _tree_cells(flow.configs(width, height)), n, flow.color)
        return _plan_line_chains(flow, senders, receivers, pattern)
    if not senders & receivers:
        return _plan_chain(flow, senders, receivers, width, height)
    return _plan_relay(flow, senders, receivers, width, height)


def _plan_line_chains(flow, senders: RectSet, receivers: RectSet, pattern: str) -> FlowPlan:
    """A `row` (`col`) flow with several senders per line: one switch chain per line.

    The expert regions' root columns sending into a combine corridor: every
    row holds the same senders (one per region) and its receivers on one side
    of them. Along each row the senders are serialised as in `_plan_chain`:
    the farthest from the receivers injects first, every further sender's
    router forwards the stream from upstream (position 0) and takes its own
    ramp after the upstream sender's advance (position 1), and the nearest
    (the head) forwards the row's messages on to the receivers. The routers
    between senders forward statically: they are not switch routers, so they
    pop no switch command and the advance behind a message reaches the next
    sender's router. Every line is alike, so a router column's configuration
    is one box over all rows.
    """
    sent, got = _by_line(senders, pattern == "row"), _by_line(receivers, pattern == "row")
    shapes = {tuple(v) for v in sent.values()}
    if len(shapes) != 1 or set(sent) != set(got) or len({tuple(v) for v in got.values()}) != 1:
        _fail(flow, f"pattern {pattern} with several senders per {pattern}: every {pattern} must "
              "hold the same senders and receivers to be switch-chained")
    lo, hi = min(sent), max(sent) + 1
    if set(sent) != set(range(lo, hi)):
        _fail(flow, f"pattern {pattern} with several senders per {pattern}: its {pattern}s are "
              "not contiguous")
    xs, rs = list(next(iter(shapes))), next(iter(got.values()))
    if set(xs) & set(rs) or (min(rs) < max(xs) and max(rs) > min(xs)):
        _fail(flow, f"pattern {pattern} with several senders per {pattern}: its receivers are not "
              "all on one side of the senders (the switch chain runs toward them)")
    fwd = min(rs) > max(xs)  # the stream runs toward increasing positions
    order = xs if fwd else xs[::-1]  # first sender .. head
    last = max(rs) if fwd else min(rs)
    span = range(order[0], last + 1) if fwd else range(order[0], last - 1, -1)
    d = (EAST if fwd else WEST) if pattern == "row" else (SOUTH if fwd else NORTH)

    def box(p: int) -> Box:
        return (p, lo, p + 1, hi) if pattern == "row" else (lo, p, hi, p + 1)

    chain_at, recv_at = set(xs), set(rs)
    cells = []
    for p in span:
        rx = RAMP if p == order[0] else OPPOSITE[d]
        if p in recv_at:
            tx = (RAMP,) if p == last else (RAMP, d)
        else:
            tx = (d,)
        cells.append((norm(sbox(box(p))), Cfg((("static", (rx,), tx),), switch=p in chain_at)))
    firsts, heads = [norm(sbox(box(order[0])))], [norm(sbox(box(order[-1])))]
    return FlowPlan(flow.name, CHAIN, cells, senders.count, flow.color,
                    chain=senders, firsts=firsts, heads=heads, per_line=len(xs))


def _toward(a: tuple[int, int], b: tuple[int, int]) -> str:
    """The side of cell a that faces cell b on the same row or column."""
    if a[1] == b[1]:
        return EAST if b[0] > a[0] else WEST
    return SOUTH if b[1] > a[1] else NORTH


def _by_line(rs: RectSet, along_rows: bool) -> dict[int, list[int]]:
    """Row (column) -> the sorted positions along it of the cores of `rs` on it."""
    out: dict[int, list[int]] = {}
    for x0, y0, x1, y1 in rs.boxes:
        for c, ps in ((y, range(x0, x1)) for y in range(y0, y1)) if along_rows else \
                ((x, range(y0, y1)) for x in range(x0, x1)):
            out.setdefault(c, []).extend(ps)
    return {c: sorted(v) for c, v in out.items()}


def _column_runs(senders: RectSet) -> dict[int, tuple[int, int]] | None:
    """x -> (y0, y1) of each sender column, if the senders are whole columns' runs."""
    runs = {}
    for x, ys in _by_line(senders, False).items():
        if ys[-1] - ys[0] + 1 != len(ys):
            return None
        runs[x] = (ys[0], ys[-1] + 1)
    return runs


def _plan_column_chain(flow, senders: RectSet, receivers: RectSet, width: int,
                       height: int) -> FlowPlan | None:
    """An `all` gather from several separate sender columns, all on one side of the
    receivers (the root columns of stacked expert regions sending into the combine
    corridor), or None if the senders are not such columns.

    One switch chain snakes through the columns, farthest first, down one and
    up the next; between two columns the stream crosses the gap along the row
    the first ends on (which must be an end of the next) through routers that
    forward statically (they pop no switch command, so a sender's advance
    reaches the next sender's router). The head, the last cell of the column
    nearest the receivers, feeds their multicast tree, as in `_plan_chain`.
    """
    runs = _column_runs(senders)
    if runs is None or len(runs) < 2 or any(x + 1 in runs for x in runs):
        return None  # not separate columns (adjacent ones form boxes `_plan_chain` snakes)
    xs = sorted(runs)
    rx0, rx1 = min(b[0] for b in receivers.boxes), max(b[2] for b in receivers.boxes)
    if rx0 > xs[-1]:
        order = xs
    elif rx1 <= xs[0]:
        order = xs[::-1]
    else:
        return None

    def snake_from(start_row: int | None, down: bool) -> list[Snake] | None:
        out = []
        for x in order:
            y0, y1 = runs[x]
            if start_row is not None:
                if start_row not in (y0, y1 - 1):
                    return None
                down = start_row == y0 if y1 - y0 > 1 else down
            sn = Snake((x, y0, x + 1, y1), "cols", (x, y0) if down else (x, y1 - 1))
            out.append(sn)
            start_row, down = sn.last[1], not down
        return out

    snakes = snake_from(None, True) or snake_from(None, False)
    if snakes is None:
        return None
    union = RectSet(b for b, _ in flow.configs(width, height))
    tree = next((t for _, t in _fitting_trees(snakes[-1].last, senders, receivers, union, width, height)),
                None)
    if tree is None:
        return None
    bridges = []
    for a, b in zip(snakes, snakes[1:]):
        (xa, y), (xb, _) = a.last, b.first
        d = _toward(a.last, b.first)
        lo, hi = min(xa, xb) + 1, max(xa, xb)
        if lo < hi:
            bridges.append((norm(sbox((lo, y, hi, y + 1))), Cfg((("static", (OPPOSITE[d],), (d,)),))))
    return _chain_plan(flow, senders, snakes, tree, _toward, bridges)


def _fitting_trees(head: tuple[int, int], senders: RectSet, receivers: RectSet, union: RectSet,
                   width: int, height: int):
    """(routers, tree) of each multicast tree from a chain's head to the receivers that
    leaves the senders at the head and stays on the flow's original routes."""
    hs = RectSet([(head[0], head[1], head[0] + 1, head[1] + 1)])
    for tree in _trees(head, receivers, width, height):
        tree_set = RectSet(b for b, _ in tree)
        if (tree_set & senders) == hs and union.covers(tree_set):
            yield tree_set, tree


def _chain_plan(flow, senders: RectSet, snakes: list[Snake], tree, link=None,
                extra: list[tuple[SBox, Cfg]] = ()) -> FlowPlan:
    """The CHAIN plan of snakes through the senders whose head feeds `tree`: the head's
    router forwards the stream the tree's way, the tree's other routers as they are."""
    head = snakes[-1].last
    hs = RectSet([(head[0], head[1], head[0] + 1, head[1] + 1)])
    head_tx, rest = (), []
    for box, cfg in tree:
        if box[0] <= head[0] < box[2] and box[1] <= head[1] < box[3]:
            head_tx = cfg.static()[1]
            rest += [(b, cfg) for b in RectSet([box]) - hs]
        else:
            rest.append((box, cfg))
    cells = _chain_cells(snakes, head_tx, link) + list(extra) + _tree_cells(rest)
    return FlowPlan(flow.name, CHAIN, cells, senders.count, flow.color, first=snakes[0].first,
                    head=head, chain=senders, order=[(sn.box, sn.orient, sn.start) for sn in snakes])


def _plan_chain(flow, senders: RectSet, receivers: RectSet, width: int, height: int) -> FlowPlan:
    if len(senders.boxes) > 3:
        plan = _plan_column_chain(flow, senders, receivers, width, height)
        if plan is not None:
            return plan
        _fail(flow, f"{len(senders.boxes)} sender boxes (the switch chain joins at most 3, or "
              "several columns of one height beside the receivers)")
    best = None
    union = RectSet(b for b, _ in flow.configs(width, height))
    tried: set = set()

    def consider(snakes) -> None:
        nonlocal best
        head = snakes[-1].last
        if head in tried:
            return
        tried.add(head)
        for tree_set, tree in _fitting_trees(head, senders, receivers, union, width, height):
            if best is None or tree_set.count < best[0]:
                best = (tree_set.count, snakes, tree)

    for snakes in _chains(senders.boxes):
        consider(snakes)
    if best is None and len(senders.boxes) == 1:
        # No corner works: end the chain mid-side with a two-row strip.
        for snakes in _edge_chains(senders.boxes[0], union):
            consider(snakes)
            if best is not None:
                break
    if best is None:
        _fail(flow, "no snake through its senders ends where the multicast tree to the receivers "
              "leaves the sender boxes")
    _, snakes, tree = best
    return _chain_plan(flow, senders, snakes, tree)


def _plan_relay(flow, senders: RectSet, receivers: RectSet, width: int, height: int) -> FlowPlan:
    why = line_relay_obstacle(senders, receivers)
    if why is not None:
        _fail(flow, why)
    rb = receivers.boxes[0]
    others = senders - receivers
    ends = [(rb[0], rb[1]), (rb[2] - 1, rb[3] - 1)]
    chosen = None
    if not others:
        chosen = (ends[0], None, [])
    else:
        if len(others.boxes) > 3:
            _fail(flow, f"{len(others.boxes)} sender boxes besides the receivers")
        for snakes in _chains(others.boxes):
            head = snakes[-1].last
            for end in ends:
                d = _adjacent(head, end)
                if d is not None:
                    chosen = (end, d, snakes)
                    break
            if chosen:
                break
        if chosen is None:
            _fail(flow, "no snake through the senders outside the receiver line ends next to "
                  "an end of the line")
    r0, entry_move, snakes = chosen
    m = receivers.count
    other_end = ends[1] if r0 == ends[0] else ends[0]
    if m > 1:
        step = ((other_end[0] - r0[0]) // max(1, abs(other_end[0] - r0[0])) if other_end[0] != r0[0] else 0,
                (other_end[1] - r0[1]) // max(1, abs(other_end[1] - r0[1])) if other_end[1] != r0[1] else 0)
        fwd = _adjacent(r0, (r0[0] + step[0], r0[1] + step[1]))
    else:
        step, fwd = (0, 1), SOUTH
    entry = OPPOSITE[entry_move] if entry_move else None
    relay = Relay(r0, step, m, others.count, fwd, entry)
    cells: list[tuple[SBox, Cfg]] = []
    if snakes:
        cells += _chain_cells(snakes, (entry_move,))
    back = OPPOSITE[fwd]

    def phases(i: int):
        ph = []
        if i > 0:
            ph.append(("fwd_recv", (back,), (RAMP,)))
        elif entry is not None:
            ph.append(("fwd_recv", (entry,), (RAMP,)))
        if i < m - 1:
            ph.append(("fwd_send", (RAMP,), (fwd,)))
            ph.append(("bwd_recv", (fwd,), (RAMP,)))
        if i > 0:
            ph.append(("bwd_send", (RAMP,), (back,)))
        return tuple(ph)

    def cell_box(i: int) -> SBox:
        x, y = relay.cell(i)
        return sbox((x, y, x + 1, y + 1))

    idx = [0] + ([m - 1] if m > 1 else [])
    for i in idx:
        ph = phases(i)
        if ph:
            cells.append((cell_box(i), Cfg(ph)))
    if m > 2:
        a, b = relay.cell(1), relay.cell(m - 2)
        box = (min(a[0], b[0]), min(a[1], b[1]), max(a[0], b[0]) + 1, max(a[1], b[1]) + 1)
        cells.append((sbox(box), Cfg(phases(1))))
    return FlowPlan(flow.name, RELAY, cells, senders.count, flow.color,
                    first=snakes[0].first if snakes else None,
                    head=snakes[-1].last if snakes else None,
                    chain=others if snakes else None, relay=relay,
                    order=[(sn.box, sn.orient, sn.start) for sn in snakes])


def switch_chained(op, width: int, height: int) -> bool:
    """Whether on-mesh flow `op` (an `event.flow`) is carried through router
    switches (several senders chained on its colour), so that it needs a colour
    with switch positions; False when the backend cannot plan it at all (the
    backend reports that itself). Used by `color-routes` before any colour exists."""
    from meshrt.backend.csl.model import Flow

    flow = Flow(op, op.flow_name, "", op.wafer_index, None, False, "", op.flow_role)
    try:
        return plan_flow(flow, width, height).switched
    except MeshrtError:
        return False


def plans(program) -> dict[str, FlowPlan]:
    """Transport plans of every coloured on-mesh flow (cached on the program)."""
    cached = getattr(program, "_plans", None)
    if cached is None:
        cached = {f.name: plan_flow(f, program.width, program.height)
                  for f in program.flows.values() if f.color is not None and not f.cross}
        program._plans = cached
    return cached


def routers(plan: FlowPlan) -> RectSet:
    """The plan's routers as dense boxes (bounding boxes of strided pieces
    are expanded row by row only when small; used for checks)."""
    boxes = []
    for s, _ in plan.cells:
        x0, y0, x1, y1, sx, sy = s
        if sx == 1 and sy == 1:
            boxes.append((x0, y0, x1, y1))
        elif sx == 1:
            boxes.extend((x0, y, x1, y + 1) for y in range(y0, y1, sy))
        else:
            boxes.extend((x, y0, x + 1, y1) for x in range(x0, x1, sx))
    return RectSet(boxes)
