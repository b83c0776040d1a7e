"""The compiler driver (meshrt.driver): any source to any level, the Target passed along."""

from __future__ import annotations

import io
import subprocess
import sys
import re
from functools import cache
from pathlib import Path

import pytest
from xdsl.printer import Printer

from meshrt import driver
from meshrt.backend.csl import emit_csl
from meshrt.diagnostics import MeshrtError
from meshrt.frontend.errors import FrontendError
from meshrt.passes.pipeline import LEVEL_PIPELINES, pipeline_between
from meshrt.targets import TARGET_DIR
from meshrt.tools.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
TINY_DENSE = str(REPO / "examples" / "tiny_dense.mrt")
TINY_MOE = str(REPO / "examples" / "tiny_moe.mrt")
IR_LEVELS = ("graph", "kernels", "events", "segments")


def _text(module) -> str:
    out = io.StringIO()
    Printer(stream=out).print_op(module)
    return out.getvalue() + "\n"


@cache
def _straight(model: str, target: str, level: str) -> str:
    return _text(driver.compile(model, target, level))


def _user_target(tmp_path: Path, base: str = "test32", name: str = "my-chip") -> Path:
    """A copy of a bundled target whose `name` is neither a bundled one nor its path."""
    text = (TARGET_DIR / f"{base}.toml").read_text()
    text, n = re.subn(r'^name = "[^"]*"', f'name = "{name}"', text, flags=re.MULTILINE)
    assert n == 1
    path = tmp_path / "chip.toml"
    path.write_text(text)
    return path


# -- restarting from printed IR ------------------------------------------------


@pytest.mark.parametrize("model, target", [(TINY_MOE, "test32"), (TINY_DENSE, "test16")])
@pytest.mark.parametrize("start", IR_LEVELS)
def test_restart_from_printed_ir_gives_the_same_segments(model, target, start):
    printed = _straight(model, target, start)
    module = driver.parse_ir(printed, f"{start}.mlir")
    assert driver.level_of(module) == start
    assert _text(driver.lower(module, "segments")) == _straight(model, target, "segments")


@pytest.mark.parametrize("start", ["kernels", "events"])
def test_restart_reaches_every_later_level(start, tmp_path):
    """kernels -> events and events -> segments from files, as the runtime reads them."""
    later = IR_LEVELS[IR_LEVELS.index(start) + 1]
    path = tmp_path / f"{start}.mlir"
    path.write_text(_straight(TINY_MOE, "test32", start))
    assert _text(driver.compile(str(path), to=later)) == _straight(TINY_MOE, "test32", later)


def test_restart_from_events_gives_the_same_csl():
    straight = emit_csl(driver.compile(TINY_DENSE, "test16", "csl")).files
    module = driver.parse_ir(_straight(TINY_DENSE, "test16", "events"), "events.mlir")
    assert emit_csl(driver.compile(module, to="csl")).files == straight


def test_segment_program_of_ir_is_the_compiled_one(tmp_path):
    path = tmp_path / "seg.mlir"
    path.write_text(_straight(TINY_DENSE, "test16", "segments"))
    program = driver.segment_program(str(path))
    assert program.name == "segment.program" and program.target.data == "test16"
    assert driver.target_of(program).name == "test16"
    assert _text(program.parent_op()) == _straight(TINY_DENSE, "test16", "segments")


def test_pipeline_between_levels():
    assert pipeline_between("graph", "segments") == LEVEL_PIPELINES["segments"]
    assert pipeline_between("kernels", "events") == "synthesize-schedules"
    assert pipeline_between("events", "events") == ""
    assert pipeline_between("segments", "csl") == "check-segments{handshakes=true},lower-to-pe"
    assert pipeline_between("segments", "pe") == "check-segments{handshakes=true},lower-to-pe"
    # the PE level keeps its segment program: restarting from it only checks it
    assert pipeline_between("pe", "csl") == "check-segments{handshakes=true}"
    assert pipeline_between("pe", "segments") == "check-segments{handshakes=true}"
    assert pipeline_between("graph", "pe") == LEVEL_PIPELINES["segments"] + ",lower-to-pe"
    with pytest.raises(ValueError, match="cannot take segments IR up to the kernels level"):
        pipeline_between("segments", "kernels")


def test_bad_sources_are_one_line_errors(tmp_path):
    with pytest.raises(FrontendError, match="needs a target"):
        driver.compile(TINY_DENSE)
    with pytest.raises(FrontendError, match="no such model file"):
        driver.compile(str(tmp_path / "missing.mrt"), "test32")
    path = tmp_path / "events.mlir"
    path.write_text(_straight(TINY_DENSE, "test16", "events"))
    with pytest.raises(MeshrtError, match="not on IR"):
        driver.compile(str(path), micro_batch=2)
    empty = tmp_path / "empty.mlir"
    empty.write_text("builtin.module {\n}\n")
    with pytest.raises(MeshrtError, match=r"empty\.mlir: error: no graph\.model"):
        driver.read_ir(empty)


