"""Expert placement (issue 9): policies, profiles and region models, the
`place-experts` pass, recalibration, and region timing on mesh_sim."""

from __future__ import annotations

import itertools
import json
import random
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.expert_placement import (
    Placement,
    contiguous,
    eplb,
    improve,
    layer_time,
    time_gap,
    vibe,
)
from meshrt.frontend.errors import FrontendError
from meshrt.runtime.expert_profile import (
    ExpertProfile,
    RegionModel,
    RegionModels,
    chat_routing,
    reasoning_routing,
    region_slowdowns,
    sample_counts,
)
from meshrt.runtime.recalibration import MoveCost, Recalibrator, total_variation

REPO = Path(__file__).resolve().parents[2]


def speeds(*factors: float, a: float = 0.0) -> list[RegionModel]:
    return [RegionModel(a * f, f) for f in factors]


def optimum(tokens, models) -> float:
    """Least predicted layer time over every placement with equal slots (brute force)."""
    R, E = len(models), len(tokens)
    k = E // R
    best = float("inf")
    for combo in itertools.product(range(R), repeat=E):
        if all(combo.count(r) == k for r in range(R)):
            best = min(best, layer_time(Placement(combo, R), tokens, models))
    return best


def counts_per_region(p: Placement) -> list[int]:
    return [len(m) for m in p.members()]


# ---------------------------------------------------------------------------
# Policies on hand-built profiles
# ---------------------------------------------------------------------------


def test_contiguous_is_the_mappers_default():
    assert contiguous(8, 4).region_of == (0, 0, 1, 1, 2, 2, 3, 3)
    with pytest.raises(ValueError, match="cannot be spread evenly"):
        contiguous(6, 4)


def test_eplb_pairs_heavy_with_light_experts():
    tokens = [8, 7, 6, 5, 4, 3, 2, 1]
    p = eplb(tokens, 4)
    assert p.region_tokens(tokens) == [9, 9, 9, 9]  # the optimum: 36 tokens / 4
    assert counts_per_region(p) == [2, 2, 2, 2]
    assert max(contiguous(8, 4).region_tokens(tokens)) == 15


def test_eplb_swaps_fix_what_the_greedy_packing_misses():
    tokens = [9, 8, 7, 7, 5, 1]  # 37 tokens: 19 : 18 is optimal
    greedy = eplb(tokens, 2, refine=False)  # DeepSeek EPLB's balanced packing
    assert sorted(greedy.region_tokens(tokens)) == [17, 20]
    assert sorted(eplb(tokens, 2).region_tokens(tokens)) == [18, 19]


def test_vibe_puts_light_experts_on_the_slow_region():
    tokens = [4, 3, 2, 1]
    models = speeds(1, 2)  # region 1 takes twice as long per token
    e, v = eplb(tokens, 2), vibe(tokens, models)
    assert layer_time(e, tokens, models) == 10  # 5 : 5 tokens, 5 x 2 on the slow region
    assert layer_time(v, tokens, models) == optimum(tokens, models) == 7
    assert v.members() in ([[0, 1], [2, 3]], [[0, 2], [1, 3]])  # 7 : 3 x 2, or 6 : 3.5 x 2


def test_vibe_accounts_for_fixed_costs_of_far_regions():
    # Region 1 is far from the dispatch core: 5 cycles before any token
    # arrives. Balancing tokens ignores that; vibe gives it the light pair.
    tokens = [6, 5, 4, 3]
    models = [RegionModel(0, 1), RegionModel(5, 1)]
    assert layer_time(eplb(tokens, 2), tokens, models) == 14
    v = vibe(tokens, models)
    assert layer_time(v, tokens, models) == optimum(tokens, models) == 12


def test_vibe_with_one_expert_per_region_sorts_hot_experts_onto_fast_regions():
    tokens = [5, 40, 1, 25, 12]
    slow = [1.03, 1.0, 1.06, 1.01, 1.02]
    v = vibe(tokens, speeds(*slow))
    by_load = sorted(range(5), key=lambda e: -tokens[e])
    by_speed = sorted(range(5), key=lambda r: slow[r])
    assert [v.region_of[e] for e in by_load] == by_speed


