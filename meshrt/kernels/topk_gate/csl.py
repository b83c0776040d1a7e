"""CSL bodies of the topk_gate kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def topk(b: ComputeBody) -> list[str]:
    w = b.w
    k = w.top_k
    # the routed experts' logits (the shared experts' sigmoid gates after them are not
    # emitted: the routing table holds the top-k choices only)
    e = max(1, min(b.param("experts"), b.e.work // b.b, w.ny // b.b))
    lines = [
        f"// top-{k} of the {e} gate logits per token into the routing table",
        f"for (@range(u16, {b.b})) |t| {{",
        f"  for (@range(u16, {k})) |c| {{",
        "    var best: u16 = 0;",
        f"    var bv: {b.T} = -1.0e4;",
        f"    for (@range(u16, {e})) |i| {{",
        f"      if (y[t * {e} + i] > bv) {{",
        f"        bv = y[t * {e} + i];",
        "        best = i;",
        "      }",
        "    }",
    ]
    if w.moe:
        lines += [f"    rt_expert[t * {k} + c] = best;",
                  f"    rt_weight[t * {k} + c] = @as(f32, bv);"]
    lines += [f"    y[t * {e} + best] = -1.0e4; // exclude it from the next choice", "  }", "}"]
    return lines
