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
    # its CSL body; None where the kind's PE bodies (`KernelOp.pe_bodies`) are its compute
    csl: Callable[[ComputeBody], list[str]] | None
    reads_input: bool = False  # reads the kernel's input buffer x (the CSL receives into it)
    admits_requests: bool = False  # where the first stage admits waiting requests (CSL)
    price: Price | None = None  # the op's own formula; None: work x costs[cost]
    # its work is over the KV rows a core holds, and its loops end at the rows the
    # micro-batch's queries reach: with data, the interpreter charges that share of it
    # (`KernelExec.reached`); the static work (the cost model's) is the capacity
    over_kv_rows: bool = False

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


def _tile(b: ComputeBody):
    """(k input rows, m output columns, region, word offset, words) of this core's
    resident tile as the fmac reads it (clamped to the region), or None."""
    w = b.w
    k = max(1, w.nx // b.b)
    m = max(1, min(b.e.work // max(1, b.b * k), w.ny // b.b))
    reg = w.region(b.sub)
    if reg is None:
        return None
    arr, off, length = reg
    if k * m > length:
        m = max(1, length // k)
        k = min(k, length)
    return k, m, arr, off, length


# A packed tile in `wq` (16-bit words, meshrt.quant's formats): the codes row-major
# (CODES_PER_WORD a word), then per tile row the index of its scale block among the tile's
# blocks, then the blocks' scales per column (mxfp4: the E8M0 byte; fp8: float32 bits, two
# words). A row's block index, not a fixed block height, so tiles that start inside a
# block keep the whole matrix's scales.
CODES_PER_WORD = {"mxfp4": 4, "fp8": 2}
SCALE_WORDS = {"mxfp4": 1, "fp8": 2}


def _packed_layout(fmt: str, k: int, m: int, off: int) -> tuple[int, int, int]:
    """Word offsets in `wq` of a packed k x m tile's codes, row blocks and scales."""
    codes = off
    blocks = codes + -(-k * m // CODES_PER_WORD[fmt])
    return codes, blocks, blocks + k


def fmac_csl(b: ComputeBody) -> list[str]:
    w = b.w
    got = _tile(b)
    if got is None:
        return [f"// no resident weights recorded for @{b.sub.kernel}: y = x", *b.passthrough()]
    k, m, arr, off, length = got
    routed = w.moe and b.kind.PLACES_EXPERTS  # only the tokens routed to this region
    if arr == "wq":  # packed: each code decoded as it is read, times its block's scale
        fmt = b.param("weights")
        per = CODES_PER_WORD[fmt]
        bits = 16 // per
        codes, blocks, _ = _packed_layout(fmt, k, m, off)
        table = "E2M1" if fmt == "mxfp4" else "E4M3"
        w.tables.add(table)
        guard = "mine[j] != 0 and " if routed else ""
        return [
            f"// y[b, {m}] = W[{k} x {m}]^T x[b, {k}]; W as {fmt} codes in wq ({per} a word), "
            f"w = {table}[code] x wscale (dequant_{fmt} decoded the scales)",
            f"for (@range(u16, {b.b})) |j| {{",
            f"  for (@range(u16, {m})) |o| {{",
            f"    y[j * {m} + o] = 0.0;",
            f"    if ({guard}true) {{",
            f"      var acc: {b.T} = 0.0;",
            f"      for (@range(u16, {k})) |i| {{",
            f"        const idx: u32 = @as(u32, i) * {m} + @as(u32, o);",
            f"        const code = (wq[{codes} + idx / {per}] >> @as(u16, (idx % {per}) * {bits})) "
            f"& {(1 << bits) - 1};",
            f"        const s = wscale[@as(u32, wq[{blocks} + @as(u32, i)]) * {m} + @as(u32, o)];",
            f"        acc += @as({b.T}, {table}[code] * s) * x[j * {k} + i];",
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
    """The tile's block scales as float32 multipliers (`wscale`), for the fmac that
    follows, which decodes each code through its format's table as it reads it."""
    got = _tile(b)
    if got is None or got[2] != "wq":
        return [f"// @{b.sub.kernel}: no packed tile recorded; nothing to decode"]
    k, m, _, off, length = got
    fmt = b.param("weights")
    _, blocks, scales = _packed_layout(fmt, k, m, off)
    nb = max(1, min(k, (length - (scales - off)) // (SCALE_WORDS[fmt] * m)))
    b.w.wscale = max(b.w.wscale, nb * m)
    if fmt == "mxfp4":  # E8M0: 2^(e - 127) is the float32 with exponent field e
        value = f"@bitcast(f32, @as(u32, wq[{scales} + s]) << 23)"
    else:  # float32 bits in two words, low first
        value = (f"@bitcast(f32, @as(u32, wq[{scales} + 2 * s]) | "
                 f"(@as(u32, wq[{scales} + 2 * s + 1]) << 16))")
    return [
        f"// {fmt}: the scales of the tile's {nb} block(s) x {m} columns, as float32",
        f"for (@range(u32, {nb * m})) |s| {{",
        f"  wscale[s] = {value};",
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
        f"  y[i] = g / (1.0 + math.exp_{b.fn}(-g)) * y[i + {f}];",
        "}",
    ]


FMAC = ComputeOp("fmac", "fmac", fmac_csl, reads_input=True)
"""Multiply-accumulate of the input against this core's resident weight tile."""
ADD = ComputeOp("add", "add", _add)
"""Elementwise sum into the output buffer (a chain's partials, a residual)."""
SILU_MUL = ComputeOp("silu_mul", "exp", _silu_mul)
"""silu(gate) * up of a fused gate|up projection (its cost is the exp)."""
