"""Variability-aware expert placement benchmark (issue 9): MoE time gap and TPOT per policy.

Run by `meshrt bench MODEL --target T --placement` (rich tables, a
"placement" key in bench.json, placement.png) and by
`python bench/bench_place_experts.py` (plain text, tiny_moe16 by default).

Model. `tiny_moe16` is examples/tiny_moe.mrt with 16 experts, two per
expert region (8 regions per MoE layer, 2 MoE layers), written to a
temporary file: with one expert per region (tiny_moe itself) every
placement has the same token balance, so eplb cannot differ from contiguous.

Chip. A chip is a mesh_sim seed (the target's seeded per-core speed factors
and jitter) plus per-region slowdowns evenly spaced over [1, 1 + spread]
in a seeded order (`expert_profile.region_slowdowns`); the dispatch paths
of the mapped regions differ in length as mapped.

Routing. A skewed profile: Zipf(0.8) expert popularity (the hottest of 16
experts gets 3.7 x the mean load), hot experts at seeded positions per
layer. Loads are in the region models' token unit: the compiled program's
expert work is the uniform-routing load (`tokens_per_step` = tokens per
region x regions), skew redistributes it (see meshrt.runtime.region_timing
for how a load is emulated).

Per chip and spread: region models are fitted from 5 mesh_sim runs at
uniform loads; then contiguous, eplb (greedy only, = DeepSeek EPLB), eplb
(with swaps, the default) and vibe are placed and each is run on mesh_sim
with its region loads, same seed (same chip), side by side.

Figures. "pred" columns are predicted from the fitted region models:
per-layer gap = slowest - fastest predicted region time; TPOT = the
uniform-load step (measured once per chip) + the change of each layer's
slowest region. That TPOT is additive, i.e. it assumes the slowest region
is on the step's critical path with everything after it unchanged; with
skewed loads the other regions finish early and the combine overlaps them,
so it overestimates absolute TPOT (by ~5 % on tiny_moe16/test32) while
its differences between policies track the measured ones.
"meas" columns are measured by mesh_sim: region time = latest end of the
region's expert sub-schedule minus the tokens' arrival at the dispatch head,
gap = slowest - fastest, TPOT = mean step cycles after one warm-up step.
Gaps are averaged over MoE layers, steps and chips.

Drift. Chat-like routing (Zipf 0.6) switches to reasoning-like routing
(Zipf 1.0, other hot experts) at step 150 of 400. The placement starts as
vibe for chat. Each step the router's expert counts for a batch of 64
tokens (sampled from the current profile) feed a `Recalibrator` (threshold
0.15, half-life 32 steps, at most 4 swaps per layer); its weight moves are
charged to the step after the plan (MoveCost: bytes over parallel links).
Per-step TPOT is predicted (region models, expected loads of the current
profile, additive as above); the placements at the end are also measured on
mesh_sim under reasoning routing.

For reference, the ViBE paper reports on GPUs a 63.9 % smaller median MoE
latency gap for EPLB than default placement, and a further 19.6 % for ViBE.

A (seed, spread) chip is calibrated once (region models and the
uniform-load step) and shared by the policy comparison and the drift
scenario (`Calibrations`): mesh_sim is deterministic for a seed, so this
only saves simulator runs.
"""

from __future__ import annotations

import functools

import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from meshrt.output import save_figure
from meshrt.tools.common import INTERPRETER_MAX_CORES, BenchError

REPO = Path(__file__).resolve().parents[2]

POLICIES = ("contiguous", "eplb/greedy", "eplb", "vibe")
DEFAULT_SEEDS = (0, 1)
DEFAULT_SPREADS = (0.0, 0.03, 0.07)
DEFAULT_STEPS = 3  # simulated decode steps per mesh_sim run (the first is warm-up)
DEFAULT_ZIPF = 0.8
DRIFT_STEPS, DRIFT_SWITCH, DRIFT_BATCH = 400, 150, 64
DRIFT_THRESHOLD, DRIFT_HALFLIFE, DRIFT_MAX_SWAPS = 0.15, 32, 4
MEASURED_ENDS = ("fixed (chat vibe)", "recalibrated", "vibe for reasoning")

