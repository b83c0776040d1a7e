"""Variability-aware expert placement (issue 9): MoE time gap and TPOT per policy.

    python bench/bench_place_experts.py                  # tiny_moe16 on test32, chips 0,1
    python bench/bench_place_experts.py --seeds 0,1,2 --spreads 0,0.03,0.07
    python bench/bench_place_experts.py --model examples/tiny_moe.mrt   # 1 expert per region
    python bench/bench_place_experts.py --save-models M.json            # keep the fitted models

Model. `tiny_moe16` is examples/tiny_moe.mrt with 16 experts, two per
expert region (8 regions per MoE layer, 2 MoE layers), written to a
temporary file: with one expert per region (tiny_moe itself) every
placement has the same token balance, so eplb cannot differ from contiguous.

Chip. A chip is a mesh_sim seed (the target's seeded per-core speed factors
and jitter) plus per-region slowdowns evenly spaced over [1, 1 + spread]
in a seeded order (`expert_profile.region_slowdowns`); the dispatch paths
of the mapped regions differ in length as mapped.

Routing. A skewed profile: Zipf(0.8) expert popularity (the hottest of 16
experts gets 3.7 x the mean load; `--zipf`), hot experts at
seeded positions per layer. Loads are in the region models' token unit:
the compiled program's expert work is the uniform-routing load
(`tokens_per_step` = tokens per region x regions), skew redistributes it
(see meshrt.runtime.region_timing for how a load is emulated).

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
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path

from meshrt.expert_placement import contiguous, eplb, layer_time, region_times, vibe
from meshrt.runtime.expert_profile import (
    ExpertProfile,
    chat_routing,
    reasoning_routing,
    region_slowdowns,
    sample_counts,
)
from meshrt.runtime.recalibration import MoveCost, Recalibrator
from meshrt.runtime.region_timing import compile_for_timing, fit_region_models, measure

REPO = Path(__file__).resolve().parent.parent

POLICIES = ("contiguous", "eplb/greedy", "eplb", "vibe")


def tiny_moe16(directory: Path) -> Path:
    text = (REPO / "examples" / "tiny_moe.mrt").read_text()
    text = text.replace("experts     = 8", "experts     = 16")
    text = text.replace("model tiny_moe {", "model tiny_moe16 {")
    text += "\nmapping {\n  experts_per_region = 2\n}\n"
    path = directory / "tiny_moe16.mrt"
    path.write_text(text)
    return path


def place(policy, tokens, regions, models):
    if policy == "contiguous":
        return contiguous(len(tokens), regions)
    if policy == "eplb/greedy":
        return eplb(tokens, regions, refine=False)
    if policy == "eplb":
        return eplb(tokens, regions)
    return vibe(tokens, models)


def tokens_of(profile, layer, lay):
    return [s * lay.tokens_per_step for s in profile.shares(layer)]


def chip(c, seed, spread):
    return {l: region_slowdowns(len(lay.regions), spread, seed * 1000 + l) for l, lay in c.layers.items()}


def run_policies(c, seeds, spreads, steps, zipf, save_models=None):
    """{(spread, policy): figures averaged over chips and layers}."""
    out = {}
    for spread in spreads:
        acc = {p: {"gap_pred": [], "gap_meas": [], "tpot_pred": [], "tpot_meas": [], "err": []}
               for p in POLICIES}
        for seed in seeds:
            prof = ExpertProfile.zipf(next(iter(c.layers.values())).experts, list(c.layers), s=zipf,
                                      seed=seed)
            slow = chip(c, seed, spread)
            models = fit_region_models(c, seed=seed, slowdowns=slow, steps=steps)
            if save_models:
                models.save(save_models)
            base = measure(c, seed=seed, slowdowns=slow, steps=steps)
            base_pred = {l: layer_time(contiguous(lay.experts, len(lay.regions)),
                                       [lay.tokens_per_step / lay.experts] * lay.experts,
                                       models.for_layer(l)) for l, lay in c.layers.items()}
            for policy in POLICIES:
                toks, pred_t = {}, {}
                for l, lay in c.layers.items():
                    tokens = tokens_of(prof, l, lay)
                    p = place(policy, tokens, len(lay.regions), models.for_layer(l))
                    toks[l] = p.region_tokens(tokens)
                    pred_t[l] = region_times(p, tokens, models.for_layer(l))
                m = measure(c, seed=seed, slowdowns=slow, region_tokens=toks, steps=steps)
                a = acc[policy]
                for l in c.layers:
                    a["gap_pred"].append(max(pred_t[l]) - min(pred_t[l]))
                    a["gap_meas"].append(m.gap(l))
                    a["err"].extend(abs(p - q) / q for p, q in zip(pred_t[l], m.region_cycles[l]))
                a["tpot_pred"].append(base.tpot_cycles + sum(max(pred_t[l]) - base_pred[l]
                                                             for l in c.layers))
                a["tpot_meas"].append(m.tpot_cycles)
        clock = c.target.clock_hz
        for policy, a in acc.items():
            out[(spread, policy)] = {
                "gap_pred": _mean(a["gap_pred"]), "gap_meas": _mean(a["gap_meas"]),
                "tpot_pred_us": _mean(a["tpot_pred"]) / clock * 1e6,
                "tpot_meas_us": _mean(a["tpot_meas"]) / clock * 1e6,
                "err": max(a["err"]),
            }
    return out


def _mean(xs):
    return sum(xs) / len(xs)


def run_drift(c, seed, spread, steps, n_steps=400, switch=150, batch=64):
    """Predicted per-step TPOT with and without recalibration, and measured end placements."""
    layers = list(c.layers)
    lay0 = c.layers[layers[0]]
    E = lay0.experts
    chat, reasoning = chat_routing(E, layers, seed), reasoning_routing(E, layers, seed)
    slow = chip(c, seed, spread)
    models = fit_region_models(c, seed=seed, slowdowns=slow, steps=steps)
    base = measure(c, seed=seed, slowdowns=slow, steps=steps)
    uniform = {l: layer_time(contiguous(lay.experts, len(lay.regions)),
                             [lay.tokens_per_step / lay.experts] * lay.experts, models.for_layer(l))
               for l, lay in c.layers.items()}
    non_moe = base.tpot_cycles - sum(uniform.values())
    start = {l: vibe(tokens_of(chat, l, lay), models.for_layer(l)) for l, lay in c.layers.items()}
    results = {}
    for mode in ("fixed", "recalibrated"):
        rc = Recalibrator(start, chat, models, threshold=0.15, halflife=32, max_swaps=4,
                          move_cost=MoveCost.for_layers(c.target, c.layers))
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
    ends = {"fixed (chat vibe)": results["fixed"][2], "recalibrated": results["recalibrated"][2],
            "vibe for reasoning": {l: vibe(tokens_of(reasoning, l, lay), models.for_layer(l))
                                   for l, lay in c.layers.items()}}
    for name, pl in ends.items():
        toks = {l: pl[l].region_tokens(tokens_of(reasoning, l, c.layers[l])) for l in layers}
        m = measure(c, seed=seed, slowdowns=slow, region_tokens=toks, steps=steps)
        measured[name] = (_mean([m.gap(l) for l in layers]), m.tpot_cycles)
    return results, measured, switch, c.target.clock_hz


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a .mrt spec (default: tiny_moe16, see the docstring)")
    ap.add_argument("--target", default="test32")
    ap.add_argument("--seeds", default="0,1", help="chips (mesh_sim seeds), comma-separated")
    ap.add_argument("--spreads", default="0,0.03,0.07", help="per-region speed spreads")
    ap.add_argument("--steps", type=int, default=3, help="simulated decode steps per run (1 warm-up)")
    ap.add_argument("--zipf", type=float, default=0.8, help="skew of the routing profile")
    ap.add_argument("--drift-spread", type=float, default=0.07)
    ap.add_argument("--no-drift", action="store_true")
    ap.add_argument("--save-models", metavar="PATH", help="write the last fitted region models")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    spreads = [float(s) for s in args.spreads.split(",")]

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(tiny_moe16(Path(tmp)))
        c = compile_for_timing(model, args.target)
    lay0 = next(iter(c.layers.values()))
    print(f"{Path(model).stem} on {args.target}: {len(c.layers)} MoE layers, {lay0.experts} experts "
          f"top-{lay0.top_k} on {len(lay0.regions)} regions of {lay0.regions[0][2]}x"
          f"{lay0.regions[0][3]} cores, {lay0.tokens_per_region} tokens/region/step compiled; "
          f"chips {seeds}; compiled in {time.perf_counter() - t0:.1f} s")

    t1 = time.perf_counter()
    rows = run_policies(c, seeds, spreads, args.steps, args.zipf, args.save_models)
    print(f"\nSkewed routing (Zipf {args.zipf:g}). gap = slowest - fastest expert region of a MoE layer "
          f"(cycles, mean over layers and chips); TPOT in us at {c.target.clock_hz / 1e6:.0f} MHz. "
          f"pred = fitted region models (TPOT: additive upper bound), meas = mesh_sim.  "
          f"[{time.perf_counter() - t1:.0f} s]")
    print(f"{'spread':>6}  {'policy':<12} {'gap pred':>9} {'gap meas':>9} {'vs contig':>9} "
          f"{'vs eplb':>8} {'TPOT pred':>10} {'TPOT meas':>10} {'model err':>9}")
    for spread in spreads:
        cont, ep = rows[(spread, "contiguous")], rows[(spread, "eplb")]
        for policy in POLICIES:
            r = rows[(spread, policy)]
            vs_c = 1 - r["gap_meas"] / cont["gap_meas"] if cont["gap_meas"] else 0.0
            vs_e = 1 - r["gap_meas"] / ep["gap_meas"] if ep["gap_meas"] else 0.0
            print(f"{spread * 100:5.0f}%  {policy:<12} {r['gap_pred']:9.0f} {r['gap_meas']:9.0f} "
                  f"{vs_c * 100:8.1f}% {vs_e * 100:7.1f}% {r['tpot_pred_us']:10.2f} "
                  f"{r['tpot_meas_us']:10.2f} {r['err'] * 100:8.1f}%")
    print("(vs contig / vs eplb: reduction of the measured gap; model err: worst |pred - meas| / "
          "meas over regions)")

    if not args.no_drift:
        t2 = time.perf_counter()
        res, measured, switch, clock = run_drift(c, seeds[0], args.drift_spread, args.steps)
        print(f"\nDrift: chat-like -> reasoning-like routing at step {switch}, spread "
              f"{args.drift_spread * 100:.0f}%, chip {seeds[0]}.  [{time.perf_counter() - t2:.0f} s]")
        print(f"{'placement':<14} {'TPOT chat':>10} {'TPOT reasoning':>15} {'replans':>8} "
              f"{'moves':>6} {'bytes':>9} {'move cycles':>12}   (predicted, us)")
        for mode, (tpot, plans, _) in res.items():
            chat_t = _mean(tpot[:switch]) / clock * 1e6
            reas_t = _mean(tpot[switch:]) / clock * 1e6
            print(f"{mode:<14} {chat_t:10.3f} {reas_t:15.3f} {len(plans):8d} "
                  f"{sum(len(p.moves) for p in plans):6d} {sum(p.bytes for p in plans):9d} "
                  f"{sum(p.cycles for p in plans):12d}")
        for p in res["recalibrated"][1]:
            print(f"  {p.summary()}")
        print(f"{'measured under reasoning routing':<36} {'gap':>8} {'TPOT us':>9}")
        for name, (gap, tpot) in measured.items():
            print(f"  {name:<34} {gap:8.0f} {tpot / clock * 1e6:9.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
