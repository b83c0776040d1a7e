"""Streaming two-level reduction trees along a line of cores: geometry, timing model, plan.

A kernel's reduction runs along each column (or row) of its tiles: `n`
cores at positions 0..n-1 along the line. `chain` (meshrt.kernels.interface)
builds its roles and flows from a `ReduceTree`:

- the root sits at the centre of the line, position `root` = (n - 1) // 2;
  the cores before it (side "a", positions < root) send toward +1, the cores
  after it (side "b") toward -1, so both halves reduce in parallel;
- on each side, a core's distance to the root is d = 1..m. With groups of
  `group` = S >= 2 cores, the cores at d = S, 2S, ... are group *leads*;
  group k holds the cores kS < d < (k+1)S, which stream their partials
  toward d = kS (the lead, or the root for k = 0): the far end of a group is
  its `edge`, the others are `mid`s. Phase 1: every group reduces in
  parallel into its lead. Phase 2: the leads stream toward the root along
  the line, S hops apart (the farthest lead sends its group's sum, every
  nearer lead adds its own into the passing stream). `group` = 0 is one
  chain per side (phase 1 only).
- the result leaves the root in one message, multicast along the line.

Every partial flow streams: a core adds the wavelets of its input stream to
its own partial as they pass (a fabric-in DSD added into a fabric-out DSD)
and forwards them, so a chain costs wavelets + hops + a per-stage latency,
not a message per hop. `stream_stage` is that per-stage timing, the one the
interpreter and the cost model apply (meshrt.runtime.schedule).

`ReduceTree.cycles` is the closed-form time of a reduction (the same model:
wavelets + hops x hop latency + stages x stage latency) that `plan` uses to
choose the group size per line length and message size, as WaferLLM chooses
its `group_num`: one place for that formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def stream_stage(recv_wavelet: float, send_wavelet: float, op_per_wavelet: float) -> tuple[float, float]:
    """(latency, cycles per wavelet) of one streaming stage on a core.

    A wavelet climbs the ramp into the core (a fabric-in DSD read,
    `recv_wavelet`), is combined (`op_per_wavelet`: the reduce op's cycles on
    one wavelet's elements) and leaves down the ramp (a fabric-out DSD write,
    `send_wavelet`). An op that keeps up with one wavelet per cycle runs in
    the DSD pipeline and adds no latency; a slower one adds what it lags. So
    with one-cycle ramps a stage plus its hop is Luczynski et al.'s
    2 T_R + 1. The stage passes one wavelet per max(recv, send, op) cycles.
    """
    lat = recv_wavelet + send_wavelet + max(0, math.ceil(op_per_wavelet) - 1)
    return lat, max(recv_wavelet, send_wavelet, op_per_wavelet)


@dataclass(frozen=True)
class StreamCosts:
    """What a reduction plan needs of the target: hop latency, ramp costs, queue budget."""

    hop: float
    recv: float
    send: float
    add: float  # cycles per element of the reduce op `plan` assumes (an add)
    queues: int  # input queues one role may bind
    colors: int  # user colours
    op_costs: dict[str, float] = field(default_factory=dict, compare=False, hash=False)  # cost key -> cycles

    @classmethod
    def of(cls, target) -> StreamCosts:
        c = target.costs
        return cls(float(target.hop_latency_cycles), float(c["recv_wavelet"]), float(c["send_wavelet"]),
                   float(c["add"]), len(target.user_input_queues), len(target.user_colors), dict(c))


QUEUES_FOR_GROUPS = 5
"""Input queues the root of a two-level tree binds: its input, both sides' groups, both sides' leads."""
COLORS_FOR_CENTRE = 8
"""User colours below which roots stay at the end of the line: a centred root takes
both sides' streams, one colour more where kernels overlap (the tight test targets)."""