def test_vibe_is_near_optimal_on_small_instances():
    rng = random.Random(9)
    ratios = []
    for _ in range(150):
        R = rng.choice([2, 3, 4])
        E = R * rng.choice([1, 2]) if R == 4 else R * rng.choice([1, 2, 3])
        tokens = [rng.choice([rng.uniform(0, 10), rng.paretovariate(1.0)]) for _ in range(E)]
        models = [RegionModel(rng.choice([0.0, rng.uniform(0, 5)]), rng.uniform(1, 1.3))
                  for _ in range(R)]
        ratios.append(layer_time(vibe(tokens, models), tokens, models) / optimum(tokens, models))
    # Pairwise swaps are a local search: not always optimal, but close.
    assert max(ratios) < 1.15
    assert sum(r == pytest.approx(1.0) for r in ratios) >= 0.8 * len(ratios)


def test_eplb_replicates_hot_experts_into_spare_slots():
    tokens = [30, 6, 5, 4, 3, 2]  # one very hot expert
    plain = eplb(tokens, 3)
    rep = eplb(tokens, 3, slots=3)  # 9 slots for 6 experts: 3 copies
    assert not rep.expressible and plain.expressible
    assert len(rep.copies(0)) >= 2 and len(set(rep.copies(0))) == len(rep.copies(0))
    assert counts_per_region(rep) == [3, 3, 3]
    assert max(rep.region_tokens(tokens)) < max(plain.region_tokens(tokens))
    assert sum(rep.region_tokens(tokens)) == pytest.approx(sum(tokens))


# ---------------------------------------------------------------------------
# Properties
# ---------------------------------------------------------------------------

layouts = st.sampled_from([(2, 1), (2, 2), (2, 3), (3, 2), (4, 1), (4, 2), (4, 4), (8, 2)])
load = st.one_of(st.integers(0, 50).map(float), st.floats(0, 100, allow_nan=False))


@st.composite
def instances(draw, uniform: bool = False):
    R, k = draw(layouts)
    tokens = draw(st.lists(load, min_size=R * k, max_size=R * k))
    if uniform:
        a, b = draw(st.floats(0, 50)), draw(st.floats(0.01, 10))
        return tokens, [RegionModel(a, b)] * R
    models = [RegionModel(draw(st.floats(0, 50)), draw(st.floats(0.5, 2.0))) for _ in range(R)]
    return tokens, models


@settings(max_examples=150, deadline=None)
@given(instances(), st.booleans())
def test_vibe_is_never_worse_than_eplb(inst, refine):
    tokens, models = inst
    R = len(models)
    v, e = vibe(tokens, models, refine=refine), eplb(tokens, R, refine=refine)
    assert layer_time(v, tokens, models) <= layer_time(e, tokens, models) + 1e-9
    k = len(tokens) // R
    assert counts_per_region(v) == [k] * R and counts_per_region(e) == [k] * R


@settings(max_examples=100, deadline=None)
@given(instances(uniform=True), st.booleans())
def test_uniform_speeds_give_vibe_the_balance_of_eplb(inst, refine):
    tokens, models = inst
    v, e = vibe(tokens, models, refine=refine), eplb(tokens, len(models), refine=refine)
    assert v == e
    assert sorted(v.region_tokens(tokens)) == sorted(e.region_tokens(tokens))


@settings(max_examples=100, deadline=None)
@given(instances(), st.integers(0, 6))
def test_improve_never_slows_the_layer_and_keeps_slots(inst, swaps):
    tokens, models = inst
    start = contiguous(len(tokens), len(models))
    p, log = improve(start, tokens, models, swaps)
    assert len(log) <= swaps
    assert layer_time(p, tokens, models) <= layer_time(start, tokens, models) + 1e-9
    assert counts_per_region(p) == counts_per_region(start)


# ---------------------------------------------------------------------------
# Profiles and region models
# ---------------------------------------------------------------------------


def test_profile_round_trip_and_shares(tmp_path):
    p = ExpertProfile.zipf(8, [0, 3], s=1.2, seed=4, tokens=100, top_k=2)
    assert sum(p.loads(3)) == pytest.approx(100)
    assert p.loads(0) != p.loads(3)  # hot experts differ per layer
    path = tmp_path / "p.json"
    p.save(path)
    q = ExpertProfile.load(path)
    assert q == p
    assert sum(q.shares(0)) == pytest.approx(1)
    assert not q.has(1)
    assert ExpertProfile.zipf(4, [0], s=0).shares(0) == (0.25,) * 4


