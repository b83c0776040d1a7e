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
                              "--jobs", "2", "--out", str(out))
    assert rc == 0, stderr
    return out, stdout, json.loads((out / "bench.json").read_text())


def test_bench_numbers_do_not_depend_on_the_worker_processes(bench_run, tmp_path):
    """The fixture's builds ran in two worker processes; in this process (--jobs 1) every
    number is the same."""
    _, _, res = bench_run
    rc, _, stderr = _run("bench", TINY, "--target", "test32", "--micro-batch", "2,1",
                         "--jobs", "1", "--out", str(tmp_path))
    assert rc == 0, stderr
    one = json.loads((tmp_path / "bench.json").read_text())
    assert one["meta"]["jobs"] == 1
    timing = ("compile_s", "model_s", "interpreter_s")

    def numbers(r):
        builds = {(b["micro_batch"], tuple(b["dynamism"]), b["label"]):
                  {k: v for k, v in b.items() if k not in timing} for b in r["builds"]}
        return builds, r["governance"], r["ablation"], r["pareto"], r["wafers"]

    assert numbers(one) == numbers(res)


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


def test_bench_shows_the_lower_bound_beside_each_tpot(bench_run):
    _, stdout, res = bench_run
    assert "lower_bound" in res["sources"] and "TPOT / bound" in stdout
    rows = [res["governance"]["static"], res["governance"]["dynamic"], *res["pareto"]["points"]]
    for r in rows:
        assert 0 < r["bound_cycles"] <= r["tpot_cycles"]
        assert r["tpot_over_bound"] == pytest.approx(r["tpot_cycles"] / r["bound_cycles"])
        assert r["bound_us"] == pytest.approx(1e6 * r["bound_cycles"] / res["meta"]["clock_hz"])
    for b in res["builds"]:  # the bound also holds against the interpreter, and adds up
        assert 0 < b["bound_cycles"] < b["interpreter_cycles"]
        assert b["bound_cycles"] == pytest.approx(
            b["bound_compute_cycles"] + b["bound_hop_cycles"] + b["bound_wafer_cycles"])


def test_bench_tpot_against_wafer_count(bench_run):
    """By default the fewest wafers (1 for tiny_dense on test32) and twice that."""
    _, stdout, res = bench_run
    wf = res["wafers"]
    assert "TPOT against wafer count" in stdout and wf["source"] == "cost_model"
    assert wf["fewest"] == 1 and wf["micro_batch"] == 1
    assert [p["wafers"] for p in wf["points"]] == [1, 2]
    for p in wf["points"]:
        assert p["ok"] and p["wafers_used"] == p["wafers"] and p["stages"] >= p["wafers"]
        assert p["tpot_us"] == pytest.approx(1e6 * p["tpot_cycles"] / res["meta"]["clock_hz"])
        assert 0 < p["bound_cycles"] <= p["tpot_cycles"]


def test_bench_wafers_too_few_is_a_row(tmp_path):
    moe = str(REPO / "examples" / "tiny_moe.mrt")
    from meshrt.tools.bench import Builder, wafer_scaling

    builder = Builder(moe, "test16")
    builder.simulate = False  # the cost model is enough here
    base = builder.build("meshrt", 1, None, required=True)
    assert base.wafers == 2
    wf = wafer_scaling(builder, base, (1, 2), 1.0)
    few, two = wf["points"]
    assert not few["ok"] and "needs at least 2 wafers" in few["error"]
    assert two["ok"] and two["wafers_used"] == 2


def test_bench_deploy_wafers_maps_every_build_onto_them():
    """--deploy-wafers 2: both systems' builds on 2 wafers (tiny_dense on test32 needs one), a
    build given its own wafers keeps them; the wafer table claims no fewest it did not measure."""
    from meshrt.tools.bench import Builder, wafer_scaling

    builder = Builder(TINY, "test32", deploy_wafers=2)
    builder.simulate = False
    static = builder.build("static", 1, (), required=True)
    full = builder.build("meshrt", 1, None, required=True)
    own = builder.build("meshrt", 1, None, wafers=1, required=True)
    assert (static.wafers, full.wafers, own.wafers) == (2, 2, 1)
    assert full.stages >= 2 and static.stages >= 2
    wf = wafer_scaling(builder, full, None, 1.0)
    assert wf["fewest"] is None and [p["wafers"] for p in wf["points"]] == [2, 4]


