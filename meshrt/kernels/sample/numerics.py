"""What the sample kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import KernelExec, part


class Sample(KernelExec):
    """Greedy argmax along the bottom row; its last core runs the serving logic."""

    OPS = frozenset({"argmax", "argmax_merge", "eos_check"})

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        if op == "argmax":
            c0, c1 = part(self.info.param("in_widths")[0], w, i)
            logits = self.input(cd).need(c0, c1, self.where(cd))
            idx = np.argmax(logits, axis=1)
            cd.acc[self.name] = (logits[np.arange(self.b), idx], idx + c0)
        elif op == "argmax_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            gv, gi = got  # from either side of the root
            mv, mi = cd.acc[self.name]
            better = (mv > gv) | ((mv == gv) & (mi < gi))  # ties: the lower token id, as np.argmax
            cd.acc[self.name] = (np.where(better, mv, gv), np.where(better, mi, gi))
        elif op == "eos_check":
            _, idx = cd.acc.pop(self.name)
            return self.plane.host.sampled(cd, [int(t) for t in idx])

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc[self.name]
        return self.plane.host.next_tokens(cd)

    def metainfo(self, cd, role, meta):
        cb, route = super().metainfo(cd, role, meta)
        if self.plane.cb and not role.internal:
            cb = self.plane.host.table_of(cd)  # the table of the step these tokens start
        return cb, route
