"""Compute bodies at the PE-program level: the executor's DSD semantics, RMSNorm's
bodies against the NumPy reference, and the CSL printed from the same ops."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects import csl

from meshrt.backend.csl.pe_print import body_lines
from meshrt.backend.csl_lint import check_csl
from meshrt.kernels.elementwise.pe import rmsnorm_bodies, silu_mul_bodies
from meshrt.kernels.embed.pe import embed_bodies
from meshrt.kernels.numerics import part
from meshrt.kernels.sample.pe import sample_bodies
from meshrt.kernels.pe import Bodies, Body, Buffer
from meshrt.runtime import pe_exec
from meshrt.runtime import reference as ref

F32 = np.float32


def _run(bodies: Bodies, op: str, bufs: dict[str, np.ndarray]) -> None:
    pe_exec.run(bodies.funcs[op], bufs)


def _buffers(bodies: Bodies) -> dict[str, np.ndarray]:
    return {b.name: np.zeros(b.elems, pe_exec.dtype(b.type().element_type)) for b in bodies.buffers}


def test_a_stride_0_destination_accumulates_in_stream_order():
    bs = Bodies("k", [Buffer("acc", 2), Buffer("v", 6)])
    b = bs.body("sum")
    acc = b.dsd("acc", (2, 3), (1, 0))
    b.fadds(acc, acc, b.dsd("v", (2, 3)))
    bs.add("sum", b)
    bufs = _buffers(bs)
    bufs["acc"][:] = [1, 2]
    bufs["v"][:] = [1e8, 1, -1e8, 3, 4, 5]
    _run(bs, "sum", bufs)
    # float32, left to right: ((1 + 1e8) + 1) - 1e8 = 0, as a stream adds them; 2 + 12 = 14
    assert bufs["acc"].tolist() == [0.0, 14.0]


def test_fmacs_and_a_broadcast_scalar_per_slot():
    bs = Bodies("k", [Buffer("y", 4), Buffer("x", 4), Buffer("s", 2)])
    b = bs.body("f")
    b.fmacs(b.dsd("y", (4,)), b.dsd("y", (4,)), b.dsd("x", (4,)), b.scalar(2.0))
    b.fmuls(b.dsd("y", (2, 2)), b.dsd("y", (2, 2)), b.dsd("s", (2, 2), (1, 0)))
    bs.add("f", b)
    bufs = _buffers(bs)
    bufs["y"][:] = [1, 1, 1, 1]
    bufs["x"][:] = [1, 2, 3, 4]
    bufs["s"][:] = [10, -1]
    _run(bs, "f", bufs)
    assert bufs["y"].tolist() == [30.0, 50.0, -7.0, -9.0]


def test_integer_arithmetic_of_constants_folds():
    """An index computed from constants alone is folded when the body is compiled (the
    environment holds only what steps compute)."""
    bodies = Bodies("k", [Buffer("x", 8), Buffer("y", 8)])
    bd = bodies.body("t")
    bd.store(bd.load("x", bd.plus(bd.mul(bd.const(2), 3), 1)), "y", bd.const(0))
    bodies.add("t", bd)
    bufs = {"x": np.arange(8, dtype=np.float32), "y": np.zeros(8, np.float32)}
    _run(bodies, "t", bufs)
    assert bufs["y"][0] == 7


def test_a_dsd_past_its_buffer_and_an_unknown_op_are_errors():
    bs = Bodies("k", [Buffer("y", 4)])
    b = bs.body("over")
    b.fmovs(b.dsd("y", (5,)), b.scalar(0.0))
    bs.add("over", b)
    with pytest.raises(pe_exec.PeExecError, match="reaches element 4 of buffer 'y', which has 4"):
        _run(bs, "over", _buffers(bs))
    b = bs.body("half")
    b._add(csl.FmaxhOp(operands=[[b.dsd("y", (4,)), b.dsd("y", (4,)), b.dsd("y", (4,))]]))
    bs.add("half", b)
    with pytest.raises(pe_exec.PeExecError, match="no executor for op csl.fmaxh"):
        _run(bs, "half", _buffers(bs))


def _rmsnorm_on_a_column(x: np.ndarray, gain: np.ndarray, h: int, eps: float) -> np.ndarray:
    """RMSNorm of x (b, n) run as its bodies run on a column of h cores: every core's
    square_sum, the partials added into core 0 one neighbour at a time, the root's
    rsqrt, its inverse RMS relayed into the others' p, every core's scale."""
    b, n = x.shape
    k = -(-n // h)
    bodies = rmsnorm_bodies("norm", b, k, n, eps, h > 1)
    cores = []
    for j in range(h):
        bufs = _buffers(bodies)
        lo, hi = min(n, j * k), min(n, (j + 1) * k)
        bufs["x"].reshape(b, k)[:, :hi - lo] = x[:, lo:hi]
        bufs["gain"][:hi - lo] = gain[lo:hi]
        _run(bodies, "square_sum", bufs)
        cores.append((lo, hi, bufs))
    root = cores[0][2]
    for _, _, other in reversed(cores[1:]):  # a chain: each partial added in at the root
        root["p"][:] = other["y"][:b]
        _run(bodies, "add", root)
    _run(bodies, "rsqrt", root)
    relayed = root["y"][:b].copy()  # what the root sends back up, before its own scale
    out = np.zeros((b, n), F32)
    for lo, hi, bufs in cores:
        if bufs is not root:
            bufs["p"][:] = relayed
        _run(bodies, "scale", bufs)
        out[:, lo:hi] = bufs["y"].reshape(b, k)[:, :hi - lo]
    return out


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), n=st.integers(1, 40), h=st.integers(1, 6),
       eps=st.sampled_from([1e-6, 1e-5, 0.5]), seed=st.integers(0, 2**16))
def test_rmsnorm_bodies_compute_the_reference_rmsnorm(b, n, h, eps, seed):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((b, n)).astype(F32) * F32(rng.uniform(0.01, 100))
    gain = rng.standard_normal(n).astype(F32)
    got = _rmsnorm_on_a_column(x, gain, h, eps)
    want = ref.rmsnorm(x, gain, eps)
    # float32 sums against the reference's float64: a few ulps of the result's scale
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())


def test_rmsnorm_csl_is_the_executed_body_and_lints():
    bodies = rmsnorm_bodies("l0_norm1", 2, 3, 6, 0.25, True)
    text = {op: "\n".join(body_lines(fn, {"gain": ("w", 40)})) for op, fn in bodies.funcs.items()}
    # the root's inverse RMS: the model's eps, 1 / n, sqrt of CSL's math library
    assert "@fmuls(scale_dsd, y_dsd, 0.1666666716" in text["rsqrt"]
    assert ", 0.25);" in text["rsqrt"] and "math.sqrt_f32(" in text["rsqrt"]
    # the scale reads the relayed inverse RMS (p) and the gains at their place in w
    assert "-> p[ d0 ]" in text["scale"] and "-> w[ (d1 + 40) ]" in text["scale"]
    program = ["const math = @import_module(\"<math>\");",
               "var x = @zeros([6]f32);", "var y = @zeros([6]f32);", "var p = @zeros([2]f32);",
               "var scale = @zeros([2]f32);", "var w = @zeros([64]f32);"]
    for op, body in text.items():
        program += [f"fn {op}() void {{", body, "}"]
    assert check_csl("\n".join(program), "rmsnorm.csl") == []


@settings(max_examples=30, deadline=None)
@given(b=st.integers(1, 3), rows=st.integers(1, 40), cols=st.integers(1, 12), bias=st.booleans(),
       seed=st.integers(0, 2**16))
def test_gemv_body_accumulates_row_by_row_in_float32(b, rows, cols, bias, seed):
    """The fmac loop runs as one computation (pe_exec's fused loop) and gives exactly what
    one @fmacs after another gives: bias, then each input row's product added in order."""
    from meshrt.kernels.gemv.pe import gemv_bodies

    rng = np.random.default_rng(seed)
    bodies = gemv_bodies("g", b, rows, cols, bias)
    bufs = _buffers(bodies)
    bufs["x"][:] = rng.standard_normal(b * rows) * 10.0 ** rng.uniform(-3, 3, b * rows)
    bufs["w"][:] = rng.standard_normal(rows * cols)
    if bias:
        bufs["bias"][:] = rng.standard_normal(cols)
    _run(bodies, "fmac", bufs)
    x, w = bufs["x"].reshape(b, rows), bufs["w"].reshape(rows, cols)
    for j in range(b):
        want = bufs["bias"].copy() if bias else np.zeros(cols, F32)
        for r in range(rows):
            want = (want + (w[r] * x[j, r]).astype(F32)).astype(F32)
        assert bufs["y"][j * cols:(j + 1) * cols].tolist() == want.tolist()


def test_gemv_csl_moves_the_row_dsd_and_reads_the_input_element():
    from meshrt.kernels.gemv.pe import gemv_bodies

    bodies = gemv_bodies("l0_qkv", 2, 3, 4, True)
    text = "\n".join(body_lines(bodies.funcs["fmac"], {"w": ("w", 8), "bias": ("w", 20)}))
    assert "-> w[ (d0 + 20) ]" in text and "-> w[ (d0 + 8) ]" in text
    assert "@increment_dsd_offset(" in text and "@fmacs(" in text and "x[" in text
    program = ["var x = @zeros([6]f32);", "var y = @zeros([8]f32);", "var w = @zeros([32]f32);",
               "fn fmac() void {", text, "}"]
    assert check_csl("\n".join(program), "gemv.csl") == []


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 3), k=st.integers(1, 20), seed=st.integers(0, 2**16),
       act=st.sampled_from([(1.0, 0.0, 0.0), (1.702, 7.0, 1.0), (1.5, 0.5, -0.25)]))
