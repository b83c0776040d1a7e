"""16-bit activations: the rounding, the format a model's activations take, and the
interpreter and the NumPy reference rounding the same values."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshrt.activations import act_format_of, bf16_to_float32, float32_to_bf16, round_activations
from meshrt.diagnostics import FrontendError
from meshrt.driver import segment_program
from meshrt.frontend.spec import parse_spec
from meshrt.runtime import dataplane
from meshrt.runtime import reference as ref
from meshrt.runtime import serving
from meshrt.runtime.serving import reference_shape, serve
from meshrt.runtime.workloads import Request
from meshrt.shape import HParams, hparams_problem
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

floats32 = st.floats(width=32, allow_nan=True, allow_infinity=True)


@given(st.lists(floats32, min_size=1, max_size=64))
def test_bf16_rounding_is_ml_dtypes_bfloat16(xs):
    x = np.asarray(xs, np.float32)
    want = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    got = round_activations(x, "bf16")
    assert np.array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    assert np.array_equal(got[ok].view(np.uint32), want[ok].view(np.uint32))  # signed zeros too


@given(st.lists(floats32, min_size=1, max_size=64))
def test_bf16_bit_patterns_are_ml_dtypes_and_widen_exactly(xs):
    """The bit patterns the CSL host driver writes (its copy of these functions' source)."""
    x = np.asarray(xs, np.float32)
    bits = float32_to_bf16(x)
    want = x.astype(ml_dtypes.bfloat16)
    ok = ~np.isnan(x)
    assert np.array_equal(bits[ok], want.view(np.uint16)[ok])
    assert np.isnan(bf16_to_float32(bits[~ok])).all()
    assert np.array_equal(bf16_to_float32(bits[ok]).view(np.uint32),
                          want.astype(np.float32)[ok].view(np.uint32))


@given(st.lists(floats32, min_size=1, max_size=64), st.sampled_from(["bf16", "f16", "f32"]))
def test_rounding_is_idempotent(xs, fmt):
    once = round_activations(np.asarray(xs, np.float32), fmt)
    assert np.array_equal(round_activations(once, fmt), once, equal_nan=True)


def test_ties_go_to_even_and_f16_is_numpys_half():
    # 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7: the even one is 1
    x = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 3.4e38, 70000.0], np.float32)
    assert round_activations(x, "bf16")[:2].tolist() == [1.0, 1 + 2 ** -6]
    assert np.isinf(round_activations(x, "bf16")[2])
    assert round_activations(x, "f16")[:2].tolist() == x[:2].tolist()  # f16 keeps 10 bits
    assert np.isinf(round_activations(x, "f16")[3])


def test_the_activation_format_follows_the_weights_unless_given():
    assert act_format_of(2) == "bf16" and act_format_of(2, "float16") == "f16"
    assert act_format_of(4) == "f32" and act_format_of(0.53125) == "f32"
    spec = "model m { layers = 1 hidden = 8 heads = 2 vocab = 16 ffn = 8 %s }"
    assert parse_spec(spec % "").shape.act_format == "bf16"
    assert parse_spec(spec % "dtype_bytes = 4").shape.act_format == "f32"
    assert parse_spec(spec % "act_format = f32").shape.act_format == "f32"
    with pytest.raises(FrontendError, match="act_format must be one of bf16, f16, f32, got 'f8'"):
        parse_spec(spec % "act_format = f8")
    # graph IR without the key: as the weights say; with a bad one: an error
    hp = parse_spec(spec % "dtype_bytes = 4").shape.to_hparams(1, 0)
    assert "act_format" not in hp and HParams.of(hp).act_format == "f32"
    assert hparams_problem({**hp, **parse_spec(spec % "act_format = bf16").shape.to_hparams(1, 0)}) is None
    from xdsl.dialects.builtin import StringAttr

    assert "act_format must be one of" in hparams_problem({**hp, "act_format": StringAttr("e5m2")})