@dataclass(frozen=True)
class ReduceTree:
    """A reduction along a line of `n` cores rooted at `root`, in groups of `group` (0: none)."""

    n: int
    root: int
    group: int = 0

    @classmethod
    def centred(cls, n: int, group: int = 0) -> ReduceTree:
        g = group if group >= 2 else 0
        root = (n - 1) // 2
        if g and g > max(root, n - 1 - root):
            g = 0  # no side is longer than one group: a plain chain
        return cls(n, root, g)

    # -- geometry ----------------------------------------------------------
    def side_length(self, side: str) -> int:
        return self.root if side == "a" else self.n - 1 - self.root

    def position(self, side: str, d: int) -> int:
        """Position along the line of the core at distance d from the root on `side`."""
        return self.root - d if side == "a" else self.root + d

    def leads(self, side: str) -> list[int]:
        """Distances of the side's group leads, nearest first."""
        m = self.side_length(side)
        return list(range(self.group, m + 1, self.group)) if self.group else []

    def groups(self, side: str) -> list[tuple[int, int]]:
        """(nearest, farthest) member distance of each non-empty group, nearest group first."""
        m = self.side_length(side)
        if not self.group:
            return [(1, m)] if m else []
        out = []
        for k in range(0, m // self.group + 1):
            lo, hi = k * self.group + 1, min((k + 1) * self.group - 1, m)
            if lo <= hi:
                out.append((lo, hi))
        return out

    def depth(self) -> int:
        """Dependent streaming stages from the farthest core to the root (Luczynski's D)."""
        best = 0
        for side in ("a", "b"):
            first = max((hi - lo + 1 for lo, hi in self.groups(side)), default=0)
            best = max(best, first + len(self.leads(side)))
        return best

    # -- timing (the closed form `plan` minimises) --------------------------
    def cycles(self, wavelets: int, costs: StreamCosts, op: float | None = None) -> float:
        """Closed-form cycles from the start of the reduction until the root holds the sum.

        Phase 1: a group's edge sends its `wavelets`; every further core of the
        group adds a hop and a stage latency; the lead (or root) consumes the
        stream. Phase 2 starts when phase 1 is done: the farthest lead sends,
        each nearer lead adds S hops and a stage. The root consumes its sides
        one after the other (one ramp). `op`: the reduce op's cycles per
        wavelet (default: an add).
        """
        lat, rate = stream_stage(costs.recv, costs.send, costs.add if op is None else op)
        per_hop = costs.hop + lat
        stream = wavelets * max(rate, costs.send)
        t_root = 0.0
        for side in ("a", "b"):
            if not self.side_length(side):
                continue
            phase1 = max((hi - lo + 1 for lo, hi in self.groups(side)), default=0)
            t = stream + phase1 * per_hop if phase1 else 0.0
            leads = self.leads(side)
            if leads:
                t += stream + len(leads) * (self.group * costs.hop + lat)
            t_root = max(t_root, t)
        sides = sum(1 for s in ("a", "b") if self.side_length(s))
        return t_root + (sides - 1) * wavelets * rate

    @classmethod
    def plan(cls, n: int, wavelets: int, costs: StreamCosts | None, group: int = 0,
             op: float | None = None, centre: bool = True) -> ReduceTree:
        """The tree for a line of `n` cores and messages of `wavelets`.

        `group` >= 2 forces groups of that size, 1 forces one chain per side;
        0 chooses the tree of least `cycles` for this message and reduce op
        (`op`, cycles per wavelet) among: groups of `group_size(n)` around a
        centred root (when the target has the input queues a two-level root
        binds, `QUEUES_FOR_GROUPS`), one chain per side of a centred root, one
        chain into a root at the end (a slow op, e.g. a softmax merge, pays
        for a centred root's second stream). On targets with fewer than
        `COLORS_FOR_CENTRE` user colours, or with `centre` false, the root is at
        the end.
        """
        if group:
            return cls.centred(n, group)
        end = cls(n, n - 1)
        if costs is None or not centre or costs.colors < COLORS_FOR_CENTRE:
            return end
        options = [cls.centred(n), end]
        if costs.queues >= QUEUES_FOR_GROUPS and n >= 6:
            options.insert(0, cls.centred(n, cls.group_size(n, costs)))
        return min(options, key=lambda t: t.cycles(wavelets, costs, op))

    @classmethod
    def group_size(cls, n: int, costs: StreamCosts) -> int:
        """The group size of a line of `n` cores: the S of least `cycles` for a
        one-wavelet message (the latency terms; the message adds the same to
        every S). One size per line length, whatever the message, so kernels
        sharing a line share its leads (and their core classes)."""
        best, best_t = 0, math.inf
        for s in range(2, n // 2 + 1):
            c = cls.centred(n, s).cycles(1, costs)
            if c < best_t - 1e-9:
                best, best_t = s, c
        return best