@pytest.mark.parametrize("argv,needle", [
    (["bench", TINY], "--target"),
    (["bench", TINY, "--target", "test32", "--deploy-wafers", "0"], "--deploy-wafers"),
    (["bench", TINY, "--target", "test32", "--deploy-wafers", "two"], "--deploy-wafers"),
    (["bench", TINY, "--target", "test32", "--jobs", "0"], "--jobs"),
    (["bench", TINY, "--target", "test32", "--ray", "nowhere"], "--ray"),
    (["bench", TINY, "--target", "test32", "--micro-batch", "1,2", "--ray", "127.0.0.1:1"],
     "--ray 127.0.0.1:1: cannot connect"),
    (["bench", TINY, "--target", "test32", "--wafers", "0"], "--wafers"),
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


# ---------------------------------------------------------------------------
# --placement: the expert-placement benchmark (issue 9)
# ---------------------------------------------------------------------------

TINY_MOE = str(REPO / "examples" / "tiny_moe.mrt")


@pytest.fixture(scope="module")
def placement_run(tmp_path_factory):
    from meshrt.tools.placement_bench import tiny_moe16

    tmp = tmp_path_factory.mktemp("placement")
    model = str(tiny_moe16(tmp))
    out = tmp / "out"
    rc, stdout, stderr = _run("bench", model, "--target", "test32", "--micro-batch", "1",
                              "--placement", "--placement-seeds", "0", "--spreads", "0.07",
                              "--placement-steps", "2", "--out", str(out))
    assert rc == 0, stderr
    return out, stdout, json.loads((out / "bench.json").read_text())


def test_placement_tables_json_and_plot(placement_run):
    out, stdout, res = placement_run
    for title in ("Expert placement", "Drift:", "Drift end placements", "measured", "predicted"):
        assert title in stdout
    assert (out / "placement.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "and 5 plots" in stdout.splitlines()[-1]
    assert res["meta"]["placement"] is True and "placement" in res["sources"]
    assert "--placement --placement-seeds 0 --spreads 0.07 --placement-steps 2" in \
        res["meta"]["command"]
    p = res["placement"]
    assert p["seeds"] == [0] and p["spreads"] == [0.07] and p["steps"] == 2
    assert (p["experts"], p["regions"], p["experts_per_region"], p["moe_layers"]) == (16, 8, 2, 2)
    assert set(p["sources"]) == {"measured", "predicted"}


def test_placement_numbers(placement_run):
    p = placement_run[2]["placement"]
    rows = {r["policy"]: r for r in p["rows"]}
    assert list(rows) == ["contiguous", "eplb/greedy", "eplb", "vibe"]
    for r in rows.values():
        assert r["spread"] == 0.07
        assert r["model_error"] < 0.05  # the fitted models predict each region within 5 %
        for key in ("gap_cycles", "tpot_us", "tpot_cycles"):
            assert set(r[key]) == {"predicted", "measured"} and r[key]["measured"] > 0
        assert r["tpot_us"]["measured"] == pytest.approx(
            r["tpot_cycles"]["measured"] / p["clock_hz"] * 1e6)
    cont = rows["contiguous"]["gap_cycles"]["measured"]
    assert rows["contiguous"]["gap_reduction_vs_contiguous"] == 0.0
    assert rows["eplb"]["gap_reduction_vs_eplb"] == 0.0
    assert rows["vibe"]["gap_reduction_vs_contiguous"] == pytest.approx(
        1 - rows["vibe"]["gap_cycles"]["measured"] / cont)
    # skewed routing: balancing beats contiguous; vibe is never worse than eplb (predicted)
    assert rows["eplb"]["gap_cycles"]["measured"] < cont
    assert rows["vibe"]["gap_cycles"]["measured"] < cont
    assert rows["vibe"]["tpot_cycles"]["predicted"] <= rows["eplb"]["tpot_cycles"]["predicted"] + 1e-6

    d = p["drift"]
    assert (d["seed"], d["spread"], d["switch"]) == (0, 0.07, 150)
    fixed, recal = d["modes"]["fixed"], d["modes"]["recalibrated"]
    assert fixed["replans"] == 0 and fixed["moves"] == 0
    assert recal["replans"] >= 1 and all(pl["after_step"] >= d["switch"] for pl in recal["plans"])
    assert recal["tpot_reasoning_us"] < fixed["tpot_reasoning_us"]
    assert fixed["tpot_chat_us"] == pytest.approx(recal["tpot_chat_us"])
    assert len(fixed["tpot_per_step_us"]) == d["steps"]
    assert set(d["measured"]) == {"fixed (chat vibe)", "recalibrated", "vibe for reasoning"}
    assert d["measured"]["recalibrated"]["gap_cycles"] < d["measured"]["fixed (chat vibe)"]["gap_cycles"]


def test_placement_chips_in_workers_give_the_same_figures(tmp_path, monkeypatch):
    """The chips of the placement comparison run in worker processes (each compiles the
    model itself) and give the figures of one process, merged in chip order."""
    from meshrt.tools import workers
    from meshrt.tools.placement_bench import compile_placement, run_policies, tiny_moe16

    pools = []
    run_jobs = workers.run_jobs

    def recording(fn, jobs, n=1, ray_address=None):
        pools.append((len(jobs), n))
        return run_jobs(fn, jobs, n, ray_address)

    monkeypatch.setattr(workers, "run_jobs", recording)
    model = str(tiny_moe16(tmp_path))
    c = compile_placement(model, "test32")
    args = (c, [0, 1], [0.07], 2, 1.2)
    one = run_policies(*args)
    two = run_policies(*args, workers=2, model=model, target="test32")
    assert pools == [(2, 2)]  # only the second ran its two chips in two workers
    assert one == two


def test_placement_text_table_of_the_script(placement_run):
    from meshrt.tools.placement_bench import print_text

    buf = io.StringIO()
    print_text(placement_run[2]["placement"], buf)
    lines = buf.getvalue().splitlines()
    assert lines[0].startswith("tiny_moe16 on test32: 2 MoE layers, 16 experts top-2 on 8 regions")
    head = lines.index(next(ln for ln in lines if ln.startswith("spread  policy")))
    assert [ln.split()[1] for ln in lines[head + 1:head + 5]] == [
        "contiguous", "eplb/greedy", "eplb", "vibe"]
    assert any(ln.startswith("recalibrated ") for ln in lines)


@pytest.mark.parametrize("argv,needle", [
    (["bench", TINY, "--target", "test32", "--placement"], "dense"),
    (["bench", TINY_MOE, "--target", "wse3", "--placement"], "core by core"),
    (["bench", TINY_MOE, "--target", "test32", "--spreads", "0.03"], "only applies with --placement"),
    (["bench", TINY_MOE, "--target", "test32", "--placement", "--spreads", "0,x"], "--spreads"),
    (["bench", TINY_MOE, "--target", "test32", "--placement", "--spreads", "-0.1"], "--spreads"),
    (["bench", TINY_MOE, "--target", "test32", "--placement", "--spreads", "2"], "--spreads"),
    (["bench", TINY_MOE, "--target", "test32", "--placement", "--placement-seeds", "a"],
     "--placement-seeds"),
    (["bench", TINY_MOE, "--target", "test32", "--placement", "--placement-steps", "1"],
     "--placement-steps"),
    (["bench", "no/such/model.mrt", "--target", "test32", "--placement"], "no such model file"),
])
def test_placement_errors_are_one_line(argv, needle, tmp_path):
    out_dir = tmp_path / "o"
    rc, out, err = _run(*argv, "--out", str(out_dir))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and needle in err and "error" in err
    assert "Traceback" not in err
    assert not out_dir.exists()  # failed before running anything


def test_placement_dense_error_is_located(tmp_path):
    rc, _, err = _run("bench", TINY, "--target", "test32", "--placement", "--out", str(tmp_path))
    assert rc == 1 and err.startswith(f"{TINY}: error: --placement needs a mixture-of-experts")


def test_placement_script_errors_are_one_line(capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_place_experts",
                                                  REPO / "bench" / "bench_place_experts.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--model", TINY]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "dense" in err and "Traceback" not in err


def test_bench_context_sweeps_the_kv_capacity(tmp_path):
    """--context: a build per context, one request in flight; the attention's rows a core
    and their cycles on the critical path grow with it; bench.json and context.png."""
    rc, out, err = _run("bench", TINY, "--target", "test32", "--context", "12,48", "--jobs", "1",
                        "--out", str(tmp_path))
    assert rc == 0, err
    assert "decode vs context" in out
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["meta"]["command"].endswith("--context 12,48")
    a, b = res["context"]["rows"]
    assert (a["context"], b["context"]) == (12, 48)
    assert a["kv_rows_per_core"] < b["kv_rows_per_core"]
    assert 0 < a["full_attention_cycles"] < b["full_attention_cycles"] <= b["tpot_cycles"]
    assert a["tpot_vs_first"] == 1.0 and b["tpot_vs_first"] > 1.0
    assert a["full_attention_layers"] == 2
    assert math.isclose(a["user_tokens_per_s"], 1.0 / (a["tpot_us"] * 1e-6))
    assert (tmp_path / "context.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,needle", [
    (["--context", "4x"], "--context"),
    (["--context", "16,8"], "contexts must increase"),
    (["--context", "0"], "--context"),
    (["--context", "12", "--placement"], "--context and --placement are separate runs"),
    (["--kv-spill", "8"], "--kv-spill only applies with --context"),
    (["--context", "12", "--kv-spill", "0"], "--kv-spill"),
])
def test_bench_context_errors_are_one_line(argv, needle, tmp_path):
    rc, out, err = _run("bench", TINY, "--target", "test32", *argv, "--out", str(tmp_path / "o"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and needle in err and "error" in err


def test_bench_context_spills_past_kv_spill(tmp_path, test32_with):
    """--kv-spill N: a context up to N is built as without it; past N the MoE layers'
    attention regions hold N positions and the rest goes to spill tiles on the expert
    cores (a test32 with the colours and a queue their flows take)."""
    target = test32_with("test32s", ("colors = 8", "colors = 10"),
                         ("reserved_colors = [6, 7]", "reserved_colors = [8, 9]"),
                         ("reserved_task_ids = [6, 7, 15]", "reserved_task_ids = [8, 9, 15]"),
                         ("input_queues = 5", "input_queues = 6"))
    moe = str(REPO / "examples" / "tiny_moe.mrt")
    rc, out, err = _run("bench", moe, "--target", str(target), "--context", "16,32", "--kv-spill", "16",
                        "--jobs", "1", "--out", str(tmp_path))
    assert rc == 0, err
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["meta"]["command"].endswith("--context 16,32 --kv-spill 16")
    assert res["context"]["kv_spill"] == 16
    a, b = res["context"]["rows"]
    assert (a["spill_tiles"], b["spill_tiles"]) == (0, 1)
    assert "spill" in out  # the table's column


def test_bench_context_past_the_models_positions_is_refused():
    rc, _, err = _run("bench", str(REPO / "examples" / "configs" / "qwen3-8b.json"), "--target",
                      "wse3", "--context", "4k,64k")
    assert rc == 1 and err.count("\n") == 1
    assert "--context 65,536 exceeds the model's max_position_embeddings (40,960)" in err


def test_bench_context_honours_deploy_wafers_and_refuses_wafers(tmp_path):
    rc, _, err = _run("bench", TINY, "--target", "test32", "--context", "12", "--deploy-wafers", "1",
                      "--jobs", "1", "--out", str(tmp_path))
    assert rc == 0, err
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["context"]["wafers"] == 1 and res["context"]["rows"][0]["wafers"] == 1
    assert res["meta"]["command"].endswith("--context 12 --deploy-wafers 1")
    rc, _, err = _run("bench", TINY, "--target", "test32", "--context", "12", "--wafers", "1,2",
                      "--out", str(tmp_path / "o"))
    assert rc == 1 and err.count("\n") == 1 and "--context maps each build onto the fewest" in err


def test_bench_prefill_times_each_chunk_for_both_systems(tmp_path):
    """--phase prefill: a build per (system, micro-batch, chunk); a lone prompt of the
    model's context takes (chunks - 1) intervals plus a latency where the build pipelines,
    a latency a chunk where it does not; each system and micro-batch at its best chunk;
    the ablation's pipelining factor; bench.json and prefill.png."""
    from meshrt.tools.prefill_bench import best, prefill_cycles

    rc, out, err = _run("bench", TINY, "--target", "test32", "--phase", "prefill", "--micro-batch", "1",
                        "--prefill-chunk", "2,4", "--jobs", "1", "--out", str(tmp_path))
    assert rc == 0, err
    assert "prefill (cost model" in out and "pipelining at micro-batch 1" in out
    res = json.loads((tmp_path / "bench.json").read_text())
    assert res["meta"]["command"].endswith("--phase prefill --micro-batch 1 --prefill-chunk 2,4")
    rows = res["prefill"]["rows"]
    assert {(r["system"], r["chunk"]) for r in rows} == {(s, c) for s in ("static", "meshrt") for c in (2, 4)}
    for r in rows:
        assert r["prompt"] == 12  # tiny_dense's context
        chunks = math.ceil(12 / r["chunk"])
        if r["system"] == "static":
            assert r["in_flight"] == 1 and r["prefill_cycles"] == chunks * r["latency_cycles"]
        else:
            assert r["in_flight"] == r["stages"] > 1
            assert r["prefill_cycles"] == (chunks - 1) * r["interval_cycles"] + r["latency_cycles"]
        assert math.isclose(r["user_tokens_per_s"], 12 / (r["ttft_ms"] * 1e-3))
    s1, m1 = best(rows, "static", 1), best(rows, "meshrt", 1)
    assert math.isclose(res["prefill"]["ablation"]["pipeline_factor"],
                        m1["user_tokens_per_s"] / s1["user_tokens_per_s"])
    assert res["prefill"]["ablation"]["pipeline_factor"] > 1
    # one token a step never lends rows: its prompt goes round the token loop a token a trip
    assert prefill_cycles(12, 1, 100.0, 30.0, 4) == 12 * 120.0
    assert (tmp_path / "prefill.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("argv,needle", [
    (["--prefill-chunk", "4"], "--prefill-chunk only applies with --phase prefill"),
    (["--phase", "prefill", "--prefill-chunk", "0"], "--prefill-chunk"),
    (["--phase", "prefill", "--prefill-chunk", "8,4"], "chunks must increase"),
    (["--phase", "prefill", "--context", "12"], "--context does not apply with --phase prefill"),
    (["--phase", "prefill", "--placement"], "--placement does not apply with --phase prefill"),
    (["--phase", "prefill", "--kv-spill", "8"], "--kv-spill does not apply with --phase prefill"),
    (["--phase", "decoding"], "--phase"),
])
def test_bench_prefill_errors_are_one_line(argv, needle, tmp_path):
    rc, out, err = _run("bench", TINY, "--target", "test32", *argv, "--out", str(tmp_path / "o"))
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and needle in err and "error" in err


def test_bench_prefill_says_why_no_build_fits(tmp_path):
    """Qwen3.5-9B's eight rows a step (chunk 8) leave some kernel no block height on a wafer."""
    rc, out, err = _run("bench", str(REPO / "examples" / "configs" / "qwen3.5-9b.json"), "--target", "wse3",
                        "--phase", "prefill", "--micro-batch", "1", "--prefill-chunk", "8", "--jobs", "1",
                        "--out", str(tmp_path / "o"))
    last = err.splitlines()[-1]  # after a progress line a build
    assert rc == 1 and last.startswith("meshrt bench: error: no prefill build of")
    assert "does not fit" in last and "Traceback" not in err
