"""The class-level cost model: calibrated against the interpreter, and class-level.

The calibration test computes both sides live (the cost model's cycles per
decode step and the interpreter's measured mean after warm-up over a few
seeds), so it fails as soon as the two drift apart by more than
`TOLERANCE`, whichever of them changed.
"""

from __future__ import annotations

import itertools
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from meshrt.driver import load_model, program_of, segment_program
from meshrt.passes.pipeline import lower_to
from meshrt.routing import RectSet, xy_path
from meshrt.runtime.cost_model import (
    CATEGORIES,
    CostModel,
    estimate,
    kernels_of_kind,
    link_load,
    max_hops,
    measured_cycles_per_step,
    messages_per_core,
    run_length,
)
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TOLERANCE = 0.10
CASES = [(m, t) for m in ("tiny_dense", "tiny_moe") for t in ("test32", "test16")]


@pytest.fixture(scope="module")
def programs():
    cache: dict = {}

    def get(model: str, target: str):
        if (model, target) not in cache:
            cache[(model, target)] = segment_program(str(EXAMPLES / f"{model}.mrt"), target)
        return cache[(model, target)]

    return get


@pytest.mark.parametrize("model,target", CASES)
def test_cost_model_agrees_with_interpreter(programs, model, target):
    program, tg = programs(model, target), load_target(target)
    predicted = CostModel(program, tg).estimate(1).cycles_per_step
    measured = measured_cycles_per_step(program, tg, seeds=(0, 1, 2), steps=4, warmup=1)
    err = predicted / measured - 1
    assert abs(err) <= TOLERANCE, (
        f"{model} on {target}: cost model {predicted:,.0f} vs interpreter {measured:,.0f} "
        f"cycles per step ({100 * err:+.1f} %)")


@pytest.mark.parametrize("static", [False, True])
def test_cost_model_agrees_with_interpreter_on_expert_passes(tmp_path, static):
    """tiny_moe with four experts a region: its regions run two passes a step routed and
    four static (`expert_passes`), timed alike by the cost model and the interpreter."""
    src = tmp_path / "moe4.mrt"
    src.write_text((EXAMPLES / "tiny_moe.mrt").read_text() + "\nmapping { experts_per_region = 4 }\n")
    tg = load_target("test32")
    program = segment_program(str(src), tg, dynamism=() if static else None)
    predicted = CostModel(program, tg).estimate(1).cycles_per_step
    measured = measured_cycles_per_step(program, tg, seeds=(0, 1, 2), steps=4, warmup=1)
    assert abs(predicted / measured - 1) <= TOLERANCE, (predicted, measured)


@pytest.mark.parametrize("model,target", [("tiny_dense", "test32"), ("tiny_moe", "test16")])
def test_stages_and_critical_path_add_up_to_the_step(programs, model, target):
    program = programs(model, target)
    est = estimate(program, target)
    step = est.latency.cycles_per_step
    assert len(est.latency.stages) == program.num_stages
    assert sum(s.cycles for s in est.latency.stages) == pytest.approx(step, rel=1e-9)
    assert all(s.cycles > 0 for s in est.latency.stages)
    assert set(est.latency.critical_path) == set(CATEGORIES)
    assert sum(est.latency.critical_path.values()) == pytest.approx(step, rel=1e-9)
    assert sum(est.latency.kernel_path.values()) == pytest.approx(step, rel=1e-9)
    # with one micro-batch per stage the pipeline cannot be slower than serial,
    # nor faster than the step divided among the stages
    ii = est.pipelined.cycles_per_step
    assert est.in_flight == program.num_stages
    assert step / program.num_stages * (1 - 1e-9) <= ii <= step * (1 + 1e-9)
    assert est.tpot_cycles >= step * (1 - 1e-9)


def test_multi_wafer_step_pays_the_wafer_link(programs):
    """tiny_moe needs two test16 wafers: its critical path crosses the wafer link."""
    program = programs("tiny_moe", "test16")
    assert program.num_wafers == 2
    tg = load_target("test16")
    est = CostModel(program, tg).estimate(1)
    assert est.critical_path["network"] >= 2 * tg.wafer_link_latency_cycles


