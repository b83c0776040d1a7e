"""The CSL backend: every example and config emits lint-clean CSL on both
archs, allocation stays within the target's limits (and over-allocation is a
located error), each program runs its class's event table, routes match the
core-by-core definition, and output size grows with classes, not area."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin

from meshrt.backend.csl import FILE_MARK, emit_csl, percore
from meshrt.backend.csl import alloc as al
from meshrt.backend.csl.check import agreement
from meshrt.backend.csl.model import read_program, segment_programs
from meshrt.backend.csl.routes import reference_pairs
from meshrt.backend.csl_lint import check_csl
from meshrt.diagnostics import MeshrtError, parse_module
from meshrt.dialects import get_all_dialects
from meshrt.dialects.mesh import CoreSetAttr, RectAttr
from meshrt.passes.pipeline import lower_to
from meshrt.targets import load_target
from meshrt.tools.cli import compile_model

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = ["examples/tiny_dense.mrt", "examples/tiny_moe.mrt"]
CONFIGS = sorted(str(p.relative_to(REPO)) for p in (REPO / "examples" / "configs").glob("*.json"))

_LOWERED: dict[tuple[str, str], object] = {}


def lowered(model: str, target: str):
    key = (model, target)
    if key not in _LOWERED:
        _LOWERED[key] = lower_to(compile_model(str(REPO / model), target), "csl")
    return _LOWERED[key]


def _lint_one(item: tuple[str, str]) -> list[str]:
    name, text = item
    return check_csl(text, name)


def lint_all(files: dict[str, str], parallel: bool = False) -> list[str]:
    items = [(n, t) for n, t in files.items() if n.endswith(".csl")]
    if parallel and len(items) > 50:
        with ProcessPoolExecutor(max_workers=max(2, os.cpu_count() or 2)) as pool:
            results = pool.map(_lint_one, items, chunksize=16)
            return [e for r in results for e in r]
    return [e for item in items for e in _lint_one(item)]


def check_allocation(module, out, arch: str | None) -> None:
    """Every class's allocation fits the target and is internally consistent."""
    for op in segment_programs(module):
        program = read_program(op)
        target = load_target(program.target)
        a = arch or (program.target if program.target in ("wse2", "wse3") else "wse3")
        lim = al.limits(program, target, a)
        marker = al.marker_task_id(program, lim)
        reserved_tasks = set(target.reserved_task_ids)
        for cls in program.classes:
            alloc = al.allocate(cls, program, lim, marker)
            for cols in alloc.colors_per_segment:
                assert len(cols) <= len(lim.user_colors)
                assert set(cols) <= set(lim.user_colors), "a memcpy colour was handed out"
            for plan, queues in ((alloc.iq, lim.iq), (alloc.oq, lim.oq)):
                assert plan.peak <= len(queues)
                for mapping in plan.per_segment:
                    assert set(mapping.values()) <= set(queues)
                    assert len(set(mapping.values())) == len(mapping), "two colours on one queue"
            tasks = [alloc.step_task, *alloc.data_tasks.values()]
            assert not reserved_tasks & set(tasks)
            assert alloc.step_task not in alloc.data_tasks.values()
            if a == "wse3":
                assert 8 <= alloc.step_task <= 30
                assert all(t < 8 for t in alloc.data_tasks.values())
            else:
                assert alloc.step_task not in alloc.colors
            assert alloc.marker_task == marker
            assert alloc.dsr_rx != alloc.dsr_tx


# ---------------------------------------------------------------------------
# Every example and config, both archs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["wse2", "wse3"])
@pytest.mark.parametrize("target", ["wse2", "wse3", "test32", "test16"])
@pytest.mark.parametrize("model", EXAMPLES)
def test_examples_emit_lint_clean_csl(model, target, arch):
    module = lowered(model, target)
    out = emit_csl(module, arch)
    assert lint_all(out.files) == []
    assert agreement(module, out) == []
    check_allocation(module, out, arch)
    program = read_program(segment_programs(module)[0])
    wafers = program.wafers
    # One program per core class (never per core), plus layout, shared module and host files.
    programs = [n for n in out.files if re.search(r"(^|/)c_\w+\.csl$", n)]
    assert len(programs) == len(program.classes)
    assert sum(n.endswith("layout.csl") for n in out.files) == wafers
    assert {"compile.sh", "run.py", "report.txt"} <= set(out.files)
    assert f"--arch={arch}" in out.files["compile.sh"]


