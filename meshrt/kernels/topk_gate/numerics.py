"""What the topk_gate kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.numerics import F32, F64, DataLayoutError, RoutesTokens, Routing, part
from meshrt.runtime import reference as ref


class TopKGate(RoutesTokens):
    OPS = frozenset({"fmac", "add", "topk"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        moe = plane.moe(self.layer)
        self.experts = moe.router.shape[1]
        self.shared = moe.shared_gate.shape[0]
        # the shared experts' gates w_sg ride the router's product as further columns
        self.gated = moe.shared_scale is not None
        self.shared_ids = np.arange(self.experts, self.experts + self.shared)
        self.router = (np.concatenate([moe.router, moe.shared_scale], axis=1) if self.gated
                       else moe.router)
        self.bias = None if moe.router_bias is None else np.concatenate(
            [moe.router_bias, np.zeros(self.router.shape[1] - self.experts, moe.router_bias.dtype)])
        self.top_k = info.param("top_k")
        if self.tiles[0][2] != 1:
            raise DataLayoutError(f"kernel @{self.name}: a gate over {self.tiles[0][2]} columns "
                                  "needs a merge across columns the tables do not have")

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        if op == "fmac":
            n_in = self.router.shape[0]
            r0, r1 = part(n_in, h, j)
            x = self.input(cd).need(r0, r1, self.where(cd))
            cd.acc[self.name] = x.astype(F64) @ cd.tile(self.name, lambda: self.router[r0:r1])
            if self.bias is not None and r0 == 0:  # the core of the first input rows adds it, once
                cd.acc[self.name] = cd.acc[self.name] + self.bias
        elif op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = got + cd.acc[self.name]
        elif op == "topk":
            logits = cd.acc.pop(self.name).astype(F32)
            e = self.experts
            ids, wts = ref.route(logits[:, :e], self.top_k, self.plane.shape.norm_topk)
            self.plane.count_routing(self.layer, ids, cd)
            if self.shared:  # every token also visits each shared expert (ids e, e + 1, ...)
                n = len(ids)
                ids = np.concatenate([ids, np.broadcast_to(self.shared_ids, (n, self.shared))], axis=1)
                gates = ref.sigmoid(logits[:, e:]) if self.gated else np.ones((n, self.shared), F32)
                wts = np.concatenate([wts, gates], axis=1)
            cd.route = Routing(ids, wts)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name)
        if role is FlowRole.UP:
            return cd.route
        # the tokens it gated go on to dispatch (with the routing as metainfo)
        return self.input(cd)

    def payload_src(self, role: FlowRole) -> str:
        # what goes on to dispatch is the tokens it gated, i.e. its input's value
        return self.inputs[0] if not role.internal else self.name

    def relayed(self, cd, value):
        cd.route = value
