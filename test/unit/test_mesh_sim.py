"""The discrete-event mesh simulation (meshrt.runtime.mesh_sim): timing, failures, traces."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.driver import parse_ir, program_of, segment_program
from meshrt.runtime.mesh_sim import (
    CorruptionReport,
    DeadlockReport,
    MeshSim,
    TimeBoundReport,
)
from meshrt.runtime.trace import trace_events, write_trace
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SEEDS = range(20)

HEADER = (
    'segment.program @{name} target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 '
    "dynamism [] hparams {{}} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, "
    "sram = 8960, ctrl = 256> colors 8 reserved [6, 7]"
)

# A (0,0) sends a small @h to B and then a long @f through B to C. B's segment
# 0 ends right after it received @h, then B releases @f; the compiled marker
# sync holds B until @f has left the region, the unsafe ablation does not.
RACE = """builtin.module {
  segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
    event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
    event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
    event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
    segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @h] {
        event.sub @ka "src" after [] demand <colors = 2> {
          event.send @h bytes 8 meta 0
          event.send @f bytes 4096 meta 0
        }
      }
    }
    segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @h] {
        event.sub @ka "pass" after [] demand <colors = 2> {
          event.recv @h bytes 8 meta 0
          event.compute "add" work 100
        }
      }
      segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
      segment.reconfigure 0 to 1 release [@f, @h] install [@g]
      segment.segment 1 use <colors = 1> routes [@g] {
        event.sub @kb "src" after [@ka] demand <colors = 1> {
          event.send @g bytes 64 meta 0
        }
      }
      segment.reconfigure 1 to 0 release [@g] install [@f, @h]
    }
    segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @g] {
        event.sub @kb "dst" after [@ka] demand <colors = 2> {
          event.recv @f bytes 4096 meta 0
          event.recv @g bytes 64 meta 0
        }
      }
    }
    segment.route @f color 0 via <(0, 0, 3, 1)>
    segment.route @h color 1 via <(0, 0, 2, 1)>
    segment.route @g color 2 via <(1, 0, 2, 1)>
  }
}
"""

# A (0,0) sends a small @h to B and a long @f through B to C. B's segment 0
# ends on a collective, so no marker sync guards its boundary: B releases @f
# (and then sends @g on a colour it just installed) while @f's tail is still
# passing. The route handshakes of insert-route-handshakes are what keep it
# safe: B drains @f and @h before releasing them, A awaits B's install
# credits for @f and @h every step, and B grants them at program start.
HANDOFF = """builtin.module {
  segment.program @handoff target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
    event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
    event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
    event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
    segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h] {
        event.sub @ka "src" after [] demand <colors = 2> {
          event.send @h bytes 8 meta 0
          event.send @f bytes 4096 meta 0
        }
      }
    }
    segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
        event.sub @ka "pass" after [] demand <colors = 2> collective {
          event.recv @h bytes 8 meta 0
          event.compute "add" work 100
        }
      }
      segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@f, @h]
      segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
        event.sub @kb "src" after [@ka] demand <colors = 1> collective {
          event.send @g bytes 64 meta 0
        }
      }
      segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
    }
    segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@f, @g] {
        event.sub @ka "dst" after [] demand <colors = 1> {
          event.recv @f bytes 4096 meta 0
        }
        event.sub @kb "dst" after [@ka] demand <colors = 1> {
          event.recv @g bytes 64 meta 0
        }
      }
    }
    segment.route @f color 0 via <(0, 0, 3, 1)>
    segment.route @h color 1 via <(0, 0, 2, 1)>
    segment.route @g color 2 via <(1, 0, 2, 1)>
  }
}

