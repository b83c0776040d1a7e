"""What the allreduce kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, KernelExec, Vec


class AllReduce(KernelExec):
    """Sums the gemv partials along each column toward its root; the root rounds and
    multicasts the result. Every add adds what arrived to what the core holds (its own
    partial, or what it already added), so the tree's shape is the table's alone."""

    OPS = frozenset({"add"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.along_row = info.param("axis") == "row"

    def _own(self, cd):
        tag, c0, c1, partial = cd.values[self.inputs[0]]
        return c0, c1, partial

    def compute(self, cd, op):
        if op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            held = cd.acc.get(self.name)
            cd.acc[self.name] = got + (held if held is not None else self._own(cd)[2])

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            if self.name in cd.acc:
                return cd.acc.pop(self.name)
            return self._own(cd)[2]
        return self._output(cd)  # the result: multicast back, or on to the consumers

    def local_value(self, cd):
        # a line of one core (one row for a column reduction, one column for a row
        # reduction) has no chain and so no event: a consumer on the same core reads
        # the partial as it is
        if self.inputs[0] not in cd.values:
            return None
        _, _, _, w, h = self.grid_pos(cd)
        return self._output(cd) if (w if self.along_row else h) == 1 else None

    def _output(self, cd):
        """The rounded sum, on the core that holds it: the root rounds what it added
        (a one-row region rounds its own partial); the others received it."""
        if self.name not in cd.values:
            c0, c1, partial = self._own(cd)
            total = cd.acc.pop(self.name, partial)
            cd.values[self.name] = Vec.of(total[:, c0:c1].astype(F32), c0, total.shape[1])
        return cd.values[self.name]
