"""CSL bodies of the embed kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def embed(b: ComputeBody) -> list[str]:
    w = b.w
    reg = w.region(b.sub)
    h = max(1, min(b.e.work // b.b, w.ny // b.b))
    if reg is None or reg[0] != "w":
        return b.passthrough()
    _, off, length = reg
    rows = max(1, length // h)
    return [
        f"// y[j] = row (token mod {rows}) of this core's {rows} x {h} slice of the table",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  const t = @as(u16, x[j]) % {rows};",
        f"  const row = @increment_dsd_offset({w.mem('w', h, off)}, t * {h}, {b.T});",
        f"  @fmov{b.s}(@increment_dsd_offset({w.mem('y', h)}, j * {h}, {b.T}), row);",
        "}",
    ]
