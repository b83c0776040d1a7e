"""KV spill (`--kv-spill N`): an MoE layer's attention keeps the first N positions of a
slot on its own region and the rest on tiles of the layer's expert cores shaped like it,
attended there in parallel; the partial softmaxes merge into the region's root. The
tokens are NumPy's, for prompts prefilled on chip and for pushed caches."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshrt import driver
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.attention.layout import tile_span
from meshrt.runtime.serving import reference_shape, serve
from meshrt.runtime.workloads import Request
from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_MOE = str(REPO / "examples" / "tiny_moe.mrt")
SPILL = 8  # of tiny_moe's 32 positions a slot

# Asynchrony seeds: the first in the suite (the pushed-cache and three-tile tests run two
# more), all twenty by hand (`-m slow`).
SEEDS = [pytest.param(s, marks=() if s < 1 else pytest.mark.slow) for s in range(20)]
# (prompt_len, output_len, arrival µs): every request's context passes position 8, two
# of them while prefilling, two while decoding
SPEC = [(12, 6, 0.0), (4, 9, 0.0), (20, 4, 20.0), (7, 6, 40.0)]

# test32 with two colours and an input queue more: the spill tiles' flows cross the gate
# and relay columns, which test32's six user colours cannot also carry
ROOMIER = (("colors = 8", "colors = 10"), ("reserved_colors = [6, 7]", "reserved_colors = [8, 9]"),
           ("reserved_task_ids = [6, 7, 15]", "reserved_task_ids = [8, 9, 15]"),
           ("input_queues = 5", "input_queues = 6"))


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    toml = (REPO / "meshrt" / "targets" / "test32.toml").read_text()
    for old, new in (('name = "test32"', 'name = "test32s"'), *ROOMIER):
        assert old in toml, old
        toml = toml.replace(old, new)
    path = tmp_path_factory.mktemp("target") / "test32s.toml"
    path.write_text(toml)
    return path


@cache
def program(target: Path, ir: str | None = None):
    """tiny_moe spilling past position 8 (or the graph IR `ir`), lowered to segments."""
    t = driver.load_target(target)
    module = driver.load_model(TINY_MOE, t, spill=SPILL) if ir is None else driver.parse_ir(ir)
    return driver.segment_program(module, t)


def requests(pushed: bool = False, prog=None) -> list[Request]:
    rng = np.random.default_rng(11)
    reqs = [Request(i, a * 1e-6, rng.integers(2, 256, p).tolist(), p, o, o)
            for i, (p, o, a) in enumerate(SPEC)]
    if pushed:  # every other request arrives with the cache of its prompt but its last token
        from meshrt.runtime import reference as ref

        shape = reference_shape(prog)
        model = ref.ReferenceModel(shape, ref.Weights.random(shape, 0))
        for r in reqs[::2]:
            r.kv, _ = model.prefill(r.prompt[:-1])
    return reqs


def attention_agrees(prog, target, reqs, res, seed: int) -> int:
    """Tokens can hide a small error in a long context's attention, so compare the
    attention kernels' values themselves with NumPy's where request 0 samples its first
    token (its prompt's last position attended): the number of kernels compared."""
    from meshrt.runtime import reference as ref
    from meshrt.runtime.serving import KERNEL_ATOL, KERNEL_RTOL, _interpret, kernel_values

    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    step, slot = next(r for r in res.records if r.id == 0).sampled_at[0]
    _, _, plane = _interpret(prog, target, reqs, weights, seed=seed, queue_capacity=16,
                             max_cycles=200_000_000, safe=True, speed_scale=None, watch=step)
    trace = ref.Trace()
    req = next(r for r in reqs if r.id == 0)
    ref.ReferenceModel(shape, weights).prefill(req.prompt, trace, req.kv)
    compared = 0
    for name, _, value, expect in kernel_values(prog, plane, trace, slot):
        if name.endswith("_attn"):
            compared += 1
            assert np.allclose(value, expect, rtol=KERNEL_RTOL, atol=KERNEL_ATOL), name
    return compared


def spilled(prog) -> dict[str, tuple]:
    """Attention kernel -> (its region's rectangle, its spill tiles) of a spilling one."""
    return {k.kernel_name: (k.region.rects.data[0].tuple[:4], [r.tuple[:4] for r in k.region.rects.data[1:]])
            for k in prog.kernels() if k.param("spill_from") is not None}


@pytest.mark.parametrize("seed", SEEDS)
def test_spilled_kv_gives_numpys_tokens(target, seed):
    """Contexts past the spill point on any asynchrony seed: NumPy's first token and
    continuation for every request, both layers' later positions on their expert cores."""
    prog = program(target)
    tiles = spilled(prog)
    assert set(tiles) == {"l0_attn", "l1_attn"} and all(len(t[1]) == 1 for t in tiles.values())
    res = serve(prog, driver.load_target(target), requests(), seed=seed)
    assert len(res.records) == len(SPEC) and not res.rejected and not res.sim.reports
    assert max(r.prompt_len + r.output_len for r in requests()) > SPILL
    assert res.outputs_match_reference, res.divergence


def test_spilled_kv_after_a_pushed_cache_gives_numpys_tokens(target):
    """The host writes a pushed cache's positions past the spill point into the spill
    tiles' rows, the earlier ones into the region's."""
    prog = program(target)
    reqs = requests(pushed=True, prog=prog)
    res = serve(prog, driver.load_target(target), reqs, seed=3)
    assert sum(r.pushed > 0 for r in res.records) == 2 and not res.rejected
    assert res.outputs_match_reference, res.divergence


def test_three_spill_tiles_pass_the_input_on_and_merge_back(target):
    """A layer whose spilled positions take three tiles (graph IR naming them): the
    q | k | v goes tile to tile, each root merges the next tile's partial into its own,
    and the region's root receives one partial, however many tiles."""
    ir = str(driver.load_model(TINY_MOE, driver.load_target(target), spill=6))
    ir, n = re.subn(r"spill = #mesh\.cores<\(5, 0, 2, 16\)>",
                    "spill = #mesh.cores<(5, 0, 2, 16), (7, 0, 2, 16), (9, 0, 2, 16)>", ir)
    assert n == 1
    prog = program(target, ir)
    assert spilled(prog)["l0_attn"][1] == [(5, 0, 2, 16), (7, 0, 2, 16), (9, 0, 2, 16)]
    flows = {f.flow_name: f for f in prog.flows()}
    assert [flows[f"l0_attn.spill{n}.in"].src.extent[0] for n in (1, 2, 3)] == [1, 5, 7]
    assert [flows[f"l0_attn.spill{n}"].dst.extent[0] for n in (1, 2, 3)] == [1, 5, 7]
    assert {flows[f"l0_attn.spill{n}.in"].flow_role for n in (1, 2, 3)} == {FlowRole.SPILL}
    reqs = requests()
    res = serve(prog, driver.load_target(target), reqs, seed=1)
    assert not res.rejected and res.outputs_match_reference, res.divergence
    assert attention_agrees(prog, driver.load_target(target), reqs, res, seed=1) == 2


@given(st.integers(2, 5000), st.integers(1, 8), st.data())
def test_the_tiles_hold_every_ring_entry_once(max_seq, spill_tiles, data):
    """The region's entries and the spill tiles' partition the ring, in order, the spill
    tiles' balanced (`tile_span`, which the numerics, the PE bodies and the roles share)."""
    spill_from = data.draw(st.integers(1, max_seq - 1))
    tiles = 1 + min(spill_tiles, max_seq - spill_from)
    spans = [tile_span(max_seq, spill_from, tiles, t) for t in range(tiles)]
    assert spans[0] == (0, spill_from)
    assert all(a[0] + a[1] == b[0] for a, b in zip(spans, spans[1:]))
    assert spans[-1][0] + spans[-1][1] == max_seq
    sizes = [n for _, n in spans[1:]]
    assert max(sizes) - min(sizes) <= 1 and min(sizes) >= 1
    assert tile_span(max_seq, None, 1, 0) == (0, max_seq)


def _fails(args, capsys) -> str:
    assert main(args) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    return err


def test_bad_spills_are_one_line_errors(tmp_path, target, capsys):
    dense = str(REPO / "examples" / "tiny_dense.mrt")
    assert "layer 0 is dense (its FFN shares the attention's region, so it has no FFN cores to spill KV to)" \
        in _fails(["compile", dense, "--target", "test32", "--kv-spill", "4"], capsys)
    assert "argument --kv-spill: a spill point must be 1..16,777,216 positions, got 0" \
        in _fails(["compile", TINY_MOE, "--target", "test32", "--kv-spill", "0"], capsys)
    # a spill the expert cores cannot hold beside their experts names the layer, the
    # tiles and the bytes a core
    assert re.search(r"--kv-spill 1: layer 0's 4,095 spilled KV positions a slot do not fit its expert "
                     r"cores: \d+ tiles of \d+ x \d+ beside their expert tiles need [\d.]+ KB per core, "
                     r"more than the [\d.]+ KB a core has",
                     _fails(["compile", TINY_MOE, "--target", "test32", "--context", "4k", "--kv-spill", "1"],
                            capsys))
    ir = tmp_path / "g.mlir"
    assert main(["compile", TINY_MOE, "--target", str(target), "--kv-spill", "8", "-o", str(ir)]) == 0
    assert "--kv-spill are chosen when a model is compiled, not on IR" \
        in _fails(["compile", str(ir), "--target", str(target), "--kv-spill", "8"], capsys)
    assert "--kv-spill is chosen when a model is compiled (meshrt compile --kv-spill), not on IR" \
        in _fails(["run", str(ir), "--kv-spill", "8"], capsys)
    assert "kernel @l0_attn: its KV spills to the expert cores (--kv-spill)" \
        in _fails(["compile", str(ir), "--target", str(target), "--emit", "csl", "-o", str(tmp_path / "c")],
                  capsys)


def test_a_head_split_spills_too(target, tmp_path):
    """A head split (one KV head over two columns, by features) spills like whole heads:
    the spill tile runs the region's row chains and column merge. Requests arrive with
    the cache of 140 positions pushed (positions 128.. on the spill tile) and decode."""
    from meshrt.runtime import reference as ref

    spec = tmp_path / "moe_kv1.mrt"
    spec.write_text(Path(TINY_MOE).read_text().replace("kv_heads    = 2", "kv_heads    = 1"))
    t = driver.load_target(target)
    prog = driver.segment_program(driver.load_model(str(spec), t, context=256, spill=128), t)
    (region, tiles), = [v for k, v in spilled(prog).items() if k == "l0_attn"]
    assert region[2] == 2 and len(tiles) == 1  # wider than its one KV head
    shape = reference_shape(prog)
    model = ref.ReferenceModel(shape, ref.Weights.random(shape, 0))
    rng = np.random.default_rng(5)
    reqs = []
    for i, n in enumerate((140, 150)):
        r = Request(i, 0.0, rng.integers(2, 256, n).tolist(), n, 3, 3)
        r.kv, _ = model.prefill(r.prompt[:-1])
        reqs.append(r)
    res = serve(prog, t, reqs, seed=2)
    assert sum(r.pushed > 0 for r in res.records) == 2 and not res.rejected
    assert res.outputs_match_reference, res.divergence
    assert attention_agrees(prog, t, reqs, res, seed=2) == 2
