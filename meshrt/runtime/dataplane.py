"""Numerics in the messages: what every core computes on what it receives.

The mesh simulator (`meshrt.runtime.mesh_sim`) decides *when* each core runs
each event of its class's table; this module decides *what* the event does
to data. Every core holds its own tiles of the weights (slices of a
`reference.Weights`), its KV rows, and the parts of the kernels' values it
computed or received; a send packs a NumPy payload from that state into the
message and a receive unpacks the payloads of the messages it gathered. No
core ever reads another core's state: everything it knows arrived in a
message, or was installed by the host before the run (weights) or between
steps (the request queue the sampler reads).

What a kernel computes is read from the lowest IR itself: the
`event.kernel` records (kind, region, inputs, shapes) beside the tables.
Layouts follow `meshrt.kernel_roles` (rows / cols / full / flat / sparse /
partial). A value is a `Vec`: the full-width array of a micro-batch with a
mask of the entries this core holds, so gathers from several senders merge
by mask, and a compute that needs an entry the core does not hold raises a
`DataLayoutError` naming the kernel, the core and the missing range: a wrong
table, flow or layout fails loudly instead of producing numbers.

Numerics mirror `meshrt.runtime.reference`: float32 at kernel boundaries,
float64 partial sums rounded once, so the tokens match the reference.
Continuous batching metainfo (`SlotTable`) and MoE routing (`Routing`) ride
the payloads of the sends that the tables give metainfo bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from meshrt.dialects import event as ev
from meshrt.dialects.event import FlowRole
from meshrt.runtime import reference as ref

F32, F64 = np.float32, np.float64


class DataLayoutError(Exception):
    """A core needs data it does not hold (a schedule or layout bug)."""


def part(n: int, parts: int, i: int) -> tuple[int, int]:
    """Range of part i when n elements are split into `parts` (ceil split)."""
    c = -(-n // max(parts, 1))
    return min(n, i * c), min(n, (i + 1) * c)


# --------------------------------------------------------------------------
# values and metainfo
# --------------------------------------------------------------------------


@dataclass
class Vec:
    """Part of a micro-batch of vectors: data (b, n) and which entries are held."""

    data: np.ndarray
    mask: np.ndarray

    @classmethod
    def empty(cls, b: int, n: int) -> Vec:
        return cls(np.zeros((b, n), F32), np.zeros((b, n), bool))

    @classmethod
    def of(cls, data: np.ndarray, lo: int = 0, n: int | None = None) -> Vec:
        """`data` (b, k) held at columns lo..lo+k of a width-n vector."""
        n = n if n is not None else data.shape[1]
        v = cls.empty(data.shape[0], n)
        v.data[:, lo:lo + data.shape[1]] = data
        v.mask[:, lo:lo + data.shape[1]] = True
        return v

    def put(self, slot: int, lo: int, values: np.ndarray) -> None:
        self.data[slot, lo:lo + len(values)] = values
        self.mask[slot, lo:lo + len(values)] = True

    def restrict(self, lo: int, hi: int) -> Vec:
        m = np.zeros_like(self.mask)
        m[:, lo:hi] = self.mask[:, lo:hi]
        return Vec(self.data, m)

    def merge(self, other: Vec, where) -> None:
        """Take `other`'s entries in place (replicas of an entry must agree)."""
        m = other.mask
        both = self.mask & m
        if both.any() and not np.array_equal(self.data[both], other.data[both]):
            raise DataLayoutError(f"{where}: two senders disagree on the same entries")
        self.data[m] = other.data[m]
        self.mask |= m

    def need(self, lo: int, hi: int, where: str) -> np.ndarray:
        if not self.mask[:, lo:hi].all():
            missing = np.nonzero(~self.mask[:, lo:hi].all(axis=0))[0]
            raise DataLayoutError(f"{where}: entries {lo + missing[0]}..{lo + missing[-1]} "
                                  f"of the value are not held here")
        return self.data[:, lo:hi]


@dataclass(frozen=True)
class Slot:
    """One micro-batch slot in the continuous-batching payload."""

    rid: int  # request id, -1 when the slot is idle
    pos: int  # position of the token fed this step
    kv: int  # KV slot the request's cache lives in


