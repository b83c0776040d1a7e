"""The interpreter with numerics: compiled tiny models serve requests on the
simulated asynchronous mesh and produce the NumPy reference's tokens."""

from __future__ import annotations

import io
import json
import re
from functools import cache

import pytest
from xdsl.printer import Printer

from meshrt.driver import parse_ir, program_of, segment_program
from meshrt.runtime import reference as ref
from meshrt.runtime.serving import reference_shape, serve
from meshrt.runtime.workloads import Request
from meshrt.targets import load_target
from meshrt.tools.cli import main as cli_main

# Asynchrony seeds per model: the first four in the suite, the rest by hand (`-m slow`);
# bench/bench_interpreter.py sweeps a thousand.
SEEDS = [pytest.param(s, marks=() if s < 4 else pytest.mark.slow) for s in range(20)]


@cache
def program(model: str, target: str = "test32", static: bool = False):
    return segment_program(f"examples/{model}.mrt", target, dynamism=() if static else None)


def requests(spec: list[tuple[int, int, float]], vocab: int = 256, seed: int = 7) -> list[Request]:
    """(prompt_len, output_len, arrival µs) -> requests with seeded prompt tokens."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return [Request(i, arrival * 1e-6, rng.integers(2, vocab, p).tolist(), p, o, o)
            for i, (p, o, arrival) in enumerate(spec)]


# short requests, staggered arrivals: slots free and refill mid-run
SMALL = [(3, 4, 0.0), (1, 5, 0.0), (2, 2, 20.0), (4, 3, 40.0), (2, 4, 60.0)]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_matches_reference_under_asynchrony(model, seed):
    res = serve(program(model), load_target("test32"), requests(SMALL), seed=seed)
    s = res.summary()
    assert s["reports"] == []
    assert s["requests_completed"] == len(SMALL) and s["requests_rejected"] == 0
    assert res.mismatches == [] and s["outputs_match_reference"]
    assert all(len(r.tokens) >= 1 for r in res.records)


def test_seeds_change_timing_not_tokens():
    t = load_target("test32")
    a = serve(program("tiny_moe"), t, requests(SMALL), seed=1)
    b = serve(program("tiny_moe"), t, requests(SMALL), seed=2)
    assert a.sim.cycles != b.sim.cycles
    assert {r.id: r.tokens for r in a.records} == {r.id: r.tokens for r in b.records}


def test_two_wafers_with_the_wafer_link():
    # tiny_moe needs two test16 wafers: the hidden state and its CF payload
    # cross the wafer-to-wafer link together
    prog = program("tiny_moe", "test16")
    assert prog.num_wafers == 2
    res = serve(prog, load_target("test16"), requests(SMALL[:3]), seed=3)
    assert res.outputs_match_reference and len(res.records) == 3


def test_static_baseline_matches_and_pads():
    t = load_target("test32")
    reqs = requests([(2, 6, 0.0), (1, 1, 0.0), (2, 2, 0.0), (1, 3, 0.0)])
    static = serve(program("tiny_dense", static=True), t, reqs, seed=0)
    dyn = serve(program("tiny_dense"), t, reqs, seed=0)
    assert static.static and not dyn.static
    assert static.outputs_match_reference and dyn.outputs_match_reference
    # a batch runs until its longest request is done
    assert static.padding_fraction > 0.2
    assert {r.id: r.tokens for r in static.records} == {r.id: r.tokens for r in dyn.records}


@pytest.mark.parametrize("static, passes", [(False, 2), (True, 4)])
def test_merged_expert_regions_run_in_passes(static, passes, tmp_path):
    """tiny_moe with four experts a region (top-2, micro-batch 2): a region computes its
    (token, expert) pairs two at a time, in two passes with routing (at most 2 x 2 pairs
    reach it) and four without (every token on every expert), and every token is NumPy's."""
    from meshrt.dialects import event as ev

    src = tmp_path / "moe4.mrt"
    src.write_text(open("examples/tiny_moe.mrt").read() + "\nmapping { experts_per_region = 4 }\n")
    prog = segment_program(str(src), "test32", dynamism=() if static else None)
    edge = next(sub for sub in prog.walk() if isinstance(sub, ev.SubScheduleOp)
                and sub.kernel_name == "l0_moe.experts" and sub.role_name == "edge")
    ops = [e.op.data for e in edge.events() if isinstance(e, ev.ComputeOp)]
    assert [op for op in ops if op.startswith("fmac")] == ["fmac", "fmac_down"] * passes  # a pass: gate|up, then down
    res = serve(prog, load_target("test32"), requests(SMALL[:3]), seed=1)
    assert res.summary()["reports"] == [] and res.mismatches == [] and res.outputs_match_reference


