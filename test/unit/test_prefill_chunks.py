"""Chunked prefill (`--prefill-chunk C`): a micro-batch carries b x C token rows; a
prefilling slot feeds C prompt tokens a step, a decoding one its last sample, and in a
chunked program the spare rows carry other micro-batches' prompts, so one request's
chunks flow through the pipeline in consecutive micro-batches. The tokens are NumPy's."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt import driver
from meshrt.frontend.mapper import map_model
from meshrt.frontend.model import MappingSpec, RectChoice
from meshrt.runtime.serving import Host, reference_shape, serve
from meshrt.runtime.workloads import Request
from meshrt.targets import load_target

REPO = Path(__file__).resolve().parents[2]

# Asynchrony seeds: the first two in the suite, all twenty by hand (`-m slow`).
SEEDS = [pytest.param(s, marks=() if s < 2 else pytest.mark.slow) for s in range(20)]
# (prompt_len, output_len, arrival µs): prompts of one to three chunks of 4, staggered
SPEC = [(7, 3, 0.0), (9, 2, 0.0), (5, 4, 20.0), (2, 3, 40.0), (10, 2, 60.0), (6, 3, 80.0)]


@cache
def program(model: str, chunk: int):
    return driver.segment_program(f"examples/{model}.mrt", "test32", chunk=chunk)


def requests() -> list[Request]:
    rng = np.random.default_rng(7)
    return [Request(i, a * 1e-6, rng.integers(2, 256, p).tolist(), p, o, o)
            for i, (p, o, a) in enumerate(SPEC)]


def push_caches(prog, reqs: list[Request]) -> list[Request]:
    """Every other request arrives with the cache of all of its prompt but its last 5 or
    fewer tokens (so a chunk or more of it is still prefilled on chip), from NumPy."""
    from meshrt.runtime import reference as ref

    shape = reference_shape(prog)
    model = ref.ReferenceModel(shape, ref.Weights.random(shape, 0))
    for r in reqs[::2]:
        n = max(1, r.prompt_len - 5)
        state, _ = model.prefill(r.prompt[:n])
        r.kv = state
    return reqs


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("seed", SEEDS)
def test_chunked_prefill_gives_numpys_tokens(model, seed):
    """Prompts of one to three chunks (and a shorter one), prefilled four tokens a step, on
    any asynchrony seed: NumPy's first token and continuation for every request."""
    prog = program(model, 4)
    res = serve(prog, load_target("test32"), requests(), seed=seed)
    assert len(res.records) == len(SPEC) and not res.rejected and not res.sim.reports
    assert res.outputs_match_reference, res.divergence


@pytest.mark.parametrize("model", ["tiny_dense", "tiny_moe"])
@pytest.mark.parametrize("seed", SEEDS)
def test_chunked_prefill_after_a_pushed_cache_gives_numpys_tokens(model, seed):
    """Half the requests arrive with the cache of a prefix of their prompt: the rest of it
    is prefilled in chunks from the first position the cache does not hold."""
    prog = program(model, 4)
    reqs = push_caches(prog, requests())
    res = serve(prog, load_target("test32"), reqs, seed=seed)
    assert len(res.records) == len(SPEC) and not res.rejected
    assert sum(r.pushed > 0 for r in res.records) == 3
    assert res.outputs_match_reference, res.divergence


def test_chunks_cut_the_time_to_first_token():
    """The same requests, one token a step against four: every first token comes sooner."""
    reqs = requests()
    one = serve(program("tiny_dense", 1), load_target("test32"), reqs, seed=0, check=False)
    four = serve(program("tiny_dense", 4), load_target("test32"), reqs, seed=0, check=False)
    ttft1 = {r.id: r.ttft for r in one.records}
    ttft4 = {r.id: r.ttft for r in four.records}
    long = [i for i, (p, _, _) in enumerate(SPEC) if p > 4]
    assert all(ttft4[i] < ttft1[i] for i in long), (ttft1, ttft4)


QWEN3_5 = REPO / "test" / "data" / "hf" / "qwen3_5"  # a Gated DeltaNet layer, then gated attention
DELTA_SPEC = [(9, 3, 0.0), (3, 3, 0.0), (6, 3, 20.0), (11, 3, 40.0)]


@cache
def delta_program(chunk: int):
    return driver.segment_program(QWEN3_5, "test32", chunk=chunk)


