"""What the dispatch kernel's events do to data in the interpreter."""

from __future__ import annotations

from meshrt.kernels.numerics import RoutesTokens, part


class Dispatch(RoutesTokens):
    """Each corridor core hands its flat slice of the tokens to the expert regions."""

    def send(self, cd, role):
        v = self.input(cd)
        _, i, j, w, h = self.grid_pos(cd)
        lo, hi = part(v.data.shape[1], w * h, j * w + i)
        v.need(lo, hi, self.where(cd))
        return v.restrict(lo, hi)
