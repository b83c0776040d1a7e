"""What the combine kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, Vec, part


class Combine(KernelExec):
    """Each corridor core sums its flat slice of the weighted expert outputs."""

    OPS = frozenset({"combine"})
    RAW_INPUTS = True  # the experts' outputs: {expert: (slots, first row, float64 rows)}

    def compute(self, cd, op):
        if op != "combine":
            return
        _, i, j, w, h = self.grid_pos(cd)
        items = cd.inbox.pop((self.name, FlowRole.INPUT), [])
        hidden = self.plane.shape.hidden
        lo, hi = part(hidden, w * h, j * w + i)
        # per expert and slot: its output on this slice (the root columns send whole
        # expert outputs of their rows; a slice may span two region rows)
        per_expert: dict[int, dict[int, np.ndarray]] = {}
        for parts in items:
            for e, (rows, r0, y) in parts.items():
                a, z = max(lo, r0), min(hi, r0 + y.shape[1])
                if a >= z:
                    continue
                d = per_expert.setdefault(e, {})
                for r, row in zip(rows, y):
                    acc = d.get(r)
                    if acc is None:
                        acc = d[r] = np.zeros(hi - lo, F64)
                    acc[a - lo:z - lo] += row[a - r0:z - r0]
        route = cd.route
        out = np.zeros((self.b, hi - lo), F64)
        # a core past the vector's end (more corridor rows than ceil-split slices) holds none
        for s in range(self.b if hi > lo else 0):
            ids = route.ids[s]
            for e in sorted(int(x) for x in ids):
                k = int(np.nonzero(ids == e)[0][0])
                y = per_expert.get(e, {}).get(s)
                if y is None:
                    raise DataLayoutError(f"{self.where(cd)}: no output of expert {e} for slot {s}")
                out[s] += F64(route.weights[s, k]) * y.astype(F32).astype(F64)
        cd.values[self.name] = Vec.of(out.astype(F32), lo, hidden)