def delta_requests(pushed: bool = False) -> list[Request]:
    """Prompts of two to six chunks of 2; `pushed`: every other one arrives with the state
    and cache of its prompt but its last 5 tokens, from NumPy."""
    from meshrt.runtime import reference as ref
    from meshrt.runtime.checkpoint import load_checkpoint

    rng = np.random.default_rng(5)
    reqs = [Request(i, a * 1e-6, rng.integers(0, 128, p).tolist(), p, o, o)
            for i, (p, o, a) in enumerate(DELTA_SPEC)]
    if pushed:
        shape = reference_shape(delta_program(2))
        model = ref.ReferenceModel(shape, load_checkpoint(QWEN3_5, shape))
        for r in reqs[::2]:
            r.kv, _ = model.prefill(r.prompt[:max(1, r.prompt_len - 5)])
    return reqs


@pytest.mark.parametrize("pushed", [False, True])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_deltanet_model_prefills_in_chunks(seed, pushed):
    """Gated DeltaNet in a chunked program: a chunk's rows of one request update its conv
    and recurrent state in position order (one token group: a row's place in the
    micro-batch does not say whose state it is). NumPy's tokens on any seed, with and
    without a pushed state, and the long prompts' first tokens come sooner than at one
    token a step."""
    from meshrt.runtime.checkpoint import load_checkpoint

    prog = delta_program(2)
    target = load_target("test32")
    weights = load_checkpoint(QWEN3_5, reference_shape(prog))
    res = serve(prog, target, delta_requests(pushed), seed=seed, weights=weights)
    assert len(res.records) == len(DELTA_SPEC) and not res.rejected and not res.sim.reports
    assert res.outputs_match_reference, res.divergence
    if seed == 0 and not pushed:
        one = serve(delta_program(1), target, delta_requests(), seed=0, weights=weights, check=False)
        before = {r.id: r.ttft for r in one.records}
        assert all(r.ttft < before[r.id] for r in res.records if DELTA_SPEC[r.id][0] > 2), \
            (before, {r.id: r.ttft for r in res.records})