def test_kernel_scale_agrees_with_interpreter_slowdown():
    """The what-if `meshrt bench` uses for 'no expert parallelism' (experts doing top_k
    times their work) against the interpreter slowing the expert cores by top_k."""
    module = load_model(str(EXAMPLES / "tiny_moe.mrt"), "test32", dynamism=())
    program, tg = program_of(lower_to(module, "segments")), load_target("test32")
    experts = kernels_of_kind(program, "expert_ffn")
    k = program.hparam("top_k")
    # the expert cores: they run the experts and the reduction of their outputs
    on_experts = experts | kernels_of_kind(program, "expert_reduce")
    slow = {(c.wafer_index, x, y) for c in program.core_classes()
            if {sub.kernel_name for s in c.segments() for sub in s.subs()} <= on_experts
            for x, y in c.cores.cores()}
    assert experts and slow
    base = CostModel(program, tg).estimate(1).cycles_per_step
    scaled = CostModel(program, tg, kernel_scale=dict.fromkeys(experts, k)).estimate(1).cycles_per_step
    runs = [MeshSim(program, tg, seed=s, speed_scale=lambda pos: k if pos in slow else 1.0).run(4)
            for s in (0, 1)]
    measured = [c for r in runs for c in r.step_cycles[1:]]
    assert scaled > base
    assert scaled == pytest.approx(sum(measured) / len(measured), rel=TOLERANCE)


def test_full_wafer_is_class_level():
    """A model on full WSE-3 (893k cores) costs what it costs on a 32 x 32 mesh."""
    program = segment_program(str(EXAMPLES / "tiny_moe.mrt"), "wse3")
    t0 = time.perf_counter()
    est = estimate(program, "wse3")
    assert time.perf_counter() - t0 < 5.0
    assert est.latency.cycles_per_step > 0 and est.pipelined.cycles_per_step > 0


# ---------------------------------------------------------------------------
# Geometry in closed form vs core by core
# ---------------------------------------------------------------------------


def _cores(rs: RectSet) -> list[tuple[int, int]]:
    return [(x, y) for b in rs for x in range(b[0], b[2]) for y in range(b[1], b[3])]


def _reference(src: RectSet, dst: RectSet, pattern: str) -> tuple[int, int, int]:
    """(busiest link's messages, most hops, most messages into one core), core by core."""
    receivers = _cores(dst)
    load: Counter = Counter()
    into: Counter = Counter()
    hops = 0
    for s in _cores(src):
        targets = [r for r in receivers if r != s and (pattern == "all" or (
            r[1] == s[1] if pattern == "row" else r[0] == s[0]))]
        links = set()
        for t in targets:
            path = xy_path(s, t)
            hops = max(hops, len(path) - 1)
            into[t] += 1
            links.update(itertools.pairwise(path))
        load.update(links)
    return max(load.values(), default=0), hops, max(into.values(), default=0)


def _random_set(rng: random.Random) -> RectSet:
    boxes = []
    for _ in range(rng.randrange(1, 3)):
        x, y = rng.randrange(12), rng.randrange(12)
        boxes.append((x, y, x + rng.randrange(1, 5), y + rng.randrange(1, 5)))
    return RectSet(boxes)


def test_flow_geometry_matches_core_by_core():
    rng = random.Random(7)
    checked = 0
    for _ in range(150):
        src, dst = _random_set(rng), _random_set(rng)
        for pattern in ("all", "row", "col"):
            load, hops, into = _reference(src, dst, pattern)
            if into == 0:
                continue
            checked += 1
            assert max_hops(src, dst, pattern, (0, 0)) == hops
            # closed forms may only over-approximate, and `all` is exact
            assert link_load(src, dst, pattern) >= load
            if pattern == "all":
                assert link_load(src, dst, pattern) == load
            assert into <= messages_per_core(src, dst, pattern) <= into + 1
    assert checked > 200


@pytest.mark.parametrize("boxes,d,expected", [
    ([(0, 1, 3, 5)], (0, 1), 4),
    ([(0, 1, 3, 5)], (0, -1), 4),
    ([(0, 0, 2, 3), (0, 3, 1, 5)], (0, 1), 5),  # stacked boxes continue the run
    ([(0, 0, 2, 3), (4, 3, 5, 5)], (0, 1), 3),  # not above each other
    ([(2, 0, 7, 1)], (1, 0), 5),
    ([(2, 0, 7, 1)], (2, 0), 1),  # only unit steps chain
])
def test_run_length(boxes, d, expected):
    assert run_length(RectSet(boxes), *d) == expected
