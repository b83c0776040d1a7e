"""What the embed kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.kernels.numerics import F64, DataLayoutError, KernelExec, part


class Embed(KernelExec):
    OPS = frozenset({"embed"})

    def compute(self, cd, op):
        if op != "embed":
            return
        tokens = cd.values.get("tokens")
        if tokens is None:
            raise DataLayoutError(f"{self.where(cd)}: no tokens received")
        _, i, j, w, h = self.grid_pos(cd)
        emb = self.plane.weights.embed
        vocab, hidden = emb.shape
        r0, r1 = part(vocab, w, i)  # the table's rows this column holds
        c0, c1 = part(hidden, h, j)  # the slice of each this row holds
        # a partial of the row's sum: this core's slice of the rows it holds, zeros elsewhere
        partial = np.zeros((self.b, hidden), F64)
        for s, t in enumerate(tokens):
            if r0 <= t < r1:
                partial[s, c0:c1] = emb[t, c0:c1]
        cd.values[self.name] = ("partial", c0, c1, partial)
