"""Numerics in the messages: the per-core values and the hooks a kind's numerics fill in.

What a kernel kind computes in the interpreter is a `KernelExec` subclass in
its folder (`numerics.py`); the data plane (`meshrt.runtime.dataplane`)
calls its hooks when a core runs an event of the kind. A value is a `Vec`:
the full-width array of a micro-batch with a mask of the entries this core
holds, so gathers from several senders merge by mask, and a compute that
needs an entry the core does not hold raises a `DataLayoutError` naming the
kernel, the core and the missing range: a wrong table, flow or layout fails
loudly instead of producing numbers. Layouts follow `meshrt.kernels.interface`.

Numerics mirror `meshrt.runtime.reference`: float32 at kernel boundaries,
float64 partial sums rounded once, so the tokens match the reference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from meshrt.activations import round_activations
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels import registry
from meshrt.runtime import pe_exec

if TYPE_CHECKING:
    from meshrt.dialects import event as ev
    from meshrt.runtime.dataplane import DataPlane

F32, F64 = np.float32, np.float64


class DataLayoutError(Exception):
    """A core needs data it does not hold (a schedule or layout bug)."""


def part(n: int, parts: int, i: int) -> tuple[int, int]:
    """Range of part i when n elements are split into `parts` (ceil split)."""
    c = -(-n // max(parts, 1))
    return min(n, i * c), min(n, (i + 1) * c)


# A GEMV whose output concatenates several vectors (blocks: q | k | v, gate | up)
# may lay it out *blocked*: column i's contiguous slice is its part of each block
# in turn, so a consumer on the same columns finds its share of every block where
# the reduction left it.
def block_range(blocks: tuple[int, ...], cols: int, i: int) -> tuple[int, int]:
    """Range of column i's slice of a blocked vector (its parts of every block)."""
    return sum(part(b, cols, i)[0] for b in blocks), sum(part(b, cols, i)[1] for b in blocks)


def block_order(blocks: tuple[int, ...], cols: int) -> np.ndarray:
    """Blocked position -> index in the plain concatenation of the blocks."""
    starts = np.cumsum((0, *blocks[:-1]))
    return np.concatenate([np.arange(s + lo, s + hi) for i in range(cols)
                           for s, b in zip(starts, blocks) for lo, hi in [part(b, cols, i)]])


