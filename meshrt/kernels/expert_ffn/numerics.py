"""What the expert_ffn kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt import quant
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.expert_reduce.op import expert_passes, group_experts, region_experts
from meshrt.kernels.numerics import F32, F64, DataLayoutError, RoutesTokens, part
from meshrt.runtime import reference as ref


class ExpertFFN(RoutesTokens):
    """See ExpertFFNOp.roles (meshrt.kernels.expert_ffn.op) for the layout."""

    OPS = frozenset({"fmac", "add", "silu_mul", "fmac_down", "dequant_fp8", "dequant_mxfp4"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.moe = plane.moe(self.layer)
        # held packed: each core keeps its tiles' codes and scales and decodes the tiles
        # of the experts with tokens, before the fmac that reads them (decoded at load:
        # the floats, which are the values the format holds)
        self.fmt = info.packed_weights
        self.placement = info.param("placement")
        # shared experts (ids experts, experts + 1, ...) hold the last regions, one each
        self.experts = len(self.placement)
        self.shared = self.moe.shared_gate.shape[0]
        m = self.moe
        # by expert id, routed then shared: (gate, up, down) floats and biases (a shared
        # expert has none), and the packed (gate, up, down) where the tiles are held packed
        self.mats = [(m.w_gate[e], m.w_up[e], m.w_down[e]) for e in range(self.experts)] + [
            (m.shared_gate[s], m.shared_up[s], m.shared_down[s]) for s in range(self.shared)]
        self.biases = [None if m.b_gate is None else (m.b_gate[e], m.b_up[e], m.b_down[e])
                       for e in range(self.experts)] + [None] * self.shared
        self.packed = None
        if self.fmt is not None:
            stacks = [plane.packed_experts(self.layer, self.fmt)]
            if self.shared:
                stacks.append(plane.packed_experts(self.layer, self.fmt, shared=True))
            self.packed = [(g[k], u[k], d[k]) for g, u, d in stacks for k in range(g.codes.shape[0])]
        self.f = info.param("expert_ffn")
        self.dynamic = plane.moe_routing
        self._members: dict[tuple[tuple[int, ...], int], list[int]] = {}
        # passes per region: those of its shape's roles (the shared experts' regions may
        # have a shape of their own)
        held = group_experts(self.tiles, region_experts(len(self.tiles), self.placement,
                                                       self.shared))
        self.passes = [expert_passes(n, self.plane.shape.top_k, self.dynamic) for n in held]
        # float32 experts compute as the PE bodies (`expert_ffn/pe.py`); the others here
        self.bodies = self.tile_bodies()
        self.in_pe = all(b is not None for b in self.bodies.values())

    def _experts(self, cd, tile):
        """Expert ids region `tile` holds at the step."""
        return self._held(self.plane.placement(self.layer, cd.step, self.placement), tile)

    def _held(self, placement, tile):
        """Expert ids region `tile` holds under `placement`."""
        key = (placement, tile)
        members = self._members.get(key)
        if members is None:
            routed = len(self.tiles) - self.shared
            members = ([self.experts + tile - routed] if tile >= routed else
                       [e for e, r in enumerate(placement) if r == tile])
            self._members[key] = members
        return members

    def _tokens(self, cd, e):
        """Slots routed to expert e (every slot in the static build)."""
        if not self.dynamic:
            return list(range(self.b))
        route = cd.route
        if route is None:
            raise DataLayoutError(f"{self.where(cd)}: no routing metainfo received")
        by_expert = route.by_expert
        if by_expert is None:
            by_expert = {}
            for s, ids in enumerate(route.ids.tolist()):
                for x in ids:
                    by_expert.setdefault(x, []).append(s)
            object.__setattr__(route, "by_expert", by_expert)
        return by_expert.get(e, [])

    def _pass(self, cd, t: int) -> dict[int, list[int]]:
        """The pairs of the pass this core is in: {expert: its slots}, the `b` pairs after
        the earlier passes' in (expert, slot) order (none past the step's last pair)."""
        p = cd.acc.get((self.name, "pass"), 0)
        pairs = [(e, s) for e in self._experts(cd, t) for s in self._tokens(cd, e)]
        out: dict[int, list[int]] = {}
        for e, s in pairs[p * self.b:(p + 1) * self.b]:
            out.setdefault(e, []).append(s)
        return out

    def _tile(self, cd, e: int, which: str, r0: int, r1: int, f0: int, f1: int) -> np.ndarray:
        """Expert e's gate|up (rows r0:r1 of the input, FFN slice f0:f1) or down tile:
        the floats, or the tile the preceding dequant decoded."""
        if self.packed is not None:
            got = cd.acc.get((self.name, "w"), {}).get((e, which))
            if got is None:
                raise DataLayoutError(f"{self.where(cd)}: fmac before the {self.fmt} tiles of "
                                      f"expert {e} are decoded")
            return got
        g, u, d = self.mats[e]
        if which == "gate_up":
            return cd.tile((self.name, e, which), lambda: np.concatenate(
                [g[r0:r1, f0:f1], u[r0:r1, f0:f1]], axis=1))
        return cd.tile((self.name, e, which), lambda: d[f0:f1, r0:r1])

    def _decode(self, cd, op, t: int, which: str, r0: int, r1: int, f0: int, f1: int) -> None:
        """dequant_*: decode this core's packed tiles of the experts with tokens this step."""
        if self.packed is None or op != f"dequant_{self.fmt}":
            raise DataLayoutError(f"{self.where(cd)}: {op} on experts stored as "
                                  f"{self.fmt or 'floats'}")
        for e in self._pass(cd, t):
            g, u, d = self.packed[e]
            if which == "gate_up":
                tile = cd.packed_tile((self.name, e, which), lambda g=g, u=u: quant.Packed.concat(
                    [g.slice(r0, r1, f0, f1), u.slice(r0, r1, f0, f1)]))
            else:
                tile = cd.packed_tile((self.name, e, which), lambda d=d: d.slice(f0, f1, r0, r1))
            cd.acc.setdefault((self.name, "w"), {})[e, which] = tile.decode()

    def resident(self, pos, placement=None):
        """A core's tiles of the experts its region holds (under `placement`; default the
        compiled one), with their biases (gate|up on the first input rows' cores, down on
        the first FFN slice's) and the experts' ids, as the PE bodies hold them."""
        if not self.in_pe:
            return None
        bodies = self.bodies_at(pos)
        t, i, j, w, h = self.grid_at(pos)
        n = bodies.buffer("held").elems
        rows, cols = bodies.buffer("x").elems // self.b, bodies.buffer("a").elems // self.b
        r0, r1 = part(self.moe.w_gate.shape[1], h, j)
        f0, f1 = part(self.f, w, i)
        nr, nf = r1 - r0, f1 - f0
        wgu, wdn = np.zeros((n, rows, 2 * cols), F32), np.zeros((n, cols, rows), F32)
        bgu, bdn = np.zeros((n, 2 * cols), F32), np.zeros((n, rows), F32)
        held = np.full(n, -1.0, F32)
        for le, e in enumerate(self._held(placement or self.placement, t)):
            g, u, d = self.mats[e]
            wgu[le, :nr, :nf], wgu[le, :nr, cols:cols + nf] = g[r0:r1, f0:f1], u[r0:r1, f0:f1]
            wdn[le, :nf, :nr] = d[f0:f1, r0:r1]
            bias = self.biases[e]
            if bias is not None and r0 == 0:
                bgu[le, :nf], bgu[le, cols:cols + nf] = bias[0][f0:f1], bias[1][f0:f1]
            if bias is not None and f0 == 0:
                bdn[le, :nr] = bias[2][r0:r1]
            held[le] = e
        out = {"wgu": wgu, "wdn": wdn, "bgu": bgu, "bdn": bdn, "held": held}
        return [out[b.name].ravel() for b in bodies.resident]

    def _compute_pe(self, cd, op):
        """The op as the PE bodies compute it, on this core's buffers."""
        t, i, j, w, h = self.grid_pos(cd)
        rows = part(self.moe.w_gate.shape[1], h, j)  # this core's rows of the input and output
        bodies = self.bodies_at(cd.pos)
        bufs = self.pe_buffers(cd, bodies)
        if op == "fmac":
            # weights moved in by a re-placement: the core holds the new experts' tiles
            placement = self.plane.placement(self.layer, cd.step, self.placement)
            if cd.acc.get((self.name, "placed"), self.placement) != placement:
                for b, data in zip(bodies.resident, self.resident(cd.pos, placement)):
                    bufs[b.name][:] = data
                cd.acc[self.name, "placed"] = placement
            xb = bufs["x"].reshape(self.b, -1)
            xb[:] = 0
            xb[:, :rows[1] - rows[0]] = self.input(cd).need(*rows, self.where(cd))
            if "rt_expert" in bufs:
                if cd.route is None:
                    raise DataLayoutError(f"{self.where(cd)}: no routing metainfo received")
                bufs["rt_expert"][:] = cd.route.ids.ravel()  # every choice, shared ones too
            self.run_body(cd, bodies, op)
            # the first step after a re-placement waits for the weights that move in
            return self.plane.move_cycles(self.layer, cd.step, t)
        if op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            bufs["p"][:] = got
        self.run_body(cd, bodies, op)
        if op == "fmac_down" and bufs["pass"][0] == 0:  # the step's last pass: its partials
            self._outputs(cd, bufs, rows)
        return None

    def _outputs(self, cd, bufs, rows: tuple[int, int]) -> None:
        """The step's output partials as expert_reduce takes them: {expert: (slots, first
        row, rows)} from the pair table and y."""
        r0, r1 = rows
        y = bufs["y"].reshape(len(bufs["pair_e"]), -1)[:, :r1 - r0]
        out: dict[int, tuple[list[int], int, list]] = {}
        for q, le in enumerate(bufs["pair_e"].tolist()):
            if le >= 0:
                slots, _, ys = out.setdefault(int(bufs["held"][le]), ([], r0, []))
                slots.append(int(bufs["pair_s"][q]))
                ys.append(y[q])
        cd.values[self.name] = {e: (slots, r0, np.array(ys, F64)) for e, (slots, r0, ys) in out.items()}

    def compute(self, cd, op):
        if self.in_pe:
            return self._compute_pe(cd, op)
        t, i, j, w, h = self.grid_pos(cd)
        where = self.where(cd)
        hidden = self.moe.w_gate.shape[1]
        f0, f1 = part(self.f, w, i)
        if op.startswith("dequant_"):  # before phase 1's fmac (gate|up) or phase 2's (down)
            r0, r1 = part(hidden, h, j)
            self._decode(cd, op, t, "down" if self.name + ".a" in cd.acc else "gate_up",
                         r0, r1, f0, f1)
            return None
        if op == "fmac":  # phase 1: x . W_gate|up
            r0, r1 = part(hidden, h, j)
            x = self.input(cd).need(r0, r1, where).astype(F64)
            parts = {}
            # only the pass's pairs: a region's experts without tokens compute and send nothing
            for e, rows in self._pass(cd, t).items():
                y = x[rows] @ self._tile(cd, e, "gate_up", r0, r1, f0, f1)
                bias = self.biases[e]
                if bias is not None and r0 == 0:  # the first input rows add the biases
                    y += np.concatenate([bias[0][f0:f1], bias[1][f0:f1]])
                parts[e] = (rows, y)
            cd.acc[self.name] = parts
            cd.acc[self.name + ".a"] = None
            # the first step after a re-placement waits for the weights that move in
            return self.plane.move_cycles(self.layer, cd.step, t)
        elif op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            own = cd.acc[self.name]
            cd.acc[self.name] = {e: (own[e][0], own[e][1] + got[e][1]) for e in own}
        elif op == "silu_mul":
            parts = cd.acc.pop(self.name)
            n = f1 - f0
            cd.acc[self.name + ".a"] = {
                e: (rows, ref.glu(g[:, :n].astype(F32), g[:, n:].astype(F32), self.plane.act))
                for e, (rows, g) in parts.items()}
        elif op == "fmac_down":  # phase 2: a[f_i] . W_down[f_i, rows j], this core's partial
            a = cd.acc.pop(self.name + ".a")
            r0, r1 = part(hidden, h, j)
            key = (self.name, "pass")
            p = cd.acc.get(key, 0)
            if p == 0:  # the step's partials, pass by pass (an expert's slots may span two)
                cd.values[self.name] = {}
            out = cd.values[self.name]
            for e, (rows, act) in a.items():
                bias = self.biases[e] if f0 == 0 else None  # the first FFN slice adds it
                y = act.astype(F64) @ self._tile(cd, e, "down", r0, r1, f0, f1) + (
                    0.0 if bias is None else bias[2][r0:r1])
                if e in out:
                    rows, y = out[e][0] + rows, np.concatenate([out[e][2], y])
                out[e] = (rows, r0, y)
            cd.acc[key] = (p + 1) % self.passes[t]
            cd.acc.pop((self.name, "w"), None)  # this pass's decoded tiles

    def send(self, cd, role):
        if self.in_pe and role in (FlowRole.UP, FlowRole.DOWN):
            return cd.buffers[self.name]["a" if role is FlowRole.UP else "gu"].copy()
        if role is FlowRole.UP:
            return cd.acc[self.name + ".a"]
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name)
        return cd.values[self.name]  # this core's output partial

    def relayed(self, cd, value):
        if self.in_pe:
            cd.buffers[self.name]["a"][:] = value
        else:
            cd.acc[self.name + ".a"] = value
