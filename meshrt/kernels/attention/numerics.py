"""What the attention kernel's events do to data in the interpreter."""

from __future__ import annotations

import math

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, Vec, block_range, part
from meshrt.runtime import reference as ref


def qkv_blocks(heads: int, kv_heads: int, head_dim: int, gated: bool = False) -> tuple[int, ...]:
    """The blocks of the q | k | v (| output gate) vector an attention reads
    (`numerics.block_order`)."""
    hd, kvd = heads * head_dim, kv_heads * head_dim
    return (hd, kvd, kvd, hd) if gated else (hd, kvd, kvd)


class Attention(KernelExec):
    """Heads split over the columns, the sequence over the rows (flash-decoding merge)."""

    OPS = frozenset({"qk", "softmax_merge", "normalize"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        p = info.param
        self.heads, self.kvh, self.d = p("heads"), p("kv_heads"), p("head_dim")
        self.max_seq, self.slots = p("max_seq"), p("slots")
        self.gated = bool(p("gated", 0))
        shape = plane.shape
        self.rope, self.eps, self.window = shape.rope, shape.rms_eps, shape.window(self.layer)
        self.q_gain, self.k_gain = plane.qk_gains(self.layer)
        self.sinks = plane.sinks(self.layer)
        # the blocks of its input when it reads a blocked q | k | v in place, else None
        self.blocks = (qkv_blocks(self.heads, self.kvh, self.d, self.gated)
                       if info.param("qkv_in_place") is not None else None)
        _, _, w, _ = self.tiles[0]
        if self.kvh % w:
            raise DataLayoutError(
                f"kernel @{self.name}: {w} columns do not hold whole KV heads ({self.kvh}); "
                "head_dim split across columns has no numerics in the interpreter")

    def _cache(self, cd, rows):
        c = cd.kv.get(self.name)
        if c is None:
            _, _, _, w, _ = self.grid_pos(cd)
            c = np.zeros((2, self.slots, rows, self.kvh // w, self.d), F32)
            cd.kv[self.name] = c
        return c

    def compute(self, cd, op):
        where = self.where(cd)
        _, i, j, w, h = self.grid_pos(cd)
        if op == "qk":
            # the CF payload that rode in with the data, or (static build) the
            # table the host installed for this batch
            cb = cd.cb if self.plane.cb else self.plane.host.installed_table(cd.step)
            if cb is None or cb.seq != cd.step:
                got = "none" if cb is None else f"the one of step {cb.seq}"
                raise DataLayoutError(f"{where}: step {cd.step} needs its continuous-batching "
                                      f"table, holds {got}")
            hq, hk = self.heads // w, self.kvh // w
            nq, nk = hq * self.d, hk * self.d
            if self.blocks:  # this column's q | k | v (| gate) slice of the blocked vector, in place
                lo, hi = block_range(self.blocks, w, i)
                x = self.input(cd).need(lo, hi, where)
                q, k, v = x[:, :nq], x[:, nq:nq + nk], x[:, nq + nk:nq + 2 * nk]
                gate = x[:, nq + 2 * nk:]
            else:
                hd, kvd = self.heads * self.d, self.kvh * self.d
                x = self.input(cd).need(0, 2 * hd + 2 * kvd if self.gated else hd + 2 * kvd, where)
                q = x[:, i * nq:(i + 1) * nq]
                k = x[:, hd + i * nk:hd + (i + 1) * nk]
                v = x[:, hd + kvd + i * nk:hd + kvd + (i + 1) * nk]
                gate = x[:, hd + 2 * kvd + i * nq:hd + 2 * kvd + (i + 1) * nq]
            if self.gated:  # Qwen3.5: this column's heads' output gates, applied at the root
                cd.acc[self.name, "gate"] = ref.sigmoid(gate)
            q = q.reshape(self.b, hq, self.d)
            k, v = k.reshape(self.b, hk, self.d), v.reshape(self.b, hk, self.d)
            r0, r1 = part(self.max_seq, h, j)
            cache = self._cache(cd, r1 - r0)
            o = np.zeros((self.b, hq, self.d), F64)
            m = np.full((self.b, hq), -np.inf)
            s = np.zeros((self.b, hq), F64)
            g = self.heads // self.kvh
            for b, slot in enumerate(cb.slots):
                if slot.rid < 0:
                    continue
                p = slot.pos
                pos = np.asarray([p])
                qr = ref.apply_rope(ref.qk_norm(q[b][None], self.q_gain, self.eps), pos, self.rope)[0]
                kr = ref.apply_rope(ref.qk_norm(k[b][None], self.k_gain, self.eps), pos, self.rope)[0]
                if r0 <= p < r1:
                    cache[0, slot.kv, p - r0] = kr
                    cache[1, slot.kv, p - r0] = v[b]
                # keys of this request in this core's rows (a sliding window: its last ones)
                lo = max(r0, p - self.window + 1) - r0 if self.window else 0
                n = min(p + 1, r1) - r0
                if n <= lo:
                    continue
                keys, vals = cache[0, slot.kv, lo:n], cache[1, slot.kv, lo:n]
                for hh in range(hq):
                    kv_i = hh // g
                    sc = (keys[:, kv_i].astype(F64) @ qr[hh].astype(F64) / math.sqrt(self.d)).astype(F32)
                    mx = float(np.max(sc))
                    e = np.exp(sc.astype(F64) - mx)
                    m[b, hh], s[b, hh] = mx, e.sum()
                    o[b, hh] = e @ vals[:, kv_i].astype(F64)
            cd.acc[self.name] = (o, m, s)
        elif op == "softmax_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = _merge_softmax(got, cd.acc[self.name])
        elif op == "normalize":
            o, m, s = cd.acc.pop(self.name)
            hq = self.heads // w
            out = np.zeros((self.b, hq, self.d), F32)
            live = s > 0
            if self.sinks is not None:  # each head's sink logit: one more softmax term
                sink = self.sinks[i * hq:(i + 1) * hq].astype(F64)[None, :]
                with np.errstate(invalid="ignore", over="ignore"):
                    s = s + np.where(live, np.exp(sink - np.where(live, m, 0.0)), 0.0)
            out[live] = (o[live] / s[live][:, None]).astype(F32)
            n = self.heads * self.d
            c0 = i * hq * self.d
            flat = out.reshape(self.b, hq * self.d)
            if self.gated:
                flat = (flat * cd.acc.pop((self.name, "gate"))).astype(F32)
            cd.values[self.name] = Vec.of(flat, c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name)
        return cd.values[self.name]



def _merge_softmax(a, b):
    """Combine two (out, max, sum) partials of the same heads (-inf max: no keys)."""
    oa, ma, sa = a
    ob, mb, sb = b
    m = np.maximum(ma, mb)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        fa = np.where(np.isfinite(ma), np.exp(ma - safe), 0.0)
        fb = np.where(np.isfinite(mb), np.exp(mb - safe), 0.0)
    return oa * fa[..., None] + ob * fb[..., None], m, sa * fa + sb * fb
