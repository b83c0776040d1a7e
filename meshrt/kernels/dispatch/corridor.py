"""The corridor an MoE layer's tokens leave and re-enter by (dispatch, combine): what its
kernels share and what its cores buffer."""

from __future__ import annotations

from typing import ClassVar

from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    OUTPUTS,
    Event,
    Footprint,
    KernelContext,
    KernelOp,
    Role,
    ceil_div,
)


class CorridorOp(KernelOp):
    """A kernel of the corridor column beside an MoE layer's expert regions.

    Its region is split flat: every core takes its slice of every token (or
    of the expert outputs), resolves the routing metainfo riding it and runs
    `work` on it; no core relays a whole token.
    """

    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True  # the routing metainfo rides the inputs

    def verify_kernel(self) -> None:
        self.grid()

    def work(self, kctx: KernelContext) -> Event:
        """The compute event every corridor core runs on its slice."""
        raise NotImplementedError(f"kernel kind {self.kernel_kind()} does not define its corridor work")

    def roles(self, kctx: KernelContext):
        return [Role("slice", self.region, [INPUTS, self.work(kctx), OUTPUTS], 0,
                     ctrl=kctx.route_bytes, sends_output=True)], []

    def input_share(self, width: int) -> int:
        _, _, w, h = self.grid()
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "flat"

    def output_layout(self) -> str:
        return "flat"


def relay_footprint(top_k: int, hidden: int, micro_batch: int, w: int, h: int) -> Footprint:
    """A corridor core buffers top_k copies of each token's slice, double-buffered
    (dispatch hands them to the experts; combine sums the expert outputs back)."""
    return Footprint(0, 2 * micro_batch * top_k * ceil_div(hidden, h * w) * ACT_BYTES)
