"""A small fixed corruption corpus, in-process: every input kind, corrupted, is
one located line and exit 1 (or still valid and exit 0), never a traceback.

The corpus and its judge live in bench/bench_corruption.py, which runs many
more cases in subprocesses (`python bench/bench_corruption.py --cases 200`).
"""

from __future__ import annotations

import importlib.util
import random
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("bench_corruption", REPO / "bench" / "bench_corruption.py")
bc = importlib.util.module_from_spec(_spec)
sys.modules["bench_corruption"] = bc
_spec.loader.exec_module(bc)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return bc.make_base(tmp_path_factory.mktemp("corpus-base"))


# (kind, seed): seed picks the edit (bc.OPS[seed % 7]) and where it lands.
CASES = [
    pytest.param("spec", 0, id="spec-flip"),
    pytest.param("spec", 4, id="spec-number"),
    pytest.param("spec", 6, id="spec-utf8"),
    pytest.param("config", 4, id="config-number"),
    # 20,000 levels deep: was a RecursionError in hf_config.load_hf_config
    pytest.param("config", 5, id="config-nest"),
    pytest.param("graph", 1, id="graph-truncate"),
    pytest.param("kernels", 3, id="kernels-duplicate-line"),
    # an event.kernel record deleted: was KeyError in DataPlane.computes
    pytest.param("events", 2, id="events-delete-line"),
    # a '"' left open: xDSL's string-literal pattern backtracked for ever
    pytest.param("segments", 0, id="segments-flip"),
    # a compute event repeated: was KeyError in the rmsnorm's numerics
    pytest.param("segments", 10, id="segments-duplicate-line"),
    pytest.param("moe_graph", 4, id="moe-graph-number"),
    pytest.param("target", 4, id="target-number"),
    # was a RecursionError in tomllib via targets.load_target
    pytest.param("target", 5, id="target-nest"),
    pytest.param("workload", 1, id="workload-truncate"),
    # was meshrt-opt exit 2, "internal error: RecursionError", in the expert profile's JSON
    pytest.param("profile", 5, id="profile-nest"),
    pytest.param("models", 2, id="models-delete-line"),
    pytest.param("run_flags", 2, id="run-flags-delete"),
    pytest.param("compile_flags", 1, id="compile-flags-truncate"),
]


@pytest.mark.parametrize("kind, seed", CASES)
def test_corrupted_input_is_one_located_line(kind, seed, base, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    tool, argv = bc.Case(kind, seed).write(base, tmp_path)
    v = bc.run_in_process(kind, tool, argv, timeout=60)
    assert v.ok, f"{bc.Case(kind, seed)}: {v.cause}: {v.stderr[-600:]}"


def test_every_kind_is_in_the_corpus():
    assert {p.values[0] for p in CASES} == set(bc.KINDS)


# The judge itself: what it must call a failure.
@pytest.mark.parametrize("rc, out, err, crash, cause", [
    (1, "", "", "RecursionError in hf_config.py:9 f", "traceback"),
    (None, "", "", None, "hang"),
    (1, "", "Traceback (most recent call last):\n  File \"/x/meshrt/a.py\", line 3, in f\nKeyError: 1\n",
     None, "traceback"),
    (1, "", "a: error: x\nb: error: y\n", None, "2 lines"),
    (1, "", "something went wrong\n", None, "unlocated"),
    (1, "", "m.mrt: error: internal error: boom\n", None, "internal error"),
    (2, "", "usage: meshrt\n", None, "exit 2"),
    (0, '{"outputs_match_reference": false, "reports": []}', "", None, "without matching"),
    (1, '{"outputs_match_reference": false, "reports": []}', "", None, "no report"),
])
def test_the_judge_fails_what_it_must(rc, out, err, crash, cause):
    v = bc.judge("graph", rc, out, err, crash)
    assert not v.ok and cause in v.cause


@pytest.mark.parametrize("rc, out, err", [
    (1, "", "m.mrt:3:7: error: heads must be at least 1, got 0\n"),
    (0, '{"outputs_match_reference": true, "reports": []}', ""),
    (1, '{"outputs_match_reference": false, "reports": ["deadlock at cycle 9"]}', ""),
])
def test_the_judge_passes_what_it_must(rc, out, err):
    assert bc.judge("graph", rc, out, err).ok


@pytest.mark.parametrize("op", bc.OPS)
def test_every_edit_changes_the_input(op):
    data = b'{"a": 12, "b": [3, 4.5]}\nline two 7\n'
    assert bc.corrupt(data, op, random.Random(1)) != data
