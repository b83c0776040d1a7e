"""Counter-based random numbers: a draw is a pure function of (seed, stream, index).

The interpreter's per-core speed factors and per-event jitter come from here
(`meshrt.runtime.mesh_sim`): stream = the core's router id, index = how many
draws that core has made. A core's draws therefore do not depend on the order
in which the simulator happens to visit cores or events, so cores (and
classes of cores) can be timed in any order, batched or in another process,
and give the same cycles.

The generator is SplitMix64 (Steele, Lea and Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014): output i of the stream whose
state starts at `key` is mix(key + (i + 1) * golden), with mix the 64-bit
finaliser of that paper (the one java.util.SplittableRandom uses). It passes
BigCrush, and its outputs are indexed directly, which is what we need; a
stream's key is itself a SplitMix64 output of the seed and the stream id.
"""

from __future__ import annotations

__all__ = ["stream_key", "unit"]

_MASK = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15  # 2^64 / golden ratio, odd
_TO_UNIT = 2.0 ** -53


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def stream_key(seed: int, stream: int) -> int:
    """The 64-bit key of stream `stream` (a non-negative id) under `seed`."""
    return _mix((_mix((seed * _GOLDEN) & _MASK) + (stream + 1) * _GOLDEN) & _MASK)


def unit(key: int, index: int) -> float:
    """Draw `index` (0, 1, ...) of the stream `key`: uniform on [0, 1), 53 bits."""
    return (_mix((key + (index + 1) * _GOLDEN) & _MASK) >> 11) * _TO_UNIT