def test_profile_from_counts_and_the_numpy_reference():
    from meshrt.runtime.reference import ReferenceModel, RefShape, Weights

    shape = RefShape(layers=2, hidden=32, heads=2, kv_heads=1, head_dim=16, vocab=64,
                     experts=4, top_k=2, expert_ffn=16)
    model = ReferenceModel(shape, Weights.random(shape, 0))
    rng = random.Random(0)
    prompts = [[rng.randrange(64) for _ in range(5)] for _ in range(4)]
    p = ExpertProfile.measure(model, prompts, 4)
    assert p.experts == 4 and set(p.layers) == {0, 1} and p.top_k == 2
    # every decode token is routed to top_k experts in every layer
    decode_tokens = sum(len(o) - 1 for o in model.generate_batch(prompts, 4))
    assert sum(p.loads(0)) == 2 * decode_tokens


@pytest.mark.parametrize(("text", "where", "what"), [
    ('{"layers": {"0": [1, 2,]}}', ":1:24:", "not valid JSON"),
    ('{"layers": {"0": [1, -2]}}', ":1:13:", "load of expert 1 must be a non-negative number, got -2"),
    ('{"layers": {"x": [1, 2]}}', ":1:13:", "layer key 'x' is not a layer number"),
    ('{"experts": 3,\n "layers": {"0": [1, 2]}}', ":2:13:", "layer 0 lists 2 experts, the profile declares"),
    ('{"layer": {"0": [1, 2]}}', ":1:2:", "unknown profile key 'layer'"),
    ('{"format": "other", "layers": []}', ":1:2:", "format is 'other'"),
    ('[1, 2]', ":1:1:", "must be a JSON object"),
    ('{"layers": {"0": [1, 2], "1": [1, 2, 3]}}', ":1:2:", "different expert counts"),
])
def test_profile_errors_are_located_one_liners(text, where, what):
    with pytest.raises(FrontendError) as e:
        ExpertProfile.from_text(text, "p.json")
    msg = str(e.value)
    assert msg.startswith("p.json" + where) and what in msg and "\n" not in msg


def test_missing_profile_file(tmp_path):
    with pytest.raises(FrontendError, match="no such expert profile file"):
        ExpertProfile.load(tmp_path / "nope.json")


def test_region_models_round_trip_and_errors(tmp_path):
    m = RegionModels.from_speeds({0: [1.0, 1.5]}, a=10, b=2, unit="cycles")
    m = RegionModels(m.layers, None, "cycles", 16.0, {"source": "test"})
    path = tmp_path / "m.json"
    m.save(path)
    n = RegionModels.load(path)
    assert n.for_layer(0) == (RegionModel(10, 2), RegionModel(15, 3))
    assert n.tokens_per_step == 16.0 and n.fit == {"source": "test"}
    with pytest.raises(FrontendError, match=r"m.json:1:13: error: layer 0: region 1 needs "
                                            "non-negative numbers"):
        RegionModels.from_text('{"layers": {"0": [{"a": 1, "b": 1}, {"a": -1, "b": 1}]}}', "m.json")
    with pytest.raises(FrontendError, match="region 0 must be"):
        RegionModels.from_text('{"layers": [[{"a": 1}]]}', "m.json")


def test_region_slowdowns_span_exactly_the_spread():
    f = region_slowdowns(8, 0.07, seed=3)
    assert min(f) == 1.0 and max(f) == pytest.approx(1.07)
    assert sorted(f) == sorted(region_slowdowns(8, 0.07, seed=4)) and f != region_slowdowns(8, 0.07, 4)
    assert region_slowdowns(4, 0.0) == [1.0] * 4


def test_sample_counts_follow_the_profile():
    rng = random.Random(1)
    shares = [0.5, 0.3, 0.1, 0.1]
    counts = [0] * 4
    for _ in range(200):
        for e, c in enumerate(sample_counts(shares, 16, 2, rng)):
            counts[e] += c
    assert sum(counts) == 200 * 16 * 2
    assert counts[0] > counts[1] > counts[2]


# ---------------------------------------------------------------------------
# The pass
# ---------------------------------------------------------------------------

GRAPH = """
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(8, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(9, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(10, 0, 2, 2)>, #mesh.cores<(10, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}
"""


def _module(text: str):
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin

    from meshrt.diagnostics import parse_module
    from meshrt.dialects import get_all_dialects

    ctx = Context()
    ctx.load_dialect(Builtin)
    for load_dialect in get_all_dialects().values():
        ctx.load_dialect(load_dialect())
    return parse_module(ctx, text, "g.mlir")


