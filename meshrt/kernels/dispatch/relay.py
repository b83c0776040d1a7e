"""Roles of a relay corridor: dispatch carries tokens from the gate past the expert regions."""

from __future__ import annotations

from typing import ClassVar

from meshrt.dialects.mesh import CoreSetAttr, FlowRole
from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    OUTPUTS,
    Footprint,
    FlowSpec,
    KernelContext,
    KernelOp,
    Role,
    ceil_div,
)


class RelayOp(KernelOp):
    """A relay corridor (dispatch).

    Every relay role resolves the routing metainfo riding its messages, and
    each core carries its slice of every token (the corridor split flat).
    """

    RESOLVES: ClassVar[frozenset[str]] = frozenset({"moe_routing"})
    ROUTED_INPUTS: ClassVar[bool] = True  # the tokens' routing metainfo rides the inputs
    HOLDS_RESULT_AT_OUTPUTS: ClassVar[bool] = True  # the result leaves where it is sent

    def roles(self, kctx: KernelContext):
        return relay_roles(self, kctx)

    def input_share(self, width: int) -> int:
        _, _, w, h = self.tiles()[0]
        return ceil_div(width, w * h)

    def input_layout(self) -> str:
        return "full"  # read in place only from a producer holding it whole; else a flow brings input_share


def relay_footprint(top_k: int, hidden: int, micro_batch: int, w: int, h: int) -> Footprint:
    """A relay forwards top_k copies of each token's slice, double-buffered."""
    return Footprint(0, 2 * micro_batch * top_k * ceil_div(hidden, h * w) * ACT_BYTES)


def relay_roles(kernel: KernelOp, kctx: KernelContext) -> tuple[list[Role], list[FlowSpec]]:
    """Dispatch relays along the corridor's long axis.

    Tokens enter at the head, and every relay core reads the routing
    metainfo to pick a direction: onward along the corridor, or across into
    the expert regions.
    """
    x, y, w, h = kernel.grid()
    k = kernel.kernel_name
    b = kctx.micro_batch
    hidden = kernel.output.type.width.data
    meta = kctx.route_bytes if "moe_routing" in kctx.dynamism else 0
    msg = b * kctx.top_k * ceil_div(hidden, w * h) * ACT_BYTES  # each relay core carries its slice
    along_y = h >= w
    length = h if along_y else w

    def cell(i: int, n: int = 1) -> CoreSetAttr:
        return CoreSetAttr.of(x, y + i, w, n) if along_y else CoreSetAttr.of(x + i, y, n, h)

    if length == 1:  # one core: it only routes
        return [Role("head", kernel.region, [INPUTS, ("compute", "route", b * kctx.top_k), OUTPUTS],
                     0, ctrl=kctx.route_bytes, switches=2, sends_output=True)], []
    dx, dy = (0, 1) if along_y else (1, 0)
    hop = f"{k}.hop"
    src, dst = cell(0, length - 1), cell(1, length - 1)
    flows = [FlowSpec(hop, src, dst, "shift", msg, dx, dy, role=FlowRole.HOP)]
    roles = [Role("head", cell(0), [INPUTS, ("compute", "route", b * kctx.top_k), ("send", hop, msg, meta), OUTPUTS],
                  0, ctrl=kctx.route_bytes, switches=2, sends_output=True)]
    if length > 2:
        roles.append(Role("relay", cell(1, length - 2), [
            ("recv", hop, msg, meta), ("compute", "route", b * kctx.top_k), ("send", hop, msg, meta), OUTPUTS,
        ], 0, ctrl=kctx.route_bytes, switches=2, sends_output=True))
    roles.append(Role("tail", cell(length - 1), [("recv", hop, msg, meta), ("compute", "route", b * kctx.top_k),
                                                 OUTPUTS], 0, ctrl=kctx.route_bytes, switches=2,
                      sends_output=True))
    return roles, flows
