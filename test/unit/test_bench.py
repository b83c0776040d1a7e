"""`meshrt bench`: one run on a tiny model, and its error paths (one line, exit 1)."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest

from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "examples" / "tiny_dense.mrt")


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench")
    rc, stdout, stderr = _run("bench", TINY, "--target", "test32", "--micro-batch", "2,1",
                              "--out", str(out))
    assert rc == 0, stderr
    return out, stdout, json.loads((out / "bench.json").read_text())


def test_bench_writes_json_and_plots(bench_run):
    out, stdout, res = bench_run
    for title in ("Governance overhead", "Policy ablation", "Single-user vs system",
                  "Padding of static batching", "Builds"):
        assert title in stdout
    for png in ("pareto.png", "padding.png", "ablation.png", "governance.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert set(res["sources"]) >= {"cost_model", "interpreter", "workload"}
    assert res["meta"]["micro_batches"] == [1, 2] and res["meta"]["interpreter"] is True
    assert "meshrt bench" in res["meta"]["command"]


def test_bench_numbers_are_consistent(bench_run):
    _, _, res = bench_run
    g = res["governance"]
    assert g["overhead_cycles"] == pytest.approx(g["dynamic"]["tpot_cycles"] - g["static"]["tpot_cycles"])
    assert g["overhead_percent"] == pytest.approx(100 * g["overhead_cycles"] / g["static"]["tpot_cycles"])
    assert g["dynamic"]["stages"] == g["static"]["stages"] == 1  # the same mapping
    assert "interpreter" in g  # test32 is small enough to simulate beside the model

    a = res["ablation"]
    assert [s["step"] for s in a["steps"]] == ["static_bs1", "expert_parallelism", "pipelining",
                                               "continuous_batching"]
    assert a["micro_batch"] == 2 and a["complete"]
    assert math.prod(s["factor"] for s in a["steps"]) == pytest.approx(a["total"])
    assert a["steps"][1]["factor"] == pytest.approx(1.0)  # dense: no experts to spread
    assert all(s["modelling"] for s in a["steps"])
    parts = a["pipelining_parts"]
    assert (parts["step_latency"] * parts["overlap"] * parts["micro_batch"]
            * parts["useful_fraction"]) == pytest.approx(a["steps"][2]["factor"])

    pts = res["pareto"]["points"]
    assert {(p["system"], p["micro_batch"]) for p in pts} == {
        (s, b) for s in ("static", "meshrt") for b in (1, 2)}
    for p in pts:
        assert p["system_tokens_per_s"] == pytest.approx(
            p["micro_batch"] * res["meta"]["clock_hz"] / p["step_cycles"])

    pad = res["padding"]
    for name in ("chat", "reasoning"):
        fr = [pad[name][str(b)] for b in pad["batches"]]
        assert fr[0] == 0.0 and fr == sorted(fr) and fr[-1] < 1
    for b in res["builds"]:
        assert b["interpreter_cycles"] and abs(b["latency_cycles"] / b["interpreter_cycles"] - 1) < 0.1


@pytest.mark.parametrize("argv,needle", [
    (["bench", TINY], "--target"),
    (["bench", TINY, "--target", "test32", "--micro-batch", "0"], "--micro-batch"),
    (["bench", TINY, "--target", "test32", "--micro-batch", "1,x"], "--micro-batch"),
    (["bench", "no/such/model.mrt", "--target", "test32"], "no such model file"),
    (["bench", TINY, "--target", "nowhere"], "unknown target"),
    (["bench", TINY, "--target", "test32", "--workload", "sharegpt"], "unknown workload"),
    (["bench", TINY, "--target", "test32", "--workload", "missing.jsonl"], "no such file"),
])
def test_bench_errors_are_one_line(argv, needle, tmp_path):
    rc, out, err = _run(*argv, "--out", str(tmp_path / "o"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and needle in err and "error" in err
    assert "Traceback" not in err


def test_bench_out_must_be_a_directory(tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    rc, out, err = _run("bench", TINY, "--target", "test32", "--out", str(f))
    assert rc == 1 and err.count("\n") == 1 and "directory" in err


def test_bench_model_that_does_not_fit(tmp_path):
    cfg = str(REPO / "examples" / "configs" / "qwen3-8b.json")
    rc, out, err = _run("bench", cfg, "--target", "test32", "--out", str(tmp_path / "o"))
    assert rc == 1 and err.count("\n") == 1 and "does not fit" in err
