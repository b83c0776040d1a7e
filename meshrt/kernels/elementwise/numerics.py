"""What the elementwise kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, DataLayoutError, KernelExec, Vec, part
from meshrt.kernels.elementwise.pe import bodies_for


class Elementwise(KernelExec):
    OPS = frozenset({"square_sum", "add", "rsqrt", "scale", "silu_mul"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.kind = info.param("kind")
        self.by_rows = info.param("layout", "cols") == "rows"
        if self.kind == "rmsnorm":
            self.gain = plane.norm_gain(self.name, self.layer)
        # per tile shape (w, h), the bodies the CSL prints: K entries of a slot a core
        self.bodies = {t[2:]: bodies_for(info, self.b, plane.hp, t) for t in self.tiles}

    def resident(self, pos):
        if self.kind != "rmsnorm":
            return None
        _, _, j, w, h = self.grid_at(pos)
        r0, r1 = part(self.info.param("out_width"), h, j)
        gain = np.zeros(self.bodies[w, h].buffer("gain").elems, F32)
        gain[:r1 - r0] = self.gain[r0:r1]
        return [gain]

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        n = self.info.param("out_width")
        where = self.where(cd)
        if self.kind == "rmsnorm":
            r0, r1 = part(n, h, j)
            bodies = self.bodies[w, h]
            bufs = self.pe_buffers(cd, bodies)
            b, k = self.b, bodies.buffer("x").elems // self.b
            if op == "square_sum":  # the input as it arrived in x: k features a slot
                x = bufs["x"].reshape(b, k)
                x[:] = 0
                x[:, :r1 - r0] = self.input(cd).need(r0, r1, where)
            elif op == "add":
                (got,) = self.take(cd, FlowRole.DOWN)
                bufs["p"][:] = got
            self.run_body(cd, bodies, op)
            if op == "scale":
                cd.values[self.name] = Vec.of(bufs["y"].reshape(b, k)[:, :r1 - r0].copy(), r0, n)
            return
        if op != self.kind:
            return
        bodies = self.bodies[w, h]
        if bodies is None:
            raise DataLayoutError(f"{where}: elementwise \"{self.kind}\" has no numerics here")
        c0, c1 = part(n, h, j) if self.by_rows else part(n, w, i)
        bufs = self.pe_buffers(cd, bodies)
        k = bodies.buffer("y").elems // self.b  # per slot: this core's k entries of y
        if self.kind == "add":  # x and x1: the operands' k entries a slot
            for name, operand in (("x", 0), ("x1", 1)):
                buf = bufs[name].reshape(self.b, k)
                buf[:] = 0
                buf[:, :c1 - c0] = self.input(cd, operand).need(c0, c1, where)
        else:  # silu_mul: gate | up of the fused up projection, blocked over its own output split
            # (not necessarily this kernel's): find this slice's entries of each
            v = self.input(cd)
            pos = self.plane.positions(self.inputs[0])
            if pos is None:
                raise DataLayoutError(f"{where}: silu_mul's input @{self.inputs[0]} is not a "
                                      "fused gate | up projection")
            x = bufs["x"].reshape(self.b, 2, k)  # per slot: k gate entries, then k up entries
            x[:] = 0
            x[:, 0, :c1 - c0] = v.need_at(pos[c0:c1], where)
            x[:, 1, :c1 - c0] = v.need_at(pos[n + c0:n + c1], where)
        self.run_body(cd, bodies, op)
        cd.values[self.name] = Vec.of(bufs["y"].reshape(self.b, k)[:, :c1 - c0].copy(), c0, n)

    def send(self, cd, role):
        if self.kind == "rmsnorm" and role in (FlowRole.DOWN, FlowRole.UP):
            bufs = cd.buffers[self.name]
            # down: the partial in y; up: the inverse RMS (y on the root, p where relayed)
            src = "p" if role is FlowRole.UP and cd.acc.pop((self.name, "relayed"), False) else "y"
            return bufs[src][:self.b].copy()
        return cd.values[self.name]

    def relayed(self, cd, value):
        cd.buffers[self.name]["p"][:] = value
        cd.acc[self.name, "relayed"] = True