@pytest.fixture(scope="module")
def bf16_moe(tmp_path_factory):
    """tiny_moe with 16-bit weights: its activations travel as bf16."""
    d = tmp_path_factory.mktemp("bf16")
    spec = d / "tiny_moe.mrt"
    spec.write_text((EXAMPLES / "tiny_moe.mrt").read_text().replace("dtype_bytes = 4", "dtype_bytes = 2"))
    return segment_program(spec, "test32")


def _requests():
    rng = np.random.default_rng(3)
    return [Request(i, 0.0, rng.integers(2, 256, p).tolist(), p, o, o)
            for i, (p, o) in enumerate([(3, 4), (2, 5)])]


def test_a_16_bit_models_random_weights_are_numbers_of_its_format(bf16_moe):
    """As a bf16 checkpoint's are: the CSL host's bf16 copies of them (run.py) are the
    values the interpreter and the reference compute with."""
    shape = reference_shape(bf16_moe)
    for name, a in ref.Weights.random(shape, seed=1).named_arrays().items():
        assert np.array_equal(round_activations(a, "bf16"), a), name
    f32 = dataclasses.replace(shape, act_format="f32")
    drawn = ref.Weights.random(f32, seed=1).named_arrays()
    assert any(not np.array_equal(round_activations(a, "bf16"), a) for a in drawn.values())


def test_bf16_reference_rounds_and_changes_the_numbers(bf16_moe):
    shape = reference_shape(bf16_moe)
    assert shape.act_format == "bf16"
    weights = ref.Weights.random(shape, seed=0)
    logits = {}
    for fmt in ("bf16", "f32"):
        s = dataclasses.replace(shape, act_format=fmt)
        w = dataclasses.replace(weights, shape=s)
        logits[fmt] = ref.ReferenceModel(s, w).forward([(ref.KVState(s), [5, 9, 11])])
    assert np.array_equal(round_activations(logits["bf16"], "bf16"), logits["bf16"])
    assert not np.array_equal(logits["bf16"], logits["f32"])


def _step_differences(program) -> tuple[int, list[str]]:
    """Serve two requests, then rerun keeping the values of the step that sampled request 0's
    second token and compare every kernel's with NumPy's: (kernels compared, those that differ)."""
    t, reqs = load_target("test32"), _requests()
    shape = reference_shape(program)
    weights = ref.Weights.random(shape, seed=0)
    kw = dict(seed=0, queue_capacity=16, max_cycles=10_000_000, safe=True, speed_scale=None)
    _, host, _ = serving._interpret(program, t, reqs, weights, **kw)
    rec = next(r for r in host.records if r.id == 0)
    step, slot = rec.sampled_at[1]
    _, _, plane = serving._interpret(program, t, reqs, weights, watch=step, **kw)
    model, trace = ref.ReferenceModel(shape, weights), ref.Trace()
    state, _ = model.prefill(reqs[0].prompt)
    model.decode_step(state, rec.tokens[0], trace)
    compared = list(serving.kernel_values(program, plane, trace, slot))
    return len(compared), [name for name, _, v, e in compared if not np.allclose(
        v, e, rtol=serving.KERNEL_RTOL, atol=serving.KERNEL_ATOL)]


def test_bf16_interpreter_matches_the_bf16_reference_and_needs_its_rounding(bf16_moe, monkeypatch):
    res = serve(bf16_moe, load_target("test32"), _requests(), seed=0)
    assert res.mismatches == [] and res.summary()["outputs_match_reference"]
    compared, differ = _step_differences(bf16_moe)
    assert compared >= 15 and differ == []
    # the interpreter computing in fp32 still gives these tokens, but not NumPy's values
    init = dataplane.DataPlane.__init__

    def fp32(self, *a, **k):
        init(self, *a, **k)
        self.rounded = {}

    monkeypatch.setattr(dataplane.DataPlane, "__init__", fp32)
    compared, differ = _step_differences(bf16_moe)
    # (the embedding's output is rows of its table: bf16 numbers, as a bf16 model's weights
    # are, so it needs no rounding)
    assert compared >= 15 and {"l0_attn", "l0_norm2", "lm_head.reduce"} <= set(differ)
    assert "embed.reduce" not in differ
