"""The corridor an MoE layer's tokens leave and re-enter by: what its cores buffer."""

from __future__ import annotations

from meshrt.kernels.interface import ACT_BYTES, Footprint, ceil_div


def relay_footprint(top_k: int, hidden: int, micro_batch: int, w: int, h: int) -> Footprint:
    """A corridor core buffers top_k copies of each token's slice, double-buffered
    (dispatch hands them to the experts; combine sums the expert outputs back)."""
    return Footprint(0, 2 * micro_batch * top_k * ceil_div(hidden, h * w) * ACT_BYTES)
