"""Activation formats: how many bytes a kernel's value travels in, and the
rounding that the NumPy reference and the interpreter both apply to it.

A model whose weights are 16-bit floats moves its activations in the same 16
bits (bf16, or f16 for a float16 checkpoint): every value a graph-level kernel
hands on (the norms', the reduced projections', attention's, the residual
adds', the combine's) is rounded to the format, round-to-nearest-even, and
its flows carry 2 bytes an element. Partial sums on their way through a
reduction, and an MoE layer's per-expert outputs on their way into the
combine, stay fp32 (a kernel kind says so with `KernelOp.VALUE_IN_FP32`), and
every kernel computes in fp32 (float64 sums) on what it reads. fp32 models
(`dtype_bytes = 4`, the tiny examples) round nothing.

The rounding is idempotent, so a consumer can round whatever it reads: parts
it holds itself and parts that arrived agree.
"""

from __future__ import annotations

import numpy as np

ACT_FORMATS = {"bf16": 2, "f16": 2, "f32": 4}  # format -> bytes per element


def act_format_of(dtype_bytes: float, torch_dtype: str = "") -> str:
    """The activation format of a model whose weights are `dtype_bytes` wide: 16-bit
    weights travel as bf16 (f16 where the checkpoint says float16), anything else as f32."""
    if dtype_bytes == 2:
        return "f16" if torch_dtype in ("float16", "half") else "bf16"
    return "f32"


def act_format_problem(fmt: object) -> str | None:
    """Why `fmt` is not an activation format, or None."""
    if fmt not in ACT_FORMATS:
        return f"act_format must be one of {', '.join(ACT_FORMATS)}, got {fmt!r}"
    return None


def act_value_bytes(fmt: str) -> int:
    """Bytes of one element of a value in format `fmt`."""
    return ACT_FORMATS[fmt]


def round_activations(x: np.ndarray, fmt: str) -> np.ndarray:
    """`x` as float32 holding the values format `fmt` can hold (round to nearest, ties
    to even; NaN stays NaN, values beyond the format's range become infinities)."""
    x = np.asarray(x, np.float32)
    if fmt == "f32":
        return x
    if fmt == "f16":
        with np.errstate(over="ignore"):  # beyond 65504: infinity, as the format holds it
            return x.astype(np.float16).astype(np.float32)
    if fmt != "bf16":
        raise ValueError(act_format_problem(fmt))
    return bf16_to_float32(float32_to_bf16(x))


# The two conversions below use NumPy alone: the CSL backend's host driver (run.py, which
# runs where meshrt may not be installed) carries their source, so the host writes and
# reads bf16 arrays exactly as the interpreter rounds.

def float32_to_bf16(x):
    """The bfloat16 bit patterns (uint16) of float32 `x`, rounded to nearest, ties to even
    (NaN stays a NaN; beyond the format's range: infinity)."""
    x = np.asarray(x, np.float32)
    bits = x.view(np.uint32)
    # add half an ulp of bf16 (0x7fff) plus the lowest kept bit (ties to even), then cut
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)
    quiet = (bits >> np.uint32(16)) | np.uint32(0x40)  # a NaN's top bits, kept a NaN
    return np.where(np.isnan(x), quiet, rounded).astype(np.uint16)


def bf16_to_float32(bits):
    """float32 values of bfloat16 bit patterns (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)
