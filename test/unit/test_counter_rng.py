"""meshrt.runtime.counter_rng: SplitMix64 draws indexed by (seed, stream, index)."""

from __future__ import annotations

import statistics

from hypothesis import given
from hypothesis import strategies as st

from meshrt.runtime.counter_rng import stream_key, unit


def test_splitmix64_reference_outputs():
    """The first outputs of SplitMix64 seeded with state 0 (java.util.SplittableRandom's
    mixer; the published sequence starts 0xe220a8397b1dcdaf, 0x6e789e6aa1b965f4)."""
    assert int(unit(0, 0) * 2 ** 53) == 0xE220A8397B1DCDAF >> 11
    assert int(unit(0, 1) * 2 ** 53) == 0x6E789E6AA1B965F4 >> 11


@given(st.integers(-2 ** 70, 2 ** 70), st.integers(0, 2 ** 40), st.integers(0, 2 ** 40))
def test_draws_are_pure_and_in_the_unit_interval(seed, stream, index):
    key = stream_key(seed, stream)
    assert 0 <= key < 2 ** 64
    u = unit(key, index)
    assert 0.0 <= u < 1.0 and u == unit(stream_key(seed, stream), index)


def test_streams_and_seeds_differ_and_look_uniform():
    keys = {stream_key(seed, s) for seed in range(20) for s in range(500)}
    assert len(keys) == 20 * 500
    draws = [unit(stream_key(7, s), i) for s in range(100) for i in range(100)]
    assert abs(statistics.fmean(draws) - 0.5) < 0.01
    assert abs(statistics.pvariance(draws) - 1 / 12) < 0.003
    deciles = [0] * 10
    for u in draws:
        deciles[int(u * 10)] += 1
    assert all(900 < n < 1100 for n in deciles)
