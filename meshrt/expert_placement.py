"""Expert placement policies: which expert region of a MoE layer holds which expert.

A MoE layer is as slow as its slowest expert region, so placement decides
layer time. Three policies, all keeping every region at the same number of
experts (the regions are one shape and sized for that many):

- `contiguous`: expert e on region e // k (k experts per region), the
  mapper's default, blind to routing.
- `eplb`: balance token load. DeepSeek EPLB's balanced packing: experts by
  load, heaviest first, each onto the least-loaded region that still has a
  free slot; then (`refine`, default on) pairwise expert swaps between
  regions while they lower the heavier region of the pair. `refine=False`
  is the packing alone, as DeepSeek ships it.
- `vibe`: balance predicted *time* (ViBE): the same greedy and swaps, but a
  region's value is its region model's `a + b * tokens`, so hot experts go
  to fast regions and slow regions (slower cores, longer dispatch paths)
  get lighter loads. The result is compared with eplb's placement and the
  better one kept, so vibe is never worse than eplb in predicted time (the
  swap search also runs from eplb's placement when the greedy loses).
  When every region of the layer has the same model, time is a monotone
  function of tokens, balancing one is balancing the other, and vibe
  returns eplb's placement: the same balance for uniform speeds by
  construction rather than by luck of floating-point ties.

Loads are per-expert tokens per decode step (`tokens`), in the token unit of
the region models. `Placement.replicas` (eplb with spare `slots`) copies hot
experts into spare slots as EPLB does; the IR's `placement` (expert -> one
region) cannot express copies, so the pass never asks for them (see
`meshrt.passes.place_experts`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from meshrt.runtime.expert_profile import RegionModel

POLICIES = ("contiguous", "eplb", "vibe")

Key = Callable[[int, float], tuple[float, ...]]


@dataclass(frozen=True)
class Placement:
    """Expert -> region of one MoE layer; `replicas` lists every copy's region when
    hot experts are replicated (tokens then split evenly over the copies)."""

    region_of: tuple[int, ...]
    regions: int
    replicas: tuple[tuple[int, ...], ...] | None = None

    @property
    def experts(self) -> int:
        return len(self.region_of)

    def copies(self, e: int) -> tuple[int, ...]:
        return self.replicas[e] if self.replicas is not None else (self.region_of[e],)

    def members(self) -> list[list[int]]:
        """Experts (copies included) on each region."""
        out: list[list[int]] = [[] for _ in range(self.regions)]
        for e in range(self.experts):
            for r in self.copies(e):
                out[r].append(e)
        return out

    def region_tokens(self, tokens: Sequence[float]) -> list[float]:
        out = [0.0] * self.regions
        for e in range(self.experts):
            cs = self.copies(e)
            for r in cs:
                out[r] += tokens[e] / len(cs)
        return out

    @property
    def expressible(self) -> bool:
        """Whether the IR's `placement` array can hold it (no replicas)."""
        return self.replicas is None


def region_times(p: Placement, tokens: Sequence[float], models: Sequence[RegionModel]) -> list[float]:
    """Predicted time of every region under per-expert `tokens`."""
    return [m.time(t) for m, t in zip(models, p.region_tokens(tokens), strict=True)]


def layer_time(p: Placement, tokens: Sequence[float], models: Sequence[RegionModel]) -> float:
    """Predicted MoE time of the layer: its slowest region."""
    return max(region_times(p, tokens, models))


def time_gap(p: Placement, tokens: Sequence[float], models: Sequence[RegionModel]) -> float:
    """Slowest minus fastest region, the ViBE paper's per-layer latency gap."""
    t = region_times(p, tokens, models)
    return max(t) - min(t)


def slots_per_region(experts: int, regions: int) -> int:
    if regions < 1 or experts % regions:
        raise ValueError(f"{experts} experts cannot be spread evenly over {regions} expert regions")
    return experts // regions


# ---------------------------------------------------------------------------
# Policies
# ---------------------------------------------------------------------------