@dataclass(frozen=True)
class SlotTable:
    seq: int  # the micro-batch step it describes (every core counts the same steps)
    slots: tuple[Slot, ...]


@dataclass(frozen=True)
class Routing:
    ids: np.ndarray  # (b, k) expert ids
    weights: np.ndarray  # (b, k) float32
    by_expert: dict[int, list[int]] | None = field(default=None, compare=False)  # cache: slots per expert


@dataclass
class Payload:
    src: str  # kernel whose value (or partial) this is
    value: object = None
    cb: SlotTable | None = None
    route: Routing | None = None


# --------------------------------------------------------------------------
# per-core state
# --------------------------------------------------------------------------


@dataclass
class CoreData:
    pos: tuple[int, int, int]  # (wafer, x, y)
    values: dict[str, object] = field(default_factory=dict)
    recvd: dict[tuple[str, str], Vec] = field(default_factory=dict)
    acc: dict[str, object] = field(default_factory=dict)  # chain partials per kernel
    inbox: dict[tuple[str, FlowRole], list] = field(default_factory=dict)  # (kernel, role) -> payloads
    kv: dict[str, np.ndarray] = field(default_factory=dict)
    cb: SlotTable | None = None
    route: Routing | None = None
    kernel: KernelExec | None = None
    step: int = 0
    tiles: dict = field(default_factory=dict)  # resident weight tiles (float64 for accumulation)

    def tile(self, key, make) -> np.ndarray:
        """This core's resident tile `key`, loaded once (as the host does before the run)."""
        t = self.tiles.get(key)
        if t is None:
            t = self.tiles[key] = np.asarray(make(), F64)
        return t


class _Where:
    """Names kernel and core in an error; formatted only when one is raised."""

    __slots__ = ("kernel", "pos")

    def __init__(self, kernel: str, pos: tuple[int, int, int]):
        self.kernel, self.pos = kernel, pos

    def __str__(self) -> str:
        return f"kernel @{self.kernel} on core ({self.pos[1]}, {self.pos[2]})"


class KernelExec:
    """What the events of one kernel do on one core (subclasses per kind)."""

    # compute ops with numeric effect (the simulator skips the hook for others)
    OPS: frozenset[str] = frozenset()
    # inputs arrive as the producer's own structure (not a Vec) and go to recv()
    RAW_INPUTS = False

    def __init__(self, info: ev.KernelInfoOp, plane: DataPlane):
        self.info = info
        self.name = info.kernel_name
        self.plane = plane
        self.b = plane.b
        self.tiles = [r.tuple[:4] for r in info.region.rects.data]
        self.inputs = info.input_names
        self.layer = info.param("layer", -1)
        self._grid: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {}

    def grid_pos(self, cd: CoreData) -> tuple[int, int, int, int, int]:
        """(tile index, i, j, w, h) of the core in the kernel's tiles."""
        gp = self._grid.get(cd.pos)
        if gp is None:
            _, x, y = cd.pos
            for t, (tx, ty, tw, th) in enumerate(self.tiles):
                if tx <= x < tx + tw and ty <= y < ty + th:
                    gp = self._grid[cd.pos] = (t, x - tx, y - ty, tw, th)
                    return gp
            raise DataLayoutError(f"kernel @{self.name}: core {cd.pos[1:]} is outside its region")
        return gp

    def where(self, cd: CoreData) -> _Where:
        return _Where(self.name, cd.pos)

    def input(self, cd: CoreData, k: int = 0) -> Vec:
        """Operand k as this core holds it: its own copy of the producer's value
        plus whatever arrived on the input flow."""
        prod = self.inputs[k]
        local = cd.values.get(prod)
        got = cd.recvd.get((self.name, prod))
        if local is None and got is None:
            raise DataLayoutError(f"{self.where(cd)}: holds no part of the value of @{prod}")
        if not isinstance(local, Vec):
            local = None
        if local is None:
            return got
        if got is None:
            return local
        v = Vec(local.data.copy(), local.mask.copy())
        v.merge(got, self.where(cd))
        return v

    # event hooks (defaults: nothing to do)
    def compute(self, cd: CoreData, op: str) -> None:
        pass

    # `role` is the FlowRole of the flow the event sends or receives on.
    def send(self, cd: CoreData, role: FlowRole) -> object:
        return cd.values.get(self.name)

    def recv(self, cd: CoreData, role: FlowRole, items: list) -> None:
        if role is FlowRole.UP:
            self.relayed(cd, items[0])
        else:
            cd.inbox[self.name, role] = items

    def relayed(self, cd: CoreData, value) -> None:
        """The result a reduction's root relays back up the chain."""
        cd.values[self.name] = value

    def payload_src(self, role: FlowRole) -> str:
        """The kernel whose value a send on a flow of `role` carries."""
        return self.name

    def metainfo(self, cd: CoreData, role: FlowRole, meta: int) -> tuple[SlotTable | None, Routing | None]:
        """(CF table, routing) riding a send: what the core holds, where the table
        gives the send metainfo bytes."""
        return (cd.cb, cd.route) if meta else (None, None)

    def take(self, cd: CoreData, role: FlowRole) -> list:
        items = cd.inbox.pop((self.name, role), None)
        if items is None:
            raise DataLayoutError(f"{self.where(cd)}: nothing received on its {role} flow")
        return items


