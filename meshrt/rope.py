"""Rotary position embeddings: the frequency table, written once.

`Rope` holds what a config says about RoPE (the base `theta` and the
scaling variant with its parameters); `inv_freq(dim)` is the per-pair
inverse frequency and `attention_factor` the factor cos and sin are scaled
by, exactly as transformers' `ROPE_INIT_FUNCTIONS` compute them (in float64
here). The NumPy reference's `apply_rope` and the attention kernel's
numerics both rotate with this table, so the formula lives here only.

Variants: "default" (theta ** (-2i/dim)), "linear" (divided by `factor`),
"llama3" (Llama 3.1's wavelength-banded smoothing: `factor`,
`low_freq_factor`, `high_freq_factor`, `original_max`) and "yarn" (NTK-by-
parts blending of interpolated and extrapolated frequencies between the
correction dims of `beta_fast` / `beta_slow` over `original_max`, cos and sin
scaled by `attention_factor`, 0.1 ln(factor) + 1 when not given). Any of
them may rotate only the first `partial` share of a head (Qwen3.5's
`partial_rotary_factor`: the table is that of the rotated dims, the rest of
the head passes unchanged).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import numpy as np

ROPE_TYPES = ("default", "linear", "llama3", "yarn")


@dataclass(frozen=True)
class Rope:
    theta: float = 10000.0
    type: str = "default"
    factor: float = 1.0
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    original_max: int = 0  # original_max_position_embeddings (llama3, yarn)
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    yarn_attention_factor: float = 0.0  # yarn; 0: from factor
    truncate: bool = True  # yarn: round the correction range outwards
    partial: float = 1.0  # partial_rotary_factor: the first int(dim * partial) elements rotate

    def problem(self) -> str | None:
        """Why these parameters define no rotation, or None."""
        if self.type not in ROPE_TYPES:
            return f"rope type '{self.type}' is not one of {', '.join(ROPE_TYPES)}"
        if not (math.isfinite(self.theta) and self.theta > 1):
            return f"rope_theta must be a finite number above 1, got {self.theta}"
        if self.type != "default" and not (math.isfinite(self.factor) and self.factor > 0):
            return f"rope factor must be a positive number, got {self.factor}"
        if not 0 < self.partial <= 1:
            return f"partial_rotary_factor must be in (0, 1], got {self.partial}"
        if self.type in ("llama3", "yarn") and self.original_max < 1:
            return f"rope type {self.type} needs original_max_position_embeddings of at least 1"
        if self.type == "llama3" and not 0 < self.low_freq_factor < self.high_freq_factor:
            return (f"llama3 rope needs 0 < low_freq_factor < high_freq_factor, got "
                    f"{self.low_freq_factor} and {self.high_freq_factor}")
        return None

    @property
    def attention_factor(self) -> float:
        """What cos and sin are multiplied by (1 but for yarn)."""
        if self.type != "yarn":
            return 1.0
        if self.yarn_attention_factor:
            return self.yarn_attention_factor
        return 1.0 if self.factor <= 1 else 0.1 * math.log(self.factor) + 1.0

    def inv_freq(self, dim: int) -> np.ndarray:
        """(dim // 2,) float64 inverse frequencies of a head of `dim` rotated elements."""
        return _inv_freq(self, dim)


@functools.lru_cache(maxsize=64)
def _inv_freq(rope: Rope, dim: int) -> np.ndarray:
    base = rope.theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    inv = 1.0 / base
    if rope.type == "linear":
        inv = inv / rope.factor
    elif rope.type == "llama3":
        low_wavelen = rope.original_max / rope.low_freq_factor
        high_wavelen = rope.original_max / rope.high_freq_factor
        wavelen = 2 * math.pi / inv
        scaled = np.where(wavelen > low_wavelen, inv / rope.factor, inv)
        smooth = (rope.original_max / wavelen - rope.low_freq_factor) / (
            rope.high_freq_factor - rope.low_freq_factor)
        smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        inv = np.where(medium, smoothed, scaled)
    elif rope.type == "yarn":
        def correction_dim(rotations: float) -> float:
            return dim * math.log(rope.original_max / (rotations * 2 * math.pi)) / (
                2 * math.log(rope.theta))

        low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001  # as transformers: no zero-width ramp
        ramp = np.clip((np.arange(dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
        extrapolated = 1 - ramp
        inv = inv / rope.factor * (1 - extrapolated) + inv * extrapolated
    inv.setflags(write=False)
    return inv


def rotary_dim(rope: Rope, dim: int) -> int:
    """How many leading elements of a head of `dim` rotate (transformers' int(dim * partial))."""
    return int(dim * rope.partial)


def rotate(x: np.ndarray, positions: np.ndarray, rope: Rope) -> np.ndarray:
    """Rotate-half RoPE of x (N, n_heads, dim) at positions (N,), in float64; with a
    partial rotary factor only the first `rotary_dim` elements rotate, the rest pass."""
    if rope.partial != 1.0:
        r = rotary_dim(rope, x.shape[-1])
        return np.concatenate([rotate(x[..., :r], positions, dataclasses.replace(rope, partial=1.0)),
                               x[..., r:].astype(np.float64)], axis=-1)
    d = x.shape[-1]
    half = d // 2
    ang = np.asarray(positions, np.float64)[:, None] * rope.inv_freq(d)[None, :]  # (N, half)
    scale = rope.attention_factor
    cos, sin = (np.cos(ang) * scale)[:, None, :], (np.sin(ang) * scale)[:, None, :]
    x1, x2 = x[..., :half].astype(np.float64), x[..., half:].astype(np.float64)
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


# Bits of each part of `turn_parts`: a position below 2**17 (128K) times a part is exact
# in float32 (17 + 7 bits within the 24 of its significand).
TURN_PART_BITS = 7


def turn_parts(rope: Rope, dim: int) -> np.ndarray:
    """(3, dim // 2) float32: each pair's rotation per position in turns (inv_freq / 2pi)
    split into three parts, the first two of TURN_PART_BITS significant bits. A core
    rotating position p (attention's PE bodies) takes the fraction of p times each of the
    first two exactly, adds p times the third and so reduces the angle to a fraction of
    a turn with no loss at large p (a float32 angle p * inv_freq at p = 100,000 is off by
    up to 0.004 rad)."""
    f = rope.inv_freq(dim) / (2 * math.pi)
    parts = []
    for _ in range(2):
        m, e = np.frexp(f)
        head = np.ldexp(np.round(m * 2.0 ** TURN_PART_BITS), e - TURN_PART_BITS)
        parts.append(head)
        f = f - head
    parts.append(f)
    return np.stack(parts).astype(np.float32)
