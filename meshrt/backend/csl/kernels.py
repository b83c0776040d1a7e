"""The compute of one `event.compute`, as CSL DSD operations and short loops.

x is the kernel's input, y its output, p the partner's partial of a
reduction / relay chain, w (or wq, packed) the sub-schedule's resident
weights, KV tiles or embedding rows. Shapes follow the event's operation
count and are clamped to the buffers; see docs/csl-backend.md for what is
simplified.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrt.backend.csl.model import Event

if TYPE_CHECKING:
    from meshrt.backend.csl.program import ProgramWriter


class ComputeBody:
    """DSD code of one `event.compute`, by op kind.

    x: the kernel's input, y: its output, p: the partner's partial (chains);
    w: this sub-schedule's resident region. Element counts follow the
    event's work and are clamped to the buffers.
    """

    def __init__(self, w: ProgramWriter, e: Event, sub, src: str | None):
        self.w, self.e, self.sub, self.src = w, e, sub, src
        self.T = w.sh.elem
        self.s = w.sh.sfx
        self.b = w.b

    def lines(self) -> list[str]:
        op = self.e.name
        fn = getattr(self, f"op_{op}", None)
        if fn is None:
            return self.op_default()
        return fn()

    # helpers
    def n(self, cap: int) -> int:
        return max(1, min(self.e.work or 1, cap))

    def zero(self) -> str:
        return "0.0"

    def op_default(self) -> list[str]:
        n = min(self.w.nx, self.w.ny)
        return [f"@fmov{self.s}({self.w.mem('y', n)}, {self.w.mem('x', n)}); // {self.e.name}: pass-through"]

    def op_fmac(self) -> list[str]:
        w = self.w
        b = self.b
        k = max(1, w.nx // b)
        m = max(1, min(self.e.work // max(1, b * k), w.ny // b))
        reg = w.region(self.sub)
        if reg is None:
            return [f"// no resident weights recorded for @{self.sub.kernel}: y = x",
                    *self.op_default()]
        arr, off, length = reg
        if k * m > length:
            m = max(1, length // k)
            k = min(k, length)
        if arr == "wq":  # packed weights: dequantize on the fly
            guard = "mine[j] != 0 and " if w.moe and "experts" in self.sub.kernel else ""
            return [
                f"// y[b, {m}] = W[{k} x {m}]^T x[b, {k}]; W packed 4 bits per weight in wq",
                f"for (@range(u16, {b})) |j| {{",
                f"  for (@range(u16, {m})) |o| {{",
                f"    y[j * {m} + o] = 0.0;",
                f"    if ({guard}true) {{",
                f"      var acc: {self.T} = 0.0;",
                f"      for (@range(u16, {k})) |i| {{",
                f"        const idx: u32 = {off * 4} + @as(u32, i) * {m} + @as(u32, o);",
                "        const nib = (wq[idx >> 2] >> @as(u16, (idx & 3) * 4)) & 0xf;",
                f"        acc += (@as({self.T}, nib) - 8.0) * x[j * {k} + i];",
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
            f"    @fmac{self.s}(yj, yj, wcol, x[j * {k} + i]);",
            f"    wcol = @increment_dsd_offset(wcol, {m}, {self.T});",
            "  }",
        ]
        if w.moe and "experts" in self.sub.kernel:  # only the tokens routed to this region
            inner = ["  if (mine[j] != 0) {", *("  " + line for line in inner), "  }"]
        return [
            f"// y[b, {m}] = W[{k} x {m}]^T x[b, {k}]: one fmac{self.s} per input element",
            f"for (@range(u16, {b})) |j| {{",
            f"  const yj = @increment_dsd_offset({w.mem('y', m)}, j * {m}, {self.T});",
            f"  @fmov{self.s}(yj, {self.zero()});",
            *inner,
            "}",
        ]

    def op_embed(self) -> list[str]:
        w = self.w
        reg = w.region(self.sub)
        h = max(1, min(self.e.work // self.b, w.ny // self.b))
        if reg is None or reg[0] != "w":
            return self.op_default()
        _, off, length = reg
        rows = max(1, length // h)
        return [
            f"// y[j] = row (token mod {rows}) of this core's {rows} x {h} slice of the table",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  const t = @as(u16, x[j]) % {rows};",
            f"  const row = @increment_dsd_offset({w.mem('w', h, off)}, t * {h}, {self.T});",
            f"  @fmov{self.s}(@increment_dsd_offset({w.mem('y', h)}, j * {h}, {self.T}), row);",
            "}",
        ]

    def op_square_sum(self) -> list[str]:
        k = max(1, min(self.e.work // self.b, self.w.nx // self.b))
        return [
            f"// partial sum of squares per slot over this core's {k} elements",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  var s: {self.T} = 0.0;",
            f"  for (@range(u16, {k})) |i| {{",
            f"    s += x[j * {k} + i] * x[j * {k} + i];",
            "  }",
            "  y[j] = s;",
            "}",
        ]

    def op_rsqrt(self) -> list[str]:
        self.w.uses_math = True
        hidden = max(1, int(self.w.p.hp("hidden", 1)))
        return [
            f"for (@range(u16, {self.b})) |j| {{",
            f"  scale[j] = 1.0 / math.sqrt_{self.T}(y[j] / {float(hidden)} + 1.0e-6);",
            "  y[j] = scale[j]; // relayed back up the column",
            "}",
        ]

    def op_scale(self) -> list[str]:
        k = max(1, min(self.e.work // self.b, self.w.nx // self.b, self.w.ny // self.b))
        factor = "p[j]" if self.src == "p" else "scale[j]"
        return [
            "// y = x * rms scale, per slot",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  const xj = @increment_dsd_offset({self.w.mem('x', k)}, j * {k}, {self.T});",
            f"  const yj = @increment_dsd_offset({self.w.mem('y', k)}, j * {k}, {self.T});",
            f"  @fmul{self.s}(yj, xj, {factor});",
            "}",
        ]

    def _reduce_n(self) -> int:
        caps = [self.w.ny, self.w.np if self.src == "p" else self.w.nx]
        return max(1, min(self.e.work or 1, *caps))

    def op_add(self) -> list[str]:
        n = self._reduce_n()
        src = self.src or "x"
        return [f"@fadd{self.s}({self.w.mem('y', n)}, {self.w.mem('y', n)}, {self.w.mem(src, n)});"]

    def op_softmax_merge(self) -> list[str]:
        n = self._reduce_n()
        src = self.src or "x"
        self.w.uses_math = True
        return [
            "// flash-decoding merge: the partner's partial (out..., max, sum) rescaled to the",
            "// common maximum and added",
            f"const m_self = y[{n - 2 if n > 2 else 0}];",
            f"const m_peer = {src}[{n - 2 if n > 2 else 0}];",
            "const m = if (m_self > m_peer) m_self else m_peer;",
            f"const a = math.exp_{self.T}(m_self - m);",
            f"const c = math.exp_{self.T}(m_peer - m);",
            f"@fmul{self.s}({self.w.mem('y', n)}, {self.w.mem('y', n)}, a);",
            f"@fmac{self.s}({self.w.mem('y', n)}, {self.w.mem('y', n)}, {self.w.mem(src, n)}, c);",
            f"y[{n - 2 if n > 2 else 0}] = m;",
        ]

    def op_argmax_merge(self) -> list[str]:
        src = self.src or "x"
        return [
            "// keep the larger (value, index) pair per slot",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  if ({src}[j * 2] > y[j * 2]) {{",
            f"    y[j * 2] = {src}[j * 2];",
            f"    y[j * 2 + 1] = {src}[j * 2 + 1];",
            "  }",
            "}",
        ]

    def op_combine(self) -> list[str]:
        n = self._reduce_n()
        src = self.src or "x"
        weight = "rt_weight[0]" if self.w.moe else "1.0"
        return ["// y += expert result x gate weight",
                f"@fmac{self.s}({self.w.mem('y', n)}, {self.w.mem('y', n)}, {self.w.mem(src, n)}, "
                f"@as({self.T}, {weight}));"]

    def op_qk(self) -> list[str]:
        w = self.w
        reg = w.region(self.sub)
        d = max(1, w.nx // self.b)
        rows = w.attn_rows
        if reg is None:
            return self.op_default()
        arr, off, length = reg
        rows = max(1, min(rows, length // (2 * d)))
        return [
            f"// scores of this core's {rows} KV rows: s[r] = q . K[r] (K in the first half of w)",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  for (@range(u16, {rows})) |r| {{",
            f"    var s: {self.T} = 0.0;",
            f"    for (@range(u16, {d})) |i| {{",
            f"      s += x[j * {d} + i] * {arr}[{off} + r * {d} + i];",
            "    }",
            f"    sc[j * {rows} + r] = s;",
            "  }",
            "}",
        ]

    def op_exp(self) -> list[str]:
        self.w.uses_math = True
        rows = self.w.attn_rows
        return [
            f"for (@range(u16, {self.b})) |j| {{",
            f"  var m: {self.T} = sc[j * {rows}];",
            f"  for (@range(u16, {rows})) |r| {{",
            f"    if (sc[j * {rows} + r] > m) {{",
            f"      m = sc[j * {rows} + r];",
            "    }",
            "  }",
            f"  var l: {self.T} = 0.0;",
            f"  for (@range(u16, {rows})) |r| {{",
            f"    sc[j * {rows} + r] = math.exp_{self.T}(sc[j * {rows} + r] - m);",
            f"    l += sc[j * {rows} + r];",
            "  }",
            "}",
        ]

    def op_av(self) -> list[str]:
        w = self.w
        reg = w.region(self.sub)
        d = max(1, min(w.nx, w.ny) // self.b)
        rows = w.attn_rows
        if reg is None:
            return self.op_default()
        arr, off, length = reg
        rows = max(1, min(rows, length // (2 * d)))
        voff = off + length // 2
        return [
            "// y = sum_r s[r] V[r] (V in the second half of w)",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  const yj = @increment_dsd_offset({w.mem('y', d)}, j * {d}, {self.T});",
            f"  @fmov{self.s}(yj, 0.0);",
            f"  var vrow = {w.mem(arr, d, voff)};",
            f"  for (@range(u16, {rows})) |r| {{",
            f"    @fmac{self.s}(yj, yj, vrow, sc[j * {rows} + r]);",
            f"    vrow = @increment_dsd_offset(vrow, {d}, {self.T});",
            "  }",
            "}",
        ]

    def op_normalize(self) -> list[str]:
        n = max(1, min(self.e.work or 1, self.w.ny - 1))
        return ["// divide by the softmax sum carried in the last element",
                f"const inv = 1.0 / y[{self.w.ny - 1}];",
                f"@fmul{self.s}({self.w.mem('y', n)}, {self.w.mem('y', n)}, inv);"]

    def op_silu_mul(self) -> list[str]:
        self.w.uses_math = True
        f = max(1, min(self.e.work, self.w.ny // 2))
        return [
            "// y[i] = silu(gate[i]) * up[i], gate and up side by side in y",
            f"for (@range(u16, {f})) |i| {{",
            "  const g = y[i];",
            f"  y[i] = g / (1.0 + math.exp_{self.T}(-g)) * y[i + {f}];",
            "}",
        ]

    def op_topk(self) -> list[str]:
        w = self.w
        k = w.top_k
        e = max(1, min(self.e.work // self.b, w.ny // self.b))
        lines = [
            f"// top-{k} of the {e} gate logits per token into the routing table",
            f"for (@range(u16, {self.b})) |t| {{",
            f"  for (@range(u16, {k})) |c| {{",
            "    var best: u16 = 0;",
            f"    var bv: {self.T} = -1.0e4;",
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

    def op_route(self) -> list[str]:
        if not self.w.moe:
            return ["// no routing metainfo on this core: tokens go on along the corridor"]
        k = self.w.top_k
        return [
            "// the resolved routing table picks, per token, whether it turns into the",
            "// expert regions here or goes on along the corridor",
            f"for (@range(u16, {self.b})) |t| {{",
            "  mine[t] = 0;",
            f"  for (@range(u16, {k})) |c| {{",
            f"    if (@as(i16, rt_expert[t * {k} + c]) == region) {{",
            "      mine[t] = 1;",
            "    }",
            "  }",
            "}",
        ]

    def op_argmax(self) -> list[str]:
        v = max(1, min(self.e.work // self.b, self.w.nx // self.b))
        return [
            f"// (value, index) of the largest of this core's {v} logits per slot",
            f"for (@range(u16, {self.b})) |j| {{",
            f"  var bv: {self.T} = x[j * {v}];",
            "  var bi: u16 = 0;",
            f"  for (@range(u16, {v})) |i| {{",
            f"    if (x[j * {v} + i] > bv) {{",
            f"      bv = x[j * {v} + i];",
            "      bi = i;",
            "    }",
            "  }",
            "  y[j * 2] = bv;",
            f"  y[j * 2 + 1] = @as({self.T}, bi) + @as({self.T}, px) * {float(v)}; // index in the vocabulary",
            "}",
        ]

    def op_eos_check(self) -> list[str]:
        eos = int(self.w.p.hp("eos_token", 0))
        return [
            f"for (@range(u16, {self.b})) |j| {{",
            f"  done[j] = if (@as(u16, y[j * 2 + 1]) == {eos}) 1 else 0;",
            "}",
        ]
