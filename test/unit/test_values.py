"""The CSL programs' value plan (meshrt.backend.csl.values): where each kernel value is
held when a compute reads it.

Checked by a second, backward reading of each class's events: from every compute
that reads an operand, the latest earlier event that wrote the buffer the plan names
must have put that operand's value there (a receive of a flow carrying it, the
compute of its kernel, a chain's result coming back up, or a save of it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrt.backend.csl import emit_csl, program
from meshrt.backend.csl.values import KEEPS_Y, save_buffer
from meshrt.dialects.mesh import FlowRole
from meshrt.driver import load_model
from meshrt.passes.pipeline import lower_to

REPO = Path(__file__).resolve().parents[2]


def _plans(model: str, target: str, monkeypatch):
    """(program view, class, value plan) of every class of `model` on `target`."""
    seen = []
    emit = program.ProgramWriter.emit

    def keep(self):
        seen.append((self.p, self.cls, self.values))
        return emit(self)

    monkeypatch.setattr(program.ProgramWriter, "emit", keep)
    emit_csl(lower_to(load_model(str(REPO / model), target), "csl"))
    return seen


def _defines(p, sub, e, step):
    """{buffer: value} an event leaves in the buffers (before any save it makes)."""
    if e.kind == "recv":
        flow = p.flows[e.flow]
        value = None
        if flow.role is FlowRole.UP:  # a reduction's result; a norm's inverse RMS is none
            rec = p.records[sub.kernel]
            value = None if rec.kind.data == "elementwise" and rec.param("kind") == "rmsnorm" else sub.kernel
        elif flow.role is FlowRole.INPUT and flow.op.operand is not None:
            value = p.records[flow.kernel].input_names[flow.op.operand.value.data]
        return {step.target: value}
    if e.kind == "compute":
        out = {}
        if step.promote is not None:
            out["x"] = ("copy", step.promote)
        if e.name not in KEEPS_Y:
            out["y"] = sub.kernel
        return out
    return {}


def _held(history, i, buf):
    """The value buffer `buf` holds just before event `i` (history: (sub, event, step))."""
    for j in range(i - 1, -1, -1):
        p, sub, e, step = history[j]
        for src, into, _ in step.saves:
            if into == buf:
                return _held(history, j + 1, src) if src != buf else None
        d = _defines(p, sub, e, step)
        if buf in d:
            v = d[buf]
            if isinstance(v, tuple):  # a promotion: what its source held then
                return _held(history, j, v[1])
            return v
    return None


@pytest.mark.parametrize("model,target", [("examples/tiny_dense.mrt", "test32"),
                                          ("examples/tiny_moe.mrt", "test32"),
                                          ("examples/tiny_moe.mrt", "wse3")])
def test_every_operand_is_read_where_its_value_is(model, target, monkeypatch):
    checked = saved = 0
    for p, cls, plan in _plans(model, target, monkeypatch):
        history = [(p, sub, e, plan.step(e)) for seg in cls.segments for sub in seg.subs for e in sub.events]
        alias = {sub.kernel: p.records[sub.kernel].input_names[0] for seg in cls.segments
                 for sub in seg.subs if not sub.events and sub.kernel in p.records}
        for i, (_, sub, e, step) in enumerate(history):
            saved += len(step.saves)
            if e.kind != "compute":
                continue
            inputs = p.records[sub.kernel].input_names
            for k, buf in enumerate(step.operands):
                if buf is None:
                    continue
                want = inputs[k]
                # x after a promotion: what the promoted buffer held
                got = _held(history, i, step.promote if buf == "x" and step.promote else buf)
                assert got in (want, alias.get(want)), (
                    f"{cls.name}: @{sub.kernel} {e.name} reads operand {k} (@{want}) from {buf}, "
                    f"which holds @{got}")
                checked += 1
    assert checked > 20
    if model.endswith("tiny_dense.mrt"):
        assert saved > 0  # the residuals are kept from the start of the layer


def test_the_residual_add_reads_the_reduced_value_and_the_kept_input(monkeypatch):
    """On a core at the edge of the o projection's reduction, the reduced value comes back
    into p; the layer's input came into x at the layer's start and was overwritten since.
    The old program added its own unreduced partial (in y) to x."""
    for p, cls, plan in _plans("examples/tiny_dense.mrt", "test32", monkeypatch):
        if cls.name != "l0_add2.tile":
            continue
        steps = {(sub.kernel, e.name): plan.step(e) for seg in cls.segments for sub in seg.subs
                 for e in sub.events if e.kind == "compute"}
        assert steps["l0_add1", "add"].operands == (save_buffer("handoff_s0"), "p")
        assert steps["l0_add2", "add"].operands == (save_buffer("l0_add1"), "p")
        assert plan.saved == {save_buffer("handoff_s0"): 8, save_buffer("l0_add1"): 8}  # 2 slots x 4
        return
    pytest.fail("no class l0_add2.tile")


def test_a_norms_inverse_rms_coming_back_up_is_not_kept_as_its_value(monkeypatch):
    """The root of an RMSNorm column sends its inverse RMS back up, not the norm's output:
    the plan does not hold the norm's value there, so nothing keeps the chain's message as
    it (the old plan did, sized by the longest message on the shared chain flow)."""
    norms = 0
    for p, cls, plan in _plans("examples/tiny_moe.mrt", "test32", monkeypatch):
        for seg in cls.segments:
            for sub in seg.subs:
                rec = p.records.get(sub.kernel)
                if rec is None or rec.param("kind") != "rmsnorm":
                    continue
                for e in sub.events:
                    if e.kind == "recv" and p.flows[e.flow].role is FlowRole.UP:
                        norms += 1
                        assert plan.step(e).holds is None and not plan.step(e).saves, (cls.name, e.flow)
    assert norms > 0