PAPER = ("ViBE (on GPUs): median MoE latency gap 63.9 % smaller with EPLB than with default "
         "placement, and a further 19.6 % smaller with ViBE")
SOURCES = {
    "measured": "meshrt.runtime.mesh_sim: core-by-core simulation of the compiled segment IR "
                "with the chip's seeded per-core speeds and per-region slowdowns; a region's "
                "token load is emulated by scaling its cores' cycle costs "
                "(meshrt.runtime.region_timing)",
    "predicted": "per-region a + b * tokens models fitted from mesh_sim runs at 5 uniform loads "
                 "on the same chip (fit_region_models); TPOT = measured uniform-load step + the "
                 "change of each layer's slowest predicted region (additive: an upper bound, "
                 "its differences between policies track the measured ones)",
}


def tiny_moe16(directory: Path) -> Path:
    """examples/tiny_moe.mrt with 16 experts, two per region, written into `directory`."""
    text = (REPO / "examples" / "tiny_moe.mrt").read_text()
    text = text.replace("experts     = 8", "experts     = 16")
    text = text.replace("model tiny_moe {", "model tiny_moe16 {")
    text += "\nmapping {\n  experts_per_region = 2\n}\n"
    path = Path(directory) / "tiny_moe16.mrt"
    path.write_text(text)
    return path


# ---------------------------------------------------------------------------
# Input checks and compilation (one-line errors)
# ---------------------------------------------------------------------------


def check_target(target, name: str) -> None:
    """A target the mesh simulator can run core by core (`target`: loaded from `name`)."""
    if target.cores > INTERPRETER_MAX_CORES:
        where = name if name.endswith(".toml") else "meshrt bench"
        raise BenchError(
            f"{where}: error: --placement measures placements on the mesh simulator, which runs "
            f"core by core only on targets of at most {INTERPRETER_MAX_CORES:,} cores; "
            f"{target.name} has {target.cores:,} (use test32 or test16)")


def check_model(model: str) -> None:
    """An MoE model (read without compiling); spec errors are the compiler's own one line."""
    from meshrt import driver
    from meshrt.frontend.errors import FrontendError

    try:
        spec = driver.load_spec(model)
    except FrontendError as e:
        raise BenchError(str(e)) from None
    if not spec.shape.is_moe:
        raise BenchError(f"{model}: error: --placement needs a mixture-of-experts model; "
                         f"{spec.shape.name} is dense (experts = 0: no experts to place)")


def compile_placement(model: str, target: str):
    """Compile for region timing (`region_timing.Compiled`); BenchError unless it has MoE layers."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.runtime.region_timing import compile_for_timing

    try:
        tgt = driver.load_target(target)
        check_target(tgt, target)
        check_model(model)
        c = compile_for_timing(model, tgt)
    except FrontendError as e:
        raise BenchError(str(e)) from None
    except MeshrtError as e:
        raise BenchError(f"{model}: error: {e.message}") from None
    if not c.layers:
        raise BenchError(f"{model}: error: --placement needs a mixture-of-experts model with routed "
                         f"expert regions; {Path(model).stem} has no MoE layer (dense model)")
    return c


def describe(c) -> dict:
    """The MoE layers' shape, as the tables and bench.json give it."""
    lay0 = next(iter(c.layers.values()))
    _, _, w, h = lay0.regions[0]
    return {"moe_layers": len(c.layers), "experts": lay0.experts, "top_k": lay0.top_k,
            "regions": len(lay0.regions), "region_cores": [w, h],
            "experts_per_region": lay0.experts // len(lay0.regions),
            "tokens_per_region": lay0.tokens_per_region, "tokens_per_step": lay0.tokens_per_step}


# ---------------------------------------------------------------------------
# Placement, chips and calibration
# ---------------------------------------------------------------------------


def place(policy, tokens, regions, models):
    """`expert_placement.place`, plus "eplb/greedy": eplb without its swaps."""
    from meshrt.expert_placement import place as place_by_name

    if policy == "eplb/greedy":
        return place_by_name("eplb", tokens, regions, refine=False)
    return place_by_name(policy, tokens, regions, models)


