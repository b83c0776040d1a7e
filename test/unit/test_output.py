"""Outputs are written atomically (meshrt.output): a failed run never truncates or
leaves a partial file, an existing output is untouched when the input is bad."""

from __future__ import annotations

import errno
import json
import os
import resource
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from meshrt import output
from meshrt.output import atomic_directory, atomic_file, save_figure, write_text
from meshrt.tools import cli, meshrt_opt

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny_dense.mrt")
OLD = "the previous output\n"


def leftovers(directory: Path) -> list[str]:
    """Temporary files or directories the writers left behind."""
    return sorted(p.name for p in directory.iterdir() if p.name.endswith(output.TEMP_SUFFIX))


@pytest.fixture
def disk_full(monkeypatch):
    """Every atomic write fails with ENOSPC after `limit` bytes (part-way)."""
    limit = {"bytes": 100}
    real_open = open

    class Full:
        def __init__(self, f):
            self._f, self._n = f, 0

        def write(self, data):
            self._n += len(data)
            if self._n > limit["bytes"]:
                self._f.write(data[: max(0, len(data) - (self._n - limit["bytes"]))])
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            return self._f.write(data)

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return self._f.__exit__(*exc)

    monkeypatch.setattr(output, "open", lambda *a, **k: Full(real_open(*a, **k)), raising=False)
    return limit


# -- the helper -------------------------------------------------------------

def test_atomic_file_replaces_on_success(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text(OLD)
    with atomic_file(path) as f:
        f.write("new\n")
        assert path.read_text() == OLD  # nothing visible before the block completes
    assert path.read_text() == "new\n"
    assert leftovers(tmp_path) == []


def test_atomic_file_keeps_old_file_on_error(tmp_path):
    path = tmp_path / "out.txt"
    path.write_text(OLD)
    with pytest.raises(RuntimeError):
        with atomic_file(path) as f:
            f.write("half of it")
            raise RuntimeError("the pass failed")
    assert path.read_text() == OLD
    assert leftovers(tmp_path) == []


def test_atomic_file_failing_write_leaves_nothing(tmp_path, disk_full):
    path = tmp_path / "new.txt"
    with pytest.raises(OSError) as e:
        write_text(path, "x" * 1000)
    assert e.value.errno == errno.ENOSPC
    assert not path.exists() and leftovers(tmp_path) == []


def test_atomic_file_permissions(tmp_path):
    fresh = tmp_path / "fresh.txt"
    write_text(fresh, "a")
    umask = os.umask(0)
    os.umask(umask)
    assert stat.S_IMODE(fresh.stat().st_mode) == 0o666 & ~umask  # as open() gives
    script = tmp_path / "run.sh"
    script.write_text("old")
    script.chmod(0o750)
    write_text(script, "new")
    assert stat.S_IMODE(script.stat().st_mode) == 0o750  # a replaced file keeps its mode


def test_atomic_file_follows_symlink_and_writes_devices_in_place(tmp_path):
    real = tmp_path / "real.txt"
    real.write_text(OLD)
    link = tmp_path / "link.txt"
    link.symlink_to(real)
    write_text(link, "new\n")
    assert link.is_symlink() and real.read_text() == "new\n"
    write_text("/dev/null", "discarded")  # not renamed over
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)


def test_atomic_file_names_the_users_path(tmp_path):
    with pytest.raises(FileNotFoundError) as e:
        write_text(tmp_path / "no" / "such" / "dir.txt", "x")
    assert e.value.filename == str(tmp_path / "no" / "such" / "dir.txt")


def test_save_figure_failing_keeps_old(tmp_path):
    class Fig:
        def savefig(self, f, **kw):
            assert kw["format"] == "png" and kw["dpi"] == 10
            f.write(b"\x89PNG half")
            raise OSError(errno.ENOSPC, "No space left on device")

    path = tmp_path / "plot.png"
    path.write_bytes(b"old png")
    with pytest.raises(OSError):
        save_figure(Fig(), path, dpi=10)
    assert path.read_bytes() == b"old png" and leftovers(tmp_path) == []


def test_atomic_directory(tmp_path):
    new = tmp_path / "new"
    with atomic_directory(new) as d:
        (d / "a.csl").write_text("a")
        assert not new.exists()
    assert (new / "a.csl").read_text() == "a"

    with pytest.raises(OSError):
        with atomic_directory(new) as d:
            (d / "a.csl").write_text("A, half")
            raise OSError(errno.EFBIG, "File too large")
    assert (new / "a.csl").read_text() == "a"  # the old output, whole

    (new / "mine.txt").write_text("user file")
    with atomic_directory(new) as d:
        (d / "a.csl").write_text("A")
        (d / "sub").mkdir()
        (d / "sub" / "b.csl").write_text("B")
    assert (new / "a.csl").read_text() == "A" and (new / "sub" / "b.csl").read_text() == "B"
    assert (new / "mine.txt").read_text() == "user file"  # merged, as writing into it did

    empty = tmp_path / "empty"
    empty.mkdir()
    with atomic_directory(empty) as d:
        (d / "x").write_text("x")
    assert (empty / "x").read_text() == "x"
    assert leftovers(tmp_path) == []