@pytest.mark.parametrize("target", ["wse2", "wse3"])
@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: Path(p).stem)
def test_configs_emit_lint_clean_csl(config, target):
    module = lowered(config, target)
    out = emit_csl(module)
    assert lint_all(out.files, parallel=True) == []
    assert agreement(module, out) == []
    check_allocation(module, out, None)
    _LOWERED.pop((config, target), None)  # large; not needed again


# ---------------------------------------------------------------------------
# Allocation report and errors
# ---------------------------------------------------------------------------


def test_per_class_report_and_program_headers():
    module = lowered("examples/tiny_moe.mrt", "test32")
    out = emit_csl(module)
    program = read_program(segment_programs(module)[0])
    report = out.files["report.txt"]
    rows = [line.split()[0] for line in out.table[1:]]
    assert rows == [c.name for c in program.classes]
    assert out.table[0].split()[:4] == ["class", "wafer", "cores", "segs"]
    assert "Not checked: compilation by cslc, timing, or execution on a simulator" in report
    for cls in program.classes:
        text = out.files[cls.file]
        header = text[:text.index("param memcpy_params")]
        for resource in ("colours", "input queues", "output queues", "data task ids",
                         "local task ids", "control task ids", "DSRs (dest/src1)", "SRAM bytes"):
            assert f"//   {resource}" in header, (cls.name, resource)


def _module(text: str):
    ctx = Context(allow_unregistered=False)
    ctx.load_dialect(Builtin)
    for name, factory in get_all_dialects().items():
        ctx.register_dialect(name, factory)
    return parse_module(ctx, text, "<test>")


GATHER = """
segment.program @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 16
  event.flow @b kernel @k wafer 0 from <(0, 1, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  event.flow @c kernel @k wafer 0 from <(0, 2, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  event.flow @d kernel @k wafer 0 from <(0, 3, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  segment.core_class @s wafer 0 cores <(0, 0, 1, 4)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a, @b, @c, @d] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 16 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 4, iq = 1> routes [@a, @b, @c, @d] {
      event.sub @k "dst" after [] demand <colors = 4, iq = 1> {
        RECVS
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 2, 1)>
  segment.route @b color 1 via <(0, 0, 2, 2)>
  segment.route @c color 2 via <(0, 0, 2, 3)>
  segment.route @d color 3 via <(0, 0, 2, 4)>
}
"""


def test_over_allocation_is_a_located_error():
    recvs = "\n".join(f"event.recv @{f} bytes 16 meta 0" for f in "abcd")
    module = _module(GATHER.replace("RECVS", recvs))
    with pytest.raises(MeshrtError) as e:
        emit_csl(module, "wse3")
    msg = str(e.value)
    assert "core class @r needs 4 input queues at once but wse3 on target test32 has 3" in msg
    assert msg.startswith("<test>:") and "'segment.core_class' op" in msg
    # Three flows fit: queues 1, 2, 3.
    recvs = "\n".join(f"event.recv @{f} bytes 16 meta 0" for f in "abc")
    out = emit_csl(_module(GATHER.replace("RECVS", recvs)), "wse3")
    assert re.search(r"//   input queues +3 +3  ids 1, 2, 3\n", out.files["c_r.csl"])


def test_no_local_task_id_left_is_an_error():
    module = lowered("examples/tiny_moe.mrt", "test32")
    program = read_program(segment_programs(module)[0])
    target = load_target("test32").with_overrides(task_ids=8, reserved_task_ids=(6, 7))
    lim = al.limits(program, target, "wse3")
    with pytest.raises(MeshrtError, match=r"needs 1 local task IDs but wse3 on target test32 has 0"):
        al.allocate(program.classes[0], program, lim, None)
    # wse2 takes local IDs from 0..30 minus the class's colours: there are some.
    al.allocate(program.classes[0], program, al.limits(program, target, "wse2"), None)