def tokens_of(profile, layer, lay):
    return [s * lay.tokens_per_step for s in profile.shares(layer)]


def chip(c, seed, spread):
    from meshrt.runtime.expert_profile import region_slowdowns

    return {l: region_slowdowns(len(lay.regions), spread, seed * 1000 + l) for l, lay in c.layers.items()}


@dataclass
class Calibration:
    """One chip: its slowdowns, fitted region models and uniform-load step."""

    slowdowns: dict
    models: object  # RegionModels
    base: object  # Measurement at the compiled (uniform) load
    base_pred: dict  # layer -> predicted time of its slowest region at the uniform load


Calibrations = dict  # (seed, spread, steps) -> Calibration


def calibrate(c, seed: int, spread: float, steps: int,
              cache: Calibrations | None = None) -> Calibration:
    from meshrt.expert_placement import contiguous, layer_time
    from meshrt.runtime.region_timing import fit_region_models, measure

    key = (seed, spread, steps)
    if cache is not None and key in cache:
        return cache[key]
    slow = chip(c, seed, spread)
    models = fit_region_models(c, seed=seed, slowdowns=slow, steps=steps)
    base = measure(c, seed=seed, slowdowns=slow, steps=steps)
    base_pred = {l: layer_time(contiguous(lay.experts, len(lay.regions)),
                               [lay.tokens_per_step / lay.experts] * lay.experts,
                               models.for_layer(l)) for l, lay in c.layers.items()}
    cal = Calibration(slow, models, base, base_pred)
    if cache is not None:
        cache[key] = cal
    return cal


# ---------------------------------------------------------------------------
# The two experiments
# ---------------------------------------------------------------------------


FIGURES = ("gap_pred", "gap_meas", "tpot_pred", "tpot_meas", "err")


def measure_chip(c, seed: int, spread: float, steps: int, zipf: float,
                 cache: Calibrations | None = None) -> tuple[dict, Calibration]:
    """One simulated chip at one spread: its calibration and, per policy, the figures it
    adds (lists, in layer order) to the averages of `run_policies`."""
    from meshrt.expert_placement import region_times
    from meshrt.runtime.expert_profile import ExpertProfile
    from meshrt.runtime.region_timing import measure

    prof = ExpertProfile.zipf(next(iter(c.layers.values())).experts, list(c.layers), s=zipf, seed=seed)
    cal = calibrate(c, seed, spread, steps, cache)
    out = {}
    for policy in POLICIES:
        toks, pred_t = {}, {}
        for l, lay in c.layers.items():
            tokens = tokens_of(prof, l, lay)
            p = place(policy, tokens, len(lay.regions), cal.models.for_layer(l))
            toks[l] = p.region_tokens(tokens)
            pred_t[l] = region_times(p, tokens, cal.models.for_layer(l))
        m = measure(c, seed=seed, slowdowns=cal.slowdowns, region_tokens=toks, steps=steps)
        a = out[policy] = {k: [] for k in FIGURES}
        for l in c.layers:
            a["gap_pred"].append(max(pred_t[l]) - min(pred_t[l]))
            a["gap_meas"].append(m.gap(l))
            a["err"].extend(abs(p - q) / q for p, q in zip(pred_t[l], m.region_cycles[l]))
        a["tpot_pred"].append(cal.base.tpot_cycles + sum(max(pred_t[l]) - cal.base_pred[l]
                                                         for l in c.layers))
        a["tpot_meas"].append(m.tpot_cycles)
    return out, cal


@functools.lru_cache(maxsize=2)
def _compiled(model: str, target: str):
    return compile_placement(model, target)


def _chip_in_worker(job: tuple) -> tuple[dict, Calibration]:
    """`measure_chip` in a worker process: the model compiled once per process."""
    model, target, seed, spread, steps, zipf = job
    return measure_chip(_compiled(model, target), seed, spread, steps, zipf)


