"""CSL bodies of the Gated DeltaNet kernel's own compute ops (see meshrt.kernels.compute).

Buffers as the other kinds use them: x the input (this core's channels of the in
projection), w the resident region (the conv taps, then per slot the conv
state and the recurrent state of the core's heads' v_dim slice), y the output
slices, p a partner's. Sizes are clamped to the buffers the schedule gave.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meshrt.backend.csl.kernels import ComputeBody


def _k(b: ComputeBody) -> int:
    return max(1, int(b.param("k_dim") or 1))


def _taps(b: ComputeBody) -> int:
    return max(2, int(b.param("conv") or 2))


def _tokens(b: ComputeBody) -> int:
    """Tokens this core runs: its token group's share of the micro-batch."""
    return max(1, b.b // max(1, int(b.param("groups") or 1)))


def conv(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    reg = b.w.region(b.sub)
    if reg is None:
        return b.passthrough()
    arr, off, length = reg
    k = _taps(b)
    t = _tokens(b)
    n = max(1, min(b.e.work // (t * k), b.w.nx // t, length // (2 * k)))
    return [
        f"// causal conv of {n} channels over the slot's last {k - 1} inputs, then silu;",
        "// taps first in w, the conv state after them (oldest input first)",
        f"for (@range(u16, {t})) |j| {{",
        f"  for (@range(u16, {n})) |c| {{",
        f"    var s: {b.T} = x[j * {n} + c] * {arr}[{off} + c * {k} + {k - 1}];",
        f"    for (@range(u16, {k - 1})) |t| {{",
        f"      s += {arr}[{off} + {n * k} + c * {k - 1} + t] * {arr}[{off} + c * {k} + t];",
        "    }",
        f"    for (@range(u16, {k - 2})) |t| {{",
        f"      {arr}[{off} + {n * k} + c * {k - 1} + t] = {arr}[{off} + {n * k} + c * {k - 1} + t + 1];",
        "    }",
        f"    {arr}[{off} + {n * k} + c * {k - 1} + {k - 2}] = x[j * {n} + c];",
        f"    x[j * {n} + c] = s / (1.0 + math.exp_{b.fn}(-s));",
        "  }",
        "}",
    ]


def _merge(b: ComputeBody, buf: str, what: str) -> list[str]:
    """The partner's slices of `what` join this core's in `buf` (disjoint slices: a sum)."""
    n = b.reduce_n()
    src = b.src or "p"
    return [
        f"// the partner's slices of {what} join this core's (disjoint: a sum)",
        f"@fadd{b.s}({b.w.mem(buf, n)}, {b.w.mem(buf, n)}, {b.w.mem(src, n)});",
    ]


def qk_merge(b: ComputeBody) -> list[str]:
    return _merge(b, "x", "the column's convolved q / k")


def delta(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    reg = b.w.region(b.sub)
    if reg is None:
        return b.passthrough()
    arr, off, length = reg
    kd = _k(b)
    t = _tokens(b)
    vs = max(1, min(b.e.work // (4 * t * kd), b.w.ny // t, length // max(1, kd)))
    return [
        f"// gated delta rule on {vs} state columns of {kd} rows: S *= exp(g);",
        "// m = S^T k; S += k (beta (v - m))^T; y = S^T q (q, k, v, g, beta in x)",
        f"for (@range(u16, {t})) |j| {{",
        f"  const decay: {b.T} = math.exp_{b.fn}(x[j * {2 * kd + vs + 2} + {2 * kd + vs}]);",
        f"  const beta: {b.T} = x[j * {2 * kd + vs + 2} + {2 * kd + vs + 1}];",
        f"  for (@range(u16, {vs})) |c| {{",
        f"    var m: {b.T} = 0.0;",
        f"    for (@range(u16, {kd})) |r| {{",
        f"      {arr}[{off} + r * {vs} + c] *= decay;",
        f"      m += {arr}[{off} + r * {vs} + c] * x[j * {2 * kd + vs + 2} + {kd} + r];",
        "    }",
        f"    const d: {b.T} = beta * (x[j * {2 * kd + vs + 2} + {2 * kd} + c] - m);",
        f"    var o: {b.T} = 0.0;",
        f"    for (@range(u16, {kd})) |r| {{",
        f"      {arr}[{off} + r * {vs} + c] += x[j * {2 * kd + vs + 2} + {kd} + r] * d;",
        f"      o += {arr}[{off} + r * {vs} + c] * x[j * {2 * kd + vs + 2} + r];",
        "    }",
        f"    y[j * {vs} + c] = o;",
        "  }",
        "}",
    ]


def delta_merge(b: ComputeBody) -> list[str]:
    return _merge(b, "y", "the head outputs")


def norm_gate(b: ComputeBody) -> list[str]:
    b.w.uses_math = True
    vd = max(1, int(b.param("v_dim") or 1))
    t = _tokens(b)
    heads = max(1, min(b.e.work // (t * vd), b.w.ny // (t * vd)))
    return [
        f"// per head of {vd}: y = y / sqrt(mean(y^2) + eps) * gain * silu(z) (z in x)",
        f"for (@range(u16, {t * heads})) |hh| {{",
        f"  var ss: {b.T} = 0.0;",
        f"  for (@range(u16, {vd})) |c| {{",
        f"    ss += y[hh * {vd} + c] * y[hh * {vd} + c];",
        "  }",
        f"  const inv: {b.T} = 1.0 / math.sqrt_{b.fn}(ss / {float(vd)} + 1.0e-6);",
        f"  for (@range(u16, {vd})) |c| {{",
        f"    const z: {b.T} = x[hh * {vd} + c];",
        f"    y[hh * {vd} + c] = y[hh * {vd} + c] * inv * z / (1.0 + math.exp_{b.fn}(-z));",
        "  }",
        "}",
    ]
