"""Compute ops: what an `event.compute` names, its cost key, and its CSL body.

Every compute op a kernel's roles run is declared once, by the kind that
owns it (in its folder) or here when several kinds share it (`fmac`, `add`,
`silu_mul`). The interpreter and the cost model charge `work x cycles of
its cost key` (a key of the target's `[costs]`, `meshrt.targets.COST_KEYS`);
the CSL backend prints its body. A compute op nobody declares is an error.

A CSL body is a function of a `meshrt.backend.csl.kernels.ComputeBody`
(`b` below): `b.w` is the program writer, `b.e` the event, `b.b` the
micro-batch, `b.T` / `b.s` the element type and its DSD suffix, `b.src` the
buffer holding the partner's partial in a chain ("p") or None.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


Price = Callable[[Mapping[str, float], int, Callable[[str], int]], float]
"""cycles(costs, work, param): an op's own formula; `param` reads the kernel's parameters."""


@dataclass(frozen=True)
class ComputeOp:
    name: str
    cost: str | tuple[str, ...]  # the target cost key charged per element of work, or the keys `price` reads
    csl: Callable[[ComputeBody], list[str]]
    reads_input: bool = False  # reads the kernel's input buffer x (the CSL receives into it)
    admits_requests: bool = False  # where the first stage admits waiting requests (CSL)
    price: Price | None = None  # the op's own formula; None: work x costs[cost]

    def cost_keys(self) -> tuple[str, ...]:
        """The target cost keys this op is priced by."""
        return (self.cost,) if isinstance(self.cost, str) else self.cost

    def cycles(self, costs: Mapping[str, float], work: int, param: Callable[[str], int]) -> float:
        """Cycles of one `event.compute` of this op with `work` elements, on one core.

        `param(key)` is the kernel's parameter `key` (`event.kernel` params).
        """
        if self.price is not None:
            return float(self.price(costs, work, param))
        return work * float(costs[self.cost])


def _fmac(b: ComputeBody) -> list[str]:
    w = b.w
    k = max(1, w.nx // b.b)
    m = max(1, min(b.e.work // max(1, b.b * k), w.ny // b.b))
    reg = w.region(b.sub)
    if reg is None:
        return [f"// no resident weights recorded for @{b.sub.kernel}: y = x", *b.passthrough()]
    arr, off, length = reg
    if k * m > length:
        m = max(1, length // k)
        k = min(k, length)
    routed = w.moe and b.kind.PLACES_EXPERTS  # only the tokens routed to this region
    if arr == "wq":  # packed weights: dequantize on the fly
        guard = "mine[j] != 0 and " if routed else ""
        return [
            f"// y[b, {m}] = W[{k} x {m}]^T x[b, {k}]; W packed 4 bits per weight in wq",
            f"for (@range(u16, {b.b})) |j| {{",
            f"  for (@range(u16, {m})) |o| {{",
            f"    y[j * {m} + o] = 0.0;",
            f"    if ({guard}true) {{",
            f"      var acc: {b.T} = 0.0;",
            f"      for (@range(u16, {k})) |i| {{",
            f"        const idx: u32 = {off * 4} + @as(u32, i) * {m} + @as(u32, o);",
            "        const nib = (wq[idx >> 2] >> @as(u16, (idx & 3) * 4)) & 0xf;",
            f"        acc += (@as({b.T}, nib) - 8.0) * x[j * {k} + i];",
            "      }",
            f"      y[j * {m} + o] = acc;",
            "    }",
            "  }",
            "}",
        ]
    col = w.mem("w", m, off)
    inner = [
        f"  var wcol = {col};",
        f"  for (@range(u16, {k})) |i| {{",
        f"    @fmac{b.s}(yj, yj, wcol, x[j * {k} + i]);",
        f"    wcol = @increment_dsd_offset(wcol, {m}, {b.T});",
        "  }",
    ]
    if routed:
        inner = ["  if (mine[j] != 0) {", *("  " + line for line in inner), "  }"]
    return [
        f"// y[b, {m}] = W[{k} x {m}]^T x[b, {k}]: one fmac{b.s} per input element",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  const yj = @increment_dsd_offset({w.mem('y', m)}, j * {m}, {b.T});",
        f"  @fmov{b.s}(yj, {b.zero()});",
        *inner,
        "}",
    ]


def _dequant(b: ComputeBody) -> list[str]:
    """Decode this core's packed tile (`wq`: one code per byte here, the scales of its
    blocks after them) into the float tile the fmac reads (`w`)."""
    fmt = b.param("weights")
    n = max(1, b.e.work)
    rows = 32 if fmt == "mxfp4" else max(1, b.param("block_in") or 1)
    table = "E2M1" if fmt == "mxfp4" else "E4M3"
    scale = ("math.ldexp(1.0, @as(i16, wq_scale[s]) - 127)" if fmt == "mxfp4"
             else "@bitcast(f32, wq_scale32[s])")
    b.w.uses_math = True
    return [
        f"// {fmt}: w[i] = {table}[code i] x scale of its block ({rows} input rows of a column)",
        f"for (@range(u32, {n})) |i| {{",
        f"  const s: u32 = i / {rows * max(1, b.w.ny // max(1, b.b))};",
        f"  w[i] = @as({b.T}, {table}[wq[i]] * {scale});",
        "}",
    ]


DEQUANT = {
    "fp8": ComputeOp("dequant_fp8", "dequant_fp8", _dequant),
    "mxfp4": ComputeOp("dequant_mxfp4", "dequant_mxfp4", _dequant),
}
"""Decode a packed weight tile where the kernel computes (`meshrt.quant`), by format."""


def _add(b: ComputeBody) -> list[str]:
    n = b.reduce_n()
    src = b.src or "x"
    return [f"@fadd{b.s}({b.w.mem('y', n)}, {b.w.mem('y', n)}, {b.w.mem(src, n)});"]


def _silu_mul(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    f = max(1, min(b.e.work, b.w.ny // 2))
    return [
        "// y[i] = silu(gate[i]) * up[i], gate and up side by side in y",
        f"for (@range(u16, {f})) |i| {{",
        "  const g = y[i];",
        f"  y[i] = g / (1.0 + math.exp_{b.T}(-g)) * y[i + {f}];",
        "}",
    ]


FMAC = ComputeOp("fmac", "fmac", _fmac, reads_input=True)
"""Multiply-accumulate of the input against this core's resident weight tile."""
ADD = ComputeOp("add", "add", _add)
"""Elementwise sum into the output buffer (a chain's partials, a residual)."""
SILU_MUL = ComputeOp("silu_mul", "exp", _silu_mul)
"""silu(gate) * up of a fused gate|up projection (its cost is the exp)."""
