"""CSL bodies of the combine kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def combine(b: ComputeBody) -> list[str]:
    n = b.reduce_n()
    src = b.src or "x"
    weight = "rt_weight[0]" if b.w.moe else "1.0"
    return ["// y += expert result x gate weight",
            f"@fmac{b.s}({b.w.mem('y', n)}, {b.w.mem('y', n)}, {b.w.mem(src, n)}, "
            f"@as({b.T}, {weight}));"]
