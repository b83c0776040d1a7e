"""Routed flows: only the expert regions a step routed to send their outputs into combine
(meshrt.kernels.expert_reduce.routed, the interpreter and the cost model)."""

from __future__ import annotations

import itertools
from functools import lru_cache
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.driver import segment_program
from meshrt.kernels.expert_reduce.routed import (
    RoutedSenders,
    draw,
    region_routed_probability,
    routing_key,
)
from meshrt.runtime.cost_model import CostModel
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@lru_cache(maxsize=None)
def _tiny_moe():
    return segment_program(EXAMPLES / "tiny_moe.mrt", "test32")


def _exact(experts: int, held: int, top_k: int, tokens: int) -> float:
    """Probability by enumeration: every token's top-k set equally likely."""
    sets = list(itertools.combinations(range(experts), top_k))
    mine = set(range(held))
    hit = sum(1 for combo in itertools.product(sets, repeat=tokens)
              if any(mine.intersection(c) for c in combo))
    return hit / len(sets) ** tokens


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6).flatmap(lambda e: st.tuples(
    st.just(e), st.integers(0, e), st.integers(1, e), st.integers(1, 2))))
def test_region_probability_is_the_enumerated_one(case):
    experts, held, top_k, tokens = case
    got = region_routed_probability(experts, held, top_k, tokens)
    assert got == pytest.approx(_exact(experts, held, top_k, tokens), abs=1e-12)


@settings(max_examples=80, deadline=None)
@given(st.integers(0, 2**32), st.integers(0, 10**6), st.integers(0, 63),
       st.integers(1, 300), st.integers(1, 9))
def test_draws_are_distinct_experts_and_a_pure_function(seed, step, slot, experts, top_k):
    key = routing_key(seed, "l3_moe.combine")
    got = draw(key, step, slot, experts, top_k)
    assert got == draw(key, step, slot, experts, top_k)
    assert len(got) == len(set(got)) == min(top_k, experts)
    assert all(0 <= e < experts for e in got)


def test_draws_route_a_region_as_often_as_the_cost_model_expects():
    """The interpreter's draws (timing without numerics) and the cost model's expectation
    describe one routing: over 4,000 steps of 2 slots, the share of steps that reach a
    region of 2 of 8 experts (top-2) is the closed form's within sampling error."""
    key = routing_key(0, "l0_moe.combine")
    steps = 4000
    hits = sum(1 for s in range(steps)
               if {0, 1} & {e for slot in range(2) for e in draw(key, s, slot, 8, 2)})
    p = region_routed_probability(8, 2, 2, 2)
    assert abs(hits / steps - p) < 4 * (p * (1 - p) / steps) ** 0.5


def _meta_bytes(prog, flow) -> int:
    """The metainfo bytes a message of `flow` carries ahead of its data (its sends')."""
    from meshrt.dialects import event as ev

    (meta,) = {op.meta.value.data for op in prog.walk()
               if isinstance(op, ev.SendOp) and op.flow.root_reference.data == flow.flow_name}
    return meta


class _Recording(MeshSim):
    """Records (flow, sender router, step, bytes, control) of every message of a routed flow."""

    def __init__(self, *a, **kw):
        self.sent: list[tuple[int, int, int, int, bool]] = []
        super().__init__(*a, **kw)

    def _inject(self, core, f, nbytes, t, *rest, control=False, **kw):
        if f in self.routed:
            self.sent.append((f, core.rid, core.step, nbytes, control))
        return super()._inject(core, f, nbytes, t, *rest, control=control, **kw)


def test_only_the_regions_a_step_routed_to_send_their_outputs():
    """Timed without numerics: a root core sends its message exactly when the step's
    draw chose one of its region's experts; the others pass only their switch advance
    (one wavelet no core receives), and the receivers gather the routed ones alone."""
    prog, tg = _tiny_moe(), load_target("test32")
    flows = {f.flow_name: f for f in prog.flows() if f.is_routed}
    assert flows, "tiny_moe has no routed flow"
    sim = _Recording(prog, tg, seed=5)
    res = sim.run(4)
    assert res.steps == 4 and not res.reports
    names = sim.flow_names
    full = advances = 0
    for f, rid, step, nbytes, control in sim.sent:
        fo = flows[names[f]]
        rs, key = sim.routed[f]
        region = sim.routed_region[(rid, f)]
        chosen = {e for slot in range(prog.micro_batch_size)
                  for e in draw(key, step, slot, rs.experts, rs.top_k)}
        carries = bool(rs.holds(region) & chosen)
        assert control == (not carries), (names[f], rid, step)
        assert nbytes == (fo.bytes.value.data + _meta_bytes(prog, fo) if carries else 4)
        full += carries
        advances += not carries
    assert full and advances  # both occur in 4 steps


def test_numerics_hold_when_only_routed_regions_send(monkeypatch):
    """With the model's own routing (numerics), the regions no token chose send nothing,
    and the combine still gets every routed expert's output it needs, on several
    asynchrony seeds."""
    from meshrt.runtime.serving import serve
    from meshrt.runtime.workloads import Request

    advances = []
    inject = MeshSim._inject

    def counting(self, core, f, nbytes, t, *rest, control=False, **kw):
        advances.append(control)
        return inject(self, core, f, nbytes, t, *rest, control=control, **kw)

    monkeypatch.setattr(MeshSim, "_inject", counting)
    prog, tg = _tiny_moe(), load_target("test32")
    reqs = [Request(i, 0.0, [3 + i, 7, 11], 3, 4, 4) for i in range(3)]
    for seed in (0, 1, 2):
        s = serve(prog, tg, reqs, seed=seed).summary()
        assert s["outputs_match_reference"] and s["reports"] == [], (seed, s["reports"])
    assert any(advances), "no region went without a token"


def test_the_cost_model_charges_the_expected_payload():
    """The cost model's routed recv costs the messages the routing makes likely: each
    receiver expects the routed share of its senders' messages."""
    prog, tg = _tiny_moe(), load_target("test32")
    cm = CostModel(prog, tg)
    fo = next(f for f in prog.flows() if f.is_routed)
    f = cm.flow_names.index(fo.flow_name)
    rs = RoutedSenders.of(prog, fo)
    share = rs.send_share(cm.src[f], prog.micro_batch_size)
    assert 0.0 < share < 1.0
    full = fo.bytes.value.data + _meta_bytes(prog, fo)
    recvs = [ins for cl in cm.classes for ins in cl.instrs
             if type(ins).__name__ == "Recv" and ins.flow == f]
    assert recvs
    for ins in recvs:
        assert ins.nbytes == round(share * full)
        assert ins.cycles == pytest.approx(share * (full // 4) * tg.costs["recv_wavelet"])