def test_silu_mul_body_is_the_reference_glu_exactly(b, k, seed, act):
    """silu(gate) * up, and gpt-oss's clamped form, element for element as
    reference.glu computes them in float32 (a loop calling <math>'s exp_f32)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((b, 2, k)) * 8).astype(np.float32)
    bodies = silu_mul_bodies("act", b, k, *act)
    bufs = _buffers(bodies)
    bufs["x"][:] = x.reshape(-1)
    _run(bodies, "silu_mul", bufs)
    want = ref.glu(x[:, 0], x[:, 1], ref.Act(*act))
    np.testing.assert_array_equal(bufs["y"].reshape(b, k), want)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 3), k=st.integers(1, 12), n=st.integers(1, 30), seed=st.integers(0, 2**16))
def test_independent_loop_iterations_run_at_once_as_they_run_one_by_one(b, k, n, seed):
    """pe_exec runs a loop whose iterations are independent (silu_mul's, the norm's 1/sqrt)
    on all iterations at once; the result is the one-by-one loop's, bit for bit."""
    rng = np.random.default_rng(seed)
    cases = [(silu_mul_bodies("act", b, k, 1.702, 7.0, 1.0), "silu_mul"),
             (rmsnorm_bodies("norm", b, k, n, 1e-5, True), "rsqrt")]
    for bodies, op in cases:
        start = {name: (rng.standard_normal(v.size) * 4).astype(np.float32) ** 2
                 for name, v in _buffers(bodies).items()}
        got = {name: v.copy() for name, v in start.items()}
        pe_exec._CACHE.clear()
        _run(bodies, op, got)
        with pytest.MonkeyPatch.context() as m:
            m.setattr(pe_exec, "_parallel", lambda op, ctx: None)
            pe_exec._CACHE.clear()
            one_by_one = {name: v.copy() for name, v in start.items()}
            _run(bodies, op, one_by_one)
        pe_exec._CACHE.clear()
        for name in start:
            np.testing.assert_array_equal(got[name], one_by_one[name])