def test_pass_writes_the_placement_at_graph_and_kernel_level(tmp_path):
    from meshrt.passes.pipeline import run_pipeline
    from meshrt.passes.place_experts import moe_sites

    prof = tmp_path / "p.json"
    ExpertProfile(4, {0: (8, 6, 2, 1)}).save(prof)
    models = tmp_path / "m.json"
    RegionModels.from_speeds({0: [2.0, 1.0]}).save(models)
    g = _module(GRAPH)
    run_pipeline(g, f'place-experts{{policy=eplb profile="{prof}"}}')
    (site,) = moe_sites(g)
    assert site.placement.region_of == (0, 1, 1, 0)
    assert site.op.placement_policy.data == "eplb"
    run_pipeline(g, f'lower-to-mesh-kernels,place-experts{{policy=vibe profile="{prof}" '
                    f'models="{models}"}}')
    (site,) = moe_sites(g)
    assert site.op.name == "mesh_kernel.expert_ffn"
    # region 0 twice as slow: 2 x (6 + 1) = 14 and 8 + 2 = 10, the optimum (eplb's takes 18)
    assert site.placement.region_of == (1, 0, 1, 0)


def test_pass_uses_the_tokens_the_models_were_fitted_for(tmp_path):
    # With a large fixed cost on region 0 the balance depends on the load's
    # scale: at 2 tokens per step region 0 should hold only light experts, at
    # 2000 the fixed cost is noise and the placement balances tokens.
    from meshrt.passes.pipeline import run_pipeline
    from meshrt.passes.place_experts import moe_sites

    prof = tmp_path / "p.json"
    ExpertProfile(4, {0: (4, 3, 2, 1)}).save(prof)
    place = {}
    for tokens in (2, 2000):
        models = tmp_path / f"m{tokens}.json"
        RegionModels({0: (RegionModel(10, 1), RegionModel(0, 1))}, tokens_per_step=tokens).save(models)
        g = _module(GRAPH)
        run_pipeline(g, f'place-experts{{policy=vibe profile="{prof}" models="{models}"}}')
        place[tokens] = moe_sites(g)[0].placement
    assert place[2].members() == [[2, 3], [0, 1]]  # region 0 gets the lightest pair
    assert place[2000].region_tokens([800, 600, 400, 200]) == [1000, 1000]


# ---------------------------------------------------------------------------
# Recalibration
# ---------------------------------------------------------------------------

E, R, LAYERS, TOKENS = 16, 8, (0, 1), 32


def _recalibrator(**kw) -> tuple[Recalibrator, ExpertProfile, ExpertProfile]:
    chat, reasoning = chat_routing(E, LAYERS), reasoning_routing(E, LAYERS)
    models = RegionModels.from_speeds({l: region_slowdowns(R, 0.07, l) for l in LAYERS},
                                      a=5.0, b=10.0)
    placements = {l: vibe([s * TOKENS for s in chat.shares(l)], models.for_layer(l)) for l in LAYERS}
    cost = MoveCost(98304, 4.0, 1.0, {l: [(2 + 4 * r, 0, 4, 8) for r in range(R)] for l in LAYERS})
    rc = Recalibrator(placements, chat, models, tokens_per_step=TOKENS, move_cost=cost, **kw)
    return rc, chat, reasoning


def _serve(rc, schedule, steps, seed=0):
    rng = random.Random(seed)
    plans = []
    for step in range(steps):
        prof = schedule(step)
        for l in LAYERS:
            rc.observe(l, sample_counts(prof.shares(l), 64, 2, rng))
        plan = rc.maybe_replan(step)
        if plan is not None:
            plans.append(plan)
    return plans


def test_no_recalibration_without_drift():
    rc, chat, _ = _recalibrator()
    assert _serve(rc, lambda s: chat, 300) == []
    assert all(rc.drift(l) < rc.threshold for l in LAYERS)


