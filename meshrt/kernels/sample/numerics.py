"""What the sample kernel's events do to data in the interpreter: its PE bodies
(`sample/pe.py`) on each core's buffers."""

from __future__ import annotations

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, KernelExec, part


class Sample(KernelExec):
    """Greedy argmax along the bottom row; its last core runs the serving logic."""

    OPS = frozenset({"argmax", "argmax_merge", "eos_check"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.bodies = self.tile_bodies()

    def compute(self, cd, op):
        _, i, _, w, _ = self.grid_pos(cd)
        bodies = self.bodies_at(cd.pos)
        bufs = self.pe_buffers(cd, bodies)
        if op == "argmax":  # the core's logits, n a slot, as they arrived in x
            c0, c1 = part(self.info.param("in_widths")[0], w, i)
            x = bufs["x"].reshape(self.b, -1)
            x[:] = 0
            x[:, :c1 - c0] = self.input(cd).need(c0, c1, self.where(cd)).astype(F32)
        elif op == "argmax_merge":  # a neighbour's candidates, from either side of the root
            (got,) = self.take(cd, FlowRole.DOWN)
            bufs["cand_in"][:] = got
        self.run_body(cd, bodies, op)
        if op == "eos_check":
            return self.plane.host.sampled(cd, [int(v) for v in bufs["tokens"]],
                                           [bool(v) for v in bufs["done"]])

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.buffers[self.name]["cand"].copy()
        return self.plane.host.next_tokens(cd)

    def metainfo(self, cd, role, meta):
        cb, route = super().metainfo(cd, role, meta)
        if self.plane.cb and not role.internal:
            cb = self.plane.host.table_of(cd)  # the table of the step these tokens start
        return cb, route
