"""What the handoff kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.kernels.numerics import KernelExec, part


class Handoff(KernelExec):
    def send(self, cd, role):
        _, i, j, w, h = self.grid_pos(cd)
        v = self.input(cd)
        lo, hi = part(v.data.shape[1], w * h, j * w + i)
        v.need(lo, hi, self.where(cd))
        return v.restrict(lo, hi)