def test_recalibration_follows_drift_and_pays_off():
    rc, chat, reasoning = _recalibrator()
    old = dict(rc.placements)
    plans = _serve(rc, lambda s: chat if s < 100 else reasoning, 250)
    assert plans and all(p.step >= 100 for p in plans)  # nothing before the switch
    assert plans[0].step < 140  # ... and soon after it
    for p in plans:
        assert p.apply_at == p.step + 1
        for l in p.placements:
            assert p.after[l] < p.before[l]  # the plan lowers the predicted max-region time
            assert p.ideal[l] <= p.after[l] + 1e-9
        assert len(p.swaps) <= rc.max_swaps * len(p.placements)
        assert p.moves and all(m.bytes == 98304 and m.cycles > 0 for m in p.moves)
        assert p.cycles == sum(m.cycles for m in p.moves) and "swap" in p.summary()
    for l in LAYERS:
        assert counts_per_region(rc.placements[l]) == [2] * R
        # after the plans, the live (reasoning) routing is served faster than by the old placement
        assert rc.predicted(l) <= rc.predicted(l, old[l])
    assert rc.history == plans


def test_replan_without_commit_changes_nothing():
    rc, _, reasoning = _recalibrator()
    rng = random.Random(3)
    for _ in range(100):
        for l in LAYERS:
            rc.observe(l, sample_counts(reasoning.shares(l), 64, 2, rng))
    before = (dict(rc.placements), dict(rc.reference))
    plan = rc.maybe_replan(99, commit=False)
    assert plan is not None and (dict(rc.placements), dict(rc.reference)) == before
    rc.commit(plan)
    assert rc.placements[next(iter(plan.placements))] == plan.placements[next(iter(plan.placements))]
    assert all(rc.drift(l) < rc.threshold for l in plan.placements)


def test_drift_measure_and_noise_guard():
    assert total_variation([0.5, 0.5], [0.5, 0.5]) == 0
    assert total_variation([1, 0], [0, 1]) == 1
    rc, _, _ = _recalibrator(min_tokens=10_000)
    for l in LAYERS:
        rc.observe(l, [0] * (E - 1) + [100])  # one step, wildly off, but too few tokens
    assert rc.drift(0) > 0.5 and rc.maybe_replan(0) is None


def test_recalibrator_from_ir_and_back(tmp_path):
    from meshrt.passes.place_experts import moe_sites
    from meshrt.runtime.recalibration import apply_to_module
    from meshrt.targets import load_target

    g = _module(GRAPH)
    prof = ExpertProfile(4, {0: (1, 1, 1, 1)})
    models = RegionModels.from_speeds({0: [1.0, 1.0]})
    rc = Recalibrator.for_module(g, prof, models, load_target("test32"), tokens_per_step=4,
                                 min_tokens=100)
    assert rc.placements[0].region_of == (0, 0, 1, 1)
    for _ in range(50):
        rc.observe(0, [20, 20, 1, 1])  # experts 0 and 1, both on region 0, get hot
    plan = rc.maybe_replan(49)
    assert plan is not None and plan.after[0] < plan.before[0]
    assert {m.expert for m in plan.moves} in ({0, 2}, {0, 3}, {1, 2}, {1, 3})
    assert all(m.bytes == 3 * 32 * 16 * 2 and m.cycles > 0 for m in plan.moves)
    apply_to_module(g, plan)
    assert moe_sites(g)[0].placement == plan.placements[0]


def test_move_cost_uses_parallel_lanes_and_distance():
    mc = MoveCost(4096, 4.0, 1.0, {0: [(0, 0, 4, 8), (4, 0, 4, 8), (20, 0, 4, 8)]})
    near, far = mc.move_cycles(0, 0, 1), mc.move_cycles(0, 0, 2)
    assert near == 4 + 4096 // (8 * 4)  # 8 rows carry it, 4 hops
    assert far > near


# ---------------------------------------------------------------------------
# Region timing on mesh_sim (tiny_moe on test32: 8 regions of one expert)
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_moe():
    from meshrt.runtime.region_timing import compile_for_timing

    return compile_for_timing(str(REPO / "examples" / "tiny_moe.mrt"), "test32")


def test_fitted_region_models_see_slow_regions(tiny_moe):
    from meshrt.runtime.region_timing import fit_region_models

    slow = {l: region_slowdowns(len(lay.regions), 0.07, 5 + l) for l, lay in tiny_moe.layers.items()}
    models = fit_region_models(tiny_moe, seed=2, slowdowns=slow, loads=(0.5, 1.0, 2.0))
    assert models.fit["worst_relative_residual"] < 0.05
    assert models.tokens_per_step == tiny_moe.layers[0].tokens_per_step
    for l, lay in tiny_moe.layers.items():
        b = [m.b for m in models.for_layer(l)]
        assert len(b) == len(lay.regions) == 8
        # per-token cost follows the region slowdown; the target's per-core
        # speed factors (+-2 %, seeded) blur regions 1 % apart
        assert float(np.corrcoef(b, slow[l])[0, 1]) > 0.8
        assert all(m.a > 0 for m in models.for_layer(l))  # the dispatch path does not scale
    data = json.loads(json.dumps(models.to_json()))
    assert RegionModels.from_text(json.dumps(data)).for_layer(0)[0].b == pytest.approx(
        models.for_layer(0)[0].b, rel=1e-4)