"""

# Two cores that each wait to receive from the other before sending.
DEADLOCK = "builtin.module {\n  " + HEADER.format(name="dl") + """ {
    event.flow @ab kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
    event.flow @ba kernel @k role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(0, 0, 1, 1)> pattern "shift" by -1, 0 bytes 8
    segment.core_class @left wafer 0 cores <(0, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@ab, @ba] {
        event.sub @k "l" after [] demand <colors = 2> {
          event.recv @ba bytes 8 meta 0
          event.send @ab bytes 8 meta 0
        }
      }
    }
    segment.core_class @right wafer 0 cores <(1, 0, 1, 1)> {
      segment.segment 0 use <colors = 2> routes [@ab, @ba] {
        event.sub @k "r" after [] demand <colors = 2> {
          event.recv @ab bytes 8 meta 0
          event.send @ba bytes 8 meta 0
        }
      }
    }
    segment.route @ab color 0 via <(0, 0, 2, 1)>
    segment.route @ba color 1 via <(0, 0, 2, 1)>
  }
}
"""

# One core that only computes: it never ends on its own.
SPIN = "builtin.module {\n  " + HEADER.format(name="spin") + """ {
    segment.core_class @spin wafer 0 cores <(3, 3, 1, 1)> {
      segment.segment 0 use <colors = 0> {
        event.sub @k "s" after [] demand <colors = 0> {
          event.compute "fmac" work 4000
        }
      }
    }
  }
}
"""


@pytest.fixture(scope="module")
def test32():
    return load_target("test32")


@pytest.fixture(scope="module")
def programs():
    cache = {}

    def get(model: str, target: str):
        if (model, target) not in cache:
            cache[model, target] = segment_program(str(EXAMPLES / f"{model}.mrt"), target)
        return cache[model, target]

    return get


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_one_segment_target_completes_across_seeds(programs, model):
    """wse3 gives every class one segment: no reconfiguration, nothing can race."""
    program, target = programs(model, "wse3"), load_target("wse3")
    for seed in SEEDS:
        res = MeshSim(program, target, seed=seed).run(2)
        assert res.completed, (seed, res.summary())
        assert res.steps == 2 and len(res.step_cycles) == 2 and all(c > 0 for c in res.step_cycles)
        assert not res.reports


def racing_program(model: str, materialize: str = ""):
    """`model` on test32, segments cut with `materialize`'s tightened budget: the
    budgets under which its classes reconfigure while traffic passes (tiny_dense
    as compiled; tiny_moe, whose classes mostly fit a segment since a shared
    chain flow binds its colour once, with 4 colours per segment)."""
    from meshrt.driver import compile as compile_to
    from meshrt.passes.pipeline import pipeline_between, run_pipeline

    tg = load_target("test32")
    module = compile_to(str(EXAMPLES / f"{model}.mrt"), tg, "events")
    rest = pipeline_between("events", "segments")
    if materialize:
        rest = rest.replace("materialize-segments", f"materialize-segments{{{materialize}}}", 1)
    run_pipeline(module, rest, tg)
    return program_of(module)


RACES = [("tiny_dense", "", "l0_o.reduce.down"), ("tiny_moe", "colors=4", "l0_o.reduce.down")]


@pytest.mark.parametrize("target", ["test32", "test16"])
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_safe_build_on_test32_has_no_corruption(programs, model, target):
    """Classes switch segments asynchronously; the compiled route handshakes
    (install credits before use, drains before release) keep every colour
    bound while its traffic passes: no corruption, no deadlock, on any seed."""
    program, tg = programs(model, target), load_target(target)
    for seed in SEEDS:
        res = MeshSim(program, tg, seed=seed).run(2)
        assert res.completed and not res.reports, res.summary()


@pytest.mark.parametrize("model, materialize, flow", RACES)
def test_the_handshakes_are_awaited_and_keep_the_racing_build_safe(model, materialize, flow, test32):
    program = racing_program(model, materialize)
    credit = 0
    for seed in SEEDS:
        res = MeshSim(program, test32, seed=seed).run(2)
        assert res.completed and not res.reports, res.summary()
        credit += res.stall_totals()["credit"]
    assert credit > 0  # the credits are really awaited


def strip_handshakes(program) -> None:
    for c in program.core_classes():
        for seg in c.segments():
            seg.awaits = None
            seg.grant = None
        for *_, rec in c.boundaries():
            rec.notify = None
            rec.drain = None


@pytest.mark.parametrize("model, materialize, flow", RACES)
def test_without_handshakes_the_safe_build_races(model, materialize, flow, test32):
    """The same program with its handshakes removed races: a flow's messages
    meet a router that has not (or no longer) bound its colour."""
    program = racing_program(model, materialize)
    strip_handshakes(program)
    bad = [MeshSim(program, test32, seed=seed).run(2).corruptions() for seed in range(5)]
    assert any(bad)
    assert any(r.flow.endswith(flow) for rs in bad for r in rs)


@pytest.mark.parametrize("model, materialize, flow", RACES)
def test_unsafe_ablation_still_fails_on_the_compiled_models(model, materialize, flow, test32):
    program = racing_program(model, materialize)
    fails = sum(bool(MeshSim(program, test32, seed=seed, safe=False).run(2).reports) for seed in range(5))
    assert fails > 0


def test_safe_build_with_handshakes_is_deterministic(programs, test32):
    program = programs("tiny_moe", "test32")
    a = MeshSim(program, test32, seed=3).run(2)
    b = MeshSim(program, test32, seed=3).run(2)
    assert a.completed and b.completed
    assert (a.cycles, a.step_cycles, a.stalls, a.events, a.messages) == (
        b.cycles, b.step_cycles, b.stalls, b.events, b.messages)


def test_drain_and_credit_guard_an_unsynchronised_pass_through(test32):
    program = program_of(parse_ir(HANDOFF))
    for seed in SEEDS:
        res = MeshSim(program, test32, seed=seed).run(3)
        assert res.completed and not res.reports, res.summary()
        stalls = res.stall_totals()
        assert stalls["route_drain"] > 0 and stalls["credit"] > 0
        unsafe = MeshSim(program, test32, seed=seed, safe=False).run(3)
        (r,) = unsafe.corruptions()
        assert (r.flow, r.router[1:], r.router_class, r.when) == ("f", (1, 0), "b", "reconfigure")
    strip_handshakes(program)
    assert MeshSim(program, test32, seed=0).run(3).corruptions()


def test_a_credit_nobody_sends_is_a_named_deadlock(test32):
    program = program_of(parse_ir(HANDOFF))
    seg0 = next(c for c in program.core_classes() if c.class_name == "b").segments()[0]
    seg0.grant = None  # B never grants the first step's credits
    res = MeshSim(program, test32).run(1)
    assert not res.completed
    (dl,) = res.deadlocks()
    waits = {w.core[1:]: w for w in dl.waits}
    assert (waits[0, 0].waits_for, waits[0, 0].flow, waits[0, 0].on) == ("credit", "h", ((0, 1, 0),))
    assert waits[1, 0].waits_for == "recv"
    assert "install credit of @h for step 0 from (1, 0)" in str(dl)


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_safe_build_on_test32_runs_all_steps_in_diagnostic_mode(programs, test32, model):
    """Letting corrupted messages pass shows that nothing else goes wrong: no deadlock."""
    program = programs(model, "test32")
    for seed in range(5):
        res = MeshSim(program, test32, seed=seed, stop_on_corruption=False).run(2)
        assert res.steps == 2 and len(res.step_cycles) == 2
        assert not res.deadlocks()
        assert not any(isinstance(r, TimeBoundReport) for r in res.reports)
        for r in res.corruptions():
            assert r.router_class and r.sender_class and r.router_segment is not None
            assert r.flow and r.color >= 0 and "corruption at cycle" in str(r)


def test_same_seed_same_result(programs, test32):
    program = programs("tiny_moe", "test32")
    a = MeshSim(program, test32, seed=7, stop_on_corruption=False).run(2)
    b = MeshSim(program, test32, seed=7, stop_on_corruption=False).run(2)
    c = MeshSim(program, test32, seed=8, stop_on_corruption=False).run(2)
    assert (a.cycles, a.step_cycles, a.stalls, a.events, a.messages) == (
        b.cycles, b.step_cycles, b.stalls, b.events, b.messages)
    assert [str(r) for r in a.reports] == [str(r) for r in b.reports]
    assert a.cycles != c.cycles


def test_unsafe_ablation_fails_where_safe_build_does_not(test32):
    program = program_of(parse_ir(RACE))
    unsafe_fail = 0
    for seed in SEEDS:
        safe = MeshSim(program, test32, seed=seed).run(1)
        assert safe.completed and not safe.reports, safe.summary()
        assert safe.stall_totals()["marker"] > 0
        unsafe = MeshSim(program, test32, seed=seed, safe=False).run(1)
        bad = [r for r in unsafe.reports if isinstance(r, CorruptionReport | DeadlockReport)]
        unsafe_fail += bool(bad)
    assert unsafe_fail > 0
    r = MeshSim(program, test32, seed=0, safe=False).run(1).corruptions()[0]
    assert (r.flow, r.router[1:], r.router_class, r.router_segment) == ("f", (1, 0), "b", 1)
    assert (r.sender[1:], r.sender_class, r.sender_segment, r.color) == ((0, 0), "a", 0, 0)


def test_deadlock_report_names_both_cores_and_flows(test32):
    res = MeshSim(program_of(parse_ir(DEADLOCK)), test32).run(1)
    assert not res.completed
    (dl,) = res.deadlocks()
    waits = {w.core[1:]: w for w in dl.waits}
    assert set(waits) == {(0, 0), (1, 0)}
    assert (waits[0, 0].waits_for, waits[0, 0].flow, waits[0, 0].on) == ("recv", "ba", ((0, 1, 0),))
    assert (waits[1, 0].waits_for, waits[1, 0].flow, waits[1, 0].on) == ("recv", "ab", ((0, 0, 0),))
    assert "@left" in str(dl) and "@right" in str(dl)


def test_time_bound_stops_a_run_that_never_ends(test32):
    res = MeshSim(program_of(parse_ir(SPIN)), test32, max_cycles=20_000).run(10**9)
    assert not res.completed
    (tb,) = res.reports
    assert isinstance(tb, TimeBoundReport) and tb.max_cycles == 20_000 and tb.steps_done > 0


def test_wall_time_bound_stops_a_run_that_never_ends(test32):
    # no cycle bound to speak of: only the wall-time limit can end this run
    res = MeshSim(program_of(parse_ir(SPIN)), test32, max_cycles=1 << 62, max_seconds=0.2).run(10**9)
    assert not res.completed
    (tb,) = res.reports
    assert isinstance(tb, TimeBoundReport) and tb.max_seconds == 0.2 and tb.steps_done > 0
    assert 0 < tb.cycle < 1 << 62 and f"{tb.cycle:,}" in str(tb) and "wall-time limit of 0.2 s" in str(tb)


@pytest.mark.parametrize("by_class", [False, True])
def test_trace_export(tmp_path, test32, by_class):
    res = MeshSim(program_of(parse_ir(RACE)), test32, trace=True).run(1)
    path = tmp_path / "trace.json"
    write_trace(res, str(path), by_class=by_class)
    data = json.loads(path.read_text())
    assert set(data) >= {"traceEvents", "displayTimeUnit"}
    xs = [e for e in data["traceEvents"] if e["ph"] == "X"]
    assert xs and all({"name", "ts", "dur", "pid", "tid"} <= set(e) for e in xs)
    names = {e["args"]["name"] for e in data["traceEvents"] if e["ph"] == "M" and e["name"] == "thread_name"}
    if by_class:
        assert names == {"@a", "@b", "@c"}
    else:
        assert names == {"(0, 0) @a", "(1, 0) @b", "(2, 0) @c"}
    assert any(e["name"] == "marker sync" for e in xs)
    with pytest.raises(ValueError):
        trace_events(MeshSim(program_of(parse_ir(RACE)), test32).run(1))


class _Recording(MeshSim):
    """Records every timed event's (base cost, drawn cost) per core position."""

    def _cost(self, core, base):
        c = super()._cost(core, base)
        self.costs_by_core.setdefault(core.pos, []).append((base, c))
        return c


