"""What the topk_gate kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, F64, DataLayoutError, RoutesTokens, Routing, part


class TopKGate(RoutesTokens):
    OPS = frozenset({"fmac", "add", "topk"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        moe = plane.moe(self.layer)
        self.experts = moe.router.shape[1]
        # the shared experts' gates w_sg ride the router's product as further columns
        self.gated = moe.shared_scale is not None
        self.router = (np.concatenate([moe.router, moe.shared_scale], axis=1) if self.gated
                       else moe.router)
        self.bias = None if moe.router_bias is None else np.concatenate(
            [moe.router_bias, np.zeros(self.router.shape[1] - self.experts, moe.router_bias.dtype)])
        self.top_k = info.param("top_k")
        self.bodies = self.tile_bodies()
        # the router's product and the chain's adds are bodies too (float32 programs)
        self.product_in_pe = all("fmac" in b.funcs for b in self.bodies.values())
        if self.tiles[0][2] != 1:
            raise DataLayoutError(f"kernel @{self.name}: a gate over {self.tiles[0][2]} columns "
                                  "needs a merge across columns the tables do not have")

    def resident(self, pos):
        """The router's rows this core holds, and the bias on the first rows' core."""
        if not self.product_in_pe:
            return None
        bodies = self.bodies_at(pos)
        _, _, j, _, h = self.grid_at(pos)
        r0, r1 = part(self.router.shape[0], h, j)
        rows, cols = bodies.buffer("x").elems // self.b, bodies.buffer("y").elems // self.b
        tile = np.zeros((rows, cols), F32)
        tile[:r1 - r0] = self.router[r0:r1]
        out = [tile.ravel()]
        if self.bias is not None:
            out.append(self.bias.astype(F32) if r0 == 0 else np.zeros(cols, F32))
        return out

    def compute(self, cd, op):
        _, _, j, _, h = self.grid_pos(cd)
        bodies = self.bodies_at(cd.pos)
        bufs = self.pe_buffers(cd, bodies)
        if op == "fmac":
            n_in = self.router.shape[0]
            r0, r1 = part(n_in, h, j)
            x = self.input(cd).need(r0, r1, self.where(cd))
            if self.product_in_pe:  # the router's product in float32, as the CSL computes it
                xb = bufs["x"].reshape(self.b, -1)
                xb[:] = 0
                xb[:, :r1 - r0] = x
                self.run_body(cd, bodies, "fmac")
                return
            logits = x.astype(F64) @ cd.tile(self.name, lambda: self.router[r0:r1])
            if self.bias is not None and r0 == 0:  # the core of the first input rows adds it, once
                logits = logits + self.bias
            cd.acc[self.name] = logits
        elif op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            if self.product_in_pe:
                bufs["p"][:] = np.asarray(got, F32).ravel()
                self.run_body(cd, bodies, "add")
            else:
                cd.acc[self.name] = got + cd.acc[self.name]
        elif op == "topk":
            if not self.product_in_pe:  # the logits as this core summed them
                bufs["y"][:] = cd.acc.pop(self.name).astype(F32).ravel()
            self.run_body(cd, bodies, "topk")
            # per token its routed choices, then each shared expert (ids e, e + 1, ...)
            ids = bufs["rt_expert"].reshape(self.b, -1).astype(np.int64)
            wts = bufs["rt_weight"].reshape(self.b, -1).copy()
            self.plane.count_routing(self.layer, ids[:, :self.top_k], cd)
            cd.route = Routing(ids, wts)

    def send(self, cd, role):
        if role is FlowRole.DOWN:  # this core's partial logits, summed with what it received
            if self.product_in_pe:
                return cd.buffers[self.name]["y"].reshape(self.b, -1).copy()
            return cd.acc.pop(self.name)
        if role is FlowRole.UP:
            return cd.route
        # the tokens it gated go on to dispatch (with the routing as metainfo)
        return self.input(cd)


    def relayed(self, cd, value):
        cd.route = value