def test_a_loop_that_reads_another_iterations_element_runs_one_by_one():
    """A prefix sum (x[i] += x[i - 1]) carries a value from one iteration to the next:
    it must not run at once."""
    bodies = Bodies("scan", [Buffer("x", 5)])
    body = bodies.body("scan")
    body.each(4, lambda bd, i: bd.store(bd.addf(bd.load("x", i), bd.load("x", bd.plus(i, 1))), "x",
                                        bd.plus(i, 1)))
    bodies.add("scan", body)
    bufs = {"x": np.arange(1, 6, dtype=np.float32)}
    _run(bodies, "scan", bufs)
    np.testing.assert_array_equal(bufs["x"], np.cumsum(np.arange(1, 6, dtype=np.float32)))


def _reach_bodies() -> Bodies:
    """Per slot j, loops as long as `n[j]` (read at run time): an @fmacs accumulation over
    the rows, independent stores, a carried maximum; rows past n[j] stay untouched."""
    from xdsl.dialects.builtin import IndexType

    bodies = Bodies("r", [Buffer("n", 3, "i32"), Buffer("v", 3 * 5 * 2), Buffer("acc", 3 * 2),
                          Buffer("sq", 3 * 5), Buffer("mx", 3)])
    bd = bodies.body("reach")

    def slot(bd: Body, j) -> None:
        n = bd.cast(bd.load("n", j), IndexType())
        acc = bd.offset(bd.dsd("acc", (2,)), bd.mul(j, 2))
        rows = bd.offset(bd.dsd("v", (2,)), bd.mul(j, 10))
        bd.each(n, lambda b2, r: b2.fmacs(acc, acc, b2.offset(rows, b2.mul(r, 2)), b2.scalar(2.0)))

        def square(b2: Body, r) -> None:
            x = b2.load("v", b2.add(b2.mul(j, 10), b2.mul(r, 2)))
            b2.store(b2.mulf(x, x), "sq", b2.add(b2.mul(j, 5), r))

        bd.each(n, square)
        (m,) = bd.fold(n, [bd.scalar(-1.0)],
                       lambda b2, r, m: [b2.maxf(m, b2.load("v", b2.add(b2.mul(j, 10), b2.mul(r, 2))))])
        bd.store(m, "mx", j)

    bd.each(3, slot)
    bodies.add("reach", bd)
    return bodies


