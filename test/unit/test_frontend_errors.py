"""The frontend error corpus (test/frontend_errors): one located line, exit 1."""

from __future__ import annotations

import contextlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "test" / "frontend_errors"
EXAMPLES = REPO / "examples"
CASES = sorted(p for p in CORPUS.iterdir() if p.suffix in (".mrt", ".json", ".toml"))


def _meta(path: Path) -> tuple[list[str], str]:
    side = path.with_name(path.name + ".expect")
    text = side.read_text() if side.exists() else path.read_bytes().decode("utf-8", "replace")
    meta = dict(re.findall(r"^#?\s*(args|expect):\s*(.*)$", text, re.MULTILINE))
    rel = str(path.relative_to(REPO))
    args = meta["args"].replace("{file}", rel).replace("{examples}", "examples").split()
    return args, meta["expect"].replace("{file}", rel)


def test_corpus_is_not_empty():
    kinds = {p.suffix for p in CASES}
    assert {".mrt", ".json", ".toml"} <= kinds and len(CASES) >= 60


@pytest.mark.parametrize("path", CASES, ids=lambda p: p.name)
def test_error_case(path: Path, monkeypatch):
    monkeypatch.chdir(REPO)
    args, expected = _meta(path)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["compile", *args])
    assert rc == 1
    assert out.getvalue() == ""
    lines = err.getvalue().splitlines()
    assert len(lines) == 1, lines
    assert lines[0] == expected
    assert re.match(r"^\S+?(:\d+:\d+)?: error: \S", lines[0])


@pytest.mark.parametrize("name", ["zero_heads.mrt", "json_syntax_error.json", "target_bad_toml.toml"])
def test_console_script_has_no_traceback(name: str):
    """The real process: exit code 1, one stderr line, no Python traceback."""
    args, expected = _meta(CORPUS / name)
    proc = subprocess.run([sys.executable, "-m", "meshrt.tools.cli", "compile", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.splitlines() == [expected]
