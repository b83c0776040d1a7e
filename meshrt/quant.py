"""Quantized weight formats: what a packed weight is and the values it stands for.

Two formats, as Hugging Face checkpoints store them and transformers
dequantizes them:

- `mxfp4` (OCP Microscaling, GPT-OSS's experts): blocks of 32 consecutive
  input-dimension values share one E8M0 scale byte (2^(s - 127)); each value
  is a 4-bit E2M1 code (sign, 2 exponent bits, 1 mantissa bit: 0, 0.5, 1,
  1.5, 2, 3, 4, 6), two per byte, the even element in the low nibble. 17
  bytes per 32 weights.
- `fp8` (transformers' fine-grained FP8): E4M3 codes (bias 7, no infinities,
  largest 448) and one float32 `weight_scale_inv` per (rows x cols) block of
  the (out, in) matrix, or one per tensor; the value is code x scale.

One implementation serves the checkpoint loader (decoding the stored
tensors), the random weights of a quantized model (drawn, then rounded to
the format, so the NumPy reference and the interpreter compute with values
the format can hold) and the interpreter's tiles (held packed, decoded where
the kernel computes).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = ["FORMATS", "MXFP4_BLOCK", "Packed", "bytes_per_weight", "decode_e4m3", "decode_mxfp4",
           "encode_e4m3", "fake_quant", "pack", "packed_format"]

FORMATS = ("mxfp4", "fp8")
MXFP4_BLOCK = 32
E4M3_MAX = 448.0
# The 16 E2M1 values by code (transformers' FP4_VALUES, the OCP MX table).
E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                 -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], np.float32)


def _e4m3_table() -> np.ndarray:
    """The value of every E4M3 byte (0x7F / 0xFF are NaN)."""
    codes = np.arange(256)
    sign = np.where(codes & 0x80, -1.0, 1.0)
    exp, man = (codes >> 3) & 0xF, codes & 0x7
    normal = (1 + man / 8) * np.exp2(exp - 7.0)
    sub = man / 8 * 2.0 ** -6
    val = sign * np.where(exp == 0, sub, normal)
    val[(exp == 0xF) & (man == 0x7)] = np.nan
    return val.astype(np.float32)


E4M3 = _e4m3_table()
_E4M3_FINITE = np.flatnonzero(np.isfinite(E4M3) & (np.arange(256) < 0x80))  # non-negative codes
_E4M3_POS = E4M3[_E4M3_FINITE]  # ascending: 0, 2^-9, ..., 448


def packed_format(weights: str | None, decoded: object) -> str | None:
    """The format a kernel's cores hold its weight tiles in: `weights` (decoded each time
    the kernel computes with them), or None for floats: plain weights, or stored weights
    `decoded` once when they are installed (16-bit floats of SRAM, no decoding per token;
    the values are the same, the format's). The kernels' events, the interpreter and the
    CSL backend all ask this."""
    return None if decoded else weights


def decode_e4m3(codes: np.ndarray) -> np.ndarray:
    return E4M3[np.asarray(codes, np.uint8)]


def _nearest_code(x: np.ndarray, values: np.ndarray, codes: np.ndarray, sign: int) -> np.ndarray:
    """The code of the nearest of the ascending non-negative `values` to |x| (ties to the
    even code, saturating at the largest), with the `sign` bit set for negative x."""
    x = np.asarray(x, np.float32)
    a = np.minimum(np.abs(x), values[-1])
    hi = np.clip(np.searchsorted(values, a), 1, len(values) - 1)
    lo = hi - 1
    dlo, dhi = a - values[lo], values[hi] - a
    take_hi = (dhi < dlo) | ((dhi == dlo) & (codes[hi] % 2 == 0))
    code = np.where(take_hi, codes[hi], codes[lo]).astype(np.uint8)
    return code | np.where(np.signbit(x) & (code != 0), sign, 0).astype(np.uint8)


def encode_e4m3(x: np.ndarray) -> np.ndarray:
    """The nearest E4M3 code of each value (saturating at 448, as quantizers clamp before
    the cast)."""
    return _nearest_code(x, _E4M3_POS, _E4M3_FINITE, 0x80)


def encode_e2m1(x: np.ndarray) -> np.ndarray:
    """The nearest E2M1 code of each value (saturating at 6)."""
    return _nearest_code(x, E2M1[:8], np.arange(8), 8)


def unpack_nibbles(packed: np.ndarray) -> np.ndarray:
    """Two 4-bit codes per byte, the even element in the low nibble, along the last axis."""
    packed = np.asarray(packed, np.uint8)
    return np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def decode_mxfp4(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """A checkpoint's `*_blocks` (uint8, (..., G, 16): two codes per byte, the even element
    in the low nibble) and `*_scales` (uint8, (..., G): E8M0) as float32 (..., G * 32)."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    codes = unpack_nibbles(blocks)
    vals = np.ldexp(E2M1[codes], scales.astype(np.int32)[..., None] - 127)
    return vals.reshape(*blocks.shape[:-2], -1).astype(np.float32)