@settings(max_examples=25, deadline=None)
@given(n=st.lists(st.integers(0, 5), min_size=3, max_size=3), seed=st.integers(0, 2**16))
def test_loops_end_where_a_value_computed_at_run_time_says(n, seed):
    """A loop's end may be an index the body computes (attention's loops over the KV rows a
    slot's query reaches): each slot's loops run its own count, at once or one by one."""
    rng = np.random.default_rng(seed)
    bodies = _reach_bodies()
    v = rng.standard_normal(30).astype(F32)
    for parallel in (True, False):
        with pytest.MonkeyPatch.context() as m:
            if not parallel:
                m.setattr(pe_exec, "_parallel", lambda op, ctx: None)
                m.setattr(pe_exec, "_fused", lambda op, ctx: None)
            pe_exec._CACHE.clear()
            bufs = _buffers(bodies)
            bufs["n"][:] = n
            bufs["v"][:] = v
            _run(bodies, "reach", bufs)
        pe_exec._CACHE.clear()
        rows = v.reshape(3, 5, 2)
        for j, k in enumerate(n):
            want = np.zeros(2, F32)
            for r in range(k):
                want = (want + rows[j, r] * F32(2.0)).astype(F32)
            np.testing.assert_array_equal(bufs["acc"].reshape(3, 2)[j], want)
            sq = bufs["sq"].reshape(3, 5)[j]
            np.testing.assert_array_equal(sq[:k], rows[j, :k, 0] ** 2)
            assert not sq[k:].any()  # past the end: never touched
            assert bufs["mx"][j] == max([-1.0, *rows[j, :k, 0].tolist()])