def run_policies(c, seeds, spreads, steps, zipf, save_models=None, cache=None, progress=None,
                 workers: int = 1, ray_address: str | None = None, model: str | None = None,
                 target: str | None = None):
    """{(spread, policy): figures averaged over chips and layers}. With `workers` > 1 (or
    `ray_address`) each (spread, chip) runs in a worker, which compiles `model` for the
    target itself; the figures are merged in chip order, so they do not depend on it."""
    from meshrt.tools.workers import run_jobs

    cache = {} if cache is None else cache
    pairs = [(spread, seed) for spread in spreads for seed in seeds]
    if (workers > 1 or ray_address) and model is not None:
        jobs = [(model, target or c.target.name, seed, spread, steps, zipf) for spread, seed in pairs]
        results = run_jobs(_chip_in_worker, jobs, workers, ray_address)
    else:
        results = ((i, measure_chip(c, seed, spread, steps, zipf, cache))
                   for i, (spread, seed) in enumerate(pairs))
    found: dict[int, tuple[dict, Calibration]] = {}
    for i, got in results:
        found[i] = got
        spread, seed = pairs[i]
        cache[(seed, spread, steps)] = got[1]
        if progress:
            progress(f"placement: chip {seed}, spread {spread * 100:g} %: "
                     f"{len(POLICIES)} policies measured")
    out = {}
    clock = c.target.clock_hz
    for spread in spreads:
        acc = {p: {k: [] for k in FIGURES} for p in POLICIES}
        for i, (sp, seed) in enumerate(pairs):
            if sp != spread:
                continue
            figures, cal = found[i]
            if save_models:
                cal.models.save(save_models)
            for policy in POLICIES:
                for k in FIGURES:
                    acc[policy][k].extend(figures[policy][k])
        for policy, a in acc.items():
            out[(spread, policy)] = {
                "gap_pred": _mean(a["gap_pred"]), "gap_meas": _mean(a["gap_meas"]),
                "tpot_pred_us": _mean(a["tpot_pred"]) / clock * 1e6,
                "tpot_meas_us": _mean(a["tpot_meas"]) / clock * 1e6,
                "tpot_pred_cycles": _mean(a["tpot_pred"]),
                "tpot_meas_cycles": _mean(a["tpot_meas"]),
                "err": max(a["err"]),
            }
    return out


def _mean(xs):
    return sum(xs) / len(xs)


def run_drift(c, seed, spread, steps, n_steps=DRIFT_STEPS, switch=DRIFT_SWITCH, batch=DRIFT_BATCH,
              cache=None):
    """Predicted per-step TPOT with and without recalibration, and measured end placements.

    Returns (results, measured, switch, clock): results[mode] = (per-step
    predicted TPOT cycles, replans, end placements) for mode fixed /
    recalibrated; measured[name] = (mean measured gap, TPOT cycles) of the
    end placements under reasoning routing (`MEASURED_ENDS`).
    """
    from meshrt.expert_placement import layer_time, vibe
    from meshrt.runtime.expert_profile import chat_routing, reasoning_routing, sample_counts
    from meshrt.runtime.recalibration import MoveCost, Recalibrator
    from meshrt.runtime.region_timing import measure

    layers = list(c.layers)
    lay0 = c.layers[layers[0]]
    E = lay0.experts
    chat, reasoning = chat_routing(E, layers, seed), reasoning_routing(E, layers, seed)
    cal = calibrate(c, seed, spread, steps, cache)
    models = cal.models
    non_moe = cal.base.tpot_cycles - sum(cal.base_pred.values())
    start = {l: vibe(tokens_of(chat, l, lay), models.for_layer(l)) for l, lay in c.layers.items()}
    results = {}
    for mode in ("fixed", "recalibrated"):
        rc = Recalibrator(start, chat, models, threshold=DRIFT_THRESHOLD, halflife=DRIFT_HALFLIFE,
                          max_swaps=DRIFT_MAX_SWAPS, move_cost=MoveCost.for_layers(c.target, c.layers))
        rng = random.Random(seed)
        tpot, pending, plans = [], 0, []
        for step in range(n_steps):
            prof = chat if step < switch else reasoning
            t = non_moe + sum(layer_time(rc.placements[l], tokens_of(prof, l, c.layers[l]),
                                         models.for_layer(l)) for l in layers)
            tpot.append(t + pending)
            pending = 0
            for l in layers:
                rc.observe(l, sample_counts(prof.shares(l), batch, lay0.top_k, rng))
            if mode == "recalibrated":
                plan = rc.maybe_replan(step)
                if plan is not None:
                    plans.append(plan)
                    pending = plan.cycles  # the weight moves stall the next step
        results[mode] = (tpot, plans, dict(rc.placements))
    # measure the end placements under reasoning routing, and a from-scratch vibe
    measured = {}
    ends = {MEASURED_ENDS[0]: results["fixed"][2], MEASURED_ENDS[1]: results["recalibrated"][2],
            MEASURED_ENDS[2]: {l: vibe(tokens_of(reasoning, l, lay), models.for_layer(l))
                               for l, lay in c.layers.items()}}
    for name, pl in ends.items():
        toks = {l: pl[l].region_tokens(tokens_of(reasoning, l, c.layers[l])) for l in layers}
        m = measure(c, seed=seed, slowdowns=cal.slowdowns, region_tokens=toks, steps=steps)
        measured[name] = (_mean([m.gap(l) for l in layers]), m.tpot_cycles)
    return results, measured, switch, c.target.clock_hz


