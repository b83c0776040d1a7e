"""CSL bodies of the elementwise kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def square_sum(b: ComputeBody) -> list[str]:
    k = max(1, min(b.e.work // b.b, b.w.nx // b.b))
    return [
        f"// partial sum of squares per slot over this core's {k} elements",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  var s: {b.T} = 0.0;",
        f"  for (@range(u16, {k})) |i| {{",
        f"    s += x[j * {k} + i] * x[j * {k} + i];",
        "  }",
        "  y[j] = s;",
        "}",
    ]


def rsqrt(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    hidden = max(1, int(b.w.p.hp("hidden", 1)))
    return [
        f"for (@range(u16, {b.b})) |j| {{",
        f"  scale[j] = 1.0 / math.sqrt_{b.T}(y[j] / {float(hidden)} + 1.0e-6);",
        "  y[j] = scale[j]; // relayed back up the column",
        "}",
    ]


def scale(b: ComputeBody) -> list[str]:
    k = max(1, min(b.e.work // b.b, b.w.nx // b.b, b.w.ny // b.b))
    factor = "p[j]" if b.src == "p" else "scale[j]"
    return [
        "// y = x * rms scale, per slot",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  const xj = @increment_dsd_offset({b.w.mem('x', k)}, j * {k}, {b.T});",
        f"  const yj = @increment_dsd_offset({b.w.mem('y', k)}, j * {k}, {b.T});",
        f"  @fmul{b.s}(yj, xj, {factor});",
        "}",
    ]
