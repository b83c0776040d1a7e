"""The quantized weight formats (`meshrt.quant`): codes, rounding, packing, slicing."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt import quant


def test_e4m3_codes_are_the_ocp_values():
    got = quant.decode_e4m3(np.array([0x00, 0x01, 0x07, 0x08, 0x38, 0xB8, 0x7E, 0xFE], np.uint8))
    want = [0.0, 2.0 ** -9, 7 * 2.0 ** -9, 2.0 ** -6, 1.0, -1.0, 448.0, -448.0]
    assert got.tolist() == want
    assert np.isnan(quant.decode_e4m3(np.array([0x7F, 0xFF], np.uint8))).all()  # no infinities


def test_e2m1_and_mxfp4_decoding_follow_the_checkpoint_layout():
    # one block of 32 codes 0..15, 0..15 (even element in the low nibble), scale 2^(128 - 127)
    codes = np.tile(np.arange(16, dtype=np.uint8), 2)
    blocks = (codes[0::2] | (codes[1::2] << 4)).reshape(1, 16)
    got = quant.decode_mxfp4(blocks, np.array([128], np.uint8))
    assert got.shape == (32,)
    assert got.tolist() == (2 * quant.E2M1[codes]).tolist()


def _nearest(table: np.ndarray, x: float) -> float:
    finite = table[np.isfinite(table)]
    return float(finite[np.argmin(np.abs(finite - x))])


@settings(max_examples=200, deadline=None)
@given(st.floats(-440.0, 440.0, allow_nan=False, width=32))
def test_e4m3_rounds_to_the_nearest_value(x):
    got = float(quant.decode_e4m3(quant.encode_e4m3(np.array([x], np.float32)))[0])
    assert abs(got - x) <= abs(_nearest(quant.E4M3, x) - x)


@settings(max_examples=200, deadline=None)
@given(st.floats(-6.0, 6.0, allow_nan=False, width=32))
def test_e2m1_rounds_to_the_nearest_value(x):
    got = float(quant.E2M1[quant.encode_e2m1(np.array([x], np.float32))][0])
    assert abs(got - x) <= abs(_nearest(quant.E2M1, x) - x)


def test_out_of_range_values_saturate():
    assert quant.decode_e4m3(quant.encode_e4m3(np.array([1e6, -1e6]))).tolist() == [448.0, -448.0]
    assert quant.E2M1[quant.encode_e2m1(np.array([100.0, -7.0]))].tolist() == [6.0, -6.0]


FORMATS = [("mxfp4", None), ("fp8", (16, 8)), ("fp8", None)]


@pytest.mark.parametrize("fmt, block", FORMATS)
@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_a_tile_decodes_to_its_slice_of_the_matrix(fmt, block, data):
    n, m = data.draw(st.integers(1, 80)), data.draw(st.integers(1, 20))
    seed = data.draw(st.integers(0, 2 ** 16))
    w = np.random.default_rng(seed).standard_normal((n, m)).astype(np.float32)
    p = quant.pack(w, fmt, block)
    whole = p.decode()
    r0 = data.draw(st.integers(0, n - 1))
    r1 = data.draw(st.integers(r0 + 1, n))
    c0 = data.draw(st.integers(0, m - 1))
    c1 = data.draw(st.integers(c0 + 1, m))
    assert np.array_equal(p.slice(r0, r1, c0, c1).decode(), whole[r0:r1, c0:c1])
    # a tile of a tile: its scales are still the whole matrix's blocks
    t = p.slice(r0, n)
    assert np.array_equal(t.slice(r1 - r0 - 1, r1 - r0).decode(), whole[r1 - 1:r1])
    # values the format holds are held exactly (rounding is idempotent)
    assert np.array_equal(quant.fake_quant(whole, fmt, block), whole)


@pytest.mark.parametrize("fmt, block", FORMATS)
def test_concatenated_and_permuted_columns_keep_their_own_scales(fmt, block):
    rng = np.random.default_rng(1)
    a = quant.pack(rng.standard_normal((64, 24)).astype(np.float32) * 10, fmt, block)
    b = quant.pack(rng.standard_normal((64, 8)).astype(np.float32) / 10, fmt, block)
    both = np.concatenate([a.decode(), b.decode()], -1)
    cat = quant.Packed.concat([a, b])
    assert np.array_equal(cat.decode(), both)
    order = rng.permutation(32)
    assert np.array_equal(cat.columns(order).slice(5, 40).decode(), both[5:40][:, order])
    stacked = quant.Packed.stack([a, a])
    assert np.array_equal(stacked[1].decode(), a.decode())


def test_quantization_error_is_bounded_by_the_formats_precision():
    w = np.random.default_rng(2).standard_normal((256, 16)).astype(np.float32)
    fp8 = quant.fake_quant(w, "fp8", (128, 16))
    amax = np.abs(w).reshape(2, 128, 16).max(axis=1)
    # e4m3 keeps 3 mantissa bits: half a step is at most 2^-4 of the value, and the block's
    # largest value maps to 448 exactly
    assert np.all(np.abs(fp8 - w) <= np.abs(w) * 2.0 ** -4 + 2.0 ** -9 * amax.repeat(128, 0) / 448)
    mx = quant.fake_quant(w, "mxfp4")
    assert np.all(np.abs(mx - w) <= np.abs(w) * 0.25 + 1e-6 + 0.25 * np.abs(w).reshape(8, 32, 16)
                  .max(axis=1).repeat(32, 0) / 4)


def test_bytes_per_weight():
    assert quant.bytes_per_weight("mxfp4") == 17 / 32
    assert quant.bytes_per_weight("fp8") == 1.0
    assert quant.bytes_per_weight("fp8", (128, 128)) == 1 + 1 / 4096
    assert quant.bytes_per_weight("fp8", (96, 96)) == 1 + 2 / 4096  # rounded up to 1/4096
    with pytest.raises(ValueError, match="unknown weight format"):
        quant.pack(np.zeros((2, 2)), "int4")
