"""Which expert regions send into combine in a step: the ones a token was routed to.

A flow marked `routed` (`event.flow ... routed`) is sent by the root columns
of the expert regions (`expert_reduce`). The event tables keep one send per
root core and one recv per receiver, but in a step only a region that a
token of the step chose (or a shared expert's region, which every token
uses) sends; the others pass only their switch advance (one control wavelet
that no core receives), and each receiver gathers one message from each
chosen region's senders that target it.

This module is the one description of that rule for the interpreter (which
reads or draws the step's routing, senders and receivers alike), the cost
model (which charges its expectation) and the CSL backend (which prints it):
`RoutedSenders.of(program, flow)` finds the sender regions and their experts
from the program's kernel records.

Routing is the model's when the interpreter moves real tensors (the gate's
top-k, as each core resolved it, with the placement its step runs with).
Timed without numerics, each slot of a step chooses `top_k` distinct experts
uniformly (`draw`): a counter-based draw of (seed, layer, step, slot), so it
does not depend on event order. The cost model charges the expectation of
that same draw (`send_share`): experts chosen uniformly is an assumption,
the balanced case; skewed routing sends from fewer regions.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

from meshrt.routing import RectSet
from meshrt.runtime import counter_rng

ROUTING_STREAMS = 1 << 48
"""Stream ids of the routing draws start here, clear of the cores' (router ids)."""


def region_routed_probability(experts: int, held: int, top_k: int, tokens: int) -> float:
    """Probability that at least one of `tokens` tokens, each choosing `top_k` of `experts`
    experts uniformly without repeats, chooses one of a region's `held` experts."""
    k = min(top_k, experts)
    if held <= 0:
        return 0.0
    miss_one = math.comb(experts - held, k) / math.comb(experts, k) if experts - held >= k else 0.0
    return 1.0 - miss_one ** tokens


def draw(key: int, step: int, slot: int, experts: int, top_k: int) -> list[int]:
    """The `top_k` distinct experts slot `slot` of step `step` chooses under stream `key`
    (a partial Fisher-Yates shuffle, one draw per choice)."""
    k = min(top_k, experts)
    pool = list(range(experts))
    base = (step * 1_000_003 + slot) * k
    for j in range(k):
        i = j + int(counter_rng.unit(key, base + j) * (experts - j))
        pool[j], pool[i] = pool[i], pool[j]
    return pool[:k]


def routing_key(seed: int, kernel: str) -> int:
    """The draw stream of one MoE layer's routing (named by its combine kernel)."""
    return counter_rng.stream_key(seed, ROUTING_STREAMS + zlib.crc32(kernel.encode()))


@dataclass(frozen=True)
class RoutedSenders:
    """The expert regions that send a routed flow and the experts each holds."""

    experts: int
    top_k: int
    layer: int
    placement: tuple[int, ...]  # expert -> region, as compiled
    regions: tuple[RectSet, ...]  # every expert region, routed ones first, then shared ones
    routed_regions: int  # how many of them hold routed experts (the mapper's order)
    kernel: str  # the expert kernel whose regions these are

    @staticmethod
    def of(program, flow) -> "RoutedSenders":
        """From the kernel records of `program`: the flow's consumer reads the
        `expert_reduce` whose root columns send it, which reads the `expert_ffn` whose
        placement says which experts each region holds; the gate gives top_k."""
        infos = {k.kernel_name: k for k in program.kernels()}
        consumer = infos[flow.kernel.root_reference.data]
        reduce = next(infos[n] for n in consumer.input_names if infos[n].kind.data == "expert_reduce")
        return RoutedSenders.of_experts(program, infos[reduce.input_names[0]], infos)

    @staticmethod
    def of_experts(program, ffn, infos: dict | None = None) -> "RoutedSenders":
        """From expert kernel record `ffn` (an `expert_ffn`'s): its regions and placement,
        and top_k from the gate it reads (`infos`: the program's records by name, if at
        hand)."""
        infos = infos or {k.kernel_name: k for k in program.kernels()}
        gate = next(infos[n] for n in ffn.input_names if infos[n].param("top_k") is not None)
        placement = tuple(int(r) for r in ffn.param("placement"))
        regions = tuple(RectSet.from_cores(cs) for cs in ffn.params.data["expert_regions"].data)
        return RoutedSenders(len(placement), int(gate.param("top_k")), int(ffn.param("layer", 0)),
                             placement, regions, len(regions) - int(ffn.param("shared_experts", 0)),
                             ffn.kernel_name)

    def region_at(self, x: int, y: int) -> int:
        """The expert region a sender core lies in."""
        for i, r in enumerate(self.regions):
            if r.contains(x, y):
                return i
        raise ValueError(f"core ({x}, {y}) is in no expert region")

    def holds(self, region: int, placement: tuple[int, ...] | None = None) -> frozenset[int]:
        """The experts `region` holds under `placement` (default: as compiled); none for a
        shared expert's region."""
        return frozenset(e for e, r in enumerate(placement or self.placement) if r == region)

    def is_shared(self, region: int) -> bool:
        return region >= self.routed_regions

    def send_share(self, senders: RectSet, micro_batch: int) -> float:
        """Expected fraction of `senders` that send in a step of `micro_batch` uniformly
        routed slots."""
        total = weighted = 0.0
        for i, region in enumerate(self.regions):
            n = (region & senders).count
            if n:
                held = len(self.holds(i))
                p = 1.0 if self.is_shared(i) else region_routed_probability(
                    self.experts, held, self.top_k, micro_batch)
                total += n
                weighted += n * p
        return weighted / total if total else 1.0
