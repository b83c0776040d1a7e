"""What the elementwise kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, Vec, part
from meshrt.runtime import reference as ref


class Elementwise(KernelExec):
    OPS = frozenset({"square_sum", "add", "rsqrt", "scale", "silu_mul"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.kind = info.param("kind")
        self.by_rows = info.param("layout", "cols") == "rows"
        if self.kind == "rmsnorm":
            self.gain = plane.norm_gain(self.name, self.layer)

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        n = self.info.param("out_width")
        where = self.where(cd)
        if self.kind == "rmsnorm":
            r0, r1 = part(n, h, j)
            if op == "square_sum":
                x = self.input(cd).need(r0, r1, where).astype(F64)
                cd.acc[self.name] = np.sum(x * x, axis=1)
            elif op == "add":
                (got,) = self.take(cd, FlowRole.DOWN)
                cd.acc[self.name] = got + cd.acc[self.name]
            elif op == "rsqrt":
                eps = self.plane.shape.rms_eps
                cd.acc[self.name + ".inv"] = 1.0 / np.sqrt(cd.acc.pop(self.name) / n + eps)
            elif op == "scale":
                inv = cd.acc.pop(self.name + ".inv")
                x = self.input(cd).need(r0, r1, where).astype(F64)
                out = (x * inv[:, None] * self.gain[r0:r1].astype(F64)).astype(F32)
                cd.values[self.name] = Vec.of(out, r0, n)
            return
        if op != self.kind:
            return
        c0, c1 = part(n, h, j) if self.by_rows else part(n, w, i)
        if self.kind == "add":
            a = self.input(cd, 0).need(c0, c1, where)
            b = self.input(cd, 1).need(c0, c1, where)
            out = a + b
        elif self.kind == "silu_mul":
            # gate | up of the fused up projection, blocked over its own output split
            # (not necessarily this kernel's): find this slice's entries of each
            v = self.input(cd)
            pos = self.plane.positions(self.inputs[0])
            if pos is None:
                raise DataLayoutError(f"{where}: silu_mul's input @{self.inputs[0]} is not a "
                                      "fused gate | up projection")
            gate = v.need_at(pos[c0:c1], where)
            up = v.need_at(pos[n + c0:n + c1], where)
            out = ref.glu(gate, up, self.plane.act)
        else:
            raise DataLayoutError(f"{where}: elementwise \"{self.kind}\" has no numerics here")
        cd.values[self.name] = Vec.of(out.astype(F32), c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc[self.name]
        if role is FlowRole.UP:
            return cd.acc[self.name + ".inv"]
        return cd.values[self.name]

    def relayed(self, cd, value):
        cd.acc[self.name + ".inv"] = value