# -- the tools ----------------------------------------------------------------

def test_meshrt_opt_bad_input_keeps_output(tmp_path, capsys):
    bad = tmp_path / "bad.mlir"
    bad.write_text("garbage\n")
    good = tmp_path / "good.mlir"
    good.write_text(OLD)
    assert meshrt_opt.main([str(bad), "-o", str(good)]) == 1
    assert good.read_text() == OLD
    assert leftovers(tmp_path) == []
    assert "error" in capsys.readouterr().err


def test_meshrt_opt_failing_pass_keeps_output(tmp_path, capsys):
    graph = tmp_path / "graph.mlir"
    assert cli.main(["compile", TINY, "--target", "test32", "-o", str(graph)]) == 0
    out = tmp_path / "out.mlir"
    out.write_text(OLD)
    assert meshrt_opt.main([str(graph), "-p", "synthesize-schedules", "-o", str(out)]) == 1
    assert out.read_text() == OLD and leftovers(tmp_path) == []
    assert meshrt_opt.main([str(graph), "-p", "lower-to-mesh-kernels", "-o", str(out)]) == 0
    assert "mesh_kernel.program" in out.read_text() and leftovers(tmp_path) == []


def test_compile_output_disk_full(tmp_path, disk_full, capsys):
    out = tmp_path / "out.mlir"
    out.write_text(OLD)
    assert cli.main(["compile", TINY, "--target", "test32", "-o", str(out)]) == 1
    assert "cannot write output" in capsys.readouterr().err
    assert out.read_text() == OLD and leftovers(tmp_path) == []


def test_compile_bad_input_keeps_output(tmp_path, capsys):
    spec = tmp_path / "bad.mrt"
    spec.write_text("model {")
    out = tmp_path / "out.mlir"
    out.write_text(OLD)
    assert cli.main(["compile", str(spec), "--target", "test32", "-o", str(out)]) == 1
    assert out.read_text() == OLD


def test_trace_disk_full(tmp_path, disk_full, monkeypatch):
    from meshrt.runtime import trace

    monkeypatch.setattr(trace, "trace_events", lambda result, by_class=False: {"traceEvents": [0] * 500})
    path = tmp_path / "trace.json"
    path.write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(OSError):
        trace.write_trace(None, str(path))
    assert json.loads(path.read_text()) == {"traceEvents": []} and leftovers(tmp_path) == []


def _limited(args: list[str], limit: int, cwd: Path) -> subprocess.CompletedProcess:
    """Run a meshrt command with RLIMIT_FSIZE `limit` bytes (a write past it fails: EFBIG)."""
    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-c", "import sys; from meshrt.tools." + args[0]
                           + " import main; sys.exit(main(sys.argv[1:]))", *args[1:]],
                          cwd=cwd, env=env, capture_output=True, text=True, preexec_fn=preexec,
                          timeout=300)


def test_rlimit_fsize_compile_and_opt(tmp_path):
    out = tmp_path / "out.mlir"
    out.write_text(OLD)
    r = _limited(["cli", "compile", TINY, "--target", "test32", "--emit", "kernels", "-o", str(out)],
                 4096, tmp_path)
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert r.stderr.count("\n") == 1
    assert out.read_text() == OLD and leftovers(tmp_path) == []

    graph = tmp_path / "graph.mlir"
    assert cli.main(["compile", TINY, "--target", "test32", "-o", str(graph)]) == 0
    r = _limited(["meshrt_opt", str(graph), "-p", "lower-to-mesh-kernels", "-o", str(out)],
                 int(graph.stat().st_size), tmp_path)
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert out.read_text() == OLD and leftovers(tmp_path) == []


def test_rlimit_fsize_csl_directory(tmp_path):
    old = tmp_path / "csl"
    old.mkdir()
    (old / "layout.csl").write_text(OLD)
    r = _limited(["cli", "compile", TINY, "--target", "test32", "--emit", "csl", "-o", str(old)],
                 8192, tmp_path)
    assert r.returncode == 1 and "File too large" in r.stderr, r.stderr
    assert [p.name for p in old.iterdir()] == ["layout.csl"]
    assert (old / "layout.csl").read_text() == OLD and leftovers(tmp_path) == []

    fresh = tmp_path / "fresh"
    r = _limited(["cli", "compile", TINY, "--target", "test32", "--emit", "csl", "-o", str(fresh)],
                 8192, tmp_path)
    assert r.returncode == 1 and not fresh.exists() and leftovers(tmp_path) == []
