"""CSL bodies of the dispatch kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def route(b: ComputeBody) -> list[str]:
    if not b.w.moe:
        return ["// no routing metainfo on this core: tokens go on along the corridor"]
    # the resolver filled rt_expert / rt_weight; every region on the corridor's row gets
    # each token's slice, and an expert region computes the tokens routed to it (`mine`,
    # which the routing resolver sets on the expert cores from the placement)
    return ["// the routing table is resolved (resolve_moe_routing): each token's slice goes",
            "// on to the expert regions, which compute only the tokens routed to them"]
