"""`meshrt viz`: what each picture draws is exactly what the IR says (checked
on the data functions, without pixels), the files are real PNG / SVG, and bad
input is one line and exit 1."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from xdsl.printer import Printer

from meshrt.dialects import mesh_kernel as mk
from meshrt.driver import load_model, program_of
from meshrt.kernels.expert_ffn.op import ExpertFFNOp
from meshrt.passes.pipeline import lower_to
from meshrt.routing import RectSet
from meshrt.targets import load_target
from meshrt.tools import viz
from meshrt.tools.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@cache
def program(model: str, level: str, target: str = "test32"):
    """A tiny model compiled once per test session to `level` (kernels / segments)."""
    module = load_model(str(REPO / "examples" / f"{model}.mrt"), target)
    return program_of(lower_to(module, level))


@cache
def segment_ir(tmp_dir: str) -> str:
    """tiny_moe's coloured segment IR printed to a file (what `meshrt viz IR` reads)."""
    path = Path(tmp_dir) / "tiny_moe.seg.mlir"
    with path.open("w") as f:
        Printer(stream=f).print_op(program("tiny_moe", "segments").parent_op())
        f.write("\n")
    return str(path)


@pytest.fixture(scope="module")
def seg_ir(tmp_path_factory) -> str:
    return segment_ir(str(tmp_path_factory.mktemp("viz")))


def _area(boxes) -> int:
    return sum(b.w * b.h for b in boxes)


# ---------------------------------------------------------------------------
# mapping
# ---------------------------------------------------------------------------


def test_mapping_boxes_are_the_kernels_tiles():
    prog = program("tiny_moe", "kernels")
    assert isinstance(prog, mk.ProgramOp)
    want = Counter((k.kernel_name, k.name.split(".", 1)[1], k.wafer_index, k.stage_index, *t)
                   for k in prog.kernels() for t in k.tiles())
    boxes = viz.mapping_boxes(prog)
    got = Counter((b.label, b.kind, b.wafer, b.stage, b.x, b.y, b.w, b.h) for b in boxes)
    assert got == want
    # the experts' regions are tiles of their own (8 per MoE layer), each
    # naming the experts the placement puts there
    experts = [b for b in boxes if b.kind == "expert_ffn"]
    assert len(experts) == 16
    for k in prog.kernels():
        if isinstance(k, ExpertFFNOp):
            mine = sorted((b for b in experts if b.label == k.kernel_name), key=lambda b: b.tile)
            assert [(b.x, b.y, b.w, b.h) for b in mine] == k.tiles()
            assert sorted(e for b in mine for e in b.experts) == list(range(len(k.expert_placement)))
            assert all(k.expert_placement[e] == b.tile for b in mine for e in b.experts)
    assert {b.label for b in boxes} == {k.kernel_name for k in prog.kernels()}


def test_mapping_from_segment_ir_matches_the_kernel_ir():
    # the event.kernel records kept in event / segment IR give the same picture
    a = viz.mapping_boxes(program("tiny_moe", "kernels"))
    b = viz.mapping_boxes(program("tiny_moe", "segments"))
    assert Counter(a) == Counter(b)


def test_stage_outlines_bound_each_stage():
    boxes = viz.mapping_boxes(program("tiny_moe", "kernels"))
    edges = viz.stage_outlines(boxes)
    stages = {(b.wafer, b.stage) for b in boxes}
    assert {(e.wafer, e.stage) for e in edges} == stages
    for wafer, stage in stages:
        cores = RectSet([(b.x, b.y, b.x + b.w, b.y + b.h) for b in boxes
                         if (b.wafer, b.stage) == (wafer, stage)])
        mine = [e for e in edges if (e.wafer, e.stage) == (wafer, stage)]
        # axis-parallel pieces on the stage's border: one side inside, the other outside
        for e in mine:
            assert e.x0 == e.x1 or e.y0 == e.y1
            if e.y0 == e.y1:
                inside = [cores.contains(x, e.y0) for x in range(e.x0, e.x1)]
                above = [cores.contains(x, e.y0 - 1) for x in range(e.x0, e.x1)]
                assert all(i != a for i, a in zip(inside, above))
            else:
                inside = [cores.contains(e.x0, y) for y in range(e.y0, e.y1)]
                left = [cores.contains(e.x0 - 1, y) for y in range(e.y0, e.y1)]
                assert all(i != a for i, a in zip(inside, left))
        # the outline's length is the perimeter of the stage's cores
        perimeter = sum(abs(e.x1 - e.x0) + abs(e.y1 - e.y0) for e in mine)
        want = sum(4 - sum(cores.contains(x + dx, y + dy) for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)))
                   for bx0, by0, bx1, by1 in cores for x in range(bx0, bx1) for y in range(by0, by1))
        assert perimeter == want