# --------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------


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
        r0, r1 = part(vocab, h, j)
        c0, c1 = part(hidden, w, i)
        out = Vec.empty(self.b, hidden)
        for s, t in enumerate(tokens):
            if r0 <= t < r1:  # this core holds the row
                out.put(s, c0, emb[t, c0:c1])
        cd.values[self.name] = out


class Handoff(KernelExec):
    def send(self, cd, role):
        _, i, j, w, h = self.grid_pos(cd)
        v = self.input(cd)
        lo, hi = part(v.data.shape[1], w * h, j * w + i)
        v.need(lo, hi, self.where(cd))
        return v.restrict(lo, hi)


class Gemv(KernelExec):
    OPS = frozenset({"fmac"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.weight = plane.matrix(self.name, self.layer, grid=self.tiles[0])

    def compute(self, cd, op):
        if op != "fmac":
            return
        _, i, j, w, h = self.grid_pos(cd)
        n_in, n_out = self.weight.shape
        r0, r1 = part(n_in, h, j)
        c0, c1 = part(n_out, w, i)
        x = self.input(cd).need(r0, r1, self.where(cd))
        partial = np.zeros((self.b, n_out), F64)
        partial[:, c0:c1] = x.astype(F64) @ cd.tile(self.name, lambda: self.weight[r0:r1, c0:c1])
        cd.values[self.name] = ("partial", c0, c1, partial)


class AllReduce(KernelExec):
    """Sums the gemv partials down each column; the root rounds, relays back."""

    OPS = frozenset({"add"})

    def _own(self, cd):
        tag, c0, c1, partial = cd.values[self.inputs[0]]
        return c0, c1, partial

    def compute(self, cd, op):
        if op == "add":
            c0, c1, partial = self._own(cd)
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = got + partial
            if not self._has_down_send(cd):
                self._finish(cd)

    def _has_down_send(self, cd) -> bool:
        _, i, j, w, h = self.grid_pos(cd)
        return j < h - 1

    def _finish(self, cd):
        c0, c1, _ = self._own(cd)
        total = cd.acc.pop(self.name)
        n = total.shape[1]
        cd.values[self.name] = Vec.of(total[:, c0:c1].astype(F32), c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            if self.name in cd.acc:
                return cd.acc.pop(self.name)
            return self._own(cd)[2]
        if role is FlowRole.UP:
            return cd.values[self.name]
        return self._output(cd)

    def _output(self, cd):
        if self.name not in cd.values:  # a one-row region: nothing to reduce
            c0, c1, partial = self._own(cd)
            cd.values[self.name] = Vec.of(partial[:, c0:c1].astype(F32), c0, partial.shape[1])
        return cd.values[self.name]



class Elementwise(KernelExec):
    OPS = frozenset({"square_sum", "add", "rsqrt", "scale", "silu_mul"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.kind = info.param("kind")
        if self.kind == "rmsnorm":
            self.gain = plane.norm_gain(self.name, self.layer)

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        n = self.info.param("out_width")
        where = self.where(cd)
        if self.kind == "rmsnorm":
            r0, r1 = part(n, h, j)
            if op == "square_sum":
                x = self.input(cd).need(r0, r1, where).astype(F64)
                cd.acc[self.name] = np.sum(x * x, axis=1)
            elif op == "add":
                (got,) = self.take(cd, FlowRole.DOWN)
                cd.acc[self.name] = got + cd.acc[self.name]
            elif op == "rsqrt":
                cd.acc[self.name + ".inv"] = 1.0 / np.sqrt(cd.acc.pop(self.name) / n + ref.RMS_EPS)
            elif op == "scale":
                inv = cd.acc.pop(self.name + ".inv")
                x = self.input(cd).need(r0, r1, where).astype(F64)
                out = (x * inv[:, None] * self.gain[r0:r1].astype(F64)).astype(F32)
                cd.values[self.name] = Vec.of(out, r0, n)
            return
        if op != self.kind:
            return
        c0, c1 = part(n, w, i)
        if self.kind == "add":
            a = self.input(cd, 0).need(c0, c1, where)
            b = self.input(cd, 1).need(c0, c1, where)
            out = a + b
        elif self.kind == "silu_mul":
            # the fused up projection holds gate and up of each slice side by side
            v = self.input(cd)
            gate = v.need(2 * c0, 2 * c0 + (c1 - c0), where)
            up = v.need(2 * c0 + (c1 - c0), 2 * c1, where)
            out = ref._silu(gate) * up
        else:
            raise DataLayoutError(f"{where}: elementwise \"{self.kind}\" has no numerics here")
        cd.values[self.name] = Vec.of(out.astype(F32), c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc[self.name]
        if role is FlowRole.UP:
            return cd.acc[self.name + ".inv"]
        return cd.values[self.name]

    def relayed(self, cd, value):
        cd.acc[self.name + ".inv"] = value


class Attention(KernelExec):
    """Heads split over the columns, the sequence over the rows (flash-decoding merge)."""

    OPS = frozenset({"qk", "softmax_merge", "normalize"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        p = info.param
        self.heads, self.kvh, self.d = p("heads"), p("kv_heads"), p("head_dim")
        self.max_seq, self.slots = p("max_seq"), p("slots")
        _, _, w, _ = self.tiles[0]
        if self.kvh % w:
            raise DataLayoutError(
                f"kernel @{self.name}: {w} columns do not hold whole KV heads ({self.kvh}); "
                "head_dim split across columns has no numerics in the interpreter")

    def _cache(self, cd, rows):
        c = cd.kv.get(self.name)
        if c is None:
            _, _, _, w, _ = self.grid_pos(cd)
            c = np.zeros((2, self.slots, rows, self.kvh // w, self.d), F32)
            cd.kv[self.name] = c
        return c

    def compute(self, cd, op):
        where = self.where(cd)
        _, i, j, w, h = self.grid_pos(cd)
        if op == "qk":
            # the CF payload that rode in with the data, or (static build) the
            # table the host installed for this batch
            cb = cd.cb if self.plane.cb else self.plane.host.installed_table(cd.step)
            if cb is None or cb.seq != cd.step:
                got = "none" if cb is None else f"the one of step {cb.seq}"
                raise DataLayoutError(f"{where}: step {cd.step} needs its continuous-batching "
                                      f"table, holds {got}")
            x = self.input(cd)
            hd, kvd = self.heads * self.d, self.kvh * self.d
            x = x.need(0, hd + 2 * kvd, where)
            hq, hk = self.heads // w, self.kvh // w
            q = x[:, i * hq * self.d:(i + 1) * hq * self.d].reshape(self.b, hq, self.d)
            k = x[:, hd + i * hk * self.d:hd + (i + 1) * hk * self.d].reshape(self.b, hk, self.d)
            v = x[:, hd + kvd + i * hk * self.d:hd + kvd + (i + 1) * hk * self.d].reshape(self.b, hk, self.d)
            r0, r1 = part(self.max_seq, h, j)
            cache = self._cache(cd, r1 - r0)
            o = np.zeros((self.b, hq, self.d), F64)
            m = np.full((self.b, hq), -np.inf)
            s = np.zeros((self.b, hq), F64)
            g = self.heads // self.kvh
            for b, slot in enumerate(cb.slots):
                if slot.rid < 0:
                    continue
                p = slot.pos
                pos = np.asarray([p])
                qr = ref.apply_rope(q[b][None], pos)[0]
                kr = ref.apply_rope(k[b][None], pos)[0]
                if r0 <= p < r1:
                    cache[0, slot.kv, p - r0] = kr
                    cache[1, slot.kv, p - r0] = v[b]
                n = min(p + 1, r1) - r0  # keys of this request in this core's rows
                if n <= 0:
                    continue
                keys, vals = cache[0, slot.kv, :n], cache[1, slot.kv, :n]
                for hh in range(hq):
                    kv_i = hh // g
                    sc = (keys[:, kv_i].astype(F64) @ qr[hh].astype(F64) / math.sqrt(self.d)).astype(F32)
                    mx = float(np.max(sc))
                    e = np.exp(sc.astype(F64) - mx)
                    m[b, hh], s[b, hh] = mx, e.sum()
                    o[b, hh] = e @ vals[:, kv_i].astype(F64)
            cd.acc[self.name] = (o, m, s)
        elif op == "softmax_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = _merge_softmax(got, cd.acc[self.name])
        elif op == "normalize":
            o, m, s = cd.acc.pop(self.name)
            hq = self.heads // w
            out = np.zeros((self.b, hq, self.d), F32)
            live = s > 0
            out[live] = (o[live] / s[live][:, None]).astype(F32)
            n = self.heads * self.d
            c0 = i * hq * self.d
            cd.values[self.name] = Vec.of(out.reshape(self.b, hq * self.d), c0, n)

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc.pop(self.name)
        return cd.values[self.name]



def _merge_softmax(a, b):
    """Combine two (out, max, sum) partials of the same heads (-inf max: no keys)."""
    oa, ma, sa = a
    ob, mb, sb = b
    m = np.maximum(ma, mb)
    safe = np.where(np.isfinite(m), m, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        fa = np.where(np.isfinite(ma), np.exp(ma - safe), 0.0)
        fb = np.where(np.isfinite(mb), np.exp(mb - safe), 0.0)
    return oa * fa[..., None] + ob * fb[..., None], m, sa * fa + sb * fb


class _RoutesTokens(KernelExec):
    """Gate, dispatch and experts: without routing metainfo (the static build)
    the gate's weights still travel with the tokens, as data."""

    def metainfo(self, cd, role, meta):
        cb, route = super().metainfo(cd, role, meta)
        return cb, route if self.plane.moe_routing else cd.route


class TopKGate(_RoutesTokens):
    OPS = frozenset({"fmac", "add", "topk"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.router = plane.moe(self.layer).router
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
        elif op == "add":
            (got,) = self.take(cd, FlowRole.DOWN)
            cd.acc[self.name] = got + cd.acc[self.name]
        elif op == "topk":
            logits = cd.acc.pop(self.name).astype(F32)
            probs = ref.softmax(logits, axis=-1)
            ids = np.argsort(-probs, axis=-1, kind="stable")[:, :self.top_k]
            wts = np.take_along_axis(probs, ids, axis=-1)
            cd.route = Routing(ids, (wts / np.sum(wts, axis=-1, keepdims=True)).astype(F32))
            self.plane.count_routing(self.layer, ids, cd)

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


class Dispatch(_RoutesTokens):
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


class ExpertFFN(_RoutesTokens):
    """See meshrt.kernel_roles._expert_roles for the layout."""

    OPS = frozenset({"fmac", "add", "silu_mul"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.moe = plane.moe(self.layer)
        self.placement = info.param("placement")
        self.f = info.param("expert_ffn")
        self.dynamic = plane.moe_routing
        self._members: dict[tuple[tuple[int, ...], int], list[int]] = {}

    def _experts(self, cd, tile):
        placement = self.plane.placement(self.layer, cd.step, self.placement)
        key = (placement, tile)
        members = self._members.get(key)
        if members is None:
            members = self._members[key] = [e for e, r in enumerate(placement) if r == tile]
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

    def compute(self, cd, op):
        t, i, j, w, h = self.grid_pos(cd)
        where = self.where(cd)
        hidden = self.moe.w_gate.shape[1]
        f0, f1 = part(self.f, w, i)
        if op == "fmac" and self.name + ".a" not in cd.acc:  # phase 1: x . W_gate|up
            r0, r1 = part(hidden, h, j)
            x = self.input(cd).need(r0, r1, where).astype(F64)
            parts = {}
            for e in self._experts(cd, t):
                rows = self._tokens(cd, e)
                if not rows:  # no token routed here this step: nothing to compute or send
                    parts[e] = (rows, np.zeros((0, 2 * (f1 - f0))))
                    continue
                w13 = cd.tile((self.name, e, "gate_up"), lambda: np.concatenate(
                    [self.moe.w_gate[e, r0:r1, f0:f1], self.moe.w_up[e, r0:r1, f0:f1]], axis=1))
                parts[e] = (rows, x[rows] @ w13)
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
                e: (rows, (ref._silu(g[:, :n].astype(F32)) * g[:, n:].astype(F32)))
                for e, (rows, g) in parts.items()}
        elif op == "fmac":  # phase 2: a[f_i] . W_down[f_i, rows j], this core's partial
            a = cd.acc.pop(self.name + ".a")
            r0, r1 = part(hidden, h, j)
            cd.acc[self.name] = {
                e: (rows, r0, act.astype(F64) @ cd.tile((self.name, e, "down"),
                                                        lambda e=e: self.moe.w_down[e, f0:f1, r0:r1]))
                for e, (rows, act) in a.items()}

    def send(self, cd, role):
        if role is FlowRole.UP:
            return cd.acc[self.name + ".a"]
        return cd.acc.pop(self.name)  # down partials, or this core's output partial

    def relayed(self, cd, value):
        cd.acc[self.name + ".a"] = value


class Combine(KernelExec):
    """Corridor cores each sum their flat slice of the weighted expert outputs
    and pass the slices on to the head."""

    OPS = frozenset({"combine"})
    RAW_INPUTS = True  # the experts' partial outputs

    def compute(self, cd, op):
        if op != "combine":
            return
        _, i, j, w, h = self.grid_pos(cd)
        items = cd.inbox.pop((self.name, FlowRole.INPUT), [])  # the experts' partial outputs
        hidden = self.plane.shape.hidden
        lo, hi = part(hidden, w * h, j * w + i)
        # per expert and slot: the sum of its cores' partial outputs, rounded once
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
        for s in range(self.b):
            ids = route.ids[s]
            for e in sorted(int(x) for x in ids):
                k = int(np.nonzero(ids == e)[0][0])
                y = per_expert.get(e, {}).get(s)
                if y is None:
                    raise DataLayoutError(f"{self.where(cd)}: no output of expert {e} for slot {s}")
                out[s] += F64(route.weights[s, k]) * y.astype(F32).astype(F64)
        v = cd.values.get(self.name)
        mine = Vec.of(out.astype(F32), lo, hidden)
        if v is None:
            cd.values[self.name] = mine
        else:
            v.merge(mine, self.where(cd))

    def send(self, cd, role):
        return cd.values[self.name]

    def recv(self, cd, role, items):
        if role is FlowRole.HOP:
            cd.values[self.name] = items[0]
        else:
            cd.inbox[self.name, role] = items


class Sample(KernelExec):
    """Greedy argmax along the bottom row; its last core runs the serving logic."""

    OPS = frozenset({"argmax", "argmax_merge", "eos_check"})

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        if op == "argmax":
            c0, c1 = part(self.info.param("in_widths")[0], w, i)
            logits = self.input(cd).need(c0, c1, self.where(cd))
            idx = np.argmax(logits, axis=1)
            cd.acc[self.name] = (logits[np.arange(self.b), idx], idx + c0)
        elif op == "argmax_merge":
            (got,) = self.take(cd, FlowRole.DOWN)
            gv, gi = got  # from the columns to the left: lower token ids
            mv, mi = cd.acc[self.name]
            better = mv > gv
            cd.acc[self.name] = (np.where(better, mv, gv), np.where(better, mi, gi))
        elif op == "eos_check":
            _, idx = cd.acc.pop(self.name)
            return self.plane.host.sampled(cd, [int(t) for t in idx])

    def send(self, cd, role):
        if role is FlowRole.DOWN:
            return cd.acc[self.name]
        return self.plane.host.next_tokens(cd)

    def metainfo(self, cd, role, meta):
        cb, route = super().metainfo(cd, role, meta)
        if self.plane.cb and not role.internal:
            cb = self.plane.host.table_of(cd)  # the table of the step these tokens start
        return cb, route


EXECS = {
    "embed": Embed, "handoff": Handoff, "gemv": Gemv, "allreduce": AllReduce,
    "elementwise": Elementwise, "attention": Attention, "topk_gate": TopKGate,
    "dispatch": Dispatch, "expert_ffn": ExpertFFN, "combine": Combine, "sample": Sample,
}


# --------------------------------------------------------------------------
# the plane
# --------------------------------------------------------------------------


class DataPlane:
    """Weights, kernels and per-core data of one interpreted run."""

    def __init__(self, program, weights: ref.Weights, host):
        self.weights = weights
        self.shape = weights.shape
        self.b = program.micro_batch_size
        self.moe_routing = "moe_routing" in program.dynamism_kinds
        self.cb = "continuous_batching" in program.dynamism_kinds
        self.host = host
        self.kernels = {}
        for info in program.kernels():
            cls = EXECS.get(info.kind.data)
            if cls is None:
                raise DataLayoutError(f"kernel @{info.kernel_name}: kind {info.kind.data} has no numerics")
            self.kernels[info.kernel_name] = cls(info, self)
        self.routing_counts = np.zeros((self.shape.layers, max(self.shape.experts, 1)), np.int64)
        # flow name -> (role, kernel): the kernels' hooks see a flow's role, not its name
        self.roles = {f.flow_name: (f.flow_role, f.kernel.root_reference.data) for f in program.flows()}
        # live re-placements: layer -> [(first step, placement, cycles per destination region)]
        self.replacements: dict[int, list[tuple[int, tuple[int, ...], dict[int, int]]]] = {}

    def placement(self, layer: int, step: int, compiled: tuple[int, ...]) -> tuple[int, ...]:
        """The expert -> region map micro-batch `step` runs with."""
        current = compiled
        for first, placement, _ in self.replacements.get(layer, ()):
            if step >= first:
                current = placement
        return current

    def move_cycles(self, layer: int, step: int, region: int) -> int:
        for first, _, cycles in self.replacements.get(layer, ()):
            if step == first:
                return cycles.get(region, 0)
        return 0

    def replace_experts(self, layer: int, first_step: int, placement: tuple[int, ...],
                        cycles_by_region: dict[int, int]) -> None:
        """From micro-batch `first_step` on, layer's experts run where `placement` says;
        the regions receiving weights first wait for them (cycles per region)."""
        self.replacements.setdefault(layer, []).append((first_step, tuple(placement), cycles_by_region))

    # weights by kernel name (the lowering's naming: l{i}_qkv, l{i}_o, ...)
    def matrix(self, name: str, layer: int, grid) -> np.ndarray:
        w = self.weights
        if name == "lm_head":
            return w.lm_head
        lw = w.layers[layer]
        suffix = name.split("_", 1)[1]
        if suffix == "qkv":
            return np.concatenate([lw.wq, lw.wk, lw.wv], axis=1)
        if suffix == "o":
            return lw.wo
        if suffix == "up":  # per column block: gate then up of one slice of the FFN width
            _, _, cols, _ = grid
            f = lw.dense.w_gate.shape[1]
            blocks = []
            for i in range(cols):
                lo, hi = part(f, cols, i)
                blocks += [lw.dense.w_gate[:, lo:hi], lw.dense.w_up[:, lo:hi]]
            return np.concatenate(blocks, axis=1)
        if suffix == "down":
            return lw.dense.w_down
        raise DataLayoutError(f"kernel @{name}: no weight matrix of that name")

    def norm_gain(self, name: str, layer: int) -> np.ndarray:
        if name == "final_norm":
            return self.weights.final_norm
        lw = self.weights.layers[layer]
        return lw.attn_norm if name.endswith("norm1") else lw.ffn_norm

    def moe(self, layer: int) -> ref.MoEFFNWeights:
        m = self.weights.layers[layer].moe
        if m is None or m.shared_gate.shape[0]:
            raise DataLayoutError(f"layer {layer}: only MoE layers without shared experts have numerics")
        return m

    def count_routing(self, layer, ids, cd) -> None:
        """The gate root counts each live slot's choices once: the live activation
        profile recalibration and placement studies read."""
        live = [s for s, sl in enumerate(cd.cb.slots) if sl.rid >= 0] if cd.cb is not None \
            else range(self.b)
        for s in live:
            for e in ids[s]:
                self.routing_counts[layer, int(e)] += 1

    # hooks called by MeshSim ----------------------------------------------
    def core_data(self, pos: tuple[int, int, int]) -> CoreData:
        return CoreData(pos)

    def host_prime(self, cd: CoreData, flow: str, group: int) -> Payload:
        """The host's first message of micro-batch `group` on a loop-carried flow."""
        return Payload("host", self.host.first_tokens(group), cb=self.host.first_table(group))

    def sub(self, cd: CoreData, kernel: str) -> None:
        cd.kernel = self.kernels[kernel]

    def computes(self, kernel: str, op: str) -> bool:
        """Whether compute `op` of `kernel` has a numeric effect (else the hook is skipped)."""
        return op in self.kernels[kernel].OPS

    def compute(self, cd: CoreData, op: str) -> int | None:
        """Returns extra cycles of host work the event waited for, if any."""
        return cd.kernel.compute(cd, op)

    def send(self, cd: CoreData, flow: str, meta: int) -> Payload:
        k = cd.kernel
        role = self.roles[flow][0]
        value = k.send(cd, role)
        cb, route = k.metainfo(cd, role, meta)
        return Payload(k.payload_src(role), value, cb, route)

    def _flow_kind(self, kernel: KernelExec, role: FlowRole, owner: str) -> str:
        """"tokens", "internal" (the kernel's own chain/relay flows) or "input"."""
        if role is FlowRole.TOKENS:
            return "tokens"
        return "internal" if role.internal and owner == kernel.name else "input"

    def recv(self, cd: CoreData, flow: str, payloads: list[Payload]) -> None:
        k = cd.kernel
        role, owner = self.roles[flow]
        kind = self._flow_kind(k, role, owner)
        for p in payloads:
            if p.cb is not None:
                cd.cb = p.cb
            if p.route is not None:
                cd.route = p.route
        internal = kind == "internal"
        if kind == "tokens":
            cd.values["tokens"] = payloads[0].value
            for p in payloads[1:]:
                if list(p.value) != list(payloads[0].value):
                    raise DataLayoutError(f"{k.where(cd)}: samplers disagree on the tokens")
            return
        if internal:
            k.recv(cd, role, [p.value for p in payloads])
            return
        if k.RAW_INPUTS:
            k.recv(cd, role, [p.value for p in payloads])
            return
        for p in payloads:
            key = (k.name, p.src)
            v = p.value
            if not isinstance(v, Vec):
                raise DataLayoutError(f"{k.where(cd)}: unexpected payload on @{flow}")
            have = cd.recvd.get(key)
            if have is None:
                cd.recvd[key] = Vec(v.data.copy(), v.mask.copy())
            else:
                have.merge(v, k.where(cd))

    def end_step(self, cd: CoreData) -> None:
        """A core finished a pass over its table: drop the step's received values."""
        cd.recvd.clear()
        cd.values = {k: v for k, v in cd.values.items() if k == "tokens"}
        cd.step += 1
