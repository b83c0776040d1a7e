"""The mapper's modelled step time: the cost model run on a probe of each candidate mapping.

The default mapper (`meshrt.frontend.mapper`) chooses among packings that
fit (block height, width scale, on the wafers it uses) by the decode step
they would take. It does not estimate that with formulas of its own: every
cycle comes from the one cost model (`meshrt.runtime.cost_model`, which
prices compute with the kernels' `op_cycles`, sends and receives per
wavelet, hops and serialisation per flow, reductions and relays as the
chains they compile to), run on a *probe*: the same model with two layers
of each layer kind, the embedding and the LM head, mapped with the
candidate's unit shapes at the candidate's height, lowered through the
same passes to segment IR. The probe is the static build (no dynamism),
except that an MoE model's probe routes (`moe_routing`): the mapping is
chosen for its compute and data movement, the governance on top of it
costs about the same on every candidate, and a build and its `--dynamism
none` counterpart (the governance comparison) get one mapping; but without
routing every expert computes and sends every token, a gather into the
combine corridor no routed build makes, which would rank MoE layouts (the
grid arrangements above all) by traffic that never occurs. So whatever the passes and the cost model
charge (collectives, redistributions, transfer volume) is what the mapper
minimises, and a candidate whose probe does not compile (a resource budget
the kernels exceed) is never chosen.

A probe's step is the sum of its critical path by kernel
(`StepEstimate.kernel_path`), which gives each unit's time: the second
layer of each kind stands for every further layer of that kind (it
receives from a layer like itself, as they do); the first carries the
hand-in from the embedding (or from the other kind). The full model's step
is the sum of its units' times (`unit_cycles`, `step_cycles`):

    probe step + sum over kinds of (layers of the kind - layers probed) x
    the second layer's time.

The unit times also balance the pipeline: the mapper cuts the units into
stages so that the slowest stage (the initiation interval) is least.

Left out: the hand-offs between wafers (the same count for every candidate
on the same wafers) and stage boundaries. A probe costs a few tenths of a
second on a whole-wafer model, so the mapper probes at most MAX_PROBES
(height, width scale) points, each with both grid arrangements of an MoE
model (more experts per region, or stacked regions: which is faster
depends on the mesh): evenly spread over the points in order, then the
neighbours of the fastest (the time mostly varies smoothly with both);
then up to MAX_PROBES more: the widest candidate of each height,
spread over the heights (a threshold such as expert tiles that fit decoded
only when wide is not smooth). The pick is the fastest probed, so the second
round can only find a faster one. Probes are cached per process (a bench
compiles the same mapping for several builds).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.frontend.mapper import Layout, _Mapper

MAX_PROBES = 8
"""Candidate mappings the mapper times with the cost model, at most."""

LINEAR = "/linear"
"""Suffix of a probe kind whose layers mix tokens with Gated DeltaNet (they cost otherwise)."""


def probe_kind(mapper: _Mapper, unit) -> str:
    """The kind a layer is probed as: its unit kind, told apart by its token mixer."""
    return unit.kind + (LINEAR if mapper.shape.is_linear_layer(unit.layer) else "")


def _probe_kinds(mapper: _Mapper) -> list[tuple[str, int]]:
    """(probe kind, layers of that kind) in the order the model's layers take them."""
    counts: dict[str, int] = {}
    for u in mapper.units:
        if u.layer >= 0:
            k = probe_kind(mapper, u)
            counts[k] = counts.get(k, 0) + 1
    return list(counts.items())


def unit_cycles(mapper: _Mapper, lay: Layout) -> list[float] | None:
    """Modelled cycles of each unit of `lay` (in `lay.placed` order) on the decode step's
    critical path, from its probe: the embedding and the LM head as probed, the first layer of
    each kind as the probe's first (with its hand-in), every other layer as the probe's second
    of its kind; None if the probe does not compile or the cost model cannot run it."""
    shapes: dict[str, object] = {}
    for p in lay.placed:
        shapes.setdefault(p.unit.kind, p.shape)
    probe = tuple((kind, min(n, 2)) for kind, n in _probe_kinds(mapper))
    key = (mapper.spec.shape, mapper.target, mapper.mb, mapper.chunk, lay.kv_slots, mapper.group, lay.height,
           probe, tuple(sorted(shapes.items())))
    times = mapper.probe_times(key)
    if times is None:
        return None
    embed, head, first, steady = times
    out, seen = [], set()
    for p in lay.placed:
        kind = p.unit.kind
        if kind == "embed":
            out.append(embed)
        elif kind == "lm_head":
            out.append(head)
        else:
            kind = probe_kind(mapper, p.unit)
            out.append(steady[kind] if kind in seen else first[kind])
            seen.add(kind)
    return out


def step_cycles(mapper: _Mapper, lay: Layout) -> float | None:
    """Modelled decode-step cycles (one micro-batch in flight) of the full model mapped as
    `lay`: the sum of its units' (`unit_cycles`); None where that is None."""
    units = unit_cycles(mapper, lay)
    return None if units is None else sum(units)


def layout_cycles(mapper: _Mapper, lay: Layout) -> float | None:
    """The modelled step `lay` was chosen by (`fastest`), else its probe's (`step_cycles`)."""
    return lay.step_cycles if lay.step_cycles is not None else step_cycles(mapper, lay)


def fastest(mapper: _Mapper, cands: Sequence[Layout]) -> Layout:
    """The candidate with the least modelled step (see the module docstring for which are
    probed); the first candidate if no probe runs. Candidates of one (height, scale) point
    (an MoE model's grid arrangements, `_Mapper.grid_arrangements`) are probed together."""
    if len(cands) == 1:
        return cands[0]
    points: dict[tuple, list[int]] = {}
    for i, lay in enumerate(cands):
        points.setdefault((lay.height, lay.scale), []).append(i)
    order = sorted(points)
    times: dict[int, float | None] = {}
    probed: set[tuple] = set()

    def probe(pos: int, budget: int = MAX_PROBES) -> None:
        if 0 <= pos < len(order) and order[pos] not in probed and len(probed) < budget:
            probed.add(order[pos])
            for i in points[order[pos]]:
                times[i] = step_cycles(mapper, cands[i])

    spread = max(1, MAX_PROBES // 2)
    for k in range(spread):
        probe(round(k * (len(order) - 1) / max(spread - 1, 1)))
    while len(probed) < min(MAX_PROBES, len(order)):
        ok = {i: t for i, t in times.items() if t is not None}
        if not ok:
            break
        best_lay = cands[min(ok, key=ok.get)]
        best = order.index((best_lay.height, best_lay.scale))
        before = len(probed)
        for d in (1, -1, 2, -2, 3, -3):
            probe(best + d)
        if len(probed) == before:
            break
    # The widest candidate of each height too (spread over the heights): at one height
    # more cores per unit rarely slow a step, and a threshold the neighbours above do not
    # cross (expert tiles that fit decoded only when wide) can make it the fastest by far.
    widest = [pos for pos in range(len(order))
              if pos + 1 == len(order) or order[pos + 1][0] != order[pos][0]]
    n = min(MAX_PROBES, len(widest))
    picks = sorted({widest[round(k * (len(widest) - 1) / max(n - 1, 1))] for k in range(n)})
    budget = len(probed) + MAX_PROBES
    for pos in picks:
        probe(pos, budget)
    ok = {i: t for i, t in times.items() if t is not None}
    if not ok:
        return cands[0]
    pick = min(ok, key=lambda i: (ok[i], i))
    cands[pick].step_cycles = ok[pick]
    return cands[pick]
