"""CSL of the embed kernel where it has no PE body (a 16-bit or quantized table:
docs/csl-backend.md, "Compute"); float32 tables print their PE body (embed/pe.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrt.backend.csl.values import kernel_array

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def embed(b: ComputeBody) -> list[str]:
    """y[j] = the token's row where this core's column holds it (rows [c * R, (c + 1) * R)
    of the table, c its column in the region), zeros where it does not."""
    w = b.w
    reg = w.region(b.sub)
    h = max(1, min(b.e.work // b.b, w.ny // b.b))
    if reg is None or reg[0] != "w":
        return b.passthrough()
    _, off, length = reg
    rows = max(1, length // h)
    x0 = w.p.record(b.sub).region.rects.data[0].x.data
    tokens = w.ident(kernel_array(b.sub.kernel, "tokens"))
    return [
        f"// rows [(px - {x0}) * {rows}, + {rows}) of the table, {h} entries of each, are this core's",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  const r = {tokens}[j] - @as(i32, px - {x0}) * {rows};",
        f"  @fmov{b.s}(@increment_dsd_offset({w.mem('y', h)}, j * {h}, {b.T}), {b.zero()});",
        f"  if (r >= 0 and r < {rows}) {{",
        f"    @fmov{b.s}(@increment_dsd_offset({w.mem('y', h)}, j * {h}, {b.T}),",
        f"               @increment_dsd_offset({w.mem('w', h, off)}, @as(i16, r) * {h}, {b.T}));",
        "  }",
        "}",
    ]