# ---------------------------------------------------------------------------
# Everything as one JSON-ready dict
# ---------------------------------------------------------------------------


def run_placement(c, *, model: str, seeds: Sequence[int] = DEFAULT_SEEDS,
                  spreads: Sequence[float] = DEFAULT_SPREADS, steps: int = DEFAULT_STEPS,
                  zipf: float = DEFAULT_ZIPF, drift_spread: float | None = None,
                  drift_seed: int | None = None, save_models: str | None = None,
                  compile_s: float = 0.0,
                  progress: Callable[[str], None] | None = None,
                  workers: int = 1, ray_address: str | None = None, target: str | None = None) -> dict:
    """The policy comparison and (unless drift_spread is None) the drift scenario; the
    chips of the comparison in `workers` processes (or on Ray at `ray_address`).

    Simulator failures (a run that does not complete) become a BenchError.
    """
    seeds, spreads = list(seeds), [float(s) for s in spreads]
    clock = c.target.clock_hz
    cache: Calibrations = {}
    t0 = time.perf_counter()
    try:
        rows = run_policies(c, seeds, spreads, steps, zipf, save_models, cache, progress,
                            workers, ray_address, model, target)
        t1 = time.perf_counter()
        drift = None
        if drift_spread is not None:
            dseed = seeds[0] if drift_seed is None else drift_seed
            drift = run_drift(c, dseed, drift_spread, steps, cache=cache)
            if progress:
                progress(f"placement: drift scenario on chip {dseed}, spread "
                         f"{drift_spread * 100:g} %")
    except (RuntimeError, ValueError) as e:
        raise BenchError(f"{model}: error: --placement: mesh_sim: {' '.join(str(e).split())}") \
            from None
    t2 = time.perf_counter()

    table = []
    for spread in spreads:
        cont, ep = rows[(spread, "contiguous")], rows[(spread, "eplb")]
        for policy in POLICIES:
            r = rows[(spread, policy)]
            table.append({
                "spread": spread, "policy": policy,
                "gap_cycles": {"predicted": r["gap_pred"], "measured": r["gap_meas"]},
                "tpot_us": {"predicted": r["tpot_pred_us"], "measured": r["tpot_meas_us"]},
                "tpot_cycles": {"predicted": r["tpot_pred_cycles"],
                                "measured": r["tpot_meas_cycles"]},
                "gap_reduction_vs_contiguous": 1 - r["gap_meas"] / cont["gap_meas"]
                if cont["gap_meas"] else 0.0,
                "gap_reduction_vs_eplb": 1 - r["gap_meas"] / ep["gap_meas"] if ep["gap_meas"] else 0.0,
                "model_error": r["err"],
            })
    out = {
        "model": model, "target": c.target.name, "clock_hz": clock, **describe(c),
        "seeds": seeds, "spreads": spreads, "steps": steps, "warmup": 1, "zipf": zipf,
        "policies": list(POLICIES),
        "rows": table,
        "notes": {
            "gap_cycles": "slowest minus fastest expert region of a MoE layer, cycles, mean over "
                          "MoE layers, measured steps and chips",
            "tpot": "time per output token (decode step); measured: mean mesh_sim step after one "
                    "warm-up step; predicted: additive, see sources",
            "gap_reduction": "1 - measured gap / measured gap of contiguous (or eplb) at the same "
                             "spread",
            "model_error": "worst |predicted - measured| / measured region time over regions, "
                           "layers and chips",
            "eplb/greedy": "eplb without its swap refinement (= DeepSeek EPLB)",
        },
        "sources": SOURCES,
        "paper": PAPER,
        "timing": {"compile_s": compile_s, "policies_s": t1 - t0, "drift_s": t2 - t1},
    }
    if drift is not None:
        out["drift"] = _drift_json(drift, seeds[0] if drift_seed is None else drift_seed,
                                   drift_spread)
    return out


