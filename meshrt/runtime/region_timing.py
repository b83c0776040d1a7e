"""Timing expert regions on the GALS mesh simulator, and fitting region models.

Why: `place-experts{policy=vibe}` balances *predicted* region time, so it
needs a model of what a token load costs on each expert region of this
chip. Here the chip is `mesh_sim`: seeded per-core speed factors (the
target's `speed_spread`), per-event jitter, optional extra slowdown of whole
regions (`speed_scale`), and the real dispatch paths, whose length differs
from region to region.

What is measured. For every MoE layer and decode step, a region's time is
the latest end of its cores' expert sub-schedule minus the moment the
layer's tokens reached the corridor (the end of the first of its cores'
dispatch input receives): queueing on the dispatch path, the metainfo resolve, the expert
FFN and the in-region reduction. Steps before `warmup` (pipeline fill) are
dropped and the rest averaged.

How a token load is emulated. The simulator is timing-only and its event
tables are per core class, shared by every expert region of a layer, with
the work of `tokens_per_region` = micro-batch x min(experts per region,
top-k) tokens (what the region is sized for). A region given `n` tokens
instead runs with its per-core cycle costs scaled by n / tokens_per_region
(through `speed_scale`, on top of any hardware slowdown). That is exact for
the FFN compute and the per-wavelet send/receive costs, which are
proportional to tokens, and approximate for the per-sub fixed costs (task
switch, metainfo resolve), which it scales too; network hops are not scaled.
A layer's total expert work at the default load (`tokens_per_region` on
every region) is the compiled program's, so skewed routing redistributes
that work rather than adding to it.

Fitting. `fit_region_models` runs the program at a few uniform loads
(fractions of `tokens_per_region`, same seed: same chip) and fits each
region's `a + b * tokens` by least squares (`a` clamped at 0).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from meshrt.passes.place_experts import MoESite, moe_sites
from meshrt.runtime.expert_profile import RegionModel, RegionModels

DEFAULT_FIT_LOADS = (0.25, 0.5, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class MoELayer:
    """What timing needs of one MoE layer of a compiled program."""

    layer: int
    experts_kernel: str  # mesh_kernel name of the expert_ffn kernel
    dispatch_kernel: str
    wafer: int
    regions: tuple[tuple[int, int, int, int], ...]  # (x, y, w, h) per routed region
    experts: int
    top_k: int
    tokens_per_region: int
    expert_bytes: int

    @classmethod
    def of(cls, site: MoESite) -> MoELayer:
        k = site.experts // len(site.regions)
        name = site.name.removesuffix(".experts")
        return cls(site.layer, f"{name}.experts", f"{name}.dispatch", site.wafer,
                   tuple(site.rects()), site.experts, site.top_k,
                   site.micro_batch * min(k, site.top_k), site.expert_bytes())

    def region_at(self, x: int, y: int) -> int | None:
        for r, (rx, ry, rw, rh) in enumerate(self.regions):
            if rx <= x < rx + rw and ry <= y < ry + rh:
                return r
        return None

    @property
    def tokens_per_step(self) -> int:
        """Token-expert assignments per step at which every region runs its compiled work."""
        return self.tokens_per_region * len(self.regions)


@dataclass
class Compiled:
    """A segment program ready for mesh_sim plus its MoE layers."""

    program: object  # segment.ProgramOp
    target: object  # Target
    layers: dict[int, MoELayer]
    module: object = None


def compile_for_timing(model: str, target, *, micro_batch: int | None = None,
                       before: str = "") -> Compiled:
    """Compile a model spec to coloured segment IR, keeping its MoE layers' regions.

    `target` is a Target, a bundled name or a .toml path. `before` is a pass
    pipeline run on the graph IR first (e.g. a `place-experts{...}`);
    placement does not change the segment program (all regions hold the same
    number of experts), only which tokens go where.
    """
    from meshrt import driver
    from meshrt.passes.pipeline import run_pipeline

    target = driver.load_target(target)
    module = driver.load_model(model, target, micro_batch=micro_batch)
    if before:
        run_pipeline(module, before, target)
    driver.lower(module, "kernels", target)
    layers = {s.layer: MoELayer.of(s) for s in moe_sites(module)}
    driver.lower(module, "segments", target)
    return Compiled(driver.program_of(module), target, layers, module)


@dataclass
class Measurement:
    """Region times and step cycles of one simulation (cycles)."""

    region_cycles: dict[int, list[float]]  # layer -> mean time per region
    step_cycles: list[int]  # measured steps only (after warmup)
    clock_hz: float
    per_step: dict[int, list[list[float]]] = field(default_factory=dict)  # layer -> step -> region

    def layer_time(self, layer: int) -> float:
        return max(self.region_cycles[layer])

    def gap(self, layer: int) -> float:
        t = self.region_cycles[layer]
        return max(t) - min(t)

    @property
    def tpot_cycles(self) -> float:
        return sum(self.step_cycles) / len(self.step_cycles)

    @property
    def tpot_us(self) -> float:
        return self.tpot_cycles / self.clock_hz * 1e6


def speed_scale_for(layers: Mapping[int, MoELayer],
                    slowdowns: Mapping[int, Sequence[float]] | None = None,
                    region_tokens: Mapping[int, Sequence[float]] | None = None):
    """A mesh_sim `speed_scale`: region r of layer l runs slowdown x tokens/tokens_per_region."""
    table: dict[tuple[int, int, int], float] = {}
    for l, lay in layers.items():
        for r, (x0, y0, w, h) in enumerate(lay.regions):
            f = slowdowns[l][r] if slowdowns and l in slowdowns else 1.0
            if region_tokens and l in region_tokens:
                f *= region_tokens[l][r] / lay.tokens_per_region
            for x in range(x0, x0 + w):
                for y in range(y0, y0 + h):
                    table[(lay.wafer, x, y)] = f

    def scale(pos: tuple[int, int, int]) -> float:
        return table.get(pos, 1.0)

    return scale


def measure(c: Compiled, *, seed: int = 0, slowdowns: Mapping[int, Sequence[float]] | None = None,
            region_tokens: Mapping[int, Sequence[float]] | None = None, steps: int = 3,
            warmup: int = 1) -> Measurement:
    """Simulate `steps` decode steps and time every expert region (module docstring)."""
    from meshrt.runtime.mesh_sim import MeshSim

    if steps <= warmup:
        raise ValueError(f"steps ({steps}) must exceed warmup ({warmup})")
    sim = MeshSim(c.program, c.target, seed=seed, trace=True,
                  speed_scale=speed_scale_for(c.layers, slowdowns, region_tokens))
    res = sim.run(steps)
    if not res.completed:
        raise RuntimeError(f"mesh_sim did not complete: {res.summary()}")
    return _region_times(res, c.layers, warmup)


def _region_times(res, layers: Mapping[int, MoELayer], warmup: int) -> Measurement:
    steps = res.steps
    subs: dict[int, list[tuple[int, int]]] = {}  # core -> expert sub spans, any layer
    arrive: dict[str, dict[int, list[int]]] = {}  # dispatch kernel -> core -> arrival per step
    by_kernel = {lay.experts_kernel: lay for lay in layers.values()}
    inflow = {f"{lay.dispatch_kernel}.in0": lay.dispatch_kernel for lay in layers.values()}
    span_kernel: dict[int, str] = {}
    for core, _cls, name, start, end in res.spans:
        kernel = name.split(" ", 1)[0]
        if kernel in by_kernel and " " in name:
            subs.setdefault(core, []).append((start, end))
            span_kernel[core] = kernel
            continue
        kind, _, flow = name.partition(" ")
        if kind in ("wait", "recv") and flow in inflow:
            # a receive that waited records "wait" ending at the arrival; one
            # that found its data records "recv" starting then
            arrive.setdefault(inflow[flow], {}).setdefault(core, []).append(
                end if kind == "wait" else start)
    finish: dict[int, list[list[float]]] = {
        l: [[0.0] * len(lay.regions) for _ in range(steps)] for l, lay in layers.items()}
    for core, spans in subs.items():
        lay = by_kernel[span_kernel[core]]
        _, x, y = res.cores[core][0]
        r = lay.region_at(x, y)
        if r is None:
            continue
        for s, (_, end) in enumerate(sorted(spans)[:steps]):
            finish[lay.layer][s][r] = max(finish[lay.layer][s][r], end)
    per_step: dict[int, list[list[float]]] = {}
    region_cycles: dict[int, list[float]] = {}
    for l, lay in layers.items():
        # the tokens reach the corridor when its first core has them (every corridor
        # core takes its slice of them, one receive per step)
        by_core = [sorted(t) for t in arrive.get(lay.dispatch_kernel, {}).values()]
        if not by_core or min(len(t) for t in by_core) < steps:
            raise RuntimeError(f"layer {l}: no token arrival at @{lay.dispatch_kernel} in every step")
        starts = [min(t[s] for t in by_core) for s in range(steps)]
        rows = [[f - starts[s] for f in finish[l][s]] for s in range(warmup, steps)]
        per_step[l] = rows
        region_cycles[l] = [sum(col) / len(col) for col in zip(*rows)]
    return Measurement(region_cycles, res.step_cycles[warmup:], res.clock_hz, per_step)


def fit_affine(points: Sequence[tuple[float, float]]) -> tuple[RegionModel, float]:
    """Least-squares `a + b * x` through (x, t) points, a >= 0; and the worst relative residual."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    mt = sum(t for _, t in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    b = sum((x - mx) * (t - mt) for x, t in points) / sxx if sxx else 0.0
    a = mt - b * mx
    if a < 0:
        sx2 = sum(x * x for x, _ in points)
        a, b = 0.0, sum(x * t for x, t in points) / sx2 if sx2 else 0.0
    b = max(b, 0.0)
    m = RegionModel(a, b)
    worst = max(abs(m.time(x) - t) / max(abs(t), 1e-9) for x, t in points)
    return m, worst