def contiguous(experts: int, regions: int) -> Placement:
    k = slots_per_region(experts, regions)
    return Placement(tuple(e // k for e in range(experts)), regions)


def _token_key(_r: int, load: float) -> tuple[float, ...]:
    return (load,)


def _time_key(models: Sequence[RegionModel]) -> Key:
    def key(r: int, load: float) -> tuple[float, ...]:
        return (models[r].time(load), load)

    return key


def _greedy(tokens: Sequence[float], regions: int, key: Key) -> list[list[int]]:
    """Heaviest expert first, onto the free region whose value after taking it is least."""
    k = slots_per_region(len(tokens), regions)
    members: list[list[int]] = [[] for _ in range(regions)]
    load = [0.0] * regions
    for e in sorted(range(len(tokens)), key=lambda e: (-tokens[e], e)):
        r = min((r for r in range(regions) if len(members[r]) < k),
                key=lambda r: (key(r, load[r] + tokens[e]), r))
        members[r].append(e)
        load[r] += tokens[e]
    return members


def _loads(members: list[list[int]], tokens: Sequence[float]) -> list[float]:
    return [sum(tokens[e] for e in sorted(m)) for m in members]


def _refine(members: list[list[int]], tokens: Sequence[float], a: Sequence[float],
            b: Sequence[float], max_swaps: int | None = None,
            log: list[tuple[int, int, int, int]] | None = None) -> list[list[int]]:
    """Pairwise swaps while one lowers the larger value `a[r] + b[r] * load` of its two regions.

    Each accepted swap lowers the sorted (descending) vector of region values
    lexicographically, so the search terminates; regions are tried from the
    highest value down, so the slowest region is relieved first, and each
    takes its best swap. Loads are recomputed from the members (not updated
    incrementally) so that values are a function of the partition and
    rounding cannot cycle. Token balance is a = 0, b = 1.
    """
    members = [list(m) for m in members]
    tok = np.asarray(tokens, dtype=float)
    A, B = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    reg = np.empty(len(tok), dtype=int)
    for r, m in enumerate(members):
        reg[m] = r
    load = np.array(_loads(members, tokens))
    val = A + B * load
    cap = max_swaps if max_swaps is not None else 8 * len(tok) + 16
    for _ in range(cap):
        moved = False
        for i in np.argsort(-val, kind="stable"):
            others = np.flatnonzero((reg != i) & (val[reg] < val[i]))
            if not len(others):
                continue  # a swap with a region at least as high is that region's move
            mine = np.asarray(members[i])
            j = reg[others]
            d = tok[others][None, :] - tok[mine][:, None]  # (my expert, other expert)
            new = np.maximum(A[i] + B[i] * (load[i] + d), A[j] + B[j] * (load[j] - d))
            new[d >= 0] = np.inf  # values grow with load: region i must shed tokens
            x, y = np.unravel_index(int(np.argmin(new)), new.shape)
            if not new[x, y] < val[i] - 1e-9 * max(1.0, abs(val[i])):
                continue
            e, f = int(mine[x]), int(others[y])
            jj = int(reg[f])
            members[i][members[i].index(e)] = f
            members[jj][members[jj].index(f)] = e
            reg[e], reg[f] = jj, i
            if log is not None:
                log.append((e, int(i), f, jj))  # e: i -> jj, f: jj -> i
            load[i], load[jj] = _loads([members[i], members[jj]], tokens)
            val[i], val[jj] = A[i] + B[i] * load[i], A[jj] + B[jj] * load[jj]
            moved = True
            break
        if not moved:
            break
    return members


def _placement(members: list[list[int]], experts: int) -> Placement:
    region_of = [0] * experts
    for r, m in enumerate(members):
        for e in m:
            region_of[e] = r
    return Placement(tuple(region_of), len(members))


def eplb(tokens: Sequence[float], regions: int, *, refine: bool = True,
         slots: int | None = None) -> Placement:
    """Token-balanced placement (module docstring); `slots` > experts/regions
    replicates hot experts into the spare slots (EPLB's redundant experts)."""
    E = len(tokens)
    if slots is not None and slots * regions != E:
        return _eplb_replicated(tokens, regions, slots)
    members = _greedy(tokens, regions, _token_key)
    if refine:
        members = _refine(members, tokens, [0.0] * regions, [1.0] * regions)
    return _placement(members, E)


def _eplb_replicated(tokens: Sequence[float], regions: int, slots: int) -> Placement:
    E = len(tokens)
    spare = slots * regions - E
    if spare < 0:
        raise ValueError(f"{regions} regions x {slots} slots cannot hold {E} experts")
    copies = [1] * E
    for _ in range(spare):  # EPLB: the next copy goes to the expert with most load per copy
        e = max((e for e in range(E) if copies[e] < regions),
                key=lambda e: (tokens[e] / copies[e], -e))
        copies[e] += 1
    items = sorted(((tokens[e] / copies[e], e) for e in range(E) for _ in range(copies[e])),
                   key=lambda it: (-it[0], it[1]))
    members: list[list[int]] = [[] for _ in range(regions)]
    load = [0.0] * regions
    for w, e in items:
        r = min((r for r in range(regions) if len(members[r]) < slots and e not in members[r]),
                key=lambda r: (load[r], r))
        members[r].append(e)
        load[r] += w
    where: list[list[int]] = [[] for _ in range(E)]
    for r, m in enumerate(members):
        for e in m:
            where[e].append(r)
    return Placement(tuple(w[0] for w in where), regions, tuple(tuple(w) for w in where))


def uniform_models(models: Sequence[RegionModel]) -> bool:
    return all(m == models[0] for m in models)


def _sorted_times(members: list[list[int]], tokens: Sequence[float],
                  models: Sequence[RegionModel]) -> list[float]:
    load = _loads(members, tokens)
    return sorted((m.time(x) for m, x in zip(models, load)), reverse=True)


def vibe(tokens: Sequence[float], models: Sequence[RegionModel], *, refine: bool = True) -> Placement:
    """Time-balanced placement (module docstring): never worse than `eplb` in
    predicted layer time, identical to it when all region models are equal."""
    base = eplb(tokens, len(models), refine=refine)
    if uniform_models(models):
        return base
    key = _time_key(models)
    a, b = [m.a for m in models], [m.b for m in models]
    own = _greedy(tokens, len(models), key)
    if refine:
        own = _refine(own, tokens, a, b)
    start = base.members()
    if _sorted_times(own, tokens, models) <= _sorted_times(start, tokens, models):
        return _placement(own, len(tokens))
    if refine:  # eplb's placement is better: search from there too
        start = _refine(start, tokens, a, b)
    best = min((own, start), key=lambda m: _sorted_times(m, tokens, models))
    return _placement(best, len(tokens))


def improve(p: Placement, tokens: Sequence[float], models: Sequence[RegionModel],
            max_swaps: int) -> tuple[Placement, list[tuple[int, int, int, int]]]:
    """At most `max_swaps` pairwise swaps that relieve the slowest regions of `p`
    (vibe's search, started from `p`): the incremental re-placement of
    recalibration. Returns the new placement and the swaps as
    (expert e, its region, expert f, its region), e and f trading places."""
    if not p.expressible:
        raise ValueError("cannot improve a placement with replicated experts")
    log: list[tuple[int, int, int, int]] = []
    members = _refine(p.members(), tokens, [m.a for m in models], [m.b for m in models],
                      max_swaps=max_swaps, log=log)
    return _placement(members, p.experts), log


def place(policy: str, tokens: Sequence[float], regions: int,
          models: Sequence[RegionModel] | None = None, *, refine: bool = True) -> Placement:
    """Dispatch on the policy name (what `place-experts{policy=...}` accepts)."""
    if policy == "contiguous":
        return contiguous(len(tokens), regions)
    if policy == "eplb":
        return eplb(tokens, regions, refine=refine)
    if policy == "vibe":
        if models is None:
            raise ValueError("vibe needs region models")
        if len(models) != regions:
            raise ValueError(f"{len(models)} region models for {regions} expert regions")
        return vibe(tokens, models, refine=refine)
    raise ValueError(f"unknown placement policy '{policy}', expected one of {', '.join(POLICIES)}")