@pytest.mark.parametrize("static", [False, True])
def test_shared_expert_region_of_its_own_shape_runs(static, tmp_path):
    """tiny_moe with a shared expert and two routed experts a region: the shared expert's
    region is narrower than the routed ones (sized for one expert) and runs one pass of the
    micro-batch's tokens where the routed regions run two (min(2 experts, top-2) routed,
    one per expert static), and every token is NumPy's."""
    from meshrt.dialects import event as ev

    src = tmp_path / "moe_shared.mrt"
    src.write_text(open("examples/tiny_moe.mrt").read().replace(
        "expert_ffn  = 128", "expert_ffn  = 128\n  shared_experts = 1")
        + "\nmapping { experts_per_region = 2 }\n")
    prog = segment_program(str(src), "test32", dynamism=() if static else None)
    info = next(k for k in prog.kernels() if k.kernel_name == "l0_moe.experts")
    tiles = [cs.rects.data[0].tuple[2:4] for cs in info.params.data["expert_regions"].data]
    assert tiles[-1][0] < tiles[0][0] and len(set(tiles)) == 2  # (w, h): its own, narrower

    def fmacs(role: str) -> int:
        sub = next(sub for sub in prog.walk() if isinstance(sub, ev.SubScheduleOp)
                   and sub.kernel_name == "l0_moe.experts" and sub.role_name == role)
        return sum(isinstance(e, ev.ComputeOp) and e.op.data in ("fmac", "fmac_down") for e in sub.events())

    assert fmacs("shared_root") == 2  # one pass: gate|up, then down
    assert fmacs("root") == 2 * 2
    res = serve(prog, load_target("test32"), requests(SMALL[:3]), seed=1)
    assert res.summary()["reports"] == [] and res.mismatches == [] and res.outputs_match_reference


def test_requests_beyond_capacity_are_rejected_and_counted():
    t = load_target("test32")
    prog = program("tiny_dense")
    max_seq = int(prog.hparams.data["max_seq"].value.data)
    spec = [(2, 2, 0.0)] * 6 + [(max_seq, 2, 0.0)]  # the last needs more KV than a slot holds
    res = serve(prog, t, requests(spec), queue_capacity=2, seed=0)
    s = res.summary()
    assert s["requests_completed"] + s["requests_rejected"] == len(spec)
    reasons = " ".join(s["rejections"])
    assert "waiting queue full (2)" in reasons and "KV positions" in reasons
    assert s["requests_rejected"] >= 2 and res.outputs_match_reference


def test_time_bound_stops_the_run():
    res = serve(program("tiny_dense"), load_target("test32"), requests(SMALL), max_cycles=20_000)
    s = res.summary()
    assert s["time_bound"] and not s["outputs_match_reference"]
    # nothing vanishes: what did not finish is counted as such
    assert s["requests_completed"] + s["requests_rejected"] + s["requests_unfinished"] == len(SMALL)
    assert s["requests_unfinished"] > 0
    assert "time bound" in s["reports"][0]


def test_wall_time_bound_stops_the_run_and_counts_what_is_left():
    reqs = requests(SMALL * 4)
    res = serve(program("tiny_dense"), load_target("test32"), reqs, max_seconds=0.01)
    s = res.summary()
    assert s["time_bound"] and "wall-time limit" in s["reports"][0]
    assert s["requests_completed"] + s["requests_rejected"] + s["requests_unfinished"] == len(reqs)
    assert s["requests_unfinished"] > 0


def test_unsafe_ablation_is_caught_and_safe_never_is():
    t = load_target("test32")
    bad = 0
    for seed in range(6):
        s = serve(program("tiny_moe"), t, requests(SMALL[:2]), seed=seed, safe=False,
                  check=False).summary()
        bad += s["corruption"] or s["deadlock"]
    assert bad > 0


def test_a_broken_metainfo_path_is_a_data_error():
    # Strip the CF payload from the flow into the first layer's region (its attention
    # reads q, k and v in place and takes the payload from the norm's input): attention
    # then holds no table for the step and the run says so.
    from xdsl.printer import Printer
    import io

    buf = io.StringIO()
    Printer(stream=buf).print_op(program("tiny_moe"))
    text = buf.getvalue()
    text = re.sub(r"(event\.(?:send|recv) @l0_norm1\.in0 bytes \d+ meta )\d+", r"\g<1>0", text)
    text = re.sub(r'event\.meta_resolve "continuous_batching" from @l0_norm1\.in0 bytes \d+\n', "", text)
    res = serve(program_of(parse_ir(text)), load_target("test32"), requests(SMALL[:1]), seed=0)
    s = res.summary()
    assert s["data_error"] and not s["outputs_match_reference"]
    assert "continuous-batching table" in s["reports"][0] and "@l0_attn" in s["reports"][0]


