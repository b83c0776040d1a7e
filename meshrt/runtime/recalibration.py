"""Recalibration: re-place experts when live routing drifts from the placement's profile.

Why: a placement is only as good as the profile it was made for; when the
workload changes (chat turns give way to long reasoning traces) other
experts get hot and the slowest region of a layer slows every step. Moving
expert weights is not free, so the response is *incremental*: a few expert
swaps that relieve the slowest regions, each priced in bytes and cycles,
applied between decode steps.

The logic is pure (no IR, no simulator): the serving loop feeds it the
per-step expert token counts it already has (the routing metainfo) and asks
between decode steps whether to re-place::

    rc = Recalibrator(placements, profile, models, threshold=0.15,
                      move_cost=MoveCost.for_layers(target, layers))
    # or Recalibrator.for_module(ir_module, profile, models, target)
    for step in ...:
        for layer, counts in routed_counts(step):
            rc.observe(layer, counts)
        plan = rc.maybe_replan(step)
        if plan:                      # apply before step + 1 (safe reconfiguration):
            apply(plan.placements)    # e.g. apply_to_module(ir_module, plan); plan.moves
                                      # says which weights move, plan.cycles what it costs

Live profile: exponentially decayed per-expert counts (half-life in
observations of that layer), so old routing fades and a one-step burst does
not. Drift of a layer: total-variation distance between its live and
reference expert shares, 0 (same routing) to 1 (disjoint experts). A layer
is considered only after `min_tokens` (decayed) tokens, so sampling noise of
a few steps cannot trigger. On drift past `threshold` the layer gets at most
`max_swaps` swaps (vibe's swap search started from the current placement,
on the live profile); the plan is returned only if it lowers the layer's
predicted time by `min_gain` (relative). Either way the layer's reference
becomes the live profile: the placement has been checked against it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meshrt.expert_placement import Placement, improve, layer_time, time_gap, vibe
from meshrt.runtime.expert_profile import ExpertProfile, RegionModel, RegionModels


@dataclass(frozen=True)
class MoveCost:
    """Cost of moving one expert's weights between two regions of a layer.

    The source region's cores each hold a slice and send it in parallel:
    `lanes` links carry the transfer (the rows of horizontally separated
    regions, the columns of vertically separated ones), so it takes
    hops x hop latency + bytes / (lanes x link bytes per cycle).
    """

    expert_bytes: Mapping[int, int] | int
    link_bytes_per_cycle: float = 4.0
    hop_latency_cycles: float = 1.0
    regions: Mapping[int, Sequence[tuple[int, int, int, int]]] = field(default_factory=dict)

    @classmethod
    def for_layers(cls, target, layers: Mapping[int, object]) -> MoveCost:
        """From a Target and `region_timing.MoELayer`s (regions and expert bytes)."""
        return cls({l: lay.expert_bytes for l, lay in layers.items()},
                   float(target.link_bytes_per_cycle), float(target.hop_latency_cycles),
                   {l: lay.regions for l, lay in layers.items()})

    def bytes(self, layer: int) -> int:
        eb = self.expert_bytes
        return int(eb[layer] if isinstance(eb, Mapping) else eb)

    def move_cycles(self, layer: int, src: int, dst: int) -> int:
        nbytes = self.bytes(layer)
        rects = self.regions.get(layer)
        if not rects:
            return math.ceil(nbytes / self.link_bytes_per_cycle)
        sx, sy, sw, sh = rects[src]
        dx, dy, dw, dh = rects[dst]
        hops = abs((sx + sw / 2) - (dx + dw / 2)) + abs((sy + sh / 2) - (dy + dh / 2))
        apart_x = sx + sw <= dx or dx + dw <= sx
        apart_y = sy + sh <= dy or dy + dh <= sy
        if apart_x and not apart_y:
            lanes = min(sh, dh)
        elif apart_y and not apart_x:
            lanes = min(sw, dw)
        else:
            lanes = min(sw, sh, dw, dh)
        return math.ceil(hops * self.hop_latency_cycles
                         + nbytes / (max(lanes, 1) * self.link_bytes_per_cycle))


@dataclass(frozen=True)
class Move:
    """Expert `expert` of `layer` moves its weights from region `src` to `dst`."""

    layer: int
    expert: int
    src: int
    dst: int
    bytes: int
    cycles: int


@dataclass(frozen=True)
class Replan:
    """An incremental re-placement decided after decode step `step`, to apply before `step + 1`.

    `swaps` are the search's steps, (layer, expert e, its region, expert f,
    its region), e and f trading places; `moves` the net weight moves they
    add up to (an expert swapped twice moves once), which is what costs.
    """

    step: int
    placements: dict[int, Placement]  # new placement of every changed layer
    swaps: tuple[tuple[int, int, int, int, int], ...]
    moves: tuple[Move, ...]
    drift: dict[int, float]  # of the changed layers, at decision time
    before: dict[int, float]  # predicted layer time (live profile, old placement)
    after: dict[int, float]  # ... with the new placement
    ideal: dict[int, float]  # ... with a from-scratch vibe placement (for reference)

    @property
    def apply_at(self) -> int:
        return self.step + 1

    @property
    def bytes(self) -> int:
        return sum(m.bytes for m in self.moves)

    @property
    def cycles(self) -> int:
        """Moves one after another: an upper bound (disjoint region pairs could overlap)."""
        return sum(m.cycles for m in self.moves)

    def summary(self) -> str:
        parts = []
        for l in sorted(self.placements):
            mv = ", ".join(f"e{m.expert} r{m.src}->r{m.dst}" for m in self.moves if m.layer == l)
            parts.append(f"layer {l} (drift {self.drift[l]:.2f}): {mv}; predicted "
                         f"{self.before[l]:.0f} -> {self.after[l]:.0f} (from scratch "
                         f"{self.ideal[l]:.0f})")
        return (f"after step {self.step}: {len(self.swaps)} swap(s), {len(self.moves)} expert "
                f"move(s), {self.bytes} bytes, {self.cycles} cycles; " + "; ".join(parts))


def total_variation(p: Sequence[float], q: Sequence[float]) -> float:
    return 0.5 * sum(abs(a - b) for a, b in zip(p, q, strict=True))


def _shares(counts: Sequence[float]) -> tuple[float, ...]:
    total = sum(counts)
    return tuple(c / total for c in counts) if total > 0 else tuple(1.0 / len(counts) for _ in counts)


class Recalibrator:
    """Tracks live routing, detects drift, plans incremental re-placements (module docstring).

    `placements`: the current placement per MoE layer (a `Placement` or the
    IR's expert -> region list); `profile`: what they were made for;
    `models`: region models, whose token unit `tokens_per_step` (or the
    argument) converts shares to loads.
    """

    def __init__(self, placements: Mapping[int, Placement | Sequence[int]], profile: ExpertProfile,
                 models: RegionModels, *, threshold: float = 0.15, halflife: float = 32.0,
                 min_tokens: float = 1024.0, max_swaps: int = 4, min_gain: float = 0.01,
                 cooldown: int = 0, tokens_per_step: float | None = None,
                 move_cost: MoveCost | None = None):
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        self.placements: dict[int, Placement] = {}
        for l, p in placements.items():
            if not isinstance(p, Placement):
                p = Placement(tuple(p), max(p) + 1)
            self.placements[l] = p
        self.models = {l: models.for_layer(l) for l in self.placements}
        for l, p in self.placements.items():
            if len(self.models[l]) != p.regions:
                raise ValueError(f"layer {l}: {len(self.models[l])} region models for "
                                 f"{p.regions} regions")
        self.reference = {l: profile.shares(l) for l in self.placements}
        tps = tokens_per_step or models.tokens_per_step
        if tps is None:
            raise ValueError("tokens_per_step: give it, or use models that record it")
        self.tokens_per_step = float(tps)
        self.threshold, self.min_tokens = threshold, min_tokens
        self.max_swaps, self.min_gain, self.cooldown = max_swaps, min_gain, cooldown
        self.decay = 0.5 ** (1.0 / halflife)
        self.move_cost = move_cost
        self.live = {l: [0.0] * self.placements[l].experts for l in self.placements}
        self.last_replan: int | None = None
        self.history: list[Replan] = []

    # -- tracking --------------------------------------------------------
    def observe(self, layer: int, expert_counts: Sequence[float]) -> None:
        """Tokens routed to each expert of `layer` in one decode step."""
        live = self.live[layer]
        if len(expert_counts) != len(live):
            raise ValueError(f"layer {layer}: {len(expert_counts)} counts for {len(live)} experts")
        d = self.decay
        for e, c in enumerate(expert_counts):
            live[e] = live[e] * d + c

    def live_shares(self, layer: int) -> tuple[float, ...]:
        return _shares(self.live[layer])

    def live_profile(self) -> ExpertProfile:
        return ExpertProfile.from_counts({l: self.live_shares(l) for l in self.live}, name="live")

    def seen(self, layer: int) -> float:
        """Decayed token count behind the live profile of `layer`."""
        return sum(self.live[layer])

    def drift(self, layer: int) -> float:
        return total_variation(self.live_shares(layer), self.reference[layer])

    def tokens(self, shares: Sequence[float]) -> list[float]:
        return [s * self.tokens_per_step for s in shares]

    def predicted(self, layer: int, placement: Placement | None = None,
                  shares: Sequence[float] | None = None) -> float:
        """Predicted layer time of a placement (default: current) under shares (default: live)."""
        p = placement or self.placements[layer]
        return layer_time(p, self.tokens(shares or self.live_shares(layer)), self.models[layer])

    def gap(self, layer: int, shares: Sequence[float] | None = None) -> float:
        p = self.placements[layer]
        return time_gap(p, self.tokens(shares or self.live_shares(layer)), self.models[layer])

    # -- planning --------------------------------------------------------
    def maybe_replan(self, step: int, commit: bool = True) -> Replan | None:
        """A plan if some layer drifted past the threshold and swaps pay off, else None.

        With `commit` (the default) the plan is adopted at once: the caller
        is expected to apply it before step + 1. `commit=False` only looks.
        """
        if self.last_replan is not None and step - self.last_replan < self.cooldown:
            return None
        drifted = {l: self.drift(l) for l in self.placements
                   if self.seen(l) >= self.min_tokens}
        drifted = {l: d for l, d in drifted.items() if d > self.threshold}
        if not drifted:
            return None
        new, swaps, moves, before, after, ideal, drift = {}, [], [], {}, {}, {}, {}
        for l, d in sorted(drifted.items()):
            shares = self.live_shares(l)
            tokens = self.tokens(shares)
            models: Sequence[RegionModel] = self.models[l]
            cur = self.placements[l]
            t0 = layer_time(cur, tokens, models)
            cand, log = improve(cur, tokens, models, self.max_swaps)
            t1 = layer_time(cand, tokens, models)
            if commit:
                self.reference[l] = shares  # checked against the live profile either way
            if not log or t1 > t0 * (1 - self.min_gain):
                continue
            new[l], before[l], after[l], drift[l] = cand, t0, t1, d
            ideal[l] = layer_time(vibe(tokens, models), tokens, models)
            swaps.extend((l, *s) for s in log)
            moves.extend(self._move(l, e, src, dst)
                         for e, (src, dst) in enumerate(zip(cur.region_of, cand.region_of))
                         if src != dst)
        if not new:
            return None
        plan = Replan(step, new, tuple(swaps), tuple(moves), drift, before, after, ideal)
        if commit:
            self.commit(plan)
        return plan

    def commit(self, plan: Replan) -> None:
        """Adopt `plan` (done by `maybe_replan` unless commit=False)."""
        for l, p in plan.placements.items():
            self.placements[l] = p
            self.reference[l] = self.live_shares(l)
        self.last_replan = plan.step
        self.history.append(plan)

    @classmethod
    def for_module(cls, module, profile: ExpertProfile, models: RegionModels, target=None,
                   **kw) -> Recalibrator:
        """A recalibrator for the MoE layers of graph / mesh_kernel IR, starting from
        the placements written there; with `target`, moves are priced on its links."""
        from meshrt.passes.place_experts import moe_sites
        from meshrt.runtime.region_timing import MoELayer

        sites = moe_sites(module)
        if target is not None and "move_cost" not in kw:
            kw["move_cost"] = MoveCost.for_layers(target, {s.layer: MoELayer.of(s) for s in sites})
        return cls({s.layer: s.placement for s in sites}, profile, models, **kw)

    def _move(self, layer: int, e: int, src: int, dst: int) -> Move:
        if self.move_cost is None:
            return Move(layer, e, src, dst, 0, 0)
        mc = self.move_cost
        return Move(layer, e, src, dst, mc.bytes(layer), mc.move_cycles(layer, src, dst))


def apply_to_module(module, plan: Replan) -> None:
    """Write a plan's placements into graph / mesh_kernel IR (the `placement` arrays).

    Every region keeps its number of experts, so the segment program is
    unchanged; what changes at runtime is which region the dispatch sends an
    expert's tokens to, and the weights the plan's moves carry.
    """
    from meshrt.passes.place_experts import moe_sites

    for site in moe_sites(module):
        if site.layer in plan.placements:
            site.set_placement(plan.placements[site.layer])
