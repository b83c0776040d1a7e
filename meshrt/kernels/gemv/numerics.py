"""What the gemv kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.kernels.numerics import F64, KernelExec, part


class Gemv(KernelExec):
    OPS = frozenset({"fmac"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.weight = plane.matrix(self.name, self.layer, grid=self.tiles[0])
        self.bias = plane.bias(self.name, self.layer, grid=self.tiles[0])
        self.transposed = info.param("axis", "col") == "row"

    def compute(self, cd, op):
        if op != "fmac":
            return
        _, i, j, w, h = self.grid_pos(cd)
        n_in, n_out = self.weight.shape
        if self.transposed:  # input over the columns, output over the rows
            r0, r1 = part(n_in, w, i)
            c0, c1 = self.plane.columns(self.name, n_out, h, j)
        else:
            r0, r1 = part(n_in, h, j)
            c0, c1 = self.plane.columns(self.name, n_out, w, i)
        x = self.input(cd).need(r0, r1, self.where(cd))
        partial = np.zeros((self.b, n_out), F64)
        partial[:, c0:c1] = x.astype(F64) @ cd.tile(self.name, lambda: self.weight[r0:r1, c0:c1])
        if self.bias is not None and r0 == 0:  # the core of the first input rows adds it, once
            partial[:, c0:c1] += self.bias[c0:c1]
        cd.values[self.name] = ("partial", c0, c1, partial)