def _drift_json(drift, seed: int, spread: float) -> dict:
    res, measured, switch, clock = drift
    modes = {}
    for mode, (tpot, plans, _) in res.items():
        modes[mode] = {
            "tpot_chat_us": _mean(tpot[:switch]) / clock * 1e6,
            "tpot_reasoning_us": _mean(tpot[switch:]) / clock * 1e6,
            "replans": len(plans),
            "moves": sum(len(p.moves) for p in plans),
            "bytes": sum(p.bytes for p in plans),
            "move_cycles": sum(p.cycles for p in plans),
            "plans": [{"after_step": p.step, "apply_at": p.apply_at,
                       "layers": sorted(p.placements), "swaps": len(p.swaps),
                       "moves": len(p.moves), "bytes": p.bytes, "cycles": p.cycles,
                       "summary": p.summary()} for p in plans],
            "tpot_per_step_us": [t / clock * 1e6 for t in tpot],
        }
    return {
        "seed": seed, "spread": spread, "steps": len(next(iter(res.values()))[0]),
        "switch": switch, "batch": DRIFT_BATCH, "threshold": DRIFT_THRESHOLD,
        "halflife": DRIFT_HALFLIFE, "max_swaps": DRIFT_MAX_SWAPS,
        "routing": {"before": "chat-like (Zipf 0.6)", "after": "reasoning-like (Zipf 1.0, other "
                    "hot experts)"},
        "modes": modes,
        "modes_source": "predicted",
        "measured": {name: {"gap_cycles": gap, "tpot_cycles": t, "tpot_us": t / clock * 1e6}
                     for name, (gap, t) in measured.items()},
        "measured_source": "measured: the end placements on mesh_sim under reasoning-like routing",
    }


# ---------------------------------------------------------------------------
# Output: plain text (bench/bench_place_experts.py), rich tables, plot
# ---------------------------------------------------------------------------


