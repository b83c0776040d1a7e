"""CSL bodies of the dispatch kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def route(b: ComputeBody) -> list[str]:
    if not b.w.moe:
        return ["// no routing metainfo on this core: tokens go on along the corridor"]
    k = b.w.choices  # the routing table's entries per token (`route_choices`)
    return [
        "// the resolved routing table picks, per token, whether it turns into the",
        "// expert regions here or goes on along the corridor",
        f"for (@range(u16, {b.b})) |t| {{",
        "  mine[t] = 0;",
        f"  for (@range(u16, {k})) |c| {{",
        f"    if (@as(i16, rt_expert[t * {k} + c]) == region) {{",
        "      mine[t] = 1;",
        "    }",
        "  }",
        "}",
    ]
