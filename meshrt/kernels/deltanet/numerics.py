"""What the Gated DeltaNet kernel's events do to data in the interpreter.

Every formula is `meshrt.runtime.reference`'s (`causal_conv`, `deltanet_qk`,
`deltanet_gates`, `delta_rule`, `gated_rmsnorm`), applied to the heads and the
v_dim slice a core holds (see `op.py` for the layout).
"""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, DataLayoutError, KernelExec, Vec, part
from meshrt.runtime import reference as ref


def group_slots(slots: int, groups: int) -> int:
    """Request slots one token group keeps state for: slot kv belongs to group kv mod
    groups, held at index kv // groups."""
    return -(-slots // groups)


class DeltaNet(KernelExec):
    """Value heads over the columns, v_dim over the rows; the column's convolved q / k
    all-gathered up and down it, the head outputs gathered down it. Token groups side by
    side: each its own tokens and their slots' state."""

    OPS = frozenset({"delta_conv", "qk_merge", "delta", "delta_merge", "norm_gate"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        p = info.param
        self.kh, self.vh, self.kd, self.vd = p("k_heads"), p("v_heads"), p("k_dim"), p("v_dim")
        self.taps, self.slots = p("conv"), p("slots")
        self.groups = p("groups", 1)
        self.eps = plane.shape.rms_eps
        self.w = plane.deltanet(self.layer)
        self.kw, self.vw = self.kh * self.kd, self.vh * self.vd
        self.conv_w = 2 * self.kw + self.vw  # z, then b, then a follow the convolved channels
        self._layout: dict[tuple[int, int, int, int], tuple] = {}

    def layout(self, i: int, j: int, w: int, h: int):
        """(value heads, key heads, v_dim slice, the column's q / k slice this row convolves,
        the input columns of the channels it convolves, each value head's key head) of the
        core at column i, row j."""
        key = (i, j, w, h)
        got = self._layout.get(key)
        if got is None:
            v0, v1 = part(self.vh, w, i)
            d0, d1 = part(self.vd, h, j)
            of = ref.key_heads(range(v0, v1), self.kh, self.vh)
            k0, k1 = (int(of[0]), int(of[-1]) + 1) if v1 > v0 else (0, 0)
            kd, vd = self.kd, self.vd
            qk = np.concatenate([np.arange(k0 * kd, k1 * kd), self.kw + np.arange(k0 * kd, k1 * kd)])
            c0, c1 = part(len(qk), h, j)
            idx = np.concatenate([
                qk[c0:c1], *(2 * self.kw + v * vd + np.arange(d0, d1) for v in range(v0, v1)),
                np.zeros(0, np.int64)]).astype(np.int64)
            got = self._layout[key] = ((v0, v1), (k0, k1), (d0, d1), (c0, c1), idx, of - k0)
        return got

    def _state(self, cd, idx, nv, ds):
        st = cd.kv.get(self.name)
        if st is None:
            slots = group_slots(self.slots, self.groups)
            st = cd.kv[self.name] = (
                np.zeros((slots, len(idx), self.taps - 1), F32),  # conv state
                np.zeros((slots, nv, self.kd, ds), F32))  # recurrent state
        return st

    def admit(self, cd, kv: int) -> None:
        """Continuous batching gave slot `kv` a new request: it starts from zero state, none
        of the request the slot held before."""
        for state in cd.kv[self.name]:
            state[kv // self.groups] = 0.0

    def load_pushed(self, cd, kv, state):
        """A pushed request's conv and recurrent state (`kv_cache`) where this core keeps
        slot kv's: its channels, its heads' v_dim slice (only its token group's slots)."""
        _, i, j, w, h = self.grid_pos(cd)
        group, i, w = self._group(i, w)
        if kv % self.groups != group:
            return
        (v0, v1), _, (d0, d1), _, idx, _ = self.layout(i, j, w, h)
        conv, rec = self._state(cd, idx, v1 - v0, d1 - d0)
        conv[kv // self.groups] = state.conv[self.layer][idx]
        rec[kv // self.groups] = state.rec[self.layer][v0:v1, :, d0:d1]

    def _group(self, i: int, w: int) -> tuple[int, int, int]:
        """(token group, column within it, its width) of column i of a w-wide region."""
        wc = w // self.groups
        return (*divmod(i, wc), wc)

    def _mine(self, cb, group: int, where: str):
        """(micro-batch position, slot) of the live tokens token group `group` runs."""
        out = []
        for b, slot in enumerate(cb.slots):
            if slot.rid < 0 or b % self.groups != group:
                continue
            if slot.kv % self.groups != group:
                raise DataLayoutError(f"{where}: slot {slot.kv} at micro-batch position {b} is "
                                      f"not a slot of token group {group} of {self.groups}")
            out.append((b, slot))
        return out

    def _gathered(self, cd, where):
        """The column's whole convolved q / k once the gather has merged every row's slice."""
        qk, held = cd.acc.pop((self.name, "qk"))
        if not held.all():
            raise DataLayoutError(f"{where}: the root holds only part of its column's q / k")
        return qk

    def compute(self, cd, op):
        where = self.where(cd)
        _, i, j, w, h = self.grid_pos(cd)
        group, i, w = self._group(i, w)
        (v0, v1), (k0, k1), (d0, d1), (c0, c1), idx, of = self.layout(i, j, w, h)
        nv, nk, ds, nc = v1 - v0, k1 - k0, d1 - d0, c1 - c0
        if op == "delta_conv":
            cb = cd.cb if self.plane.cb else self.plane.host.installed_table(cd.step)
            if cb is None or cb.seq != cd.step:
                got = "none" if cb is None else f"the one of step {cb.seq}"
                raise DataLayoutError(f"{where}: step {cd.step} needs its continuous-batching "
                                      f"table, holds {got}")
            self.apply_pushes(cd, cb)
            x = self.input(cd).need(0, self.conv_w + self.vw + 2 * self.vh, where)
            conv_st, _ = self._state(cd, idx, nv, ds)
            taps = self.w.conv[idx]
            qk = np.zeros((self.b, 2 * nk * self.kd), F32)
            held = np.zeros(2 * nk * self.kd, bool)
            held[c0:c1] = True
            prep = {}
            for b, slot in self._mine(cb, group, where):
                if slot.pos == 0:  # a request starts in this slot
                    self.admit(cd, slot.kv)

                kv = slot.kv // self.groups
                y, conv_st[kv] = ref.causal_conv(x[b, idx][None], conv_st[kv], taps)
                qk[b, c0:c1] = y[0, :nc]
                v = y[0, nc:].reshape(1, nv, ds)
                ab = self.conv_w + self.vw
                g, beta = ref.deltanet_gates(x[b, ab + v0:ab + v1][None],
                                             x[b, ab + self.vh + v0:ab + self.vh + v1][None],
                                             self.w.dt_bias[v0:v1], self.w.a_log[v0:v1])
                prep[b] = (kv, v, g, beta)
            cd.acc[self.name, "prep"] = prep
            cd.acc[self.name, "qk"] = (qk, held)
        elif op == "qk_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            qk, held = cd.acc[self.name, "qk"]
            qk[:, got[1]] = got[0][:, got[1]]
            cd.acc[self.name, "qk"] = (qk, held | got[1])
        elif op == "delta":
            qk = cd.acc.pop((self.name, "qk_all"), None)
            if qk is None:  # a one-row column: the gather had nothing to move
                qk = self._gathered(cd, where)
            _, rec = self._state(cd, idx, nv, ds)
            out = np.zeros((self.b, nv, self.vd), F32)
            held = np.zeros((self.b, nv, self.vd), bool)
            held[:, :, d0:d1] = True
            n = nk * self.kd
            for b, (kv, v, g, beta) in cd.acc.pop((self.name, "prep")).items():
                q, k = ref.deltanet_qk(qk[b, :n].reshape(1, nk, self.kd),
                                       qk[b, n:].reshape(1, nk, self.kd))
                o, rec[kv] = ref.delta_rule(q[:, of], k[:, of], v, g, beta, rec[kv])
                out[b, :, d0:d1] = o[0]
            cd.acc[self.name] = (out, held)
        elif op == "delta_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            out, held = cd.acc[self.name]
            out[got[1]] = got[0][got[1]]
            cd.acc[self.name] = (out, held | got[1])
        elif op == "norm_gate":
            out, held = cd.acc.pop(self.name)
            if not held.all():
                raise DataLayoutError(f"{where}: the root holds only part of its heads' outputs")
            x = self.input(cd).need(0, self.conv_w + self.vw, where)
            z = x[:, self.conv_w + v0 * self.vd:self.conv_w + v1 * self.vd].reshape(self.b, nv, self.vd)
            y = ref.gated_rmsnorm(out, z, self.w.norm, self.eps)
            cb = cd.cb if self.plane.cb else self.plane.host.installed_table(cd.step)
            idle = [b for b, slot in enumerate(cb.slots) if slot.rid < 0]
            y[idle] = 0.0
            v = Vec.of(y.reshape(self.b, nv * self.vd), v0 * self.vd, self.vw)
            v.mask[np.arange(self.b) % self.groups != group] = False  # other groups' tokens
            cd.values[self.name] = v

    def _gathering(self, cd) -> bool:
        """Whether the core is inside the q / k gather (between its conv and its rule)."""
        return (self.name, "prep") in cd.acc

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            if self._gathering(cd):
                return cd.acc.pop((self.name, "qk"))
            return cd.acc.pop(self.name)
        if self._gathering(cd):  # the gather's result, multicast or relayed back up the column
            if (self.name, "qk") in cd.acc:  # the root
                cd.acc[self.name, "qk_all"] = self._gathered(cd, self.where(cd))
            return cd.acc[self.name, "qk_all"]
        return cd.values[self.name]

    def recv(self, cd, role, items):
        if role is FlowRole.UP and self._gathering(cd):
            cd.acc[self.name, "qk_all"] = items[0]
        else:
            super().recv(cd, role, items)