@dataclass(frozen=True)
class Packed:
    """Weights (..., in, out) as a format stores them: one code per element (`codes`,
    uint8) and a scale per `rows` consecutive input rows of each column (`scales`,
    (..., ceil(in / rows), out): mxfp4 E8M0 bytes, fp8 float32). `first` is the
    position of row 0 in the whole matrix: a core's tile is a slice of the whole,
    and its scales are the whole matrix's blocks.

    A scale per column, not per column block, so concatenating matrices along the
    output (q | k | v) and permuting columns (blocked outputs) keep each column's
    own scales; the stored bytes (`bytes_per_weight`) count one scale per block."""

    fmt: str
    codes: np.ndarray
    scales: np.ndarray
    rows: int
    first: int = 0

    def _row_blocks(self) -> np.ndarray:
        """Each row's index into `scales` (its block, counted from this tile's first)."""
        n = self.codes.shape[-2]
        return (np.arange(self.first, self.first + n) // self.rows) - self.first // self.rows

    def _row_scales(self) -> np.ndarray:
        """Each element's scale, (..., in, out)."""
        s = self.scales[..., self._row_blocks(), :]
        return np.ldexp(np.float32(1), s.astype(np.int32) - 127) if self.fmt == "mxfp4" else s

    def decode(self) -> np.ndarray:
        """The float32 values the codes stand for (the kernel's dequantization)."""
        table = E2M1 if self.fmt == "mxfp4" else E4M3
        return (table[self.codes] * self._row_scales()).astype(np.float32)

    def __getitem__(self, e) -> "Packed":
        """Leading-axis selection (one expert of a stack)."""
        return Packed(self.fmt, self.codes[e], self.scales[e], self.rows, self.first)

    def slice(self, r0: int, r1: int, c0: int = 0, c1: int | None = None) -> "Packed":
        """Rows r0:r1 and columns c0:c1, with the scales of the row blocks they touch."""
        b, f = self.rows, self.first
        g0, g1 = (f + r0) // b - f // b, (f + max(r1, r0 + 1) - 1) // b - f // b + 1
        return Packed(self.fmt, self.codes[..., r0:r1, c0:c1], self.scales[..., g0:g1, c0:c1],
                      b, f + r0)

    def columns(self, order: np.ndarray) -> "Packed":
        """The columns in `order` (a blocked output's permutation)."""
        return Packed(self.fmt, self.codes[..., order], self.scales[..., order], self.rows, self.first)

    def rows_in(self, order: np.ndarray) -> "Packed":
        """The rows in `order` (an input laid out otherwise than plainly): each row keeps
        its own block's scale, so the result holds a scale per row."""
        return Packed(self.fmt, self.codes[..., order, :],
                      self.scales[..., self._row_blocks()[order], :], 1, 0)

    @staticmethod
    def _alike(parts: "list[Packed]") -> "Packed":
        """The first of `parts`, which must share format and row blocking to be combined."""
        first = parts[0]
        if any((p.fmt, p.rows, p.first) != (first.fmt, first.rows, first.first) for p in parts):
            raise ValueError("only weights of one format and row blocking combine")
        return first

    @staticmethod
    def concat(parts: "list[Packed]") -> "Packed":
        """Matrices of one input side by side (q | k | v): the same format and row blocks."""
        first = Packed._alike(parts)
        return Packed(first.fmt, np.concatenate([p.codes for p in parts], -1),
                      np.concatenate([p.scales for p in parts], -1), first.rows, first.first)

    @staticmethod
    def stack(parts: "list[Packed]") -> "Packed":
        """Matrices of one shape and blocking stacked along a new first axis (experts)."""
        first = Packed._alike(parts)
        return Packed(first.fmt, np.stack([p.codes for p in parts]),
                      np.stack([p.scales for p in parts]), first.rows, first.first)


def pack(w: np.ndarray, fmt: str, block: tuple[int, int] | None = None) -> Packed:
    """`w` (..., in, out) quantized: mxfp4 with a shared exponent per 32 input rows of a
    column (OCP MX: floor(log2(max |w|)) - 2, so the largest value maps into E2M1's
    top binade); fp8 with a float32 scale max |w| / 448 per `block` (input rows, output
    columns; None: one for the whole matrix)."""
    w = np.asarray(w, np.float32)
    *lead, n, m = w.shape
    if fmt == "mxfp4":
        bi, bo = MXFP4_BLOCK, 1
    elif fmt == "fp8":
        bi, bo = block or (n, m)
    else:
        raise ValueError(f"unknown weight format {fmt!r}, expected one of {', '.join(FORMATS)}")
    gi, go = -(-n // bi), -(-m // bo)
    padded = np.zeros((*lead, gi * bi, go * bo), np.float32)
    padded[..., :n, :m] = w
    amax = np.abs(padded.reshape(*lead, gi, bi, go, bo)).max(axis=(-3, -1))
    if fmt == "mxfp4":
        safe = np.where(amax > 0, amax, 1.0)
        e = np.where(amax > 0, np.floor(np.log2(safe)) - 2, -127)
        block_scales = (np.clip(e, -127, 127) + 127).astype(np.uint8)
        step = np.ldexp(np.float32(1), block_scales.astype(np.int32) - 127)
    else:
        block_scales = np.where(amax > 0, amax / E4M3_MAX, 1.0).astype(np.float32)
        step = block_scales
    scales = np.repeat(block_scales, bo, axis=-1)[..., :m]  # one per column
    full = np.repeat(np.repeat(step, bi, axis=-2), bo, axis=-1)[..., :n, :m]
    codes = encode_e2m1(w / full) if fmt == "mxfp4" else encode_e4m3(w / full)
    return Packed(fmt, codes, scales, bi)


def fake_quant(w: np.ndarray, fmt: str, block: tuple[int, int] | None = None) -> np.ndarray:
    """`w` (in, out) rounded to the values `fmt` can hold (`pack`, then decode)."""
    return pack(w, fmt, block).decode()


def bytes_per_weight(fmt: str, block: tuple[int, int] | None = None) -> float:
    """Stored bytes per weight of `fmt` including its scales: mxfp4 17 / 32; fp8 one byte
    plus a 4-byte scale per block, rounded up to 1/4096 byte per weight (the quantum of
    byte sizes, `meshrt.shape.BYTES_QUANTUM`); per tensor, one byte."""
    if fmt == "mxfp4":
        return (MXFP4_BLOCK / 2 + 1) / MXFP4_BLOCK
    if fmt == "fp8":
        if not block:
            return 1.0
        return 1.0 + math.ceil(4 * 4096 / (block[0] * block[1])) / 4096
    raise ValueError(f"unknown weight format {fmt!r}")