def test_queue_rebinding_restores_comptime_bindings_at_the_loop():
    module = lowered("examples/tiny_moe.mrt", "test32")
    program = read_program(segment_programs(module)[0])
    lim = al.limits(program, load_target("test32"), "wse3")
    for cls in program.classes:
        a = al.allocate(cls, program, lim, None)
        bound = dict(a.iq.initial)
        for s in range(len(cls.segments)):
            for q, c in a.iq.rebinds.get(s, []) if s else []:
                bound[q] = c
            for c, q in a.iq.per_segment[s].items():
                assert bound[q] == c, (cls.name, s, q, c)
        for q, c in a.iq.rebinds.get(0, []):
            bound[q] = c
        if len(cls.segments) > 1:
            assert bound == a.iq.initial


# ---------------------------------------------------------------------------
# Routes: boxes against the core-by-core definition
# ---------------------------------------------------------------------------


class _FakeFlow:
    def __init__(self, pattern, src, dst, offset=(0, 0)):
        from xdsl.dialects.builtin import StringAttr

        self.pattern = StringAttr(pattern)
        self.src, self.dst, self.offset = src, dst, offset
        self.crosses_wafer = False


def _rect(draw, w, h):
    x = draw(st.integers(0, w - 1))
    y = draw(st.integers(0, h - 1))
    return RectAttr(x, y, draw(st.integers(1, w - x)), draw(st.integers(1, h - y)))


@st.composite
def flows(draw):
    w, h = 9, 7
    pattern = draw(st.sampled_from(["shift", "all", "row", "col"]))
    src = draw(st.lists(st.builds(lambda: None), min_size=1, max_size=2))
    srcs = [_rect(draw, w, h) for _ in src]
    if pattern == "shift":
        dx = draw(st.integers(-3, 3))
        dy = draw(st.integers(-3, 3).filter(lambda v: v != 0)) if dx == 0 else draw(st.integers(-3, 3))
        srcs = [r for r in srcs if 0 <= r.x.data + dx and r.x.data + r.w.data + dx <= w
                and 0 <= r.y.data + dy and r.y.data + r.h.data + dy <= h]
        if not srcs:
            srcs = [RectAttr(max(0, -dx), max(0, -dy), 1, 1)]
        dsts = [RectAttr(r.x.data + dx, r.y.data + dy, r.w.data, r.h.data) for r in srcs]
        return _FakeFlow("shift", CoreSetAttr(srcs), CoreSetAttr(dsts), (dx, dy)), w, h
    dsts = [_rect(draw, w, h) for _ in range(draw(st.integers(1, 2)))]
    return _FakeFlow(pattern, CoreSetAttr(srcs), CoreSetAttr(dsts)), w, h


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(flows())
def test_router_configs_match_core_by_core_xy_trees(case):
    from meshrt.backend.csl.routes import flow_router_configs

    flow, w, h = case
    got: dict[tuple[int, int], set] = {}
    for box, cfg in flow_router_configs(flow, w, h):
        for x in range(box[0], box[2]):
            for y in range(box[1], box[3]):
                assert (x, y) not in got, "overlapping boxes"
                got[(x, y)] = set(cfg.pairs)
    senders = {c for r in flow.src.rects for c in r.cores()}
    receivers = {c for r in flow.dst.rects for c in r.cores()}
    want = reference_pairs(flow.pattern.data, sorted(senders), sorted(receivers), flow.offset)
    assert got == want


def _eval_expr(expr: str, px: int, py: int) -> int:
    py_expr = expr.replace(" and ", " and ").replace("true", "True")
    # CSL `if (c) a else b` -> Python `(a if c else b)`, right-nested.
    while True:
        m = re.search(r"if \(([^()]*)\) (\S+) else ", py_expr)
        if not m:
            break
        rest = py_expr[m.end():]
        py_expr = py_expr[:m.start()] + f"({m.group(2)} if {m.group(1)} else {rest})"
    return eval(py_expr, {}, {"px": px, "py": py})  # noqa: S307 - test of generated arithmetic


def test_per_core_expressions_pick_the_core_value():
    boxes = [(0, 0, 4, 2), (0, 5, 4, 6)]
    pieces = [((1, 0, 3, 2), 5), ((0, 5, 2, 6), 9), ((3, 5, 4, 6), 0x110)]
    expr = percore.expr(pieces, boxes, 0)
    for b in boxes:
        for x in range(b[0], b[2]):
            for y in range(b[1], b[3]):
                want = next((v for p, v in pieces if p[0] <= x < p[2] and p[1] <= y < p[3]), 0)
                assert _eval_expr(expr, x, y) == want, (x, y, expr)
    assert percore.expr([((0, 0, 4, 2), 7), ((0, 5, 4, 6), 7)], boxes) == "7"


