"""What the embed kernel's events do to data in the interpreter: its PE body
(`embed/pe.py`) where it has one, else the table's rows in float64."""

from __future__ import annotations

import numpy as np

from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, part


class Embed(KernelExec):
    OPS = frozenset({"embed"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.bodies = self.tile_bodies()

    def _ranges(self, pos) -> tuple[int, int, int, int]:
        """(r0, r1, c0, c1): the table's rows and the slice of each the core holds."""
        _, i, j, w, h = self.grid_at(pos)
        vocab, hidden = self.plane.weights.embed.shape
        return (*part(vocab, w, i), *part(hidden, h, j))

    def resident(self, pos):
        bodies = self.bodies_at(pos)
        if bodies is None:
            return None
        r0, r1, c0, c1 = self._ranges(pos)
        k = bodies.buffer("y").elems // self.b
        table = np.zeros((bodies.buffer("table").elems // k, k), F32)
        table[:r1 - r0, :c1 - c0] = self.plane.weights.embed[r0:r1, c0:c1]
        return [table.ravel()]

    def compute(self, cd, op):
        if op != "embed":
            return
        tokens = cd.values.get("tokens")
        if tokens is None:
            raise DataLayoutError(f"{self.where(cd)}: no tokens received")
        hidden = self.plane.weights.embed.shape[1]
        r0, r1, c0, c1 = self._ranges(cd.pos)
        bodies = self.bodies_at(cd.pos)
        # a partial of the row's sum: this core's slice of the rows it holds, zeros elsewhere
        partial = np.zeros((self.b, hidden), F64)
        if bodies is None:
            emb = self.plane.weights.embed
            for s, t in enumerate(tokens):
                if r0 <= t < r1:
                    partial[s, c0:c1] = emb[t, c0:c1]
        else:
            bufs = self.pe_buffers(cd, bodies)
            bufs["tokens"][:] = tokens
            self.run_body(cd, bodies, "embed")
            partial[:, c0:c1] = bufs["y"].reshape(self.b, -1)[:, :c1 - c0]
        cd.values[self.name] = ("partial", c0, c1, partial)