def test_a_chunked_deltanet_keeps_one_token_group():
    """Token groups split a micro-batch's rows by their place in it (group c: rows c,
    c + groups, ...), which says whose slot a row is only at one row a slot: a chunked
    program's DeltaNet takes one group's columns (its value heads), however wide its band."""
    from meshrt.frontend.mapper import delta_shape

    shape = driver.load_spec(REPO / "examples" / "configs" / "qwen3.5-9b.json").shape
    vh = shape.linear_v_heads
    assert delta_shape(shape, 4 * vh, 8) == (4 * vh, 4)
    assert delta_shape(shape, 4 * vh, 8, chunk=2) == (vh, 1)
    assert delta_shape(shape, vh // 2, 8, chunk=2) == (vh // 2, 1)


def _split_program(chunk: int, tmp_path, target: Path):
    """tiny_dense with two KV heads on five columns (a head split by features), a sliding
    window of 5 on layer 1, q/k norm, partial rotary, sinks; `chunk` rows a slot."""
    (tmp_path / "m.mrt").write_text((REPO / "examples" / "tiny_dense.mrt").read_text()
                                    .replace("kv_heads    = 4", "kv_heads    = 2"))
    spec = driver.load_spec(tmp_path / "m.mrt")
    shape = dataclasses.replace(spec.shape, attn_sinks=True, sliding_window=5, window_layers=(1,),
                                qk_norm=True, rope_partial=0.5)
    n, width, height = shape.layers, 5, 8
    m = MappingSpec(layers={i: RectChoice(4 + i * width, 0, width, height) for i in range(n)},
                    embed=RectChoice(0, 0, 4, height), lm_head=RectChoice(4 + n * width, 0, 4, height))
    spec = dataclasses.replace(spec, shape=shape, mapping=m)
    return driver.segment_program(map_model(spec, load_target(target), None, None, None, chunk), target)


def test_a_head_split_and_a_window_prefill_in_chunks(tmp_path, test32_with):
    """A head split by features sums a chunk's scores against keys the chunk writes in the
    same step (normalized once their sums of squares are in); a window of 5 over a ring
    of 5 + 3 entries: NumPy's tokens on two seeds and every prompt row's attention values,
    on test32 with twice its SRAM (the chunk's rows beside the weights)."""
    target = test32_with("test32x2", ("sram_bytes = 12288", "sram_bytes = 24576"))
    prog = _split_program(4, tmp_path, target)
    flows = {f.flow_name for f in prog.flows()}
    assert "l0_attn.scores.down" in flows
    (l1,) = [k for k in prog.kernels() if k.kernel_name == "l1_attn"]
    assert l1.param("max_seq") == 8  # window 5 + chunk 4 - 1
    _prefills_like_numpy(prog, target)


def _prefills_like_numpy(prog, target) -> None:
    """Prompts of five to eight tokens in chunks of 4: NumPy's tokens on two seeds, and
    every prompt row's attention values of two 8-token prompts (`attention_rows_off`)."""
    rng = np.random.default_rng(3)
    reqs = [Request(i, 0.0, rng.integers(0, 256, 5 + i % 4).tolist(), 5 + i % 4, 3, 3) for i in range(5)]
    for seed in range(2):
        res = serve(prog, load_target(target), reqs, seed=seed)
        assert len(res.records) == 5 and not res.sim.reports
        assert res.outputs_match_reference, (seed, res.divergence)
    long = [Request(i, 0.0, rng.integers(0, 256, 8).tolist(), 8, 3, 3) for i in range(2)]
    assert attention_rows_off(prog, target, long, range(2)) < 1e-5


def _host(groups: int, b: int, chunk: int, prompts: list[int], outputs: int = 2) -> Host:
    reqs = [Request(i, 0.0, list(range(2, 2 + p)), p, outputs, outputs) for i, p in enumerate(prompts)]
    return Host(reqs, micro_batch=b, groups=groups, max_seq=64, clock_hz=1e9, static=False,
                queue_capacity=64, refill_cycles=0, chunk=chunk)


def test_one_requests_chunks_fill_consecutive_micro_batches():
    """One request of 12 prompt tokens, chunks of 4, four micro-batches in flight: its
    three chunks go in micro-batches 0, 1 and 2 (pipelined), not 0, 4 and 8."""
    host = _host(groups=4, b=1, chunk=4, prompts=[12])
    fed = {g: [(s.rid, s.pos) for s in host.first_table(g).slots if s.rid >= 0] for g in range(4)}
    assert fed == {0: [(0, p) for p in range(4)], 1: [(0, p) for p in range(4, 8)],
                   2: [(0, p) for p in range(8, 12)], 3: []}
    assert {s.kv for g in range(3) for s in host.first_table(g).slots if s.rid >= 0} == {0}


@settings(max_examples=60, deadline=None)
@given(groups=st.integers(1, 4), b=st.integers(1, 3), chunk=st.integers(1, 5),
       prompts=st.lists(st.integers(1, 14), min_size=1, max_size=8), outputs=st.integers(1, 4))
def test_every_prompt_token_is_fed_once_in_order_and_every_request_ends(groups, b, chunk, prompts, outputs):
    """Driving the host's tables step by step (the sampler's calls in step order): each
    row names one request's position; a request's positions are fed once each, in step
    and row order, at most `chunk` a step, each decode token after its sample; every
    request finishes with its outputs."""
    host = _host(groups, b, chunk, prompts, outputs)
    seen: dict[int, list[tuple[int, int]]] = {}
    for g in range(groups):
        host.first_tokens(g)
    step = 0
    while len(host.records) < len(prompts):
        assert step < 4 * (sum(prompts) + outputs * len(prompts)) + 8 * groups, "no progress"
        table = host.tables[step]
        assert len(table.slots) == b * chunk
        per: dict[int, int] = {}
        for r, slot in enumerate(table.slots):
            if slot.rid >= 0:
                seen.setdefault(slot.rid, []).append((step, slot.pos))
                per[slot.rid] = per.get(slot.rid, 0) + 1
        assert all(n <= chunk for n in per.values())

        class _Core:
            pass

        core = _Core()
        core.step = step
        host.sampled(core, [100 + step] * len(table.slots), [False] * len(table.slots))
        step += 1
    for rid, p in enumerate(prompts):
        positions = [pos for _, pos in seen[rid]]
        assert positions == list(range(p + outputs - 1)), (rid, positions)
    assert sorted(r.id for r in host.records) == list(range(len(prompts)))
    assert all(len(r.tokens) == outputs for r in host.records)


def test_run_takes_the_chunk_with_a_model_not_ir(tmp_path, capsys):
    """`meshrt run IR --prefill-chunk N` is one line: the chunk is chosen at compile."""
    from meshrt.tools.cli import main

    ir = tmp_path / "p.mlir"
    assert main(["compile", "examples/tiny_dense.mrt", "--target", "test32", "--prefill-chunk", "4",
                 "--emit", "segments", "-o", str(ir)]) == 0
    capsys.readouterr()
    assert main(["run", str(ir), "--prefill-chunk", "4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefill-chunk is chosen when a model is compiled" in err


def test_a_static_batch_prefills_in_chunks():
    """The static build (--dynamism none: batches filled together, the table installed by
    the host) prefills in chunks too: NumPy's tokens."""
    prog = driver.segment_program("examples/tiny_moe.mrt", "test32", chunk=4, dynamism=())
    res = serve(prog, load_target("test32"), requests(), seed=0)
    assert res.static and len(res.records) == len(SPEC)
    assert res.outputs_match_reference, res.divergence


def attention_rows_off(prog, target, reqs: list[Request], steps: range) -> float:
    """The largest difference between an attention value the mesh computed for a prompt row
    and NumPy's for that position (the reference prefilling each prompt, traced), over the
    rows of micro-batch `steps`. Tokens alone miss attention errors that do not flip a
    greedy choice of the tiny models."""
    from meshrt.runtime import reference as ref
    from meshrt.runtime import serving

    shape = reference_shape(prog)
    weights = ref.Weights.random(shape, 0)
    model = ref.ReferenceModel(shape, weights)
    traces = {}
    for r in reqs:
        traces[r.id] = ref.Trace()
        model.prefill(r.prompt, traces[r.id])
    tables, sampled = {}, Host.sampled

    def keep(host, cd, tokens, ends):
        tables[cd.step] = host.tables[cd.step]
        return sampled(host, cd, tokens, ends)

    worst, seen = 0.0, 0
    Host.sampled = keep
    try:
        for step in steps:
            _, _, plane = serving._interpret(prog, load_target(target), reqs, weights, seed=0,
                                             queue_capacity=16, max_cycles=10**8, safe=True,
                                             speed_scale=None, watch=step)
            for name, held in plane.watched.items():
                key = plane.reference_key(name)
                if key is None or key[1] != "attn_out":
                    continue
                for r, slot in enumerate(tables[step].slots):
                    req = reqs[slot.rid] if slot.rid >= 0 else None
                    if req is None or slot.pos >= req.prompt_len or not held.mask[r].all():
                        continue
                    want = np.asarray(traces[slot.rid].tensors[key], np.float64).reshape(req.prompt_len, -1)
                    got = plane.in_reference_order(name, held.data[r].astype(np.float64))
                    worst = max(worst, float(np.max(np.abs(got - want[slot.pos]))))
                    seen += 1
    finally:
        Host.sampled = sampled
    assert seen, "no attention row was compared"
    return worst


def test_attention_pe_bodies_read_the_row_table(tmp_path, test32_with):
    """Whole KV heads a column (tiny_dense on four columns): attention runs its PE bodies,
    which take each row's KV slot and position from the row table; layer 1's window of 5
    over a ring of 5 + 4 - 1 (a ring of 5 would let a chunk's later rows overwrite values
    its first row reads: its attention values differ from NumPy's by as much as they are
    large, yet the tiny model's greedy tokens do not change): every prompt row's attention
    values are NumPy's, and the tokens on two seeds."""
    from meshrt.kernels.attention.pe import in_pe
    from meshrt.shape import HParams

    target = test32_with("test32x2", ("sram_bytes = 12288", "sram_bytes = 24576"))
    spec = driver.load_spec("examples/tiny_dense.mrt")
    shape = dataclasses.replace(spec.shape, sliding_window=5, window_layers=(1,))
    n, width, height = shape.layers, 4, 16
    m = MappingSpec(layers={i: RectChoice(4 + i * width, 0, width, height) for i in range(n)},
                    embed=RectChoice(0, 0, 4, height), lm_head=RectChoice(4 + n * width, 0, 4, height))
    spec = dataclasses.replace(spec, shape=shape, mapping=m)
    prog = driver.segment_program(map_model(spec, load_target(target), None, None, None, 4), target)
    attn = {k.kernel_name: k for k in prog.kernels() if k.kind.data == "attention"}
    assert all(in_pe(k, HParams.of(prog)) for k in attn.values())
    assert attn["l1_attn"].param("max_seq") == 8
    _prefills_like_numpy(prog, target)
