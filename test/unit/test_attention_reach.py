"""Attention costs the context a slot has reached, not the ring's capacity: its loops over
KV rows end at the rows the micro-batch's queries reach (`pe.py`'s `reach`), and the
interpreter charges `qk`, `exp` and `av` that share of their static work
(`KernelExec.reached`)."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import numpy as np
import pytest

from meshrt import driver
from meshrt.runtime.serving import serve
from meshrt.runtime.workloads import Request

REPO = Path(__file__).resolve().parents[2]
OVER_KV_ROWS = ("qk", "exp", "av")


@cache
def attention_cycles(context: int) -> tuple[int, bool]:
    """tiny_dense on test32 with `context` KV positions a slot, two requests of 9
    positions: (cycles of attention's compute over every core, tokens match NumPy)."""
    t = driver.load_target("test32")
    prog = driver.segment_program(driver.load_model(REPO / "examples" / "tiny_dense.mrt", t, context=context), t)
    rng = np.random.default_rng(3)
    reqs = [Request(i, 0.0, rng.integers(2, 256, 5).tolist(), 5, 4, 4) for i in range(2)]
    res = serve(prog, t, reqs, trace=True)
    return sum(e - s for _, _, name, s, e in res.sim.spans if name in OVER_KV_ROWS), not res.mismatches


def test_attention_work_does_not_grow_with_the_capacity():
    """The same requests with four times the KV capacity a slot: the rows are spread over
    the same cores, the work is the same (jitter apart). Charged by capacity, it was 2.9x."""
    small, ok_small = attention_cycles(12)
    large, ok_large = attention_cycles(48)
    assert ok_small and ok_large
    assert 0.9 < large / small < 1.1, (small, large)


@pytest.mark.parametrize("positions, reach", [((0,), 1 / 32), ((15,), 16 / 32), ((15, 31), 1.0),
                                              ((3, 40), (4 + 16) / 32), ((), 0.0)])
def test_a_cores_share_is_the_rows_its_queries_reach(positions, reach):
    """`Attention.reached` on a core holding ring entries 0..15 of 32 (`reach`: of a
    micro-batch of two rows), then 16..31: a query at p reaches the entries up to p (all
    once the ring wrapped); idle rows none."""
    from types import SimpleNamespace

    from meshrt.kernels.attention.numerics import Attention

    for first, held in ((0, 16), (16, 16)):
        a = Attention.__new__(Attention)
        a.b, a.max_seq, a.bodies = 2, 32, None  # the numerics path (PE bodies count it themselves)
        a._entries = lambda *_: np.arange(first, first + held)
        a.grid_pos = lambda cd: (0, 0, 0, 1, 1)
        a.where = lambda cd: "here"
        slots = [SimpleNamespace(rid=k, pos=p) for k, p in enumerate(positions)]
        slots += [SimpleNamespace(rid=-1, pos=0)] * (2 - len(slots))
        a._table = lambda cd, where: SimpleNamespace(slots=slots)
        got = a.reached(None, "qk")
        want = sum(min(held, max(0, min(p + 1, 32) - first)) for p in positions) / (2 * held)
        assert got == pytest.approx(want)
        if first == 0:
            assert got == pytest.approx(reach)