# ---------------------------------------------------------------------------
# Size grows with classes, not with the area they cover
# ---------------------------------------------------------------------------


SCALED = """
segment.program @m target "wse3" mesh 762 x 1172 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 21, iq = 6, oq = 6, routes = 24, switches = 4, sram = 23552, ctrl = 1024> colors 24 reserved [21, 22, 23] {
  event.flow @f kernel @k wafer 0 from <(0, 0, W, H)> to <(W, 0, W, H)> pattern "shift" by W, 0 bytes 64
  event.flow @g kernel @k wafer 0 from <(W, 0, W, 1)> to <(W, 1, W, HM)> pattern "col" bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, W, H)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@f] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @f bytes 64 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(W, 0, W, H)> {
    segment.segment 0 use <colors = 2, iq = 2, oq = 1> routes [@f, @g] {
      event.sub @k "dst" after [] demand <colors = 2, iq = 2, oq = 1> {
        event.recv @f bytes 64 meta 0
        event.compute "add" work 16
      }
    }
  }
  segment.route @f color 0 via <(0, 0, W2, H)>
  segment.route @g color 1 via <(W, 0, W, H)>
}
"""


def _scaled(w: int, h: int) -> dict[str, str]:
    text = (SCALED.replace("W2", str(2 * w)).replace("HM", str(h - 1))
            .replace("W", str(w)).replace("H", str(h)))
    return emit_csl(_module(text), "wse3").files


def test_csl_size_grows_with_classes_not_area():
    # Same classes and flows over 600 vs 150,000 cores: the same statements.
    small, large = _scaled(20, 30), _scaled(300, 500)
    assert set(small) == set(large)
    for name in small:
        if name.endswith(".csl"):
            assert len(small[name].splitlines()) == len(large[name].splitlines()), name
            assert lint_all({name: large[name]}) == []


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _meshrt(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshrt.tools.cli", *args], capture_output=True,
                          text=True, cwd=REPO)


def test_cli_writes_a_directory_or_prints_files(tmp_path):
    out = tmp_path / "csl"
    r = _meshrt("compile", "examples/tiny_moe.mrt", "--target", "wse3", "--emit", "csl", "-o", str(out))
    assert r.returncode == 0, r.stderr
    names = {p.name for p in out.iterdir()}
    assert {"layout.csl", "meshrt_rt.csl", "compile.sh", "run.py", "report.txt"} <= names
    assert os.access(out / "compile.sh", os.X_OK)
    for p in out.glob("*.csl"):
        assert check_csl(p.read_text(), str(p)) == []
    r = _meshrt("compile", "examples/tiny_moe.mrt", "--target", "wse3", "--emit", "csl")
    assert r.returncode == 0
    printed = [line[len(FILE_MARK):] for line in r.stdout.splitlines() if line.startswith(FILE_MARK)]
    assert set(printed) == names
    r = _meshrt("compile", "examples/tiny_moe.mrt", "--target", "wse3", "--emit", "csl", "--report")
    assert r.returncode == 0 and FILE_MARK not in r.stdout
    assert r.stdout.splitlines()[0].split()[:2] == ["class", "wafer"]


def test_cli_errors_are_one_line(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    r = _meshrt("compile", "examples/tiny_moe.mrt", "--target", "wse3", "--emit", "csl", "-o", str(f))
    assert r.returncode == 1
    assert r.stderr.count("\n") == 1 and "writes a directory" in r.stderr
    assert "Traceback" not in r.stderr
    r = _meshrt("compile", "examples/tiny_moe.mrt", "--target", "wse3", "--report")
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "only applies to --emit csl" in r.stderr


def test_host_files_are_valid_scripts(tmp_path):
    import ast

    out = emit_csl(lowered("examples/tiny_moe.mrt", "test16"))  # two wafers
    ast.parse(out.files["run.py"])
    (tmp_path / "compile.sh").write_text(out.files["compile.sh"])
    assert subprocess.run(["bash", "-n", str(tmp_path / "compile.sh")]).returncode == 0
    assert out.files["compile.sh"].count("cslc --arch=wse3 ./wafer") == 2
