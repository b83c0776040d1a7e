"""A GEMV's tiles: how its input and output split over its grid, and the fullest core's
tile (what its footprint, the mapper's sizer and its PE body are sized by)."""

from __future__ import annotations

from xdsl.dialects.builtin import DenseArrayBase

from meshrt.kernels.attention.layout import q_share, qkv_share
from meshrt.kernels.interface import ceil_div


def split_counts(w: int, h: int, axis: str) -> tuple[int, int]:
    """(cores the input is split over, cores the output is split over) on a w x h grid."""
    return (h, w) if axis == "col" else (w, h)


def array_values(a: DenseArrayBase | None) -> tuple[int, ...] | None:
    return None if a is None else tuple(a.get_values())


def tile_shape(n_in: int, n_out: int, w: int, h: int, axis: str, blocks: tuple[int, ...] | None,
               out_heads: tuple[int, ...] | None, in_heads: tuple[int, ...] | None) -> tuple[int, int]:
    """(input rows, output columns) of the fullest core's tile of a GEMV (its op's
    properties, or its `event.kernel` record's): a plain split of each; a blocked output
    the first column's part of every block; the units of an attention splitting head_dim
    (`attention.layout`) on the columns it shares with that attention."""
    across_in, across_out = split_counts(w, h, axis)
    it, ot = ceil_div(n_in, across_in), ceil_div(n_out, across_out)
    if out_heads is not None:
        heads, kv, d, cols = out_heads
        ot = qkv_share(heads, kv, d, cols, len(blocks or ()) == 4)
    elif blocks:
        ot = sum(min(b, ceil_div(b, across_out)) for b in blocks)
    if in_heads is not None and axis == "row":
        heads, kv, d, cols = in_heads
        it = q_share(heads, kv, d, cols)
    return it, ot