def print_text(p: dict, file=None) -> None:
    """The policy and drift tables as plain text (what bench/bench_place_experts.py prints)."""
    f = file or sys.stdout
    clock = p["clock_hz"]

    def pr(s=""):
        print(s, file=f)

    pr(f"{Path(p['model']).stem} on {p['target']}: {p['moe_layers']} MoE layers, {p['experts']} "
       f"experts top-{p['top_k']} on {p['regions']} regions of {p['region_cores'][0]}x"
       f"{p['region_cores'][1]} cores, {p['tokens_per_region']} tokens/region/step compiled; "
       f"chips {p['seeds']}; compiled in {p['timing']['compile_s']:.1f} s")
    pr(f"\nSkewed routing (Zipf {p['zipf']:g}). gap = slowest - fastest expert region of a MoE layer "
       f"(cycles, mean over layers and chips); TPOT in us at {clock / 1e6:.0f} MHz. "
       f"pred = fitted region models (TPOT: additive upper bound), meas = mesh_sim.  "
       f"[{p['timing']['policies_s']:.0f} s]")
    pr(f"{'spread':>6}  {'policy':<12} {'gap pred':>9} {'gap meas':>9} {'vs contig':>9} "
       f"{'vs eplb':>8} {'TPOT pred':>10} {'TPOT meas':>10} {'model err':>9}")
    for r in p["rows"]:
        pr(f"{r['spread'] * 100:5.0f}%  {r['policy']:<12} {r['gap_cycles']['predicted']:9.0f} "
           f"{r['gap_cycles']['measured']:9.0f} {r['gap_reduction_vs_contiguous'] * 100:8.1f}% "
           f"{r['gap_reduction_vs_eplb'] * 100:7.1f}% {r['tpot_us']['predicted']:10.2f} "
           f"{r['tpot_us']['measured']:10.2f} {r['model_error'] * 100:8.1f}%")
    pr("(vs contig / vs eplb: reduction of the measured gap; model err: worst |pred - meas| / "
       "meas over regions)")
    d = p.get("drift")
    if d is None:
        return
    pr(f"\nDrift: chat-like -> reasoning-like routing at step {d['switch']}, spread "
       f"{d['spread'] * 100:.0f}%, chip {d['seed']}.  [{p['timing']['drift_s']:.0f} s]")
    pr(f"{'placement':<14} {'TPOT chat':>10} {'TPOT reasoning':>15} {'replans':>8} "
       f"{'moves':>6} {'bytes':>9} {'move cycles':>12}   (predicted, us)")
    for mode, m in d["modes"].items():
        pr(f"{mode:<14} {m['tpot_chat_us']:10.3f} {m['tpot_reasoning_us']:15.3f} {m['replans']:8d} "
           f"{m['moves']:6d} {m['bytes']:9d} {m['move_cycles']:12d}")
    for plan in d["modes"]["recalibrated"]["plans"]:
        pr(f"  {plan['summary']}")
    pr(f"{'measured under reasoning routing':<36} {'gap':>8} {'TPOT us':>9}")
    for name, m in d["measured"].items():
        pr(f"  {name:<34} {m['gap_cycles']:8.0f} {m['tpot_us']:9.2f}")


def print_rich(con, p: dict) -> None:
    """The placement tables on a rich Console (`meshrt bench --placement`)."""
    from rich.table import Table

    t = Table(title=f"Expert placement: {p['experts']} experts top-{p['top_k']} on {p['regions']} "
                    f"regions x {p['moe_layers']} MoE layers, skewed routing (Zipf {p['zipf']:g}), "
                    f"chips {', '.join(map(str, p['seeds']))}")
    cols = ("spread", "policy", "gap cycles\npredicted", "gap cycles\nmeasured",
            "gap vs\ncontiguous", "gap vs\neplb", "TPOT us\npredicted", "TPOT us\nmeasured",
            "model\nerror")
    for col in cols:
        t.add_column(col, justify="left" if col == "policy" else "right")
    for i, r in enumerate(p["rows"]):
        if i and r["policy"] == POLICIES[0]:
            t.add_section()
        t.add_row(f"{r['spread'] * 100:g} %", r["policy"],
                  f"{r['gap_cycles']['predicted']:,.0f}", f"{r['gap_cycles']['measured']:,.0f}",
                  f"{0.0 - 100 * r['gap_reduction_vs_contiguous']:+.1f} %",
                  f"{0.0 - 100 * r['gap_reduction_vs_eplb']:+.1f} %",
                  f"{r['tpot_us']['predicted']:,.2f}", f"{r['tpot_us']['measured']:,.2f}",
                  f"{100 * r['model_error']:.1f} %")
    t.caption = ("gap = slowest - fastest expert region of a MoE layer (mean over layers and "
                 "chips). measured = mesh simulator; predicted = fitted region models (TPOT "
                 "additive: an upper bound). gap vs: change of the measured gap. "
                 f"eplb/greedy = eplb without swaps. Paper: {PAPER}.")
    if p["experts_per_region"] == 1:
        t.caption += (" One expert per region: every placement has the same token balance, so "
                      "only vibe (speed-aware) can differ from contiguous.")
    con.print(t)

    d = p.get("drift")
    if d is None:
        return
    t = Table(title=f"Drift: chat-like -> reasoning-like routing at step {d['switch']} of "
                    f"{d['steps']} (spread {d['spread'] * 100:g} %, chip {d['seed']}); predicted")
    for col in ("placement", "TPOT us chat", "TPOT us reasoning", "replans", "moves", "bytes",
                "move cycles"):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for mode, m in d["modes"].items():
        t.add_row(mode, f"{m['tpot_chat_us']:,.3f}", f"{m['tpot_reasoning_us']:,.3f}",
                  str(m["replans"]), str(m["moves"]), f"{m['bytes']:,}", f"{m['move_cycles']:,}")
    t.caption = (f"recalibration: threshold {d['threshold']:g}, half-life {d['halflife']} steps, "
                 f"at most {d['max_swaps']} swaps per layer; weight moves stall the next step")
    con.print(t)
    for plan in d["modes"]["recalibrated"]["plans"]:
        con.print(f"  {plan['summary']}", highlight=False, soft_wrap=True)
    t = Table(title="Drift end placements (measured)")
    for col in ("placement", "gap cycles", "TPOT us"):
        t.add_column(col, justify="left" if col == "placement" else "right")
    for name, m in d["measured"].items():
        t.add_row(name, f"{m['gap_cycles']:,.0f}", f"{m['tpot_us']:,.2f}")
    t.caption = "mesh simulator, reasoning-like routing"
    con.print(t)


