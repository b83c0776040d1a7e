"""The one flattening of segment IR into per-class instructions (meshrt.runtime.schedule)."""

from __future__ import annotations

import functools
import math
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.dialects import event as ev
from meshrt.driver import segment_program
from meshrt.kernels import registry
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.runtime.schedule import (
    WAVELET_BYTES,
    AwaitCredits,
    Compute,
    EndStep,
    EnterSegment,
    MarkerSync,
    MetaProduce,
    MetaResolve,
    Notify,
    Reconfigure,
    Recv,
    RouteDrain,
    Send,
    Sub,
    Switch,
    flatten,
    op_cycles,
)
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HANDSHAKES = (AwaitCredits, RouteDrain, Notify)
EVENTS = {ev.ComputeOp: Compute, ev.SendOp: Send, ev.RecvOp: Recv,
          ev.MetaResolveOp: MetaResolve, ev.MetaProduceOp: MetaProduce}


@functools.cache
def program(model: str, target: str):
    return segment_program(str(EXAMPLES / f"{model}.mrt"), target)


@pytest.mark.parametrize("target", ["test32", "test16"])
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_tables_follow_the_ir(model, target):
    p, tg = program(model, target), load_target(target)
    sched = flatten(p, tg)
    classes = p.core_classes()
    params = {k.kernel_name: k.param for k in p.kernels()}
    assert sched.flows == tuple(f.flow_name for f in p.flows())
    assert all(sched.flow_index[n] == i for i, n in enumerate(sched.flows))
    assert [c.name for c in sched.classes] == [c.class_name for c in classes]
    for i, (cs, c) in enumerate(zip(sched.classes, classes, strict=True)):
        assert cs.index == i and cs.wafer == c.wafer_index
        segs, bounds = c.segments(), c.boundaries()
        events = Counter(EVENTS[type(e)] for seg in segs for sub in seg.subs() for e in sub.events())
        for kind in EVENTS.values():
            assert cs.count(kind) == events[kind], (cs.name, kind)
        assert cs.count(Sub) == sum(len(seg.subs()) for seg in segs)
        assert cs.count(EnterSegment) == len(segs)
        assert cs.count(Reconfigure) == cs.count(Switch) == len(bounds)
        assert cs.count(MarkerSync) == sum(1 for b in bounds if b[2] is not None)
        assert cs.count(EndStep) == 1 and type(cs.instrs[-1]) is EndStep
        ins = cs.instrs
        for j, x in enumerate(ins):
            if type(x) is Reconfigure:  # the router switches once the reconfiguration is done
                nxt = ins[j + 1]
                assert type(nxt) is Switch and nxt.segment == x.dst
            elif type(x) is AwaitCredits:  # right before the segment's first send of the flow
                assert type(ins[j + 1]) is Send and ins[j + 1].flow == x.flow
            elif type(x) is Compute:
                op = registry.compute_op(x.op)
                if op.price is None:  # work x the op's cost key
                    assert x.cycles == x.work * tg.costs[op.cost]
                else:  # the op's own formula, over the computing kernel's parameters
                    assert x.cycles == op.price(tg.costs, x.work, params[x.kernel])
            elif type(x) is Send:
                assert x.cycles == math.ceil(x.nbytes / WAVELET_BYTES) * tg.costs["send_wavelet"]
        # end of flow: the class's last send of each flow in the step, and only that one
        sends = [x for x in ins if type(x) is Send]
        for f in {x.flow for x in sends}:
            flags = [x.last for x in sends if x.flow == f]
            assert flags == [False] * (len(flags) - 1) + [True]
        primed = Counter(x.flow for x in ins if type(x) is Recv and x.primed)
        assert dict(primed) == dict(cs.primed)


def test_op_cycles_prices_each_op_by_its_own_formula():
    """A plain op is work x its cost key; the attention merge is per head a max and two exps,
    then a multiply and an FMAC over each head's outputs and sum (hand-computed)."""
    costs = {"add": 0.5, "argmax": 1.0, "exp": 20.0, "mul": 0.25, "fmac": 0.125}
    param = {"head_dim": 16}.__getitem__
    assert op_cycles(costs, "add", 10, param) == 5.0
    # 2 heads x (16 outputs + max + sum) = 36 elements: 2 x (1 + 2 x 20) + 34 x (0.25 + 0.125)
    assert op_cycles(costs, "softmax_merge", 36, param) == 82.0 + 12.75
    # a core holding half a head (8 outputs + max + sum) still merges one head
    assert op_cycles(costs, "softmax_merge", 10, param) == 41.0 + 9 * 0.375


def test_the_test_builds_have_handshakes_markers_and_primed_recvs():
    """Keeps the other tests from passing vacuously."""
    sched = flatten(program("tiny_moe", "test32"), load_target("test32"))
    kinds = {type(x) for cs in sched.classes for x in cs.instrs}
    assert {AwaitCredits, RouteDrain, Notify, MarkerSync, MetaResolve, MetaProduce} <= kinds
    assert any(cs.primed for cs in sched.classes) and any(cs.grants for cs in sched.classes)


def test_unsafe_tables_drop_exactly_the_handshakes():
    p, tg = program("tiny_moe", "test32"), load_target("test32")
    safe, unsafe = flatten(p, tg), flatten(p, tg, handshakes=False)
    for a, b in zip(safe.classes, unsafe.classes, strict=True):
        assert tuple(x for x in a.instrs if not isinstance(x, HANDSHAKES)) == b.instrs
        assert b.grants == ()


def _expected_spans(sched, cs, steps: int) -> Counter:
    """What the interpreter's trace shows of one core running table `cs` for `steps` steps."""
    names: Counter = Counter()
    for x in cs.instrs:
        k = type(x)
        if k is Compute or k is MetaResolve or k is MetaProduce:
            names[x.op] += steps
        elif k is Sub:
            names[f"{x.kernel} {x.role}"] += steps
        elif k is Send:
            names["send " + sched.flows[x.flow]] += steps
        elif k is Recv:
            names["recv " + sched.flows[x.flow]] += steps
        elif k is MarkerSync:
            names["marker sync"] += steps
        elif k is Reconfigure:
            names[f"reconfigure {x.src}->{x.dst}"] += steps
    return names


@settings(max_examples=4, deadline=None)
@given(st.sampled_from(["tiny_dense", "tiny_moe"]), st.sampled_from(["test32", "test16"]),
       st.integers(0, 1 << 16), st.integers(1, 3))
def test_interpreter_runs_each_instruction_once_per_step(model, target, seed, steps):
    """Every core executes its class's table once per decode step, whatever the seed."""
    p, tg = program(model, target), load_target(target)
    sched = flatten(p, tg)
    res = MeshSim(p, tg, seed=seed, trace=True).run(steps)
    assert res.completed, res.summary()
    seen: list[Counter] = [Counter() for _ in res.cores]
    for core, _, name, _, _ in res.spans:
        seen[core][name.replace("wait ", "recv ", 1) if name.startswith("wait ") else name] += 1
    by_name = {cs.name: cs for cs in sched.classes}
    for (_, cname), got in zip(res.cores, seen, strict=True):
        assert got == _expected_spans(sched, by_name[cname], steps), cname
