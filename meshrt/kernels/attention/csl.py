"""CSL bodies of the attention kernel's own compute ops (see meshrt.kernels.compute)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def qk(b: ComputeBody) -> list[str]:
    w = b.w
    reg = w.region(b.sub)
    d = max(1, w.nx // b.b)
    rows = w.attn_rows
    if reg is None:
        return b.passthrough()
    arr, off, length = reg
    rows = max(1, min(rows, length // (2 * d)))
    return [
        f"// scores of this core's {rows} KV rows: s[r] = q . K[r] (K in the first half of w)",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  for (@range(u16, {rows})) |r| {{",
        f"    var s: {b.T} = 0.0;",
        f"    for (@range(u16, {d})) |i| {{",
        f"      s += x[j * {d} + i] * {arr}[{off} + r * {d} + i];",
        "    }",
        f"    sc[j * {rows} + r] = s;",
        "  }",
        "}",
    ]


def exp(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    rows = b.w.attn_rows
    return [
        f"for (@range(u16, {b.b})) |j| {{",
        f"  var m: {b.T} = sc[j * {rows}];",
        f"  for (@range(u16, {rows})) |r| {{",
        f"    if (sc[j * {rows} + r] > m) {{",
        f"      m = sc[j * {rows} + r];",
        "    }",
        "  }",
        f"  var l: {b.T} = 0.0;",
        f"  for (@range(u16, {rows})) |r| {{",
        f"    sc[j * {rows} + r] = math.exp_{b.fn}(sc[j * {rows} + r] - m);",
        f"    l += sc[j * {rows} + r];",
        "  }",
        "}",
    ]


def av(b: ComputeBody) -> list[str]:
    w = b.w
    reg = w.region(b.sub)
    d = max(1, min(w.nx, w.ny) // b.b)
    rows = w.attn_rows
    if reg is None:
        return b.passthrough()
    arr, off, length = reg
    rows = max(1, min(rows, length // (2 * d)))
    voff = off + length // 2
    return [
        "// y = sum_r s[r] V[r] (V in the second half of w)",
        f"for (@range(u16, {b.b})) |j| {{",
        f"  const yj = @increment_dsd_offset({w.mem('y', d)}, j * {d}, {b.T});",
        f"  @fmov{b.s}(yj, 0.0);",
        f"  var vrow = {w.mem(arr, d, voff)};",
        f"  for (@range(u16, {rows})) |r| {{",
        f"    @fmac{b.s}(yj, yj, vrow, sc[j * {rows} + r]);",
        f"    vrow = @increment_dsd_offset(vrow, {d}, {b.T});",
        "  }",
        "}",
    ]


def normalize(b: ComputeBody) -> list[str]:
    n = max(1, min(b.e.work or 1, b.w.ny - 1))
    return ["// divide by the softmax sum carried in the last element",
            f"const inv = 1.0 / y[{b.w.ny - 1}];",
            f"@fmul{b.s}({b.w.mem('y', n)}, {b.w.mem('y', n)}, inv);"]


def softmax_merge(b: ComputeBody) -> list[str]:
    n = b.reduce_n()
    src = b.src or "x"
    b.w.uses_math = True
    return [
        "// flash-decoding merge: the partner's partial (out..., max, sum) rescaled to the",
        "// common maximum and added",
        f"const m_self = y[{n - 2 if n > 2 else 0}];",
        f"const m_peer = {src}[{n - 2 if n > 2 else 0}];",
        "const m = if (m_self > m_peer) m_self else m_peer;",
        f"const a = math.exp_{b.fn}(m_self - m);",
        f"const c = math.exp_{b.fn}(m_peer - m);",
        f"@fmul{b.s}({b.w.mem('y', n)}, {b.w.mem('y', n)}, a);",
        f"@fmac{b.s}({b.w.mem('y', n)}, {b.w.mem('y', n)}, {b.w.mem(src, n)}, c);",
        f"y[{n - 2 if n > 2 else 0}] = m;",
    ]


def group_merge(b: ComputeBody) -> list[str]:
    return ["// a head split's merge along its KV head group's row: the neighbour's partial",
            *softmax_merge(b)]


def _row_add(b: ComputeBody, buf: str, what: list[str]) -> list[str]:
    """A row neighbour's values (in the chain's partner buffer) added into `buf`."""
    n = b.reduce_n()
    src = b.src or "x"
    return [*what, f"@fadd{b.s}({b.w.mem(buf, n)}, {b.w.mem(buf, n)}, {b.w.mem(src, n)});"]


def qkv_gather(b: ComputeBody) -> list[str]:
    return _row_add(b, "y", ["// a row neighbour's units of the group's q | k | v added into the whole head's",
                             "// (disjoint units: their union); head_dim is split over this KV head's columns"])


def score_add(b: ComputeBody) -> list[str]:
    return _row_add(b, "sc", ["// a row neighbour's partial scores (and sums of squares) added: head_dim is",
                              "// split over this KV head's columns"])