def inverse(order: np.ndarray) -> np.ndarray:
    """Index -> position of a permutation given as position -> index (where a value laid
    out in `order` holds each entry of its plain order)."""
    out = np.empty(len(order), np.int64)
    out[order] = np.arange(len(order))
    return out


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

    def need_at(self, idx: np.ndarray, where: str) -> np.ndarray:
        """The entries at positions `idx` (all of which must be held)."""
        held = self.mask[:, idx].all(axis=0)
        if not held.all():
            raise DataLayoutError(f"{where}: entry {int(idx[np.argmin(held)])} of the value is not held here")
        return self.data[:, idx]

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
    prefill: bool = False  # a prompt token whose sample is no output (the phase the row is in)


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
    recvd: dict[str, Vec] = field(default_factory=dict)  # producer -> what arrived of its value
    acc: dict[str, object] = field(default_factory=dict)  # chain partials per kernel
    inbox: dict[tuple[str, FlowRole], list] = field(default_factory=dict)  # (kernel, role) -> payloads
    kv: dict[str, np.ndarray] = field(default_factory=dict)
    cb: SlotTable | None = None
    route: Routing | None = None
    kernel: KernelExec | None = None
    step: int = 0
    tiles: dict = field(default_factory=dict)  # resident weight tiles (float64 for accumulation)
    # the PE-level buffers of each kernel whose compute runs its PE bodies (meshrt.kernels.pe)
    buffers: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    # (kernel, KV slot) -> the serial of the last pushed cache written into its tiles here
    pushed: dict[tuple[str, int], int] = field(default_factory=dict)

    def tile(self, key, make) -> np.ndarray:
        """This core's resident tile `key`, loaded once (as the host does before the run)."""
        t = self.tiles.get(key)
        if t is None:
            t = self.tiles[key] = np.asarray(make(), F64)
        return t

    def packed_tile(self, key, make):
        """This core's resident tile `key` as stored (a `meshrt.quant.Packed`), loaded once."""
        t = self.tiles.get(key)
        if t is None:
            t = self.tiles[key] = make()
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
        self.kernel_kind = registry.kind(info.kind.data)  # its KernelOp class
        self.plane = plane
        self.b = plane.b
        self.tiles = [r.tuple[:4] for r in info.region.rects.data]
        self.inputs = info.input_names
        self.layer = info.param("layer", -1)
        self._grid: dict[tuple[int, int, int], tuple[int, int, int, int, int]] = {}

    def grid_pos(self, cd: CoreData) -> tuple[int, int, int, int, int]:
        """(tile index, i, j, w, h) of the core in the kernel's tiles."""
        return self.grid_at(cd.pos)

    def grid_at(self, pos: tuple[int, int, int]) -> tuple[int, int, int, int, int]:
        """(tile index, i, j, w, h) of the core at `pos` (wafer, x, y) in the kernel's tiles."""
        gp = self._grid.get(pos)
        if gp is None:
            _, x, y = pos
            for t, (tx, ty, tw, th) in enumerate(self.tiles):
                if tx <= x < tx + tw and ty <= y < ty + th:
                    gp = self._grid[pos] = (t, x - tx, y - ty, tw, th)
                    return gp
            raise DataLayoutError(f"kernel @{self.name}: core {pos[1:]} is outside its region")
        return gp

    def pe_buffers(self, cd: CoreData, bodies) -> dict[str, np.ndarray]:
        """The core's buffers of this kernel's PE bodies (`meshrt.kernels.pe.Bodies`),
        made once, the resident ones loaded as the host loads them (`resident`)."""
        bufs = cd.buffers.get(self.name)
        if bufs is None:
            bufs = cd.buffers[self.name] = {b.name: np.zeros(b.elems, pe_exec.dtype(b.type().element_type))
                                            for b in bodies.buffers}
            for b, data in zip(bodies.resident, self.resident(cd.pos) or ()):
                bufs[b.name][:] = data
        return bufs

    def tile_bodies(self) -> dict:
        """Each tile's PE bodies (`KernelOp.pe_bodies`; None where the kind has none there)."""
        return {t: self.kernel_kind.pe_bodies(self.info, self.b, self.plane.hp, t) for t in self.tiles}

    def bodies_at(self, pos: tuple[int, int, int]):
        """The PE bodies of the tile holding the core at `pos` (`self.bodies`, by tile)."""
        return self.bodies[self.tiles[self.grid_at(pos)[0]]]

    def run_body(self, cd: CoreData, bodies, op: str) -> dict[str, np.ndarray]:
        """Run compute op `op`'s PE body on the core's buffers (its coordinates the
        program's px, py); the buffers."""
        bufs = self.pe_buffers(cd, bodies)
        pe_exec.run(bodies.funcs[op], bufs, {"px": cd.pos[1], "py": cd.pos[2]})
        return bufs

    def resident(self, pos: tuple[int, int, int]) -> list[np.ndarray] | None:
        """What the host loads into the core at `pos` for this kernel: its PE bodies'
        resident buffers, in their order (meshrt.kernels.pe), or None where the kernel's
        compute is not PE bodies."""
        return None

    def where(self, cd: CoreData) -> _Where:
        return _Where(self.name, cd.pos)

    def input(self, cd: CoreData, k: int = 0) -> Vec:
        """Operand k as this core holds it: its own copy of the producer's value
        plus whatever arrived on the input flow."""
        prod = self.inputs[k]
        local = cd.values.get(prod)
        if local is None and prod in self.plane.kernels:  # a producer on this core with no event
            local = self.plane.kernels[prod].local_value(cd)
        got = cd.recvd.get(prod)
        if local is None and got is None:
            raise DataLayoutError(f"{self.where(cd)}: holds no part of the value of @{prod}")
        if not isinstance(local, Vec):
            local = None
        if local is None or got is None:
            v = got if local is None else local
        else:
            v = Vec(local.data.copy(), local.mask.copy())
            v.merge(got, self.where(cd))
        fmt = self.plane.rounded.get(prod)
        if fmt is not None and isinstance(v, Vec):  # it travelled in the activation format
            v = Vec(round_activations(v.data, fmt), v.mask)
        return v

    def local_value(self, cd: CoreData) -> object:
        """This kernel's value on `cd` when a consumer on the same core asks for it
        and no event of this kernel made it (None: the core holds none)."""
        return None

    # event hooks (defaults: nothing to do)
    def compute(self, cd: CoreData, op: str) -> None:
        pass

    def reached(self, cd: CoreData, op: str) -> float:
        """The share of its static work compute `op` (one `over_kv_rows`,
        `meshrt.kernels.compute`) does on `cd` this step: the KV rows the micro-batch's
        queries reach over those the core holds for them."""
        return 1.0

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
        """The kernel whose value a send on a flow of `role` carries (`KernelOp.sends_value`)."""
        return self.kernel_kind.sends_value(self.info, role)

    def metainfo(self, cd: CoreData, role: FlowRole, meta: int) -> tuple[SlotTable | None, Routing | None]:
        """(CF table, routing) riding a send: what the core holds, where the table
        gives the send metainfo bytes."""
        return (cd.cb, cd.route) if meta else (None, None)

    def apply_pushes(self, cd: CoreData, cb: SlotTable) -> None:
        """Write the caches the host pushed (`DataPlane.push_kv`) into the live slots of `cb`
        since this core last ran them into its tiles (`load_pushed`)."""
        if self.plane.pushes:
            for slot in cb.slots:
                if slot.rid >= 0:
                    state = self.plane.pushed(cd, self.name, slot.kv)
                    if state is not None:
                        self.load_pushed(cd, slot.kv, state)

    def load_pushed(self, cd: CoreData, kv: int, state) -> None:
        """The host's write of a pushed cache (a `reference.KVState`) into the rows of KV
        slot `kv` this core holds (kinds that keep per-request state)."""
        raise DataLayoutError(f"kernel @{self.name} (kind {self.info.kind.data}) keeps no KV")

    def take(self, cd: CoreData, role: FlowRole) -> list:
        items = cd.inbox.pop((self.name, role), None)
        if items is None:
            raise DataLayoutError(f"{self.where(cd)}: nothing received on its {role} flow")
        return items


class RoutesTokens(KernelExec):
    """Gate, dispatch and experts: without routing metainfo (the static build)
    the gate's weights still travel with the tokens, as data."""

    def metainfo(self, cd, role, meta):
        cb, route = super().metainfo(cd, role, meta)
        return cb, route if self.plane.moe_routing else cd.route