def test_a_loop_end_computed_at_run_time_prints_as_a_csl_range_over_it():
    text = "\n".join(body_lines(_reach_bodies().funcs["reach"], {}))
    # the three loops of each slot end at its n, read when the loop starts
    assert len(re.findall(r"for\(@range\(i32, 0, @as\(i32, \(n\[(v\d+)\]\)\), 1\)\)", text)) == 3, text
    assert check_csl("var n = @zeros([3]i32);\nvar v = @zeros([30]f32);\nvar acc = @zeros([6]f32);\n"
                     "var sq = @zeros([15]f32);\nvar mx = @zeros([3]f32);\nfn reach() void {\n"
                     + text + "\n}", "reach.csl") == []


# ---- the sampler and the embedding: i32 token ids, carried loops, conditionals, px


def _sample_on_a_row(logits: np.ndarray, w: int, x0: int, ends: tuple[int, ...], order, cores=None,
                     elem: str = "f32"):
    """The sampler's bodies on a row of w cores from mesh column x0: argmax on each (its
    column's logits), merged into the first core of `order` in that order, then
    eos_check; (tokens, done). `cores`: the columns that run (the others' candidates are
    never merged)."""
    b, vocab = logits.shape
    bodies = sample_bodies("sample", b, vocab, x0, w, ends, elem)
    cands = {}
    for i in (range(w) if cores is None else cores):
        bufs = _buffers(bodies)
        c0, c1 = part(vocab, w, i)
        x = bufs["x"].reshape(b, -1)
        x[:, :c1 - c0] = logits[:, c0:c1]
        pe_exec.run(bodies.funcs["argmax"], bufs, {"px": x0 + i, "py": 7})
        cands[i] = bufs
    root, *rest = [i for i in order if i in cands]
    for i in rest:
        cands[root]["cand_in"][:] = cands[i]["cand"]
        pe_exec.run(bodies.funcs["argmax_merge"], cands[root])
    pe_exec.run(bodies.funcs["eos_check"], cands[root])
    return cands[root]["tokens"], cands[root]["done"]


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), vocab=st.integers(1, 90), w=st.integers(1, 7), x0=st.integers(0, 40),
       ties=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_sample_bodies_take_numpys_argmax_on_any_split_and_merge_order(b, vocab, w, x0, ties, seed, data):
    rng = np.random.default_rng(seed)
    # ties: few distinct values, so equal maxima fall on several cores
    logits = (rng.integers(-3, 3, (b, vocab)) if ties else rng.standard_normal((b, vocab)) * 50).astype(F32)
    order = data.draw(st.permutations(range(w)))
    ends = tuple(data.draw(st.lists(st.integers(0, vocab - 1), max_size=3, unique=True)))
    tokens, done = _sample_on_a_row(logits, w, x0, ends, order)
    want = np.argmax(logits, axis=1)  # the first of equal maxima
    assert tokens.dtype == np.int32 and list(tokens) == list(want)
    assert list(done) == [int(t in ends) for t in want]