def test_one_rect_outline_is_its_four_sides():
    edges = viz.stage_outlines([viz.Box("k", "gemv", 0, 2, 3, 4, 5), viz.Box("j", "gemv", 0, 6, 3, 1, 5)])
    assert sum(abs(e.x1 - e.x0) + abs(e.y1 - e.y0) for e in edges) == 2 * (5 + 5)
    assert not any(e.x0 == e.x1 == 6 for e in edges)  # no seam between adjacent kernels


# ---------------------------------------------------------------------------
# classes
# ---------------------------------------------------------------------------


def test_class_boxes_cover_exactly_each_class():
    prog = program("tiny_moe", "segments")
    boxes = viz.class_boxes(prog)
    classes = prog.core_classes()
    assert {b.index for b in boxes} == set(range(len(classes)))
    for i, c in enumerate(classes):
        mine = [b for b in boxes if b.index == i]
        assert {b.name for b in mine} == {c.class_name}
        assert {b.wafer for b in mine} == {c.wafer_index}
        assert {b.segments for b in mine} == {len(c.segments())}
        drawn = RectSet([(b.x, b.y, b.x + b.w, b.y + b.h) for b in mine])
        assert drawn == RectSet.from_cores(c.cores)
        assert _area(mine) == c.cores.count  # pieces do not overlap
        assert all(c.cores.contains(b.x, b.y) and c.cores.contains(b.x + b.w - 1, b.y + b.h - 1)
                   for b in mine)
    # the classes partition the used cores: no core is drawn twice
    union = RectSet([(b.x, b.y, b.x + b.w, b.y + b.h) for b in boxes])
    assert union.count == _area(boxes) == sum(c.cores.count for c in classes)
    # fewer boxes than cores: the picture is per class, not per core (a class
    # repeated in every expert region, one column of each, is a box per region)
    assert len(boxes) < union.count / 2


# ---------------------------------------------------------------------------
# routes
# ---------------------------------------------------------------------------


def test_routes_of_one_colour_are_the_flows_on_it():
    prog = program("tiny_moe", "segments")
    routes = prog.routes()
    flows = {f.flow_name: f for f in prog.flows()}
    for color in sorted({r.color_id for r in routes}):
        boxes = viz.route_segments(prog, color=color)
        assert {b.color for b in boxes} == {color}
        want = {r.flow_name for r in routes if r.color_id == color}
        assert {b.flow for b in boxes} == want
        for r in routes:
            if r.color_id == color:
                mine = [b for b in boxes if b.flow == r.flow_name]
                assert RectSet([(b.x, b.y, b.x + b.w, b.y + b.h) for b in mine]) == RectSet.from_cores(r.via)
                assert {b.wafer for b in mine} == {flows[r.flow_name].wafer_index}
    everything = viz.route_segments(prog)
    assert {b.flow for b in everything} == {r.flow_name for r in routes}
    # arrows point from the senders towards the receivers
    for a in viz.flow_arrows(prog, color=2):
        f = flows[a.flow]
        assert f.src.extent[0] <= a.x0 <= f.src.extent[2] and f.dst.extent[1] <= a.y1 <= f.dst.extent[3]


def test_segment_filter_keeps_the_flows_live_in_that_segment():
    prog = program("tiny_moe", "segments")
    n = viz.max_segments(prog)
    assert n > 1  # on test32 some of tiny_moe's classes take several segments
    for s in range(n):
        live = set()
        for c in prog.core_classes():
            segs = c.segments()
            if s < len(segs):
                live |= set(segs[s].route_names())
        assert {b.flow for b in viz.route_segments(prog, segment=s)} == live
    with pytest.raises(viz.VizError, match="out of range"):
        viz.route_segments(prog, segment=n)
    with pytest.raises(viz.VizError, match="carries no flow"):
        viz.route_segments(prog, color=23)


# ---------------------------------------------------------------------------
# files and the command line
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("what, ext", [("mapping", "svg"), ("classes", "png"), ("routes", "svg"),
                                       ("mapping", "png")])
def test_pictures_are_written(what, ext, seg_ir, tmp_path, capsys):
    out = tmp_path / f"pic.{ext}"
    assert cli_main(["viz", seg_ir, "--what", what, "-o", str(out)]) == 0
    line = capsys.readouterr().out
    assert line.count("\n") == 1 and str(out) in line
    data = out.read_bytes()
    assert len(data) > 1000
    if ext == "png":
        assert data.startswith(PNG_MAGIC)
    else:
        assert ET.fromstring(data).tag.endswith("svg")


