"""A plain-Python view of a segment program, as the CSL emitter needs it.

Nothing here changes the IR. Flows get their colour (from `segment.route`)
and their metainfo kind (from the resolvers / producers that name them);
core classes get their segments, boundaries and, per sub-schedule, the
events with byte counts turned into wavelets (one 32-bit wavelet per
element on the wire, as in `meshrt.kernels.interface`: activations travel as fp32).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from xdsl.dialects.builtin import FloatAttr, IntegerAttr, ModuleOp

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs
from meshrt.analysis.liveness import host_primed
from meshrt.kernels import registry
from meshrt.kernels.interface import KernelOp, wavelets
from meshrt.routing import Box, RectSet, rect_boxes


@dataclass
class Flow:
    op: ev.FlowOp
    name: str
    ident: str  # CSL identifier
    wafer: int
    color: int | None  # None: dead or across the wafer link
    cross: bool
    kernel: str
    role: ev.FlowRole
    meta_kind: str | None = None
    xw_index: int = -1  # index among cross-wafer flows
    _configs: list | None = None

    def configs(self, width: int, height: int):
        """(box, RouterConfig) of every router the flow crosses (cached)."""
        if self._configs is None:
            from meshrt.backend.csl.routes import flow_router_configs

            self._configs = flow_router_configs(self.op, width, height)
        return self._configs


@dataclass
class Event:
    kind: str  # recv | send | compute | resolve | produce
    op: ev.EventOp
    flow: str | None = None
    nbytes: int = 0
    meta: int = 0
    name: str = ""  # compute op, or dynamism kind
    work: int = 0
    # a receive (or its metainfo resolver) whose first step's messages the host
    # loads: a loop-carried flow (liveness.host_primed)
    primed: bool = False

    @property
    def elems(self) -> int:
        return wavelets(self.nbytes)

    @property
    def meta_words(self) -> int:
        return wavelets(self.meta)


@dataclass
class Sub:
    op: ev.SubScheduleOp
    kernel: str
    role: str
    events: list[Event]
    collective: bool
    state_bytes: int  # resident state (weights, KV): demand minus its largest message


@dataclass
class Segment:
    op: sg.SegmentOp
    index: int
    subs: list[Sub]
    routes: list[str]
    awaits: list[str] = field(default_factory=list)  # route handshakes in the IR ("@T::@F")
    grants: list[str] = field(default_factory=list)

    def events(self) -> list[Event]:
        return [e for s in self.subs for e in s.events]


@dataclass
class Boundary:
    source: int
    dest: int
    sync: sg.MarkerSyncOp | None
    op: sg.ReconfigureOp
    release: list[str]
    install: list[str]
    notify: list[str] = field(default_factory=list)  # route handshakes in the IR
    drain: list[str] = field(default_factory=list)


@dataclass
class CoreClass:
    op: sg.CoreClassOp
    name: str
    ident: str
    wafer: int
    boxes: list[Box]
    segments: list[Segment]
    boundaries: list[Boundary]
    params: dict[str, int] = field(default_factory=dict)

    @property
    def file(self) -> str:
        return f"{self.ident}.csl"

    @property
    def handshakes(self) -> int:
        """Route handshake entries the IR states for this class (emitted as teardown code, handshakes.py)."""
        return (sum(len(s.awaits) + len(s.grants) for s in self.segments)
                + sum(len(b.notify) + len(b.drain) for b in self.boundaries))

    @property
    def cores(self) -> int:
        return sum((b[2] - b[0]) * (b[3] - b[1]) for b in self.boxes)

    def rectset(self) -> RectSet:
        return RectSet(self.boxes)


@dataclass
class Program:
    op: sg.ProgramOp
    name: str
    target: str
    width: int
    height: int
    wafers: int
    micro_batch: int
    stages: int
    dynamism: tuple[str, ...]
    hparams: dict[str, float]
    flows: dict[str, Flow]
    classes: list[CoreClass]
    records: dict[str, ev.KernelInfoOp]  # kernel name -> its event.kernel record

    def hp(self, key: str, default: float = 0) -> float:
        return self.hparams.get(key, default)

    def record(self, sub: Sub) -> ev.KernelInfoOp:
        """The `event.kernel` record of the kernel `sub` belongs to."""
        info = self.records.get(sub.kernel)
        if info is None:
            raise MeshrtError(f"sub-schedule of @{sub.kernel} has no event.kernel record: the CSL "
                              "backend needs it to know the kernel's kind", sub.op)
        return info

    def kind_of(self, sub: Sub) -> type[KernelOp]:
        """The kind of the kernel `sub` belongs to."""
        return registry.kind(self.record(sub).kind.data)

    @property
    def slots(self) -> int:
        """Request slots in flight (micro-batch x micro-batches in flight)."""
        return int(self.hp("inflight_slots", self.hp("kv_slots", max(1, self.micro_batch))))

    @property
    def groups(self) -> int:
        """Micro-batches in flight: the slots' groups the tables serve in turn."""
        return max(1, self.slots // max(1, self.micro_batch))

    def classes_on(self, wafer: int) -> list[CoreClass]:
        return [c for c in self.classes if c.wafer == wafer]

    def flows_on(self, wafer: int) -> list[Flow]:
        return [f for f in self.flows.values() if f.wafer == wafer and f.color is not None]


_IDENT = re.compile(r"[^A-Za-z0-9_]")
CSL_KEYWORDS = {
    "and", "break", "comptime", "const", "continue", "else", "export", "extern", "fn", "for",
    "if", "inline", "layout", "or", "param", "return", "switch", "task", "var", "while",
}


def plain_identifier(name: str) -> str:
    """`name` with every character CSL does not allow in an identifier made `_`."""
    return _IDENT.sub("_", name)


def identifier(name: str, used: set[str], prefix: str = "") -> str:
    base = prefix + plain_identifier(name).strip("_")
    if not base or base[0].isdigit() or base in CSL_KEYWORDS:
        base = "n_" + base
    ident, n = base, 1
    while ident in used:
        n += 1
        ident = f"{base}_{n}"
    used.add(ident)
    return ident


def _event(op: ev.EventOp) -> Event:
    if isinstance(op, ev.RecvOp):
        return Event("recv", op, op.flow_name, op.num_bytes, op.meta.value.data)
    if isinstance(op, ev.SendOp):
        return Event("send", op, op.flow_name, op.num_bytes, op.meta.value.data)
    if isinstance(op, ev.ComputeOp):
        return Event("compute", op, name=op.op.data, work=op.work.value.data)
    if isinstance(op, ev.MetaResolveOp):
        return Event("resolve", op, op.flow_name, 0, op.num_bytes, name=op.kind.data)
    if isinstance(op, ev.MetaProduceOp):
        return Event("produce", op, op.flow_name, 0, op.num_bytes, name=op.kind.data)
    raise MeshrtError(f"the CSL backend does not know event '{op.name}'", op)


def _sub(op: ev.SubScheduleOp) -> Sub:
    events = [_event(e) for e in op.events()]
    largest = max((e.nbytes + e.meta for e in events if e.kind in ("recv", "send")), default=0)
    state = max(0, op.demand.value.sram - largest)
    return Sub(op, op.kernel_name, op.role_name, events, op.is_collective, state)


def _names(refs) -> list[str]:
    return [r.root_reference.data for r in refs.data] if refs is not None else []


def read_program(program: sg.ProgramOp) -> Program:
    """The plan of one `segment.program`; raises MeshrtError on IR the backend cannot emit."""
    for k in program.kernels():
        if k.param("spill_from") is not None:
            raise MeshrtError(
                f"kernel @{k.kernel_name}: its KV spills to the expert cores (--kv-spill): each "
                "column's q | k | v and partial cross the expert area beside the others' on shared "
                "links, which the routes printed here (one stream a colour) cannot carry yet; a "
                "spilling program is interpreted and costed, not printed at the PE level or as CSL", k)
    hparams: dict[str, float] = {}
    for k, v in program.hparams.data.items():
        if isinstance(v, IntegerAttr | FloatAttr):
            hparams[k] = float(v.value.data)
    colors = {r.flow_name: r.color_id for r in program.routes()}
    used: set[str] = set()
    flows: dict[str, Flow] = {}
    for f in program.flows():
        flows[f.flow_name] = Flow(
            f, f.flow_name, identifier(f.flow_name, used), f.wafer_index,
            colors.get(f.flow_name), f.crosses_wafer, f.kernel.root_reference.data, f.flow_role)
    xw = 0
    for f in flows.values():
        if f.cross:
            f.xw_index = xw
            xw += 1
    classes: list[CoreClass] = []
    class_idents: set[str] = {"idle", "layout"}
    primed = host_primed(program)
    for cls in program.core_classes():
        segments = []
        for seg in cls.segments():
            awaits = [f"@{t}::@{f}" for t, f in getattr(seg, "await_pairs", lambda: [])()]
            grants = list(getattr(seg, "grant_names", lambda: [])())
            segments.append(Segment(seg, seg.index_value, [_sub(s) for s in seg.subs()],
                                    seg.route_names(), awaits, grants))
        boundaries = [
            Boundary(a, b, sync, rec,
                     [r.root_reference.data for r in rec.release.data],
                     [r.root_reference.data for r in rec.install.data],
                     _names(getattr(rec, "notify", None)), _names(getattr(rec, "drain", None)))
            for a, b, sync, rec in cls.boundaries()
        ]
        params = {}
        if cls.params is not None:
            params = {k: v.value.data for k, v in cls.params.data.items() if isinstance(v, IntegerAttr)}
        boxes = [b for r in cls.cores.rects for b in rect_boxes(r, limit=1 << 30)]
        classes.append(CoreClass(cls, cls.class_name, identifier(cls.class_name, class_idents, "c_"),
                                 cls.wafer_index, boxes, segments, boundaries, params))
        for seg in segments:
            for sub in seg.subs:
                for e in sub.events:
                    if e.kind in ("resolve", "produce") and e.flow in flows:
                        flows[e.flow].meta_kind = e.name
                    if e.kind in ("recv", "resolve") and (sub.kernel, e.flow) in primed:
                        e.primed = True
    # Metainfo that rides a send no producer names is forwarded: its kind is
    # the one the flow's receivers resolve, or the program's only kind.
    kinds = [k for k in program.dynamism_kinds if k in ("continuous_batching", "moe_routing")]
    records = {k.kernel_name: k for k in program.kernels()}
    for f in flows.values():
        if f.meta_kind is None:
            routed = f.kernel in records and registry.kind(records[f.kernel].kind.data).ROUTED_INPUTS
            f.meta_kind = "moe_routing" if routed and "moe_routing" in kinds else (
                "continuous_batching" if "continuous_batching" in kinds else (kinds[0] if kinds else None))
    w, h = program.mesh_size
    return Program(program, program.program_name, program.target.data, w, h, program.num_wafers,
                   program.micro_batch_size, program.num_stages, program.dynamism_kinds, hparams,
                   flows, classes, records)


def segment_programs(module: ModuleOp) -> list[sg.ProgramOp]:
    return require_programs(module, "the CSL backend", sg.ProgramOp,
                            hint="materialize-segments,color-routes")
