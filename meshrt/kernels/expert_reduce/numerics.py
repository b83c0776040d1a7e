"""What the expert_reduce kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import DataLayoutError, KernelExec


class ExpertReduce(KernelExec):
    """Adds the expert output partials passing along a row to the core's own.

    A partial is expert_ffn's {expert: (slots, first row, float64 rows)} for
    the rows this core's region row holds; the sum stays float64 until
    combine rounds each expert's output once, as the reference does.
    """

    OPS = frozenset({"add"})

    def _own(self, cd):
        own = cd.values.get(self.inputs[0])
        if own is None:
            raise DataLayoutError(f"{self.where(cd)}: holds no expert output partial")
        return own

    def compute(self, cd, op):
        if op != "add":
            return
        (got,) = self.take(cd, FlowRole.DOWN)
        held = cd.acc.get(self.name) or self._own(cd)
        cd.acc[self.name] = {e: (rows, r0, y + got[e][2]) for e, (rows, r0, y) in held.items()}

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name, None) or self._own(cd)
        v = cd.values.get(self.name)
        if v is None:  # the root: what it added (a one-column region: its own partial)
            v = cd.values[self.name] = cd.acc.pop(self.name, None) or self._own(cd)
        return v
