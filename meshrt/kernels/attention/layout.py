"""How attention lays heads and head_dim over its columns (and what that asks of the
GEMVs on either side of it).

Columns that hold whole KV heads (the width divides kv_heads) need nothing from each
other until the merge down the column. A region wider than kv_heads splits head_dim:
KV head k takes a group of c = w // kv_heads columns (`HeadSplit.group`; the last
w mod kv_heads columns hold no heads, so every group has one shape and the row
reductions one chain's flows), and each column of the group receives some *units* of
the head's features (balanced over the group) from the qkv projection and gives
the same units of the output to the o projection, a unit being two features that
RoPE rotates together (feature m and m + rotary/2) or two features past the rotary
part.

Inside the attention the group splits either the features or the sequence,
whichever needs fewer bytes a core (`split_layout`):

- *features*: each column keeps its units of K and V for every ring entry of its
  row's block; its partial q . k dot products (and, with q/k norm, the partial sums
  of squares) are summed along the row within the group before the softmax, so every
  column of the group computes the same exponentials of its rows;
- *rows*: each core keeps whole K and V rows of its KV head for every c-th entry of
  its row's block (`HeadSplit.entries`). The columns first gather their units into
  the whole head's q, k and v, each core then computes whole dot products, the
  softmax and the weighted sum of its rows by itself (q/k norm and RoPE on whole
  heads), and the partials (out, max, sum) merge along the row within the group, so
  every column of the group holds the group's; a column keeps its units of o. It
  divides the exponentials, the part of attention that grows with the context, by c,
  at the price of whole heads' q | k | v and partial on every core; it needs fewer
  bytes once a core's rows outnumber those whole-head vectors (long contexts).

Either way the row's exchanges are one chain along the whole row into its end and
back, segmented (a core combines its left neighbour's value only if it is of its
group, and keeps the relayed value only from its group's columns); then the partials
merge down each column as in any attention.

Vectors are then stored in orders that make each column's share contiguous:
q and the output gate [kv][unit feature][j] (j: query head within the group), k
[kv][unit feature], v and o [kv][feature][j] / [kv][feature] (v and o rotate not,
so their features keep their natural order). The qkv GEMV's weight columns and the
o projection's weight rows are permuted to match (`qkv_order`, `o_order`); the
numbers are the same, the permutation only moves them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from meshrt.kernels.interface import ACT_BYTES
from meshrt.rope import rotary_dim


def balanced(n: int, parts: int, i: int) -> tuple[int, int]:
    """Range of part i when n items are split into `parts` parts differing by at most one."""
    return i * n // parts, (i + 1) * n // parts


def splits_heads(kv_heads: int, w: int) -> bool:
    """Whether a w-column attention splits head_dim over its columns (wider than kv_heads)."""
    return w > kv_heads


def whole_heads(kv_heads: int, w: int) -> bool:
    """Whether each of w columns holds whole KV heads (w divides kv_heads)."""
    return kv_heads % w == 0


def lays_out(kv_heads: int, w: int) -> bool:
    """Whether attention computes on w columns: whole KV heads a column, or head_dim split."""
    return whole_heads(kv_heads, w) or splits_heads(kv_heads, w)


def kv_share(kv_heads: int, head_dim: int, w: int) -> int:
    """Features of K (and of V) the fullest column of a w-column attention receives per
    position: whole heads, or its units of one head's (two features a unit)."""
    if splits_heads(kv_heads, w):
        return 2 * -(-(head_dim // 2) // (w // kv_heads))
    return -(-kv_heads // w) * head_dim


def heads_share(heads: int, kv_heads: int, w: int) -> int:
    """Query heads the fullest column touches (all g of its group where it splits them)."""
    if splits_heads(kv_heads, w):
        return heads // kv_heads
    return -(-heads // w)


def q_share(heads: int, kv_heads: int, head_dim: int, w: int) -> int:
    """Features of q (and of the output, and of the gate) the fullest column holds: its K
    features for each query head of its KV heads."""
    return heads // kv_heads * kv_share(kv_heads, head_dim, w)


def qkv_share(heads: int, kv_heads: int, head_dim: int, w: int, gated: bool) -> int:
    """Entries of the blocked q | k | v (| gate) the fullest column holds."""
    return 2 * kv_share(kv_heads, head_dim, w) + (2 if gated else 1) * q_share(heads, kv_heads, head_dim, w)


def tile_span(max_seq: int, spill_from: int | None, tiles: int, t: int) -> tuple[int, int]:
    """(first ring entry, entries) tile t of an attention's `tiles` holds: its region
    (t = 0) all max_seq, or where it spills (docs/kernels.md, "KV spill") the first
    spill_from, and each spill tile (t >= 1) its balanced share of the rest."""
    if spill_from is None:
        return 0, max_seq
    if t == 0:
        return 0, spill_from
    lo, hi = balanced(max_seq - spill_from, tiles - 1, t - 1)
    return spill_from + lo, hi - lo


@dataclass(frozen=True)
class SplitLayout:
    """How a head split's group shares its work (module docstring): by `rows` (the
    sequence) or by features; the fullest core's KV rows of a slot and the bytes of its
    cache and working values."""

    rows: bool
    kv_rows: int
    kv_bytes: float
    work_bytes: float


def split_layout(heads: int, kv_heads: int, d: int, max_seq: int, slots: int, kv_bytes: float,
                 micro_batch: int, w: int, h: int, by: bool | None = None) -> SplitLayout:
    """The layout of a w x h attention splitting head_dim (`splits_heads`) whose group
    needs fewer bytes a core (features on a tie): its KV (`slots` slots of `max_seq`
    entries over the h rows) and its working values for `micro_batch` slots; `by`
    forces one (True: by rows; a spill tile keeps its region's)."""
    g, c = heads // kv_heads, w // kv_heads
    block = -(-max_seq // h)  # a row's entries of the ring
    ks = kv_share(kv_heads, d, w)  # its features of k (and of v)
    qs = g * ks  # of q (and of o)
    b = micro_batch
    by_features = SplitLayout(False, block, slots * block * ks * 2 * kv_bytes,
                              ACT_BYTES * b * (2 * qs + g * block))  # q, o; the scores
    rows = -(-block // c)
    # the gathered q | k | v, the partial (out, max, sum), its units of o, the scores
    by_rows = SplitLayout(True, rows, slots * rows * d * 2 * kv_bytes,
                          ACT_BYTES * b * ((g + 2) * d + g * (d + 2) + qs + g * rows))
    if by is not None:
        return by_rows if by else by_features
    if by_rows.kv_bytes + by_rows.work_bytes < by_features.kv_bytes + by_features.work_bytes:
        return by_rows
    return by_features


def split_by_rows(heads: int, kv_heads: int, d: int, held: int, slots: int, kv_bytes: float,
                  micro_batch: int, w: int, h: int) -> bool | None:
    """Whether a w x h attention whose region holds `held` ring entries a slot splits its
    heads' groups by rows (False: by features; `split_layout`), the layout its spill
    tiles keep too; None where its columns hold whole heads."""
    if not splits_heads(kv_heads, w):
        return None
    return split_layout(heads, kv_heads, d, held, slots, kv_bytes, micro_batch, w, h).rows


@dataclass(frozen=True)
class HeadSplit:
    """The head_dim split of an attention `cols` columns wide (cols > kv_heads)."""

    heads: int
    kv_heads: int
    head_dim: int
    rotary: int  # leading features of a head RoPE rotates (the rest pass)
    cols: int

    @classmethod
    def of(cls, heads: int, kv_heads: int, head_dim: int, cols: int, rope) -> HeadSplit:
        """The split of an attention of these dimensions whose RoPE is `rope`
        (`meshrt.rope.Rope`: how many leading features of a head rotate)."""
        return cls(heads, kv_heads, head_dim, rotary_dim(rope, head_dim), cols)

    def problem(self) -> str | None:
        """Why this split cannot be laid out in units, or None."""
        if not splits_heads(self.kv_heads, self.cols):
            return f"{self.cols} columns do not split {self.kv_heads} KV heads"
        if self.heads % self.kv_heads:
            return f"heads {self.heads} are not a multiple of kv_heads {self.kv_heads}"
        if self.head_dim % 2 or self.rotary % 2 or not 0 <= self.rotary <= self.head_dim:
            return (f"head_dim {self.head_dim} split over columns needs an even head_dim and "
                    f"rotary dimension (got rotary {self.rotary})")
        return None

    @property
    def g(self) -> int:
        return self.heads // self.kv_heads

    @property
    def units(self) -> int:
        return self.head_dim // 2

    @property
    def group_width(self) -> int:
        """Columns of each KV head's group."""
        return self.cols // self.kv_heads

    def group(self, i: int) -> tuple[int, int, int]:
        """(KV head, column within its group, columns of the group) of column i (a column
        past the groups: the last head, a position past its group)."""
        c = self.group_width
        k = min(i // c, self.kv_heads - 1)
        return k, i - k * c, c

    def group_id(self, i: int) -> int:
        """Column i's KV head, or -1 past the groups (where it sums with no one)."""
        if not 0 <= i < self.group_width * self.kv_heads:
            return -1
        return i // self.group_width

    def group_columns(self) -> list[tuple[int, int]]:
        """(first column, columns) of every KV head's group."""
        c = self.group_width
        return [(k * c, c) for k in range(self.kv_heads)]

    @functools.lru_cache(maxsize=None)  # noqa: B019 (one HeadSplit per kernel)
    def column(self, i: int) -> tuple[int, int, int, int, int, np.ndarray]:
        """(KV head, k0, k1, q0, q1, features of its head) of column i: `kv_range`,
        `q_range` and the head's features at k0..k1, worked out once per column."""
        k, _, _ = self.group(i)
        k0, k1 = self.kv_range(i)
        q0, q1 = self.q_range(i)
        base = k * self.head_dim
        return k, k0, k1, q0, q1, self.unit_features[k0 - base:k1 - base]

    def entries(self, i: int, r0: int, r1: int) -> np.ndarray:
        """The ring entries of block r0..r1 (a row's) column i holds: every c-th, from its
        place in the group (none past the groups)."""
        _, s, c = self.group(i)
        return np.arange(r0 + s, r1, c) if self.group_id(i) >= 0 else np.arange(0)

    def unit_range(self, i: int) -> tuple[int, int]:
        """The units of its head column i holds (none past the groups)."""
        _, s, c = self.group(i)
        return balanced(self.units, c, s) if s < c else (self.units, self.units)

    def kv_range(self, i: int) -> tuple[int, int]:
        """Column i's positions of k (order [kv][unit feature]) and of v ([kv][feature])."""
        k, _, _ = self.group(i)
        u0, u1 = self.unit_range(i)
        return k * self.head_dim + 2 * u0, k * self.head_dim + 2 * u1

    def q_range(self, i: int) -> tuple[int, int]:
        """Column i's positions of q, the gate and o (g per k position)."""
        lo, hi = self.kv_range(i)
        return lo * self.g, hi * self.g

    @functools.cached_property
    def unit_features(self) -> np.ndarray:
        """Unit order -> feature of a head: RoPE pairs (m, m + rotary/2), then the
        features past the rotary part two by two."""
        half = self.rotary // 2
        pairs = np.stack([np.arange(half), np.arange(half) + half], axis=1).ravel()
        return np.concatenate([pairs, np.arange(self.rotary, self.head_dim)]).astype(np.int64)

    def _grouped(self, per_head: np.ndarray) -> np.ndarray:
        """Order [kv][feature position][j] of a heads x head_dim vector -> natural index,
        the feature at each position `per_head`."""
        kv, f, j = np.meshgrid(np.arange(self.kv_heads), per_head, np.arange(self.g), indexing="ij")
        return ((kv * self.g + j) * self.head_dim + f).ravel()

    @functools.cached_property
    def q_order(self) -> np.ndarray:
        return self._grouped(self.unit_features)

    @functools.cached_property
    def k_order(self) -> np.ndarray:
        kv = np.arange(self.kv_heads)[:, None] * self.head_dim
        return (kv + self.unit_features[None, :]).ravel()

    @functools.cached_property
    def o_order(self) -> np.ndarray:
        """Position of o (and of the gate) -> its natural index."""
        return self._grouped(np.arange(self.head_dim))

    def qkv_range(self, i: int, gated: bool) -> tuple[int, int]:
        """Column i's slice of the q | k | v (| gate) vector laid out blocked per column."""
        return int(self._qkv_starts(gated)[i]), int(self._qkv_starts(gated)[i + 1])

    def _column_size(self, i: int, gated: bool) -> int:
        lo, hi = self.kv_range(i)
        return (hi - lo) * (2 + self.g * (2 if gated else 1))

    @functools.lru_cache(maxsize=2)  # noqa: B019 (one HeadSplit per kernel)
    def _qkv_starts(self, gated: bool) -> np.ndarray:
        return np.cumsum([0] + [self._column_size(i, gated) for i in range(self.cols)])

    @functools.lru_cache(maxsize=2)  # noqa: B019
    def qkv_order(self, gated: bool) -> np.ndarray:
        """Blocked position -> index in the natural q | k | v (| gate) concatenation."""
        hd, kvd = self.heads * self.head_dim, self.kv_heads * self.head_dim
        out = []
        for i in range(self.cols):
            k0, k1 = self.kv_range(i)
            q0, q1 = self.q_range(i)
            out += [self.q_order[q0:q1], hd + self.k_order[k0:k1], hd + kvd + np.arange(k0, k1)]
            if gated:
                out.append(hd + 2 * kvd + self.o_order[q0:q1])
        return np.concatenate(out).astype(np.int64)
