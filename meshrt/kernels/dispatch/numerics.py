"""What the dispatch kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import RoutesTokens, part


class Dispatch(RoutesTokens):
    """A corridor: the head gathers whole tokens; every core forwards them on and
    hands its flat slice to the expert regions."""

    def _tokens(self, cd):
        v = cd.values.get(self.name + ".tokens")
        if v is None:
            v = self.input(cd)
            cd.values[self.name + ".tokens"] = v
        return v

    def send(self, cd, role):
        v = self._tokens(cd)
        if role is FlowRole.HOP:
            return v
        _, i, j, w, h = self.grid_pos(cd)
        lo, hi = part(v.data.shape[1], w * h, j * w + i)
        v.need(lo, hi, self.where(cd))
        return v.restrict(lo, hi)

    def recv(self, cd, role, items):
        if role is FlowRole.HOP:
            cd.values[self.name + ".tokens"] = items[0]
        else:
            cd.inbox[self.name, role] = items
