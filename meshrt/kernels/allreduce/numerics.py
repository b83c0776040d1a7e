"""What the allreduce kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, KernelExec, Vec


class AllReduce(KernelExec):
    """Sums the gemv partials down each column; the root rounds, relays back."""

    OPS = frozenset({"add"})

    def _own(self, cd):
        tag, c0, c1, partial = cd.values[self.inputs[0]]
        return c0, c1, partial

    def compute(self, cd, op):
        if op == "add":
            c0, c1, partial = self._own(cd)
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = got + partial
            if not self._has_down_send(cd):
                self._finish(cd)

    def _has_down_send(self, cd) -> bool:
        """Whether the core forwards its partial (every core of the chain but its root)."""
        _, i, j, w, h = self.grid_pos(cd)
        return i < w - 1 if self.info.param("axis") == "row" else j < h - 1

    def _finish(self, cd):
        c0, c1, _ = self._own(cd)
        total = cd.acc.pop(self.name)
        n = total.shape[1]
        cd.values[self.name] = Vec.of(total[:, c0:c1].astype(F32), c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            if self.name in cd.acc:
                return cd.acc.pop(self.name)
            return self._own(cd)[2]
        if role is FlowRole.UP:
            return cd.values[self.name]
        return self._output(cd)

    def local_value(self, cd):
        # a one-row region has no chain and so no event: a consumer on the same core
        # reads the partial as it is
        if self.inputs[0] in cd.values and self.grid_pos(cd)[4] == 1:
            return self._output(cd)
        return None

    def _output(self, cd):
        if self.name not in cd.values:  # a one-row region: nothing to reduce
            c0, c1, partial = self._own(cd)
            cd.values[self.name] = Vec.of(partial[:, c0:c1].astype(F32), c0, partial.shape[1])
        return cd.values[self.name]