def test_measured_gap_shrinks_with_vibe(tiny_moe):
    from meshrt.runtime.region_timing import fit_region_models, measure

    slow = {l: region_slowdowns(len(lay.regions), 0.07, 5 + l) for l, lay in tiny_moe.layers.items()}
    models = fit_region_models(tiny_moe, seed=2, slowdowns=slow, loads=(0.5, 1.0, 2.0))
    prof = ExpertProfile.zipf(8, list(tiny_moe.layers), s=1.0, seed=1)
    gaps = {}
    for policy in ("contiguous", "vibe"):
        toks = {}
        for l, lay in tiny_moe.layers.items():
            tokens = [s * lay.tokens_per_step for s in prof.shares(l)]
            p = contiguous(8, 8) if policy == "contiguous" else vibe(tokens, models.for_layer(l))
            toks[l] = p.region_tokens(tokens)
            if policy == "vibe":
                assert time_gap(p, tokens, models.for_layer(l)) < time_gap(
                    contiguous(8, 8), tokens, models.for_layer(l))
        m = measure(tiny_moe, seed=2, slowdowns=slow, region_tokens=toks)
        gaps[policy] = sum(m.gap(l) for l in tiny_moe.layers)
    # one expert per region: only a time-aware placement can shrink the gap
    assert gaps["vibe"] < gaps["contiguous"]


# ---------------------------------------------------------------------------
# Numerics: the served model still matches the NumPy reference
# ---------------------------------------------------------------------------


def test_served_tokens_match_the_reference_after_placement_and_recalibration(tmp_path):
    """Profile measured by serving on the interpreter -> vibe placement -> serve;
    then a recalibration plan written into the IR -> serve again. Both runs
    must produce the reference's tokens (placement only moves experts)."""
    from meshrt.driver import load_model, program_of
    from meshrt.passes.pipeline import lower_to, run_pipeline
    from meshrt.passes.place_experts import moe_sites
    from meshrt.runtime.recalibration import apply_to_module
    from meshrt.runtime.serving import serve
    from meshrt.runtime.workloads import Request
    from meshrt.targets import load_target

    target = load_target("test32")
    reqs = [Request(id=i, arrival=0.0, prompt=[3 + i, 5, 7], prompt_len=3, max_new_tokens=4,
                    output_len=4) for i in range(3)]

    def served(module):
        r = serve(program_of(lower_to(module, "segments")), target, reqs, seed=1)
        assert r.outputs_match_reference, r.mismatches or r.sim.reports
        return r

    first = served(load_model(str(REPO / "examples" / "tiny_moe.mrt"), "test32"))
    measured = ExpertProfile.from_counts(first.routing_counts.tolist(), top_k=2)
    assert sum(measured.loads(0)) > 0
    prof = tmp_path / "measured.json"
    measured.save(prof)

    g = load_model(str(REPO / "examples" / "tiny_moe.mrt"), "test32")
    run_pipeline(g, f'place-experts{{policy=vibe profile="{prof}" spread=0.07 seed=2}}')
    placed = {s.layer: s.placement for s in moe_sites(g)}
    assert any(p.region_of != tuple(range(8)) for p in placed.values())
    models = RegionModels.from_speeds({l: region_slowdowns(8, 0.07, 2 * 7919 + l) for l in placed},
                                      a=1.0, b=1.0)
    rc = Recalibrator.for_module(g, measured, models, target, tokens_per_step=4, min_tokens=50)
    hot = [0] * 7 + [40]
    for _ in range(10):
        for l in placed:
            rc.observe(l, hot)  # routing moves to expert 7
    plan = rc.maybe_replan(9)
    assert plan is not None and plan.moves
    apply_to_module(g, plan)
    assert {s.layer: s.placement for s in moe_sites(g)} != placed
    served(g)