def fit_region_models(c: Compiled, *, seed: int = 0,
                      slowdowns: Mapping[int, Sequence[float]] | None = None,
                      loads: Sequence[float] = DEFAULT_FIT_LOADS, steps: int = 3,
                      warmup: int = 1) -> RegionModels:
    """Per-region `a + b * tokens` fitted from mesh_sim runs at uniform `loads`
    (fractions of each layer's `tokens_per_region`) on the chip given by `seed`
    and `slowdowns`."""
    points: dict[tuple[int, int], list[tuple[float, float]]] = {}
    for frac in loads:
        toks = {l: [frac * lay.tokens_per_region] * len(lay.regions) for l, lay in c.layers.items()}
        m = measure(c, seed=seed, slowdowns=slowdowns, region_tokens=toks, steps=steps,
                    warmup=warmup)
        for l, times in m.region_cycles.items():
            for r, t in enumerate(times):
                points.setdefault((l, r), []).append((toks[l][r], t))
    out: dict[int, tuple[RegionModel, ...]] = {}
    worst = 0.0
    for l, lay in c.layers.items():
        fitted = []
        for r in range(len(lay.regions)):
            model, err = fit_affine(points[(l, r)])
            fitted.append(model)
            worst = max(worst, err)
        out[l] = tuple(fitted)
    tps = {lay.tokens_per_step for lay in c.layers.values()}
    fit = {"source": "mesh_sim", "target": c.target.name, "seed": seed,
           "loads_tokens_per_region": sorted({round(f * lay.tokens_per_region, 6)
                                              for f in loads for lay in c.layers.values()}),
           "steps": steps, "warmup": warmup, "worst_relative_residual": round(worst, 5)}
    if slowdowns:
        fit["slowdowns"] = {str(k): [round(f, 6) for f in v] for k, v in slowdowns.items()}
    return RegionModels(out, None, "cycles", float(tps.pop()) if len(tps) == 1 else None, fit)