def test_color_filter_on_the_command_line(seg_ir, tmp_path, capsys):
    out = tmp_path / "c2.png"
    assert cli_main(["viz", seg_ir, "--what", "routes", "--color", "2", "--segment", "0",
                     "-o", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_MAGIC)
    n = len({b.flow for b in viz.route_segments(program("tiny_moe", "segments"), 2, 0)})
    assert f"{n} routed flows" in capsys.readouterr().out


def test_default_name_from_the_model(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert cli_main(["viz", str(REPO / "examples/tiny_moe.mrt"), "--target", "test32"]) == 0
    assert (tmp_path / "tiny_moe-mapping.png").read_bytes().startswith(PNG_MAGIC)
    assert "tiny_moe-mapping.png" in capsys.readouterr().out


@pytest.mark.parametrize("args, needle", [
    (["--what", "nope"], "invalid choice"),
    (["--what", "routes", "--color", "17"], "colour 17 carries no flow"),
    (["--what", "routes", "--segment", "5"], "--segment 5 is out of range"),
    (["--what", "mapping", "--color", "1"], "--color only applies to --what routes"),
    (["--wafer", "1"], "--wafer 1 is out of range"),
    (["--target", "test16"], "compiled for a 32 x 32 mesh, larger than the 16 x 16 cores of target 'test16'"),
    (["-o", "/nonexistent-dir/x.png"], "cannot write output"),
    (["-o", "pic.pdf"], ".png or .svg"),
])
def test_cli_errors_are_one_line(args, needle, seg_ir, capsys):
    rc = cli_main(["viz", seg_ir, *args])
    cap = capsys.readouterr()
    assert rc == 1 and cap.out == ""
    assert cap.err.count("\n") == 1 and needle in cap.err and "error" in cap.err
    assert "Traceback" not in cap.err


def test_cli_errors_without_compiling(capsys):
    # refused before any compilation: load on a wafer-scale target, a missing --target
    rc = cli_main(["viz", str(REPO / "examples/configs/gpt-oss-120b.json"), "--target", "wse3",
                   "--what", "load"])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "simulates every core" in err and "wse3" in err
    rc = cli_main(["viz", str(REPO / "examples/tiny_moe.mrt")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "--target is required" in err


def test_ir_without_a_program_is_one_line(tmp_path, capsys):
    path = tmp_path / "empty.mlir"
    path.write_text("builtin.module {\n}\n")
    rc = cli_main(["viz", str(path), "-o", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and err.startswith(f"{path}: error: no graph.model")


def test_uncoloured_segment_ir_is_refused_for_routes(tmp_path, capsys):
    # segment IR printed before color-routes: classes can be drawn, routes cannot
    from meshrt.passes.pipeline import run_pipeline

    module = lower_to(load_model(str(REPO / "examples/tiny_moe.mrt"), "test32"), "events")
    run_pipeline(module, "materialize-segments")
    path = tmp_path / "uncoloured.mlir"
    with path.open("w") as f:
        Printer(stream=f).print_op(module)
    assert cli_main(["viz", str(path), "--what", "classes", "-o", str(tmp_path / "c.png")]) == 0
    capsys.readouterr()
    rc = cli_main(["viz", str(path), "--what", "routes", "-o", str(tmp_path / "r.png")])
    err = capsys.readouterr().err
    assert rc == 1 and err.count("\n") == 1 and "needs coloured segment IR" in err
    assert err.startswith(f"{path}: error:")


def test_cli_error_in_a_subprocess(seg_ir):
    # the installed command: one line on stderr, exit 1, no traceback
    r = subprocess.run([sys.executable, "-m", "meshrt.tools.cli", "viz", seg_ir, "--what", "routes",
                        "--color", "17"], capture_output=True, text=True, cwd=REPO, check=False)
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "colour 17 carries no flow" in r.stderr
    assert r.stderr.startswith(f"{seg_ir}: error:")


# ---------------------------------------------------------------------------
# load
# ---------------------------------------------------------------------------


def test_load_map_fractions():
    prog = program("tiny_dense", "segments")
    load = viz.load_map(prog, load_target("test32"), steps=3, seed=1)
    assert load.completed and load.steps == 3 and load.cycles > 0
    used = RectSet()
    for c in prog.core_classes():
        used = used | RectSet.from_cores(c.cores)
    mask = ~np.isnan(load.busy[0])
    assert int(mask.sum()) == used.count
    for x0, y0, x1, y1 in used:  # values exactly on the classes' cores
        assert mask[y0:y1, x0:x1].all()
    for a in (load.busy, load.waiting):
        vals = a[~np.isnan(a)]
        assert ((vals >= 0) & (vals <= 1)).all()
    busy, waiting = load.busy[0][mask], load.waiting[0][mask]
    assert (busy + waiting <= 1 + 1e-9).all() and busy.max() > 0 and waiting.max() > 0


def test_load_picture_on_test32(tmp_path, capsys):
    out = tmp_path / "load.png"
    rc = cli_main(["viz", str(REPO / "examples/tiny_dense.mrt"), "--target", "test32", "--what", "load",
                   "--steps", "2", "--seed", "3", "-o", str(out)])
    assert rc == 0, capsys.readouterr().err
    assert out.read_bytes().startswith(PNG_MAGIC)
    assert "over 2 steps" in capsys.readouterr().out