def _recorded(program, target, **kw):
    sim = _Recording.__new__(_Recording)
    sim.costs_by_core = {}
    sim.__init__(program, target, **kw)
    res = sim.run(2)
    assert res.completed
    return sim


def test_timing_draws_do_not_depend_on_event_order(programs, test32):
    """Slowing one core reorders the whole simulation's events; every other core still
    draws the same cost for each of its events (a pure function of seed, core, index)."""
    program = programs("tiny_moe", "test32")
    a = _recorded(program, test32, seed=3)
    slow = next(iter(a.costs_by_core))
    b = _recorded(program, test32, seed=3, speed_scale=lambda p: 1.7 if p == slow else 1.0)
    assert b.costs_by_core[slow] != a.costs_by_core[slow]
    others = [p for p in a.costs_by_core if p != slow]
    assert len(others) > 100
    for p in others:
        ca, cb = a.costs_by_core[p], b.costs_by_core[p]
        n = min(len(ca), len(cb))
        assert n > 0 and ca[:n] == cb[:n], p


def test_speed_factors_follow_the_core_not_the_build_order(programs, test32):
    """A core's speed is its stream's draw 0: the same wherever the core sits in the
    simulator's lists, different across seeds, within the target's spread."""
    from meshrt.runtime import counter_rng

    program = programs("tiny_moe", "test32")
    sims = [MeshSim(program, test32, seed=s) for s in (5, 6)]
    spread = test32.speed_spread
    for sim in sims:
        for core in sim.cores:
            key = counter_rng.stream_key(sim.seed, core.rid)
            assert core.speed == 1.0 + spread * (2.0 * counter_rng.unit(key, 0) - 1.0)
            assert abs(core.speed - 1.0) <= spread
    assert [c.speed for c in sims[0].cores] != [c.speed for c in sims[1].cores]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(1, 12)), min_size=1, max_size=25))
def test_link_reservations_take_the_first_free_gap(requests):
    """The closed-form network books a link for [start, start + ser) at the first start
    >= the head's arrival where the link is free: reservations never overlap, and no
    earlier start would have fitted between the ones already made."""
    booked: list[list[int]] = []
    for t, ser in requests:
        before = [tuple(b) for b in booked]
        start = MeshSim._reserve(booked, t, ser)
        assert start >= t
        assert all(start + ser <= a or b <= start for a, b in before)
        for s in range(t, start):  # every earlier start collides with a booking
            assert any(s < b and a < s + ser for a, b in before)
        assert booked == sorted(booked) and all(
            booked[i][1] <= booked[i + 1][0] for i in range(len(booked) - 1))
