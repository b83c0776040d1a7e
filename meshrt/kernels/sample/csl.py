"""CSL bodies of the sample kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrt.shape import HParams

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def argmax(b: ComputeBody) -> list[str]:
    v = max(1, min(b.e.work // b.b, b.w.nx // b.b))
    return [
        f"// (value, index) of the largest of this core's {v} logits per slot",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  var bv: {b.T} = x[j * {v}];",
        "  var bi: u16 = 0;",
        f"  for (@range(u16, {v})) |i| {{",
        f"    if (x[j * {v} + i] > bv) {{",
        f"      bv = x[j * {v} + i];",
        "      bi = i;",
        "    }",
        "  }",
        "  y[j * 2] = bv;",
        f"  y[j * 2 + 1] = @as({b.T}, bi) + @as({b.T}, px) * {float(v)}; // index in the vocabulary",
        "}",
    ]


def argmax_merge(b: ComputeBody) -> list[str]:
    src = b.src or "x"
    return [
        "// keep the larger (value, index) pair per slot",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  if ({src}[j * 2] > y[j * 2]) {{",
        f"    y[j * 2] = {src}[j * 2];",
        f"    y[j * 2 + 1] = {src}[j * 2 + 1];",
        "  }",
        "}",
    ]


def eos_check(b: ComputeBody) -> list[str]:
    eos = int(b.w.p.hp("eos_token", 0))
    if eos < 0:  # no EOS token: only a request's length ends it
        return [f"for (@range(u16, {b.b})) |j| {{", "  done[j] = 0;", "}"]
    more = HParams.of(b.w.p.op).ints("eos_more")  # a config's further EOS tokens
    hit = " or ".join(f"@as(u16, y[j * 2 + 1]) == {t}" for t in (eos, *more))
    return [
        f"for (@range(u16, {b.b})) |j| {{",
        f"  done[j] = if ({hit}) 1 else 0;",
        "}",
    ]