PLOT = "placement.png"


def write_plot(plt, p: dict, path: Path) -> None:
    """Gap per policy per spread (measured bars, predicted markers); drift TPOT beside it."""
    drift = p.get("drift")
    fig, axes = plt.subplots(1, 2 if drift else 1, figsize=(11 if drift else 6, 4.2), squeeze=False)
    ax = axes[0][0]
    spreads = p["spreads"]
    n = len(POLICIES)
    width = 0.8 / n
    for i, policy in enumerate(POLICIES):
        rows = [next(r for r in p["rows"] if r["spread"] == s and r["policy"] == policy)
                for s in spreads]
        xs = [j + (i - (n - 1) / 2) * width for j in range(len(spreads))]
        bars = ax.bar(xs, [r["gap_cycles"]["measured"] for r in rows], width,
                      label=f"{policy} (measured)")
        ax.plot(xs, [r["gap_cycles"]["predicted"] for r in rows], "k_", markersize=10,
                label="predicted" if i == 0 else None)
        for b in bars:
            b.set_edgecolor("white")
    ax.set_xticks(range(len(spreads)))
    ax.set_xticklabels([f"{s * 100:g} %" for s in spreads])
    ax.set_xlabel("per-region speed spread")
    ax.set_ylabel("MoE layer gap, slowest - fastest region (cycles)")
    ax.set_title(f"Expert placement: {Path(p['model']).stem} on {p['target']}", fontsize=10)
    top = max(max(r["gap_cycles"]["measured"], r["gap_cycles"]["predicted"]) for r in p["rows"])
    ax.set_ylim(0, 1.35 * top if top > 0 else 1)
    ax.legend(fontsize=7, ncol=2, loc="upper right")
    ax.grid(True, axis="y", alpha=0.3)
    if drift:
        ax = axes[0][1]
        for mode, m in drift["modes"].items():
            ax.plot(range(len(m["tpot_per_step_us"])), m["tpot_per_step_us"], label=mode,
                    linewidth=2.5 if mode == "fixed" else 1)
        ax.axvline(drift["switch"], color="gray", linestyle="--", linewidth=1)
        ax.set_xlabel(f"decode step (chat-like -> reasoning-like at {drift['switch']})")
        ax.set_ylabel("TPOT (us), predicted")
        ax.set_title(f"Drift, spread {drift['spread'] * 100:g} %, chip {drift['seed']}", fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)