# -- a user target file given by path, at every level -----------------------------


def test_user_target_by_path_in_the_driver(tmp_path):
    """The Target object reaches every pass: the IR keeps the file's `name`
    and records the file and its digest, and is otherwise the bundled
    target's IR."""
    path = _user_target(tmp_path, "test16")
    target = driver.load_target(path)
    assert target.name == "my-chip" and target.digest == driver.load_target("test16").digest
    header = f'target "my-chip" file "{path.resolve()}" digest "{target.digest}"'
    for level in IR_LEVELS:
        text = _text(driver.compile(TINY_DENSE, target, level))
        assert text == _straight(TINY_DENSE, "test16", level).replace('target "test16"', header)
    # Printed IR that names a target no loader knows (and records no file);
    # given the Target it goes on.
    events = driver.parse_ir(_straight(TINY_DENSE, "test16", "events").replace(
        'target "test16"', 'target "my-chip"'), "events.mlir")
    with pytest.raises(MeshrtError, match="unknown target 'my-chip'"):
        driver.lower(events.clone(), "segments")
    driver.lower(events, "segments", target)


@pytest.mark.parametrize("level", [*IR_LEVELS, "csl"])
def test_cli_compile_user_target_by_path(level, tmp_path, capsys):
    path = _user_target(tmp_path)
    out = tmp_path / "out"
    rc = cli_main(["compile", TINY_DENSE, "--target", str(path), "--emit", level, "-o", str(out)])
    cap = capsys.readouterr()
    assert rc == 0 and cap.err == "", cap.err
    if level == "csl":
        assert (out / "layout.csl").is_file() and (out / "compile.sh").is_file()
    else:
        assert 'target "my-chip"' in out.read_text()