def test_sample_bodies_keep_token_ids_exact_past_16_bits_and_compare_them_as_integers():
    """Qwen's vocabulary (151,936) and its EOS id 151,645: float16 held ids exactly only
    to 2,048 and the old CSL compared them as u16; the bodies carry i32 words."""
    vocab, w = 151_936, 64
    logits = np.full((2, vocab), -1.0, F32)
    logits[0, 151_645] = 5.0  # EOS
    logits[1, 70_001] = 5.0  # past u16's 65,535 range once truncated to 16 bits
    n = -(-vocab // w)
    holders = [151_645 // n, 70_001 // n, w - 1]
    tokens, done = _sample_on_a_row(logits, w, 3, (151_645,), holders, cores=holders)
    assert list(tokens) == [151_645, 70_001] and list(done) == [1, 0]


def test_sample_bodies_read_16_bit_logits_as_their_float32_values():
    rng = np.random.default_rng(3)
    logits = rng.standard_normal((2, 50)).astype(np.float16)
    tokens, _ = _sample_on_a_row(logits.astype(F32), 3, 0, (), range(3), elem="f16")
    assert list(tokens) == list(np.argmax(logits, axis=1))
    text = "\n".join(body_lines(sample_bodies("s", 2, 50, 0, 3, (), "f16").funcs["argmax"], {}))
    assert "@as(f32, (x[" in text  # each 16-bit logit widened where it is read: no float32 copy


def test_sample_bodies_read_bf16_logits_past_f16s_range():
    """A bf16 program's logits are bf16 values (kept exactly in float32 by the executor):
    one past 65504, which IEEE f16 would hold as infinity, still wins only where it is
    the largest; the printed body reads them as bf16."""
    from meshrt.activations import round_activations

    logits = round_activations(np.array([[70_000.0, 90_000.0, -3.0], [1e5, 3.0, 2e5]], F32), "bf16")
    tokens, _ = _sample_on_a_row(logits, 2, 0, (), range(2), elem="bf16")
    assert list(tokens) == [1, 2]
    text = "\n".join(body_lines(sample_bodies("s", 2, 3, 0, 2, (), "bf16").funcs["argmax"], {}))
    assert "@as(f32, (x[" in text


def test_a_body_writing_a_bf16_buffer_is_an_error():
    """The executor holds bf16 values in float32 and does not round stores to them: a body
    that writes one is refused where it is compiled, not run with unrounded values."""
    bodies = Bodies("k", [Buffer("x", 4, "bf16"), Buffer("y", 4)])
    bd = bodies.body("t")
    bd.fmovs(bd.dsd("x", (4,)), bd.dsd("y", (4,)))
    bodies.add("t", bd)
    with pytest.raises(pe_exec.PeExecError, match="writes bf16 buffer 'x'"):
        _run(bodies, "t", {"x": np.zeros(4, F32), "y": np.ones(4, F32)})
    bodies = Bodies("k", [Buffer("x", 4, "bf16")])
    bd = bodies.body("t")
    bd.store(bd.scalar(1.0), "x", bd.const(0))
    bodies.add("t", bd)
    with pytest.raises(pe_exec.PeExecError, match="a store writes bf16 buffer 'x'"):
        _run(bodies, "t", {"x": np.zeros(4, F32)})


@settings(max_examples=40, deadline=None)
@given(b=st.integers(1, 4), vocab=st.integers(1, 60), hidden=st.integers(1, 12), w=st.integers(1, 5),
       h=st.integers(1, 4), x0=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_embed_body_row_sums_are_the_tokens_rows(b, vocab, hidden, w, h, x0, seed):
    """Each core writes its slice of the token's row where its column holds the row and
    zeros elsewhere, so each row of cores sums to its slice of the embedding."""
    rng = np.random.default_rng(seed)
    table = rng.standard_normal((vocab, hidden)).astype(F32)
    tokens = rng.integers(0, vocab, b)
    bodies = embed_bodies("embed", b, vocab, hidden, (x0, 0, w, h))
    rows, k = bodies.buffer("table").elems // max(1, -(-hidden // h)), -(-hidden // h)
    out = np.zeros((b, hidden), F32)
    for j in range(h):
        c0, c1 = part(hidden, h, j)
        for i in range(w):
            r0, r1 = part(vocab, w, i)
            bufs = _buffers(bodies)
            tile = np.zeros((rows, k), F32)
            tile[:r1 - r0, :c1 - c0] = table[r0:r1, c0:c1]
            bufs["table"][:] = tile.ravel()
            bufs["tokens"][:] = tokens
            bufs["y"][:] = 7.0  # whatever the array held before: every entry is written
            pe_exec.run(bodies.funcs["embed"], bufs, {"px": x0 + i, "py": j})
            out[:, c0:c1] += bufs["y"].reshape(b, k)[:, :c1 - c0]
    np.testing.assert_array_equal(out, table[tokens])


def test_sample_and_embed_csl_is_the_executed_body_and_lints():
    program = ["param px: i16;", "var x = @zeros([40]f32);", "var y = @zeros([40]f32);",
               "var w = @zeros([400]f32);"]
    for kernel, bodies in (("s", sample_bodies("s", 2, 40, 3, 2, (5, 9))),
                           ("e", embed_bodies("e", 2, 40, 8, (3, 0, 2, 2)))):
        renames = {b.name: (f"{kernel}_{b.name}", 0) for b in bodies.buffers
                   if b.name not in ("x", "y") and not b.resident}
        renames.update({b.name: ("w", 10) for b in bodies.resident})
        program += [f"var {a} = @zeros([{b.elems}]{b.elem});" for b in bodies.buffers
                    for a, _ in [renames.get(b.name, (None, 0))] if a and a != "w"]
        for op, fn in bodies.funcs.items():
            program += [f"fn {kernel}_{op}() void {{", *body_lines(fn, renames), "}"]
    text = "\n".join(program)
    assert check_csl(text, "sample_embed.csl") == []
    assert "@bitcast(i32, " in text and "s_tokens[" in text and "e_tokens[" in text


def test_a_body_reading_a_parameter_the_run_does_not_give_is_an_error():
    bodies = embed_bodies("e", 1, 4, 2, (0, 0, 1, 1))
    with pytest.raises(pe_exec.PeExecError, match="parameter px"):
        pe_exec.run(bodies.funcs["embed"], _buffers(bodies))


# ---- the MoE gate: softmax, top-k, renormalisation into the routing table


@settings(max_examples=60, deadline=None)
@given(b=st.integers(1, 3), experts=st.integers(2, 40), data=st.data(), normalize=st.booleans(),
       ties=st.booleans(), seed=st.integers(0, 2**16), shared=st.integers(0, 2), gated=st.booleans())
def test_gate_topk_body_routes_as_the_reference(b, experts, data, normalize, ties, seed, shared, gated):
    """The routing table holds, per token, the reference's choice (`reference.route`: the
    top-k of the softmax, equal probabilities in expert order) and its weights to float32
    rounding of the sums (the body adds in expert order, NumPy pairwise: a few ulps
    apart), then each shared expert (ids E, E + 1, ...) weighted by the sigmoid of its
    gate's logit column where the model gates it (Qwen3.5's shared_expert_gate), else 1."""
    from meshrt.kernels.topk_gate.pe import gate_bodies, route_choices

    k = data.draw(st.integers(1, experts))
    gated = gated and shared > 0
    cols = experts + (shared if gated else 0)
    n = route_choices(k, shared)
    rng = np.random.default_rng(seed)
    logits = (rng.integers(-2, 2, (b, cols)) if ties else rng.standard_normal((b, cols)) * 4).astype(F32)
    bodies = gate_bodies("g", b, 3, cols, experts, k, normalize, False, shared=shared, gated=gated)
    bufs = _buffers(bodies)
    bufs["y"][:] = logits.ravel()
    pe_exec.run(bodies.funcs["topk"], bufs)
    ids, wts = ref.route(logits[:, :experts], k, normalize)
    table_ids, table_wts = bufs["rt_expert"].reshape(b, n), bufs["rt_weight"].reshape(b, n)
    assert table_ids[:, :k].tolist() == ids.tolist()
    np.testing.assert_allclose(table_wts[:, :k], wts, rtol=2e-6, atol=0)
    assert table_ids[:, k:].tolist() == [list(range(experts, experts + shared))] * b
    want = ref.sigmoid(logits[:, experts:]) if gated else np.ones((b, shared), F32)
    np.testing.assert_array_equal(table_wts[:, k:], want)


def test_gate_fmac_and_add_sum_the_router_product_down_the_column():
    from meshrt.kernels.topk_gate.pe import gate_bodies

    rng = np.random.default_rng(1)
    b, n, cols, h = 2, 10, 6, 3
    x, router = rng.standard_normal((b, n)).astype(F32), rng.standard_normal((n, cols)).astype(F32)
    rows = -(-n // h)
    bodies = gate_bodies("g", b, rows, cols, cols, 2, True, False)
    acc = None
    for j in range(h):
        r0, r1 = part(n, h, j)
        bufs = _buffers(bodies)
        bufs["x"].reshape(b, rows)[:, :r1 - r0] = x[:, r0:r1]
        bufs["w"].reshape(rows, cols)[:r1 - r0] = router[r0:r1]
        pe_exec.run(bodies.funcs["fmac"], bufs)
        if acc is not None:
            bufs["p"][:] = acc
            pe_exec.run(bodies.funcs["add"], bufs)
        acc = bufs["y"].copy()
    np.testing.assert_allclose(acc.reshape(b, cols), x.astype(np.float64) @ router, rtol=1e-5, atol=1e-5)


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 4), vocab=st.integers(1, 50), w=st.integers(1, 4), ties=st.booleans(),
       seed=st.integers(0, 2**16))
def test_a_loop_over_slots_carrying_an_argmax_runs_at_once_as_one_by_one(b, vocab, w, ties, seed):
    """The sampler's argmax loops over its slots, each slot's scan carrying (best, id):
    pe_exec runs the slots at once, each scan in order; the result is the one-by-one
    loop's, bit for bit."""
    rng = np.random.default_rng(seed)
    bodies = sample_bodies("s", b, vocab, 2, w, (1,))
    fn = bodies.funcs["argmax"]
    outer = next(o for o in fn.body.block.ops if o.name == "scf.for")
    assert _runs_at_once(fn, outer)
    start = _buffers(bodies)
    start["x"][:] = rng.integers(-2, 2, start["x"].size) if ties else rng.standard_normal(start["x"].size)
    runs = []
    for at_once in (True, False):
        bufs = {name: v.copy() for name, v in start.items()}
        with pytest.MonkeyPatch.context() as m:
            if not at_once:
                m.setattr(pe_exec, "_parallel", lambda op, ctx: None)
            pe_exec._CACHE.clear()
            pe_exec.run(fn, bufs, {"px": 3, "py": 0})
        pe_exec._CACHE.clear()
        runs.append(bufs)
    for name in start:
        np.testing.assert_array_equal(runs[0][name], runs[1][name])


def test_a_loop_over_tokens_sharing_scratch_runs_one_by_one():
    """The gate's topk reuses one `prob` row for every token: its token loop is not run
    at once."""
    from meshrt.kernels.topk_gate.pe import gate_bodies

    fn = gate_bodies("g", 3, 2, 6, 6, 2, True, False).funcs["topk"]
    outer = next(o for o in fn.body.block.ops if o.name == "scf.for")
    assert not _runs_at_once(fn, outer)


def _runs_at_once(fn, loop) -> bool:
    """Whether compiling `fn` runs `loop` on all its iterations at once."""
    at_once = []
    parallel = pe_exec._parallel

    def spy(op, ctx):
        got = parallel(op, ctx)
        if op is loop and got is not None:
            at_once.append(op)
        return got

    with pytest.MonkeyPatch.context() as m:
        m.setattr(pe_exec, "_parallel", spy)
        pe_exec._CACHE.clear()
        pe_exec.compiled(fn)
    pe_exec._CACHE.clear()
    return bool(at_once)
