"""Properties of the shared attributes and the plugin registration."""

import re
import subprocess
import sys

from hypothesis import given
from hypothesis import strategies as st
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin
from xdsl.parser import Parser
from xdsl.printer import Printer

from meshrt.dialects import get_all_dialects
from meshrt.dialects.mesh import CoreSetAttr, RectAttr, Resources, ResourceAttr

rects = st.builds(
    RectAttr,
    st.integers(0, 40),
    st.integers(0, 40),
    st.integers(1, 6),
    st.integers(1, 6),
    st.integers(1, 3),
    st.integers(1, 3),
)


def _ctx() -> Context:
    ctx = Context()
    ctx.load_dialect(Builtin)
    for factory in get_all_dialects().values():
        ctx.load_dialect(factory())
    return ctx


@given(st.lists(rects, min_size=1, max_size=4))
def test_core_set_prints_and_parses_back(rs):
    attr = CoreSetAttr(rs)
    import io

    out = io.StringIO()
    Printer(stream=out).print_attribute(attr)
    assert Parser(_ctx(), out.getvalue()).parse_attribute() == attr


@given(rects)
def test_rect_contains_exactly_its_cores(r):
    cores = set(r.cores())
    assert len(cores) == r.count
    x0, y0, x1, y1 = r.extent
    for x in range(x0 - 1, x1 + 1):
        for y in range(y0 - 1, y1 + 1):
            assert r.contains(x, y) == ((x, y) in cores)


@given(rects, rects)
def test_overlap_matches_core_enumeration(a, b):
    brute = bool(set(a.cores()) & set(b.cores()))
    assert CoreSetAttr(a).overlaps(CoreSetAttr(b)) == brute


def test_core_set_size_does_not_grow_with_area():
    small = CoreSetAttr.of(0, 0, 4, 4)
    huge = CoreSetAttr.of(0, 0, 762, 1172)
    assert len(str(huge)) - len(str(small)) <= 6  # a few more digits, nothing else
    assert huge.count == 762 * 1172


@given(st.builds(Resources, *[st.integers(0, 100)] * 7), st.builds(Resources, *[st.integers(0, 100)] * 7))
def test_resources_exceeded_names_every_field_over_budget(use, budget):
    over = {name for name, _, _ in use.exceeded(budget)}
    for name in ("colors", "iq", "oq", "routes", "switches", "sram", "ctrl"):
        assert (name in over) == (getattr(use, name) > getattr(budget, name))
    assert ResourceAttr(use).value == use


def test_plain_xdsl_opt_sees_meshrt_through_the_universe():
    src = (
        'graph.model @m target "t" mesh 4 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {\n'
        '  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<4>\n'
        "}\n"
    )
    out = subprocess.run(["xdsl-opt"], input=src, capture_output=True, text=True, check=True)
    assert "graph.embed @embed on <(0, 0, 2, 1)>" in out.stdout


def test_meshrt_opt_bad_input_is_one_line_without_traceback(tmp_path):
    bad = tmp_path / "bad.mlir"
    bad.write_text('graph.model @m target "t" mesh 4 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {\n  %x = graph.nope\n}\n')
    res = subprocess.run([sys.executable, "-m", "meshrt.tools.meshrt_opt", str(bad)], capture_output=True, text=True)
    assert res.returncode == 1
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr
    assert re.fullmatch(rf"{re.escape(str(bad))}:\d+:\d+: error: Operation graph.nope is not registered", lines[0])