def test_cli_run_user_target_by_path(tmp_path, capsys):
    path = _user_target(tmp_path, "test16")
    args = ["--target", str(path), "--requests", "1", "--json"]
    assert cli_main(["run", TINY_DENSE, *args]) == 0, capsys.readouterr().err
    assert '"outputs_match_reference": true' in capsys.readouterr().out
    # and from printed IR of the events level, which names the target "my-chip"
    ir = tmp_path / "events.mlir"
    assert cli_main(["compile", TINY_DENSE, "--target", str(path), "--emit", "events",
                     "-o", str(ir)]) == 0
    assert cli_main(["run", str(ir), *args]) == 0, capsys.readouterr().err
    assert '"outputs_match_reference": true' in capsys.readouterr().out
    # without --target, the IR finds the file it records again ...
    assert cli_main(["run", str(ir), "--requests", "1", "--json"]) == 0, capsys.readouterr().err
    assert '"outputs_match_reference": true' in capsys.readouterr().out
    # ... and, once the file is gone, says so in one line
    path.unlink()
    assert cli_main(["run", str(ir), "--requests", "1"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "which no longer exists; give that target" in err, err


@pytest.mark.parametrize("cmd", [["run"], ["viz", "--target", "test32", "-o", "out.png"]])
def test_ir_that_is_not_utf8_is_one_located_line(tmp_path, cmd):
    bad = tmp_path / "bad.mlir"
    bad.write_bytes(b"builtin.module {\n}\n\xff\xfe")
    proc = subprocess.run([sys.executable, "-m", "meshrt.tools.cli", cmd[0], str(bad), *cmd[1:]],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1
    assert proc.stderr.splitlines() == [f"{bad}: error: not UTF-8 at byte 19"]
    assert not (tmp_path / "out.png").exists()


# -- a target file that keeps a bundled target's name but changes its figures ----

# (figures changed in test32.toml, the resource tiny_moe then has too little of)
TIGHTER = {
    "colours": ({"colors": "5", "reserved_colors": "[2, 3, 4]", "switch_colors": "[0, 1, 2, 3, 4]"}, "colours"),
    "routes": ({"route_entries": "1"}, "route entries"),
    "iq": ({"input_queues": "3"}, "input queues"),  # one user queue (0 and 1 reserved)
    "oq": ({"output_queues": "3"}, "output queues"),
    "switches": ({"switch_positions": "1"}, "switch positions"),
}


def _tight_target(tmp_path: Path, figures: dict[str, str], name: str = "tight.toml") -> Path:
    """test32.toml, still named test32, with `figures` changed."""
    text = (TARGET_DIR / "test32.toml").read_text()
    for key, value in figures.items():
        text, n = re.subn(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.MULTILINE)
        assert n == 1, key
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize("case", list(TIGHTER))
def test_later_levels_use_the_files_figures_not_the_bundled_ones(case, tmp_path):
    """Graph IR compiled with the file names target "test32"; lowered on
    without a target (as meshrt-opt does), the passes find the file again and
    fail on its figures, instead of compiling for the bundled test32."""
    figures, resource = TIGHTER[case]
    path = _tight_target(tmp_path, figures)
    graph = tmp_path / "graph.mlir"
    graph.write_text(_text(driver.compile(TINY_MOE, path, "graph")))
    assert f'target "test32" file "{path.resolve()}" digest "' in graph.read_text()
    with pytest.raises(MeshrtError, match=rf"needs \d+ {resource}, capacity \d+") as e:
        driver.compile(str(graph), to="segments")
    assert str(e.value).startswith(f"{graph}:")
    # the same from the model, with the file given
    with pytest.raises(MeshrtError, match=rf"needs \d+ {resource}, capacity \d+"):
        driver.compile(TINY_MOE, path, "segments")


@pytest.mark.parametrize("case", list(TIGHTER))
def test_run_refuses_ir_compiled_for_more_than_the_target_has(case, tmp_path, capsys):
    """Segment IR compiled for the bundled test32 exceeds the file's budget:
    `meshrt run IR --target FILE` names the resource and both numbers."""
    figures, resource = TIGHTER[case]
    path = _tight_target(tmp_path, figures)
    seg = tmp_path / "seg.mlir"
    seg.write_text(_straight(TINY_MOE, "test32", "segments"))
    assert cli_main(["run", str(seg), "--target", str(path), "--requests", "1"]) == 1
    err = capsys.readouterr().err
    budget = driver.program_of(driver.read_ir(seg)).budget.value
    cap = driver.load_target(path).budget()
    (res, d, c), *_ = budget.exceeded(cap)
    assert err.splitlines() == [
        f"{seg}:2:3: error: 'segment.program' op the IR is compiled for {d} {resource} per core "
        f"(the program's budget), but target 'test32' ({path.resolve()}) has {c}"]


def test_run_refuses_ir_compiled_for_a_larger_mesh(tmp_path, capsys):
    from meshrt.tools.sim import main as sim_main

    for level in ("graph", "segments"):
        ir = tmp_path / f"{level}.mlir"
        ir.write_text(_straight(TINY_DENSE, "test32", level))
        line = (f"{ir}:2:3: error: '{driver.program_of(driver.read_ir(ir)).name}' op the IR is "
                "compiled for a 32 x 32 mesh, larger than the 16 x 16 cores of target 'test16'")
        assert cli_main(["run", str(ir), "--target", "test16", "--requests", "1"]) == 1
        assert capsys.readouterr().err.splitlines() == [line]
        assert cli_main(["viz", str(ir), "--target", "test16", "-o", str(tmp_path / "x.png")]) == 1
        assert capsys.readouterr().err.splitlines() == [line]
        assert sim_main([str(ir), "--target", "test16"]) == 1
        assert capsys.readouterr().err.splitlines() == [line]


def test_a_recorded_target_file_that_changed_or_went_is_one_located_line(tmp_path):
    path = _tight_target(tmp_path, {"switch_positions": "1"})
    digest = driver.load_target(path).digest
    module = driver.compile(TINY_DENSE, path, "events")
    events = tmp_path / "events.mlir"
    events.write_text(_text(module))
    # found again, it compiles on (tiny_dense fits one switch position) for the file's figures
    program = driver.segment_program(str(events))
    assert program.budget.value.switches == 1 and program.target_digest.data == digest
    # the file changed since
    _tight_target(tmp_path, {"switch_positions": "2"})
    with pytest.raises(MeshrtError) as e:
        driver.compile(str(events), to="segments")
    assert str(e.value) == (
        f"{events}:2:3: error: 'event.schedule' op the IR is compiled for target 'test32' read "
        f"from {path.resolve()} (digest {digest}), which now holds other figures (digest "
        f"{driver.load_target(path).digest}); give that target (--target FILE, or target=FILE "
        "to a pass)")
    # given again as it was, the IR goes on; the file gone, the IR says so
    original = driver.load_target(_tight_target(tmp_path, {"switch_positions": "1"}, "copy.toml"))
    driver.compile(str(events), original, "segments")
    path.unlink()
    with pytest.raises(MeshrtError, match=r"which no longer exists; give that target"):
        driver.compile(str(events), to="segments")
    # the digest without a file: the bundled test32 is not taken for it
    events.write_text(events.read_text().replace(f'file "{path.resolve()}" ', ""))
    with pytest.raises(MeshrtError, match=r"has other figures than the bundled test32"):
        driver.compile(str(events), to="segments")


def test_run_refuses_ir_routed_on_colours_the_target_reserves(tmp_path, capsys):
    """As many user colours as test32, but other ones: the IR's routes would
    use colours the target keeps for itself."""
    path = _tight_target(tmp_path, {"reserved_colors": "[0, 1]"})
    seg = tmp_path / "seg.mlir"
    seg.write_text(_straight(TINY_DENSE, "test32", "segments"))
    assert cli_main(["run", str(seg), "--target", str(path), "--requests", "1"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"{seg}:2:3: error: 'segment.program' op the IR routes on user colours 0, 1, which target "
        f"'test32' ({path.resolve()}) does not have (its user colours: 2, 3, 4, 5, 6, 7)"]