def test_reference_shape_comes_from_the_ir():
    shape = reference_shape(program("tiny_moe"))
    assert (shape.experts, shape.top_k, shape.heads, shape.kv_heads) == (8, 2, 4, 2)
    assert ref.Weights.random(shape, 0).layers[0].moe is not None


def test_cli_run_json(capsys, tmp_path):
    trace = tmp_path / "run.json"
    rc = cli_main(["run", "examples/tiny_dense.mrt", "--requests", "3", "--json",
                   "--trace", str(trace)])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0
    for key in ("outputs_match_reference", "requests_completed", "requests_rejected", "deadlock",
                "corruption", "cycles", "tpot_cycles", "system_tokens_per_mcycle",
                "padding_fraction", "events", "events_per_second"):
        assert key in out
    assert out["outputs_match_reference"] is True
    assert out["requests_completed"] + out["requests_rejected"] == 3
    events = json.loads(trace.read_text())["traceEvents"]
    assert any(e.get("ph") == "X" for e in events)


def test_cli_run_compare_side_by_side(capsys):
    rc = cli_main(["run", "examples/tiny_dense.mrt", "--requests", "3", "--compare", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["static"]["static"] and not out["meshrt"]["static"]
    assert out["speedup_system_throughput"] > 0


@pytest.mark.parametrize("level", ["kernels", "events", "segments"])
def test_cli_run_restarts_from_printed_ir(level, tmp_path, capsys):
    ir = tmp_path / f"tiny.{level}.mlir"
    assert cli_main(["compile", "examples/tiny_dense.mrt", "--target", "test32", "--emit", level,
                     "-o", str(ir)]) == 0
    rc = cli_main(["run", str(ir), "--requests", "2", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["outputs_match_reference"] and out["requests_completed"] == 2


@pytest.mark.parametrize("argv, needle", [
    (["run", "missing.mrt"], "no such model file"),
    (["run", "missing.mlir"], "cannot read"),
    (["run", "examples/tiny_dense.mrt", "--static", "--target", "test32", "--max-cycles", "0"],
     "--max-cycles must be at least 1"),
    (["run", "examples/tiny_dense.mrt", "--requests", "0"], "--requests must be at least 1"),
    (["run", "examples/tiny_dense.mrt", "--time-limit", "0"], "--time-limit must be at least 0.001"),
    (["run", "examples/tiny_dense.mrt", "--time-limit", "inf"], "--time-limit must be a finite"),
    (["run", "examples/tiny_dense.mrt", "--workload", "nope"], "unknown workload"),
    (["run", "examples/tiny_dense.mrt", "--target", "nowhere"], "nowhere"),
])
def test_cli_run_errors_are_one_line(argv, needle, capsys):
    rc = cli_main(argv)
    err = capsys.readouterr().err
    assert rc == 1 and needle in err and err.count("\n") == 1 and "Traceback" not in err


def test_live_recalibration_moves_experts_and_keeps_the_tokens():
    # Region 0 is four times slower than the others; live routing drifts from
    # the uniform profile the placement was made for, so the recalibrator
    # re-places experts between decode steps (at one micro-batch boundary on
    # every core, after the weight moves) and the tokens stay the reference's.
    from meshrt.runtime.expert_profile import ExpertProfile, RegionModel, RegionModels
    from meshrt.runtime.serving import recalibrator_for

    t = load_target("test32")
    prog = program("tiny_moe")
    models = RegionModels({}, (RegionModel(0, 4.0),) + (RegionModel(0, 1.0),) * 7, unit="relative")
    rc = recalibrator_for(prog, t, ExpertProfile.uniform(8, [0, 1]), models, threshold=0.05,
                          min_tokens=4, halflife=4, tokens_per_step=4, max_swaps=2)
    res = serve(prog, t, requests(SMALL), seed=0, recalibrator=rc)
    s = res.summary()
    assert s["outputs_match_reference"] and s["reports"] == []
    assert s["recalibrations"], "no re-placement happened"
    first = s["recalibrations"][0]
    assert first["applies_from_step"] > first["decided_at_step"]
    assert first["moves"] >= 2 and first["bytes"] > 0 and first["cycles"] > 0
    assert "expert move(s)" in first["summary"]


# -- outputs that differ from NumPy: where first ---------------------------------


def _graph_ir(model: str = "tiny_dense") -> str:
    from meshrt import driver

    out = io.StringIO()
    Printer(stream=out).print_op(driver.compile(f"examples/{model}.mrt", "test32", "graph"))
    return out.getvalue()


def _swap_names(text: str, a: str, b: str) -> str:
    """Graph IR with kernels @a and @b renamed into each other (the data plane
    picks a norm's gain by its name, so the numbers change, the IR stays valid)."""
    text = text.replace(f"@{a}(", "@TMP(").replace(f"@{b}(", f"@{a}(")
    return text.replace("@TMP(", f"@{b}(")


@pytest.mark.parametrize("layer, before", [(0, 1), (1, 9)])
def test_a_mismatch_names_request_token_step_and_first_diverging_kernel(layer, before):
    """Layer `layer`'s two norms swap gains: the report names the first
    differing token and the norm at the first one's place as the first
    kernel whose value differs; the kernels before it (the embedding and the
    layers above) agree."""
    text = _swap_names(_graph_ir(), f"l{layer}_norm1", f"l{layer}_norm2")
    prog = segment_program(parse_ir(text, "swapped.mlir"), load_target("test32"))
    res = serve(prog, load_target("test32"), requests(SMALL))
    assert res.mismatches and not res.outputs_match_reference
    d = res.divergence
    rid, got, want = next((m for m in res.mismatches if m[0] == d.request))
    assert d.token == next(i for i, (a, b) in enumerate(zip(got, want)) if a != b)
    assert (d.got, d.want) == (got[d.token], want[d.token])
    record = next(r for r in res.records if r.id == d.request)
    assert (d.step, d.slot) == record.sampled_at[d.token]
    # no other mismatch was sampled earlier
    firsts = [next(r for r in res.records if r.id == m[0]).sampled_at[
        next(i for i, (a, b) in enumerate(zip(m[1], m[2])) if a != b)][0] for m in res.mismatches]
    assert d.step == min(firsts)
    assert d.kernel == f"l{layer}_norm2"
    assert f"differ from NumPy's ffn_in of layer {layer}" in d.detail
    assert f"{before} kernel{'s' if before > 1 else ''} compared before it agree" in d.detail
    s = res.summary()
    assert s["reports"] == [str(d)] and s["first_mismatch"]["kernel"] == d.kernel
    assert str(d).startswith(f"outputs differ from NumPy: request {d.request}, output token "
                             f"{d.token} (position ")


def test_cli_run_reports_the_first_mismatch(tmp_path, capsys):
    ir = tmp_path / "swapped.mlir"
    ir.write_text(_swap_names(_graph_ir(), "l0_norm1", "l0_norm2"))
    assert cli_main(["run", str(ir), "--target", "test32", "--requests", "4", "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["outputs_match_reference"] is False
    (line,) = out["reports"]
    assert "first kernel whose value differs: @l0_norm2" in line
    assert out["first_mismatch"]["kernel"] == "l0_norm2"


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
def test_per_kernel_values_of_a_correct_run_agree_with_numpy(model):
    """The comparison names no kernel when nothing is wrong: a correct run's
    kept values, told a token differs, all agree (no false culprit)."""
    from meshrt.runtime.serving import _interpret, first_divergence

    prog, t = program(model), load_target("test32")
    reqs = requests(SMALL)
    res = serve(prog, t, reqs)
    assert res.outputs_match_reference and res.divergence is None
    weights = ref.Weights.random(reference_shape(prog), 0)
    model_ = ref.ReferenceModel(reference_shape(prog), weights)
    kw = dict(seed=0, queue_capacity=16, max_cycles=200_000_000, safe=True, speed_scale=None)

    def rerun(step):
        _, host, plane = _interpret(prog, t, reqs, weights, watch=step, **kw)
        return host.records, plane

    rec = max(res.records, key=lambda r: len(r.tokens))
    for i in (0, len(rec.tokens) - 2):
        told = [(rec.id, rec.tokens[:i] + [-1] + rec.tokens[i + 1:], rec.tokens)]
        d = first_divergence(prog, reqs, res.records, told, model_, rerun)
        assert d.kernel is None and (d.step, d.slot) == rec.sampled_at[i]
        n = int(re.search(r"^(\d+) kernels compared", d.detail).group(1))
        assert n >= 15, d.detail  # embed, both layers' norms, qkv, attention, o, adds; final norm, logits
