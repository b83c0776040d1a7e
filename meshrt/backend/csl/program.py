"""One CSL program per core class: buffers, DSDs, tasks and the event table.

The class's event table (its segments' sub-schedules, in order, with the
boundaries between segments) becomes a state machine driven by one local
task, `step`: state `pc` runs one step of one event and either continues at
once (synchronous work: compute, metainfo parsing, route writes) or starts
an asynchronous fabric transfer whose completion re-activates `step`. The
table repeats every decode step, so after its last state it starts over.

Per event:

- `event.meta_resolve` arms a data task on the flow's queue (wse3) or
  colour (wse2) that takes the metainfo wavelets riding ahead of the data
  one by one; when the last one is in, the resolver parses them and updates
  the request descriptor table (continuous batching) or the routing table
  (MoE) - all before the kernel's compute, as Algorithm 1 places it.
- `event.recv` receives the data (and the metainfo, when no resolver took
  it) through a fabric-in DSD into the kernel's input `x` (flows into the
  kernel) or the partner buffer `p` (the kernel's own chain flows).
- `event.compute` calls the kernel's compute, DSD builtins over `x`, `y`,
  `p` and the resident weights / KV tiles `w`.
- `event.meta_produce` builds the metainfo from local results; the next
  send on the flow puts it on the wire ahead of the data.
- `event.send` sends the metainfo, then the data, through a fabric-out DSD.

How the wavelets of each flow travel (a single sender's tree, shifts, the
switch chain that serialises several senders, the relay line of the
hand-off gathers) is `streams.py`'s plan; a switch-chained sender follows
its message with the control wavelet that advances its own router and the
next one, a receiver of a chained flow takes one message per sender.

At a segment boundary: markers behind the last message of the closing
segment (when it has a marker sync), the wait for the expected markers, the
drains (the end-of-flow teardowns of the released flows, `handshakes.py`),
then the run-time route change of this core's own router (release /
install, opening the colour: the install credit), and the queue rebinds the
allocation asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from xdsl.dialects import memref

from meshrt import quant
from meshrt.backend.csl import handshakes as hsk
from meshrt.backend.csl import percore, streams
from meshrt.backend.csl.alloc import ClassAlloc, Limits, format_table, report_rows
from meshrt.backend.csl.kernels import ComputeBody
from meshrt.backend.csl.metainfo import (
    HAVE_WORDS,
    PROMPT_RING,
    REQ_WORDS,
    TOK_WORDS,
    TOKEN_RING,
    MetaCode,
    request_words,
)
from meshrt.backend.csl.pe_print import body_lines, calls_math
from meshrt.backend.csl.model import CoreClass, Event, Flow, Program, Segment, plain_identifier
from meshrt.backend.csl.streams import RELAY, ROLE_FIRST, ROLE_HEAD
from meshrt.backend.csl.pe_level import ClassLevel, has_partner, relays
from meshrt.backend.csl.values import is_kernel_array, kernel_array
from meshrt.diagnostics import MeshrtError
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels import registry
from meshrt.kernels.pe import ELEM_TYPES, PROGRAM_ARRAYS
from meshrt.kernels.topk_gate.pe import route_choices
from meshrt.routing import Box, RectSet, rect_boxes
from meshrt.shape import HParams



@dataclass
class Shared:
    """What all programs of one emission share."""

    program: Program
    lim: Limits
    arch: str
    elem: str  # "f32", "bf16" or "f16" (`meshrt.kernels.pe.activation_elem`)
    marker_counts: dict[tuple[str, int], list[tuple[Box, int]]] = field(default_factory=dict)
    marker_senders: dict[tuple[str, str, int], bool] = field(default_factory=dict)
    exports: dict[int, dict[str, str]] = field(default_factory=dict)  # wafer -> symbol -> layout type
    drained: set[str] = field(default_factory=set)  # flows whose senders close each step with a teardown

    @property
    def sfx(self) -> str:
        return "s" if self.elem == "f32" else "h"

    @property
    def elem_bytes(self) -> int:
        return 4 if self.elem == "f32" else 2

    @property
    def math_sfx(self) -> str:
        """The suffix of `<math>`'s functions of the program's type: `_f32`, or `_f16`,
        whose arguments are `@fp16()` (the selected 16-bit format)."""
        return "f32" if self.elem == "f32" else "f16"

    @property
    def half(self) -> str:
        """The program's 16-bit float type, the one `cslc --fp16-format` selects (a value of
        any other 16-bit float type must be comptime-known): bf16 in a bf16 program, else f16
        (cslc's default)."""
        return "bf16" if self.elem == "bf16" else "f16"


def _dirs(ds) -> str:
    ds = tuple(ds)
    if len(ds) == 1:
        return ds[0]
    return f"[{len(ds)}]direction{{ {', '.join(ds)} }}"


def routes_struct(rx, tx) -> str:
    """The comptime route struct `color_config.reset_routes` takes."""
    return f".{{ .rx = {_dirs(rx)}, .tx = {_dirs(tx)} }}"


class ProgramWriter:
    def __init__(self, cls: CoreClass, alloc: ClassAlloc, sh: Shared, level: ClassLevel):
        self.cls = cls
        self.level = level
        self.a = alloc
        self.sh = sh
        self.p = sh.program
        self._relayed = relays(self.p, cls)
        self.lines: list[str] = []
        self.decls: list[str] = []
        self.fns: list[str] = []
        self.dsds: dict[str, str] = {}  # name -> declaration
        self.fab_extent: dict[str, int] = {}  # fabric DSD name -> the extent it was made with
        self.states: list[tuple[list[str], bool, str]] = []  # (body, waits, comment)
        self.notes: list[str] = []
        self._own: dict[str, list] = {}
        self.b = max(1, self.p.micro_batch)
        self.resident: list[tuple[str, int, int, str]] = []  # (array, offset, length, kernel)
        self.exports: list[tuple[str, str, str]] = []  # (symbol, csl var, layout type)
        self.uses_math = False
        self.tables: set[str] = set()  # decode tables packed weights need (E2M1, E4M3)
        self.wscale = 0  # float32 block scales of the largest packed tile (dequant_*)
        self.uses_ctrl = alloc.marker_task is not None
        self.shadows: dict[str, int] = {}  # float32 copies 16-bit programs run PE bodies on
        self.plans = streams.plans(self.p)
        self.lp_used = False  # the loop counter of multi-message transfers
        self.consts: list[str] = []  # per-core comptime constants (chain roles, relay indices)
        self._consts: set[str] = set()
        self.values = level.plan  # where each value is held (pe_level.py, values.py)
        # flows whose messages are 32-bit words of a kernel's own array (token ids,
        # candidates): their staging and primed arrays take that type
        self.flow_elem: dict[str, str] = {}
        for seg in cls.segments:
            for e in seg.events():
                if e.kind in ("recv", "send"):
                    st = self.values.step(e)
                    self.flow_elem[e.flow] = self.elem_of(st.target if e.kind == "recv" else st.source)
        self._plan_handshakes()
        self._plan_buffers()

    # ------------------------------------------------------------------ sizes
    def _flows_used(self) -> list[Flow]:
        seen = []
        for seg in self.cls.segments:
            for e in seg.events():
                if e.flow and self.p.flows[e.flow] not in seen:
                    seen.append(self.p.flows[e.flow])
        return seen

    def _internal(self, e: Event) -> bool:
        """A flow of the kernel's own chain (reduction down / up, relay hop), not an input."""
        return self.p.flows[e.flow].role.internal  # chains of several kernels may share a flow

    def _plan_buffers(self) -> None:
        nx = np_ = ny = 1
        meta_in: dict[str, int] = {}  # kind -> words of the largest metainfo received / forwarded
        meta_out: dict[str, int] = {}
        producers = {e.name for seg in self.cls.segments for e in seg.events() if e.kind == "produce"}
        for seg in self.cls.segments:
            for sub in seg.subs:
                for e in sub.events:
                    # a transfer into or out of a kernel's own array (a PE body's message)
                    # sizes that array, not the working ones
                    st = self.values.step(e)
                    own = is_kernel_array((st.target if e.kind == "recv" else st.source) or "")
                    if e.kind == "recv":
                        if not own and self._internal(e):
                            np_ = max(np_, e.elems)
                        elif not own:
                            nx = max(nx, e.elems)
                        if e.meta:
                            k = self.p.flows[e.flow].meta_kind
                            meta_in[k] = max(meta_in.get(k, 0), e.meta_words)
                    elif e.kind == "resolve":
                        meta_in[e.name] = max(meta_in.get(e.name, 0), e.meta_words)
                    elif e.kind == "send":
                        if not own:
                            ny = max(ny, e.elems)
                        kind = self.p.flows[e.flow].meta_kind
                        if e.meta and kind in producers:
                            meta_out[kind] = max(meta_out.get(kind, 0), e.meta_words)
                        elif e.meta:
                            meta_in[kind] = max(meta_in.get(kind, 0), e.meta_words)
                    elif e.kind == "produce":
                        meta_out[e.name] = max(meta_out.get(e.name, 0), e.meta_words)
        # a compute without a PE body may write y as long as what its sub received (its
        # CSL body assumes so); PE bodies size y by what they use (`pe_lines`)
        for seg in self.cls.segments:
            for sub in seg.subs:
                if any(e.kind == "compute" and self.level.calls.get(id(e)) is None for e in sub.events):
                    ny = max([ny, *(e.elems for e in sub.events if e.kind == "recv"
                                    and not is_kernel_array(self.values.step(e).target))])
        self.nx, self.np, self.ny = nx, np_, ny
        self.cap = {"x": self.nx, "y": self.ny, "p": self.np}  # grown by the transfers below
        self.has_p = has_partner(self.p, self.cls)
        self.meta_in = meta_in
        self.meta_in_words = max(meta_in.values(), default=0)  # the cross-wafer staging size
        cross = [(e.kind, self.p.flows[e.flow].xw_index) for seg in self.cls.segments for e in seg.events()
                 if e.flow and self.p.flows[e.flow].cross]
        self.xw_in = sorted({k for kind, k in cross if kind in ("recv", "resolve")})
        self.xw_out = sorted({k for kind, k in cross if kind == "send"})
        self.xw_elems: dict[int, int] = {}  # staging size per cross-wafer flow: its largest message
        self.xw_meta: dict[int, int] = {}
        self.xw_elem: dict[int, str] = {}  # its element type
        for seg in self.cls.segments:
            for e in seg.events():
                if e.flow and self.p.flows[e.flow].cross:
                    k = self.p.flows[e.flow].xw_index
                    self.xw_elem[k] = self.flow_elem.get(e.flow, self.sh.elem)
                    self.xw_elems[k] = max(self.xw_elems.get(k, 1), e.elems)
                    self.xw_meta[k] = max(self.xw_meta.get(k, 1), e.meta_words)
        self.meta_out_words = meta_out
        kinds = {e.name for seg in self.cls.segments for e in seg.events() if e.kind in ("resolve", "produce")}
        self.cf = "continuous_batching" in kinds
        # the RDT: kept by the continuous-batching resolver, or (a build without it) read by
        # a body and written by the host for each batch
        self.admits = self.cf and any(e.kind == "compute" and registry.compute_op(e.name).admits_requests
                                      for seg in self.cls.segments for e in seg.events())
        self.emits_tokens = any(e.kind == "produce" and e.name == "continuous_batching"
                                for seg in self.cls.segments for e in seg.events())
        self.prompt_ring = PROMPT_RING  # the first stage's prompt ring depth (`fit_rings`)
        self.token_ring = TOKEN_RING  # the sampler's token ring depth (`fit_rings`)
        self.has_rdt = self.cf or any(name == "rdt" for fn in self.level.calls.values() if fn is not None
                                      for name, _ in _arrays_of(fn))
        self.moe = "moe_routing" in kinds
        # the routing table: filled by the moe_routing resolver, or (the static build) by the
        # gate's body on its root, for the bodies after it there
        self.has_rt = self.moe or any(name in ("rt_expert", "rt_weight") for fn in self.level.calls.values()
                                      if fn is not None for name, _ in _arrays_of(fn))
        self.slots = self.p.slots
        # the routing table's entries per token: its routed choices, then the shared experts
        self.choices = route_choices(max(1, int(self.p.hp("top_k", 1))), int(self.p.hp("shared_experts", 0)))
        self.routed_vars: dict[str, str] = {}  # declarations of the routed flows' state
        self._hit_len = 0
        # Loop-carried receives the host primes: per flow, (data, metainfo) words of
        # one message; the host loads one message per micro-batch in flight.
        self.groups = self.p.groups
        self.primed: dict[str, tuple[int, int]] = {}
        for seg in self.cls.segments:
            for e in seg.events():
                if e.primed:  # a receive or its resolver (which carries no data)
                    n, m = self.primed.get(e.flow, (0, 0))
                    self.primed[e.flow] = (max(n, e.elems), max(m, e.meta_words))
        # Resident state per sub (weights, KV tiles, embedding rows).
        wq_off = w_off = 0
        self.sub_region: dict[int, tuple[str, int, int]] = {}
        self.regions: list[tuple[str, str, int, int]] = []  # (kernel, array, offset, elements)
        for seg in self.cls.segments:
            for sub in seg.subs:
                if sub.state_bytes <= 0 or id(sub) in self.sub_region:
                    continue
                if self.p.record(sub).packed_weights:  # held packed: codes and scales, 16-bit words
                    n = -(-sub.state_bytes // 2)
                    self.sub_region[id(sub)] = ("wq", wq_off, n)
                    wq_off += n
                else:
                    n = -(-sub.state_bytes // self.sh.elem_bytes)
                    self.sub_region[id(sub)] = ("w", w_off, n)
                    w_off += n
                self.regions.append((sub.kernel, *self.sub_region[id(sub)]))
        self.nw, self.nwq = w_off, wq_off
        # KV rows this core scores: from the qk work, bounded by the KV tile it holds.
        self.attn_rows = 1
        d = max(1, self.nx // self.b)
        for seg in self.cls.segments:
            for sub in seg.subs:
                for e in sub.events:
                    if e.kind == "compute" and e.name == "qk":
                        reg = self.sub_region.get(id(sub))
                        cap = reg[2] // (2 * d) if reg else 1
                        self.attn_rows = max(self.attn_rows, min(e.work // max(1, self.nx), cap))

    def sram_bytes(self) -> int:
        eb = self.sh.elem_bytes
        n = (self.cap["x"] + self.cap["y"] + (self.cap["p"] if self.has_p else 0) + self.nw) * eb
        n += self.nwq * 2
        n += 4 * (self.meta_in_words + sum(self.meta_in.values()) + sum(self.meta_out_words.values()))
        n += 4 * self.slots * 4 if self.cf else 0
        n += 4 * self.slots * request_words(self.admits, self.emits_tokens, self.prompt_ring, self.token_ring)
        n += (4 + 4) * self.b * self.choices if self.has_rt else 0  # rt_expert (i32), rt_weight
        n += 2 * self.b if self.moe else 0  # mine
        n += eb * self.b * self.attn_rows + 4 * self.b  # sc, scale (f32)
        n += 4 * sum(self.shadows.values()) + eb * sum(self.values.saved.values())
        n += sum(ELEM_TYPES[a.elem].bitwidth // 8 * a.elems for a in self.level.arrays.values()
                 if a.own)  # the kernels' own arrays
        for k in self.xw_in + self.xw_out:
            n += eb * self.xw_elems[k] + 4 * self.xw_meta[k]
        for words, meta in self.primed.values():
            n += self.groups * (eb * words + 4 * meta)
        return n

    # ------------------------------------------------------------------ names
    def color(self, c: int) -> str:
        return f"col_{c}"

    def iq(self, q: int) -> str:
        return f"iq_{q}"

    def oq(self, q: int) -> str:
        return f"oq_{q}"

    def ident(self, array: str) -> str:
        """The CSL name of an array (a kernel's own `<kernel>::<buf>`: `<kernel>_<buf>`)."""
        return plain_identifier(array.replace("::", "_")) if is_kernel_array(array) else array

    def elem_of(self, array: str) -> str:
        """The element type of an array: a kernel's own array's declared one, a program
        array's of a fixed type (`PROGRAM_ARRAYS`), else the program's activations'."""
        a = self.level.arrays.get(array)
        if a is not None and a.own:
            return a.elem
        return PROGRAM_ARRAYS.get(array) or self.sh.elem

    def xfer(self, array: str) -> str:
        """The suffix of the meshrt_rt transfer helpers moving `array`'s elements."""
        elem = self.elem_of(array)
        return "words" if elem == "i32" else "f32" if elem == "f32" else "fp16"

    def token_arrays(self) -> tuple[str, str]:
        """The CSL names of the sampled token ids and their EOS flags: the arrays of the
        class's token source (the sampler's eos_check body writes them)."""
        for seg in self.cls.segments:
            for sub in seg.subs:
                if sub.kernel in self.p.records and self.p.kind_of(sub).TOKEN_SOURCE:
                    names = [kernel_array(sub.kernel, b) for b in ("tokens", "done")]
                    if all(n in self.level.arrays for n in names):
                        return self.ident(names[0]), self.ident(names[1])
        raise MeshrtError(f"core class @{self.cls.name} produces the continuous-batching payload but "
                          "holds no sampler's token and end-of-sequence arrays (PE level)", self.cls.op)

    def copy(self, dst: str, src: str, n: int) -> str:
        """dst = src, n elements of the type they share."""
        op = "@mov32" if "i32" in (self.elem_of(dst), self.elem_of(src)) else f"@fmov{self.sh.sfx}"
        return f"{op}({self.mem(dst, n)}, {self.mem(src, n)});"

    def mem(self, buf: str, n: int, offset: int = 0) -> str:
        if buf == "y":  # sized by the transfers and what the bodies use: as long as its DSDs reach
            self.need(buf, n + offset)
        buf = self.ident(buf)
        name = f"m_{buf}_{n}" + (f"_at{offset}" if offset else "")
        if name not in self.dsds:
            idx = f"i + {offset}" if offset else "i"
            self.dsds[name] = (f"const {name} = @get_dsd(mem1d_dsd, .{{ .tensor_access = "
                               f"|i|{{{n}}} -> {buf}[{idx}] }});")
        return name

    def fab(self, kind: str, flow: Flow, seg: int, n: int, what: str = "data") -> str:
        """A fabric DSD of `flow` in segment `seg`: kind fabin / fabout / control."""
        tag = {"data": "", "meta": "m", "ctl": "c"}[what]
        name = f"f{'i' if kind == 'fabin' else 'o'}{tag}_{flow.ident}_s{seg}"
        if self.fab_extent.setdefault(name, n) != n:
            # kernels whose chains share the flow send messages of their own lengths
            name = f"{name}_n{n}"
        if name in self.dsds:
            return name
        c = flow.color
        if kind == "fabin":
            q = self.a.iq.queue(seg, c)
            fields = [f".extent = {n}"]
            if self.sh.arch == "wse2":
                fields.append(f".fabric_color = {self.color(c)}")
            fields.append(f".input_queue = {self.iq(q)}")
        else:
            q = self.a.oq.queue(seg, c)
            fields = [f".extent = {n}"]
            if self.sh.arch == "wse2":
                fields.append(f".fabric_color = {self.color(c)}")
            fields.append(f".output_queue = {self.oq(q)}")
            if what == "ctl":
                fields.append(".control = true")
        self.dsds[name] = f"const {name} = @get_dsd({kind}_dsd, .{{ {', '.join(fields)} }});"
        return name

    # ----------------------------------------------------------------- routes
    def own_cells(self, flow: Flow) -> list[tuple[Box, streams.Cfg]]:
        """The flow's router configurations at this class's cores (cached per flow)."""
        if flow.name not in self._own:
            plan = self.plans.get(flow.name)
            self._own[flow.name] = percore.clip_to(plan.cells, self.cls.boxes) if plan else []
        return self._own[flow.name]

    def plan(self, flow: Flow) -> streams.FlowPlan | None:
        return self.plans.get(flow.name)

    def is_phased_here(self, flow: Flow) -> bool:
        return any(cfg.phased for _, cfg in self.own_cells(flow))

    def is_switched_here(self, flow: Flow) -> bool:
        return any(cfg.switch for _, cfg in self.own_cells(flow))

    def relay_here(self, flow: Flow) -> bool:
        return self._relayed(flow)

    def route_stmts(self, flow: Flow, phase: str) -> list[str]:
        """Statements that give this core's router `flow`'s configuration in `phase`
        (`color_config.reset_routes` on the colour's configuration address, as the SDK's
        allreduce library writes it; a core the flow does not cross clears the colour)."""
        col = self.color(flow.color)
        relay = phase in streams.RELAY_PHASES
        pieces = []
        for box, cfg in self.own_cells(flow):
            rxtx = cfg.phase(phase) or (None if relay else cfg.initial)
            if rxtx is not None:
                pieces.append((box, routes_struct(*rxtx)))
        return percore.branch(pieces, self.cls.boxes,
                              lambda v: f"tc.color_config.reset_routes(tc.color_config.get_color_config_addr({col}), {v});",
                              None if relay else f"rt.clear_routes({col});")

    def switch_stmts(self, flow: Flow) -> list[str]:
        """Switch positions of a chain router (installed at run time): position 1 takes the ramp."""
        col = self.color(flow.color)
        out = [f"tc.switch_config.clear_current_position({col});",
               f"tc.switch_config.set_invalid_for_all_switch_positions({col});"]
        pieces = [(box, 1) for box, cfg in self.own_cells(flow) if cfg.switch]
        if pieces:  # ring and pop mode stay as the layout set them (alloc.switched_colors)
            out += percore.branch(pieces, self.cls.boxes,
                                  lambda v: [f"tc.switch_config.set_rx_switch_pos1({col}, RAMP);"], None)
        return out

    def const(self, name: str, typ: str, value: str, comment: str = "") -> str:
        """A per-core comptime constant (declared once)."""
        if name not in self._consts:
            self._consts.add(name)
            self.consts.append(f"const {name}: {typ} = {value};" + (f" // {comment}" if comment else ""))
        return name

    # ------------------------------------------------------ route handshakes
    def _plan_handshakes(self) -> None:
        """Colours whose teardowns (end of flow of a drained flow) cross this class's routers."""
        self.td_colors: dict[int, list[str]] = dict(hsk.teardown_colors(self.p)[self.cls.name])
        self.drains = hsk.class_drains(self.cls)
        self.frozen = hsk.frozen_at_start(self.p, self.cls)

    def td_count(self, flow: Flow) -> str:
        """Teardowns of one step of `flow` that cross this core's router (per-core expression)."""
        plan = self.plan(flow)
        if plan is None:
            return "0"
        return percore.expr(percore.clip_to(plan.td_counts(), self.cls.boxes), self.cls.boxes, 0)

    def drained(self, flow: Flow) -> bool:
        return flow.name in self.sh.drained and flow.color in self.td_colors

    def td_wait_state(self, flow: Flow, comment: str, cond: str | None = None) -> None:
        """Wait until the teardowns expected so far on the flow's colour passed this router."""
        k = flow.color
        test = f"td_seen_{k} < td_mark_{k}"
        if cond:
            test = f"({cond}) and {test}"
        self.state([f"if ({test}) {{", "  td_wait = true;", "  return false;", "}"], False, comment)

    def first_use(self, seg: Segment, flow: str) -> str:
        for e in seg.events():
            if e.flow == flow:
                return "send" if e.kind in ("send", "produce") else "recv"
        return "recv"

    # ---------------------------------------------------------------- states
    def state(self, body: list[str], waits: bool | str, comment: str = "", raw: bool = False) -> None:
        """Append a state. waits: it started an asynchronous transfer or wait (the
        completion re-activates step); a string is the run-time answer (`primed`).
        raw: the body sets pc and returns itself (loops)."""
        if self.notes:  # remarks that belong before the next state's code
            body = self.notes + body
            self.notes = []
        self.states.append((body, waits, comment, raw))

    def emit(self) -> str:
        for s, seg in enumerate(self.cls.segments):
            self.emit_segment(s, seg)
            for b in self.cls.boundaries:
                if b.source == seg.index:
                    self.emit_boundary(b)
        self.fit_rings()
        self.a.sram_bytes = self.sram_bytes()
        return self.render()

    def fit_rings(self) -> None:
        """The host's rings as deep as the IR's per-core budget leaves (at least one entry
        each): the first stage's prompt ring first, then the sampler's token ring in what
        is left (a class may hold both)."""
        prompt, token = 4 * self.slots, 4 * self.slots * TOK_WORDS  # bytes a unit of depth
        room = self.sh.lim.target.usable_sram_bytes - (self.sram_bytes()  # the arrays less the rings
                                                       - prompt * self.prompt_ring * self.admits
                                                       - token * self.token_ring * self.emits_tokens)
        if self.admits:
            self.prompt_ring = max(1, min(PROMPT_RING, room // prompt))
            room -= prompt * self.prompt_ring
        if self.emits_tokens:
            self.token_ring = max(1, min(TOKEN_RING, room // token))

    def emit_segment(self, s: int, seg: Segment) -> None:
        label = f"segment {seg.index} ({len(seg.subs)} sub-schedule(s))"
        if seg.grants:
            self.notes.append("// grant [" + ", ".join("@" + f for f in seg.grants) + "]: open since the "
                              "layout configured segment 0 (route handshakes: handshakes.py)")
        sync_here = any(b.source == seg.index and b.sync is not None for b in self.cls.boundaries)
        awaits: dict[str, list[str]] = {}
        for a in seg.awaits:
            t, f = a[1:].split("::@", 1)
            awaits.setdefault(f, []).append("@" + t)
        last_send = {}
        for i, e in enumerate(seg.events()):
            if e.kind == "send":
                last_send[e.flow] = i
        pending_meta: set[str] = set()
        idx = 0
        for sub in seg.subs:
            for e in sub.events:
                first = idx == 0
                idx += 1
                comment = f"{label}: " if first else ""
                comment += f"@{sub.kernel} \"{sub.role}\": "
                flow = self.p.flows.get(e.flow) if e.flow else None
                st = self.values.step(e)  # its buffers (values.py)
                if e.kind == "resolve":
                    if flow is not None and self.relay_here(flow):
                        raise MeshrtError(
                            f"core class @{self.cls.name}: a metainfo resolver on the relayed flow "
                            f"@{flow.name} is not supported by the CSL backend", self.cls.op)
                    self.emit_resolve(s, e, flow, comment)
                    pending_meta.add(e.flow)
                elif e.kind == "recv":
                    self.emit_recv(s, e, flow, st.target, e.flow in pending_meta, comment)
                    pending_meta.discard(e.flow)
                elif e.kind == "compute":
                    if st.promote is not None:
                        n = self.pe_reads(e)  # a body's whole input, else as before
                        if n is None:
                            n = min(self.nx, self.cap.get(st.promote, self.values.saved.get(st.promote, self.ny)))
                        self.need("x", n)
                        if st.promote in self.cap:
                            self.need(st.promote, n)
                        what = ("the previous kernel's output" if st.promote == "y" else
                                f"held in {st.promote}")
                        self.state([f"@fmov{self.sh.sfx}({self.mem('x', n)}, {self.mem(st.promote, n)});"],
                                   False, comment + f"input is {what}")
                        comment = ""
                    fn = self.emit_compute(e, sub, st)
                    self.state([f"{fn}();"], False, comment + f"compute \"{e.name}\" ({e.work} ops)")
                elif e.kind == "produce":
                    self.state([f"produce_{e.name}();"], False,
                               comment + f"metainfo producer: {e.name} onto @{e.flow} ({e.meta} B)")
                elif e.kind == "send":
                    if e.flow in awaits:
                        self.notes.append(f"// await [{', '.join(t + '::@' + e.flow for t in awaits.pop(e.flow))}]: "
                                          "held by the fabric until those routers open the colour")
                    pos = list(seg.events()).index(e)
                    plan = self.plan(flow) if flow.color is not None else None
                    marker = (sync_here and last_send.get(e.flow) == pos and flow.color is not None
                              and self.a.marker_task is not None
                              and not (plan is not None and plan.scheme == RELAY))
                    self.emit_send(s, e, flow, st.source, comment, marker)
                if st.saves:
                    for src, _, n in st.saves:
                        self.need(src, n)
                    self.state([f"@fmov{self.sh.sfx}({self.mem(into, n)}, {self.mem(src, n)});"
                                for src, into, n in st.saves], False,
                               f"keep {', '.join(into for _, into, _ in st.saves)}: a later kernel reads it")

    # -------------------------------------------------------------- metainfo
    def meta_task(self, s: int, flow: Flow) -> str:
        key = flow.color if self.sh.arch == "wse2" else self.a.iq.queue(s, flow.color)
        return f"meta_tid_{key}"

    def emit_resolve(self, s: int, e: Event, flow: Flow, comment: str) -> None:
        n = e.meta_words
        prime = self.prime_copy(flow, f"meta_in_{e.name}", "meta", n) if e.primed else []
        if flow.cross:
            self.emit_xw_wait(e, flow, comment + f"resolver: take {n} metainfo wavelet(s) of @{flow.name} "
                              "ahead of its data (the host relays it over the wafer link)")
            self.primed_state(e, flow, prime, [f"rt.copy_words(&meta_in_{e.name}, &xin_meta_{flow.xw_index}, {n});"],
                              False, f"resolver: {e.name}: its metainfo")
            self.state([f"resolve_{e.name}();"], False, f"resolver: {e.name}")
            return
        tid = self.meta_task(s, flow)
        self.primed_state(e, flow, prime, [f"meta_dst = &meta_in_{e.name};", f"meta_need = {n};", "meta_got = 0;",
                                           f"@unblock({tid});"], True,
                          comment + f"resolver: take {n} metainfo wavelet(s) of @{flow.name} ahead of its data")
        self.state([f"resolve_{e.name}();"], False,
                   f"resolver: {e.name} (update the {'RDT' if e.name == 'continuous_batching' else 'routing table'})")

    def host_buffer(self, sym: str, n: int, typ: str, comment: str) -> tuple[str, str]:
        """Declarations of an array the host reads or writes by memcpy (exported as `sym`)."""
        self.exports.append((sym, f"{sym}_ptr", f"[*]{typ}"))
        self.a.symbols[sym] = (n, typ)
        return f"var {sym} = @zeros([{n}]{typ}); // {comment}", f"var {sym}_ptr: [*]{typ} = &{sym};"

    # ------------------------------------------------------- host priming
    def primed_state(self, e: Event, flow: Flow, prime: list[str], lines: list[str], waits: bool,
                     comment: str, last: bool = False) -> None:
        """A state of a loop-carried receive: while host-loaded messages are left
        (one per micro-batch in flight, `prime_*`), `prime` takes the message from
        them instead of `lines` taking it from the fabric; `last` (the data) uses
        the message up."""
        if not e.primed:
            self.state(lines, waits, comment)
            return
        left = f"prime_left_{flow.ident}"
        body = [f"if ({left} > 0) {{", "  // the host loaded this micro-batch's first message (run.py)",
                *("  " + x for x in prime)]
        if last:
            body.append(f"  {left} -= 1;")
        body += ["  primed = true;", "} else {", *("  " + x for x in lines), "  primed = false;", "}"]
        self.state(body, "primed" if waits else False, comment)

    def prime_copy(self, flow: Flow, dst: str, what: str, n: int) -> list[str]:
        """Copy n words of the next host-loaded message (`what`: data | meta) into dst."""
        src = f"prime_{flow.ident}" if what == "data" else f"prime_meta_{flow.ident}"
        words, meta = self.primed[flow.name]
        stride = words if what == "data" else meta
        return [f"for (@range(u16, {n})) |i| {{",
                f"  {self.ident(dst)}[i] = {src}[({self.groups} - prime_left_{flow.ident}) * {stride} + i];", "}"]

    # ------------------------------------------------------------ transfers
    def phase(self, flow: Flow, which: str) -> list[str]:
        """Route statements that switch this core's router to the flow's `which`
        phase (before a receive or a send); a drained flow first waits until the
        teardowns of the previous phase passed the router."""
        if flow.color is None or not self.is_phased_here(flow) or self.relay_here(flow):
            return []
        if self.drained(flow):
            self.td_wait_state(flow, f"@{flow.name}: the previous phase's end-of-flow teardown passed "
                               "this router before it switches")
        return [f"// {which} phase of this router for @{flow.name}"] + self.route_stmts(flow, which)

    def emit_xw_wait(self, e: Event, flow: Flow, comment: str) -> None:
        k = flow.xw_index
        self.primed_state(e, flow, [], [f"if (xin_seq_{k} == xin_seen_{k}) {{",
                                        f"  return false; // xin_{k}_ready() re-activates step",
                                        "}", f"xin_seen_{k} += 1;"], False, comment)

    def need(self, buf: str, n: int) -> None:
        """A transfer of n elements uses `buf`: it is declared at least that long (a
        working array grows; the PE level sized every other)."""
        if buf in self.cap:
            self.cap[buf] = max(self.cap[buf], n)
            return
        a = self.level.arrays.get(buf)
        have = a.elems if a is not None else None
        if have is None or have < n:
            raise MeshrtError(f"core class @{self.cls.name}: a transfer of {n} elements uses array {buf}, "
                              f"which {'has ' + str(have) if have is not None else 'the PE level does not declare'}",
                              self.cls.op)

    def loop(self, count: str, steps: list[tuple[str | None, list[str], str]], comment: str,
             tail: list[str] | None = None, cond: str | None = None) -> None:
        """States that run `steps` (condition, transfer lines, comment) once per
        message, `count` times (`lp_i` counts); each transfer is asynchronous.
        `cond`: the whole loop runs only on cores where it holds."""
        self.lp_used = True
        self.state(["lp_i = 0;"], False, comment)
        top = len(self.states)
        end = top + len(steps)
        limit = f"lp_i >= {count}" if cond is None else f"!({cond}) or lp_i >= {count}"
        for i, (c, lines, note) in enumerate(steps):
            nxt = top + i + 1
            body = [f"if ({limit}) {{", f"  pc = {end};", "  return true;", "}"] if i == 0 else []
            if c is not None:
                body += [f"if (!({c})) {{", f"  pc = {nxt if i < len(steps) - 1 else top};"]
                if i == len(steps) - 1:
                    body.append("  lp_i += 1;")
                body += ["  return true;", "}"]
            body += lines
            if i == len(steps) - 1:
                body += ["lp_i += 1;", f"pc = {top};"]
            else:
                body.append(f"pc = {nxt};")
            body.append("return false;")
            self.state(body, True, note, raw=True)
        self.state(tail or ["// every message of the loop is through"], False, "")

    def meta_buf(self, flow: Flow) -> str:
        kind = flow.meta_kind
        return f"meta_out_{kind}" if kind in self.meta_out_words else f"meta_in_{kind}"

    def recv_steps(self, s: int, e: Event, flow: Flow, target: str, meta_cond: str | None,
                   tag: str = "", add: bool = False) -> list[tuple[str | None, list[str], str]]:
        """A message's receive: its metainfo (unless `meta_cond` says the resolver
        took it), then its data into target, or added to target (`add`)."""
        n = e.elems
        steps = []
        if e.meta:
            fim = self.fab("fabin", flow, s, e.meta_words, "meta")
            steps.append((meta_cond, [f"rt.recv_words({self.mem('meta_in_' + flow.meta_kind, e.meta_words)}, "
                                      f"{fim});{tag}"], f"receive @{flow.name}: {e.meta} B of metainfo"))
        fi = self.fab("fabin", flow, s, n)
        steps.append((None, [f"rt.recv_{'add_' if add else ''}{self.xfer(target)}({self.mem(target, n)}, {fi});{tag}"],
                      f"receive @{flow.name}: {e.nbytes} B " + ("added to " if add else "into ") + target))
        return steps

    def send_steps(self, s: int, e: Event, flow: Flow, src: str,
                   tag: str = "") -> list[tuple[str | None, list[str], str]]:
        n = e.elems
        steps = []
        if e.meta:
            fom = self.fab("fabout", flow, s, e.meta_words, "meta")
            steps.append((None, [f"rt.send_words({fom}, {self.mem(self.meta_buf(flow), e.meta_words)});{tag}"],
                          f"send @{flow.name}: {e.meta} B of metainfo ahead of the data"))
        fo = self.fab("fabout", flow, s, n)
        steps.append((None, [f"rt.send_{self.xfer(src)}({fo}, {self.mem(src, n)});{tag}"],
                      f"send @{flow.name}: {e.nbytes} B from {src}"))
        return steps

    def emit_recv(self, s: int, e: Event, flow: Flow, target: str, meta_taken: bool, comment: str) -> None:
        n = e.elems
        self.need(target, n)
        prime, prime_meta = [], []
        if e.primed:
            prime = self.prime_copy(flow, target, "data", n)
            if e.meta and not meta_taken:
                prime_meta = self.prime_copy(flow, f"meta_in_{flow.meta_kind}", "meta", e.meta_words)
        if flow.cross:
            if not meta_taken:  # else the resolver waited for this message
                self.emit_xw_wait(e, flow, comment + f"receive @{flow.name} from the host (wafer link)")
            body = [self.copy(target, f"xin_{flow.xw_index}", n)]
            if e.meta and not meta_taken:
                body.append(f"rt.copy_words(&meta_in_{flow.meta_kind}, &xin_meta_{flow.xw_index}, {e.meta_words});")
            note = f"{e.nbytes} B into {target}" if not meta_taken else \
                comment + f"receive @{flow.name} from the host (wafer link): {e.nbytes} B into {target}"
            self.primed_state(e, flow, prime + prime_meta, body, False, note, last=True)
            return
        plan = self.plan(flow)
        msgs = plan.messages if plan is not None else 1
        if e.primed and (msgs > 1 or self.relay_here(flow)):
            raise MeshrtError(f"core class @{self.cls.name}: the loop-carried flow @{flow.name} has {msgs} "
                              "senders; the CSL backend primes (host-loads) single-sender flows only", self.cls.op)
        if self.relay_here(flow):
            self.emit_relay(s, e, flow, target, comment)
            return
        pre = self.phase(flow, "recv")
        if msgs > 1 or flow.op.is_routed:
            if pre:
                self.state(pre, False, f"@{flow.name}: receive phase")
            self.state([f"@fmov{self.sh.sfx}({self.mem(target, n)}, 0.0);"], False,
                       comment + f"@{flow.name}: {msgs} senders serialised by the switch chain; their "
                       f"messages are summed into {target} as they arrive")
            steps = self.recv_steps(s, e, flow, target, "lp_i > 0" if meta_taken else None, add=True)
            count, what = str(msgs), f"{msgs} message(s) of {e.nbytes} B, one per sender"
            if flow.op.is_routed:  # only the senders whose regions a token chose send
                count = self.routed_count(flow)
                what = (f"one message of {e.nbytes} B from each of its {msgs} senders whose "
                        f"region a token chose ({count})")
            self.loop(count, steps, f"receive @{flow.name}: {what}")
            return
        if e.meta and not meta_taken:
            fim = self.fab("fabin", flow, s, e.meta_words, "meta")
            self.primed_state(e, flow, prime_meta,
                              pre + [f"rt.recv_words({self.mem('meta_in_' + flow.meta_kind, e.meta_words)}, {fim});"],
                              True, comment + f"receive @{flow.name}: {e.meta} B of metainfo ahead of the data")
            pre, comment = [], ""
        fi = self.fab("fabin", flow, s, n)
        tail = []
        if self.drained(flow) and self.is_phased_here(flow):
            tail = [f"td_mark_{flow.color} += 1; // the sender's end-of-flow teardown follows the data"]
        self.primed_state(e, flow, prime, pre + [f"rt.recv_{self.xfer(target)}({self.mem(target, n)}, {fi});"] + tail,
                          True, comment + f"receive @{flow.name}: {e.nbytes} B into {target}", last=True)

    def emit_send(self, s: int, e: Event, flow: Flow, src: str, comment: str, marker: bool = False) -> None:
        n = e.elems
        self.need(src, n)
        if flow.cross:
            k = flow.xw_index
            body = [self.copy(f"xout_{k}", src, n)]
            if e.meta:
                body.append(f"rt.copy_words(&xout_meta_{k}, &{self.meta_buf(flow)}, {e.meta_words});")
            body.append(f"xout_seq_{k}[0] += 1; // the host polls it, then relays the message")
            self.state(body, False, comment + f"send @{flow.name} to the next wafer via the host")
            return
        if self.relay_here(flow):
            self.need("x", n)
            self.state([f"@fmov{self.sh.sfx}({self.mem('x', n)}, {self.mem(src, n)}); // [stage] @{flow.name} {n}"],
                       False, comment + f"stage @{flow.name} ({e.nbytes} B): this core's contribution, "
                       "which the relay along the receiver line sums (see the receive)")
            return
        pre = self.phase(flow, "send")
        routed = flow.op.is_routed
        if routed:  # only a region a token chose sends (see event.flow `routed`)
            pre = pre + self.routed_flag(flow)

        def sending(line: str, what: str) -> None:
            nonlocal pre, comment
            if routed:
                self.state(pre + ["if (routed_data) {", "  " + line, "}"], "!routed_data",
                           comment + what + " if a token chose this region")
            else:
                self.state(pre + [line], True, comment + what)
            pre, comment = [], ""

        if e.meta:
            fom = self.fab("fabout", flow, s, e.meta_words, "meta")
            sending(f"rt.send_words({fom}, {self.mem(self.meta_buf(flow), e.meta_words)});",
                    f"send @{flow.name}: {e.meta} B of metainfo ahead of the data")
        fo = self.fab("fabout", flow, s, n)
        sending(f"rt.send_{self.xfer(src)}({fo}, {self.mem(src, n)});", f"send @{flow.name}: {e.nbytes} B from {src}")
        self.after_send(s, flow, marker)

    def routed_regions(self, flow: Flow):
        """The expert regions of routed `flow` and the placement table (a comptime
        constant); `meshrt.kernels.expert_reduce.routed` is the rule."""
        from meshrt.kernels.expert_reduce.routed import RoutedSenders

        rs = RoutedSenders.of(self.p.op, flow.op)
        return rs, self.placement_table(rs)

    def placement_table(self, rs) -> str:
        """The comptime constant of `rs`'s placement (expert -> region, as compiled)."""
        return self.const(f"placement_{plain_identifier(rs.kernel)}", f"[{rs.experts}]i16",
                          f"[{rs.experts}]i16 {{ " + ", ".join(map(str, rs.placement)) + " }",
                          f"@{rs.kernel}: expert -> region, as compiled")

    def expert_region(self, rs) -> str:
        """The comptime constant saying which of `rs`'s expert regions holds this core
        (-1: none)."""
        pieces = percore.clip_to([(b, i) for i, r in enumerate(rs.regions) for b in r.boxes],
                                 self.cls.boxes)
        return self.const(f"expert_region_{plain_identifier(rs.kernel)}", "i16",
                          percore.expr(pieces, self.cls.boxes, -1),
                          f"@{rs.kernel}: the expert region of this core")

    def experts_held(self):
        """(regions, placement table, this core's region) of the expert kernel this class
        runs with the kind's legacy CSL bodies, or None: which tokens those compute (`mine`,
        set by the routing resolver: a token chose an expert its region holds; the PE
        bodies read the routing table themselves)."""
        from meshrt.backend.csl.pe_level import class_bodies
        from meshrt.kernels.expert_reduce.routed import RoutedSenders

        for seg in self.cls.segments:
            for sub in seg.subs:
                if (sub.kernel in self.p.records and self.p.kind_of(sub).PLACES_EXPERTS
                        and class_bodies(self.p, self.cls, sub) is None):
                    rs = RoutedSenders.of_experts(self.p.op, self.p.record(sub))
                    return rs, self.placement_table(rs), self.expert_region(rs)
        return None

    def routed_flag(self, flow: Flow) -> list[str]:
        """Whether this core's expert region sends on routed `flow` this step
        (`routed_data`): a shared expert's region always, else when a (token, choice) of
        the resolved routing table names an expert the region holds. A region that
        sends nothing still advances its switch chain (after_send)."""
        rs, table = self.routed_regions(flow)
        here = self.expert_region(rs)
        self.routed_vars["routed_data"] = "var routed_data: bool = false; // this region sends on its routed flow"
        return [f"routed_data = {here} >= {rs.routed_regions}; // a shared expert's region: always",
                f"for (@range(u16, {self.b * self.choices})) |i| {{",
                f"  if (rt_expert[i] < {rs.experts}) {{ // (larger ids: the shared experts)",
                f"    if ({table}[rt_expert[i]] == {here}) {{",
                "      routed_data = true;",
                "    }",
                "  }",
                "}"]

    def routed_count(self, flow: Flow) -> str:
        """A state that counts the messages this core receives on routed `flow` this
        step: from each region the resolved routing chose (and each shared expert's),
        as many as the region has senders that target this core. Returns the count's
        variable."""
        rs, table = self.routed_regions(flow)
        pattern = flow.op.pattern.data
        src = RectSet(b for r in flow.op.src.rects for b in rect_boxes(r))
        counts = []
        for region in rs.regions:
            senders = region & src
            if pattern == "row":  # the region's senders on each of this class's rows
                per_core = {(senders & RectSet([(0, y, 1 << 30, y + 1)])).count
                            for b in self.cls.boxes for y in range(b[1], b[3])}
            else:
                per_core = {senders.count}
            if len(per_core) > 1:
                raise MeshrtError(f"core class @{self.cls.name}: the routed flow @{flow.name} brings its "
                                  "cores different numbers of messages from one expert region; the CSL "
                                  "backend counts them per class", self.cls.op)
            counts.append(per_core.pop())
        n = len(rs.regions)
        per_region = self.const(f"from_region_{flow.ident}", f"[{n}]u16",
                                f"[{n}]u16 {{ " + ", ".join(map(str, counts)) + " }",
                                f"@{flow.name}: messages from each expert region's senders")
        var = f"routed_msgs_{flow.ident}"
        self.routed_vars[var] = f"var {var}: u16 = 0; // @{flow.name}: messages this step"
        self.routed_vars["region_hit"] = f"var region_hit = @zeros([{max(n, self._hit_len)}]u16);"
        self._hit_len = max(n, self._hit_len)
        self.state([f"for (@range(u16, {n})) |r| {{",
                    f"  region_hit[r] = if (r >= {rs.routed_regions}) 1 else 0; // shared experts: always",
                    "}",
                    f"for (@range(u16, {self.b * self.choices})) |i| {{",
                    f"  if (rt_expert[i] < {rs.experts}) {{ // (larger ids: the shared experts)",
                    f"    region_hit[{table}[rt_expert[i]]] = 1;",
                    "  }",
                    "}",
                    f"{var} = 0;",
                    f"for (@range(u16, {n})) |r| {{",
                    f"  {var} += region_hit[r] * {per_region}[r];",
                    "}"], False,
                   f"@{flow.name}: the senders whose regions the routing chose send")
        return var

    def after_send(self, s: int, flow: Flow, marker: bool, cond: str | None = None) -> None:
        """Control wavelets behind a message, on the same output queue (FIFO): the
        marker, the switch-chain advance, the end-of-flow teardown."""
        if flow.color is None:
            return
        plan = self.plan(flow)
        ctl = self.fab("fabout", flow, s, 1, "ctl")

        def guard(lines: list[str], c: str | None) -> list[str]:
            return lines if c is None else [f"if ({c}) {{", *("  " + x for x in lines), "}"]

        if marker:
            self.state(guard([f"@mov32({ctl}, ctrl.encode_control_task_payload(marker_id));"], cond),
                       False, f"marker behind the last message on @{flow.name}")
        chained = plan is not None and plan.chain is not None and self.is_switched_here(flow)
        if chained:
            heads = percore.clip_to([(b, v) for b, v in plan.roles() if v == ROLE_HEAD], self.cls.boxes)
            adv = self.const(f"adv_{flow.ident}", "u32",
                             percore.expr(heads, self.cls.boxes, 0,
                                          lambda v: "rt.adv_own" if v == ROLE_HEAD else "rt.adv_own_next"),
                             f"@{flow.name}: switch commands behind this core's message")
            self.state(guard([f"@mov32({ctl}, {adv});"], cond), False,
                       f"@{flow.name}: advance this router (back to forwarding) and the next chain "
                       "router (to its own ramp)")
        if flow.name in self.sh.drained:
            lines = [f"@mov32({ctl}, rt.end_of_flow);"]
            if self.drained(flow) and self.is_phased_here(flow):
                lines.append(f"td_mark_{flow.color} += 1; // it passes this router too")
            c = cond
            if chained:
                first = percore.clip_to([(b, v) for b, v in plan.roles() if v == ROLE_FIRST], self.cls.boxes)
                if not first:
                    return
                fc = self.const(f"first_{flow.ident}", "bool",
                                percore.expr(first, self.cls.boxes, 0, lambda v: "true" if v else "false"),
                                f"@{flow.name}: this core starts the switch chain")
                c = fc if c is None else f"({c}) and {fc}"
            self.state(guard(lines, c), False, f"@{flow.name}: end of flow for this step (teardown "
                       "wavelet; some class drains the flow)")

    # ----------------------------------------------------------------- relay
    def relay_index(self, flow: Flow) -> str:
        r = self.plan(flow).relay
        return self.const(f"rl_{flow.ident}", "u16", r.index_expr(), f"@{flow.name}: this core's place on the relay line")

    def emit_relay(self, s: int, e: Event, flow: Flow, target: str, comment: str) -> None:
        """The receive of a relayed flow: a sum along the receiver line. Forward,
        r_i adds what reaches it (r_0: the chained senders' messages; r_i: r_{i-1}'s
        running sum) to its own staged contribution in x and passes the running sum
        on; r_{m-1} then holds the value, and the backward pass hands it down the
        line. One message per hop and pass (r_0: one per chained sender)."""
        plan = self.plan(flow)
        r = plan.relay
        i = self.relay_index(flow)
        n = e.elems
        if target != "x":
            raise MeshrtError(f"core class @{self.cls.name}: the relayed flow @{flow.name} must arrive "
                              "in the kernel's input", self.cls.op)
        m, o = r.m, r.others
        drained = self.drained(flow)
        k = flow.color
        tag = " // relay"
        self.notes.append(f"// @{flow.name}: relay along the receiver line ({m} core(s), {o} sender(s) "
                          "chained into its start): running sums forward, the value back")
        first_count = "1" if o == 0 else f"(if ({i} == 0) {o} else 1)"
        passes = [
            ("fwd_recv", f"{i} > 0" if r.entry is None else None, first_count, True, "add"),
            ("fwd_send", f"{i} < {m - 1}", "1", False, "x"),
            ("bwd_recv", f"{i} < {m - 1}", "1", True, "x"),
            ("bwd_send", f"{i} > 0", "1", False, "x"),
        ]
        first = True
        for name, cond, count, recv, how in passes:
            if m == 1 and name != "fwd_recv":
                continue
            if drained:
                self.td_wait_state(flow, f"@{flow.name} {name}: the previous pass's teardown passed", cond)
            head = comment if first else ""
            first = False
            routes = [f"// {name} phase of this router for @{flow.name}"] + [
                x for x in self.route_stmts(flow, name)]
            self.state(routes if cond is None else [f"if ({cond}) {{", *("  " + x for x in routes), "}"],
                       False, head + f"relay @{flow.name}: {name.replace('_', ' ')}")
            if recv:  # forward: added to the running sum in x; backward: the value, into x
                steps = self.recv_steps(s, e, flow, "x", None, tag, add=how == "add")
            else:
                steps = self.send_steps(s, e, flow, "x", tag)
            tail = []
            if drained:
                if recv:
                    tail += [f"td_mark_{k} += 1; // the neighbour's end-of-flow teardown follows"]
                else:
                    ctl = self.fab("fabout", flow, s, 1, "ctl")
                    tail += [f"@mov32({ctl}, rt.end_of_flow);", f"td_mark_{k} += 1;"]
            if tail and cond is not None:
                tail = [f"if ({cond}) {{", *("  " + x for x in tail), "}"]
            self.loop(count, steps, f"relay @{flow.name}: {name.replace('_', ' ')}, {count} message(s)",
                      tail or None, cond)
        self.state([f"// [relay] @{flow.name} {n}"], False, f"relay @{flow.name} done")

    # ------------------------------------------------------------- boundary
    def emit_boundary(self, b) -> None:
        what = f"boundary {b.source} -> {b.dest}"
        if b.sync is not None and self.a.marker_task is not None:
            pieces = self.sh.marker_counts.get((self.cls.name, b.source), [])
            need = percore.expr(pieces, self.cls.boxes, 0)
        if b.sync is not None and self.a.marker_task is not None and need == "0":
            self.notes.append(f"// {what}: marker sync over <{b.sync.over}>: no marked flow reaches "
                              "this class, so there is nothing to wait for")
        elif b.sync is not None and self.a.marker_task is not None:
            self.state(["marker_need = " + need + ";", "if (markers < marker_need) {",
                        "  marker_wait = true;", "  pc += 1;", "  return false;", "}"],
                       False, f"{what}: marker sync over <{b.sync.over}>: wait for the markers "
                       "behind the last messages of the closing segment")
            self.state(["markers -= marker_need;"], False, "every expected marker is in: nothing of "
                       "the closing segment is in flight here")
        # drain [@F]: the end-of-flow teardowns of every credited step have passed this router
        for f in b.drain:
            flow = self.p.flows.get(f)
            if flow is None or flow.color is None or flow.color not in self.td_colors:
                continue
            k = flow.color
            self.state([f"if (td_seen_{k} < td_hold_{k}) {{", "  td_wait = true;", "  return false;", "}",
                        f"td_hold_{k} = 0; // colour {k} stays in teardown until its next install"],
                       False, f"{what}: drain @{f}: wait until its end-of-flow teardowns passed this "
                       "router (the colour is then frozen)")
        body = []
        dst = next(s for s in self.cls.segments if s.index == b.dest)
        installed = {}
        for f in b.install:
            flow = self.p.flows.get(f)
            if flow is None or flow.color is None:
                continue
            installed[flow.color] = flow
        for f in b.release:
            flow = self.p.flows.get(f)
            if flow is None or flow.color is None or flow.color in installed:
                continue
            if f in b.drain and flow.color in self.td_colors:
                body.append(f"// release @{f}: colour {flow.color} stays in teardown (drained above)")
            else:
                body.append(f"rt.clear_routes({self.color(flow.color)}); // release @{f}")
        notify = set(b.notify)
        for c, flow in sorted(installed.items()):
            phase = (self.first_use(dst, flow.name)
                     if self.is_phased_here(flow) and not self.relay_here(flow) else "static")
            body.append(f"// install @{flow.name}" + (" (notify)" if flow.name in notify else ""))
            # The route first: switch position 1 inherits from position 0 (the SDK's allreduce).
            body += self.route_stmts(flow, phase)
            if c in self.a.switched:  # switch-chain colours at this class's routers (alloc)
                body += self.switch_stmts(flow)
            if c in self.td_colors:
                n = self.td_count(flow)  # a per-core `if` expression is an operand only in parentheses
                hold = f"td_seen_{c} + {n if n.isdigit() else f'({n})'}" if flow.name in self.drains else "0"
                body += [f"td_hold_{c} = {hold};",
                         f"if (td_held_{c}) {{",
                         f"  tc.teardown.exit({self.color(c)}); // the route opens: the install credit",
                         f"  td_held_{c} = false;", "}"]
        dest_pos = [i for i, s in enumerate(self.cls.segments) if s.index == b.dest][0]
        for q, c in self.a.iq.rebinds.get(dest_pos, []):
            body.append(f"rt.rebind_input_queue({q}, {c}); // UNVERIFIED register (docs/csl-backend.md)")
        for q, c in self.a.oq.rebinds.get(dest_pos, []):
            body.append(f"rt.rebind_output_queue({q}, {c}); // UNVERIFIED register (docs/csl-backend.md)")
        if not body:
            body = ["// no route of this core's router changes"]
        self.state(body, False, f"{what}: reconfigure this core's router "
                   f"(release {len(b.release)}, install {len(b.install)})")

    # --------------------------------------------------------------- compute
    def region(self, sub) -> tuple[str, int, int] | None:
        return self.sub_region.get(id(sub))

    def pe_reads(self, e: Event) -> int | None:
        """Elements of x the PE body of compute event `e` reads (None: it has none)."""
        fn = self.level.calls.get(id(e))
        if fn is None:
            return None
        return max((n for name, n in _arrays_of(fn) if name == "x"), default=None)

    def pe_lines(self, sub, e: Event) -> list[str] | None:
        """The CSL of compute event `e` where the class's PE-level module gives it a body
        (`pe_level.py`), else None. The body's arrays are this program's: x, y, p, scale
        and the kept values by name, a kernel's resident arrays at their offsets in the
        sub-schedule's region, a kernel's own arrays by their CSL names."""
        fn = self.level.calls.get(id(e))
        if fn is None:
            return None
        renames: dict[str, tuple[str, int]] = {}
        resident: set[str] = set()
        used: dict[str, int] = {}
        for name, n in _arrays_of(fn):
            used[name] = max(used.get(name, 0), n)
        for name, n in used.items():
            if name in ("x", "y"):
                self.need(name, n)
            elif name == "p":
                if not self.has_p:
                    raise MeshrtError(f"internal error: kernel @{sub.kernel}'s body reads p, which core "
                                      f"class @{self.cls.name} does not have", self.cls.op)
                self.need("p", n)
            elif name == "scale":
                if n > self.b:
                    raise MeshrtError(f"internal error: kernel @{sub.kernel}'s scale needs {n} "
                                      f"elements, the program has {self.b}", self.cls.op)
            elif name in ("rdt", "mb"):
                if n > (self.slots * 4 if name == "rdt" else 1):
                    raise MeshrtError(f"core class @{self.cls.name}: kernel @{sub.kernel}'s body uses "
                                      f"{n} entries of the request descriptor table {name}, which "
                                      f"has {self.slots * 4 if name == 'rdt' else 1}", self.cls.op)
            elif name in ("rt_expert", "rt_weight"):
                if n > self.b * self.choices:
                    raise MeshrtError(f"core class @{self.cls.name}: kernel @{sub.kernel}'s body uses "
                                      f"{n} entries of the routing table {name}, which has "
                                      f"{self.b * self.choices}", self.cls.op)
            elif name in self.level.arrays:
                arr = self.level.arrays[name]
                size, off = arr.elems, arr.offset
                if n > size:
                    raise MeshrtError(f"core class @{self.cls.name}: kernel @{sub.kernel} reads {n} "
                                      f"elements of {name}, which has {size}", self.cls.op)
                if arr.own:
                    renames[name] = (self.ident(name), 0)
                if off is not None:  # resident: at its offset in the sub-schedule's region
                    reg = self.region(sub)
                    if reg is None or reg[2] < off + n:
                        raise MeshrtError(f"internal error: kernel @{sub.kernel}'s resident '{name}' "
                                          f"ends at element {off + n}, its region holds "
                                          f"{reg[2] if reg else 0}", self.cls.op)
                    renames[name] = (reg[0], reg[1] + off)
                    resident.add(name)
            else:
                raise MeshrtError(f"core class @{self.cls.name}: kernel @{sub.kernel}'s body uses an "
                                  f"array '{name}' the program does not have", self.cls.op)
        before: list[str] = []
        after: list[str] = []
        if self.sh.elem != "f32":
            # 16-bit activations: the body runs on float32 copies (`<array>32`), converted
            # in before it and out after it (@fh2s / @fs2h), so it computes as it does in
            # the interpreter; the resident values are converted from their region.
            as_f32 = _float32_arrays(fn)
            for name, n in used.items():
                if name not in as_f32 or self.elem_of(name) != self.sh.elem:
                    continue  # float32 already, or read in the program's own type
                array, offset = renames.get(name, (name, 0))
                shadow = f"{self.ident(name)}32"  # resident kernel::buf: kernel_buf32
                self.shadows[shadow] = max(self.shadows.get(shadow, 0), n)
                renames[name] = (shadow, 0)
                before.append(f"@fh2s({self.mem(shadow, n)}, {self.mem(array, n, offset)});")
                if name not in resident:
                    after.append(f"@fs2h({self.mem(array, n)}, {self.mem(shadow, n)});")
        self.uses_math |= calls_math(fn)
        return before + body_lines(fn, renames) + after

    def admitted_tokens(self, sub) -> list[str]:
        """Where the first stage fed a request a token of its own this step (the resolver:
        an admitted request's first, a prompt's next), it replaces the sampled one among
        the ids that arrived."""
        kind = self.p.kind_of(sub)
        buf = kind.message_buffer(self.p.record(sub), HParams.of(self.p.op), FlowRole.TOKENS, False)
        tokens = self.ident(kernel_array(sub.kernel, buf))
        return ["// a request admitted or in its prompt this step is fed its token",
                f"for (@range(u16, {self.b})) |j| {{",
                "  if (admit_tok[j] >= 0) {",
                f"    {tokens}[j] = admit_tok[j];",
                "  }",
                "}"]

    def emit_compute(self, e: Event, sub, st) -> str:
        i = len(self.fns)
        name = f"k{i}_{e.name}"
        body = ComputeBody(self, e, sub, st.received).lines()
        if self.admits and registry.compute_op(e.name).admits_requests:
            body = self.admitted_tokens(sub) + body
        self.fns.append("\n".join([f"// @{sub.kernel} \"{sub.role}\": {e.name}, {e.work} ops",
                                   f"fn {name}() void {{", *("  " + l for l in body), "}"]))
        return name

    # ---------------------------------------------------------------- render
    def render(self) -> str:
        sh, a, cls, p = self.sh, self.a, self.cls, self.p
        T = sh.elem
        out: list[str] = []
        add = out.append
        add(f"// meshrt CSL backend: program of core class @{cls.name} (wafer {cls.wafer})")
        add(f"// cores <{', '.join(f'({b[0]}, {b[1]}, {b[2] - b[0]}, {b[3] - b[1]})' for b in cls.boxes)}>: "
            f"{cls.cores} core(s) run this one program; per-core values are comptime params.")
        add(f"// arch {sh.arch} (SDK 1.4 syntax), target {p.target}"
            + ("" if p.target in ("wse2", "wse3") else f" (not a Cerebras part: {sh.arch} syntax)") + ".")
        add("// Generated; checked for CSL syntax (meshrt csl-lint), not compiled by cslc.")
        add("//")
        add("// allocation (use = peak in one segment; capacity = the target's user share)")
        a.rows = report_rows(a, sh.lim)
        for line in format_table([("resource", "use", "cap", "detail")] + a.rows, "//   "):
            add(line)
        add("//")
        for seg in cls.segments:
            add(f"// segment {seg.index}: " + ", ".join(f"@{s.kernel} \"{s.role}\"" for s in seg.subs))
        add("")
        add("param memcpy_params: comptime_struct;")
        add("param px: i16; // this core's column (from the layout loop)")
        add("param py: i16; // this core's row")
        add("param region: i16; // which rectangle of the class holds this core (expert / tile index)")
        for k in sorted(cls.params):
            add(f"param {k}: i16; // class parameter")
        add("")
        add('const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);')
        add('const tc = @import_module("<tile_config>");')
        if self.uses_ctrl:
            add('const ctrl = @import_module("<control>");')
        if self.uses_math:
            add('const math = @import_module("<math>");')
        add("")
        add("// ---- colours (segment.route; memcpy's reserved colours are never used)")
        for c in a.colors:
            flows = sorted({f for seg in cls.segments for f in seg.routes
                            if f in p.flows and p.flows[f].color == c})
            add(f"const {self.color(c)}: color = @get_color({c}); // "
                + ", ".join("@" + f for f in flows[:4]) + (" ..." if len(flows) > 4 else ""))
        add("")
        add("// ---- queues")
        for q in a.iq.used:
            add(f"const {self.iq(q)}: input_queue = @get_input_queue({q});")
        for q in a.oq.used:
            add(f"const {self.oq(q)}: output_queue = @get_output_queue({q});")
        add("")
        add("// ---- task IDs")
        add(f"const step_id: local_task_id = @get_local_task_id({a.step_task});")
        if a.marker_task is not None:
            add(f"const marker_id: control_task_id = @get_control_task_id({a.marker_task});")
        for key in sorted(a.data_tasks):
            src = self.color(key) if sh.arch == "wse2" else self.iq(key)
            add(f"const meta_tid_{key}: data_task_id = @get_data_task_id({src});")
        add("")
        add("// ---- DSD registers for fabric transfers (explicitly allocated, see the report)")
        add(f"const rx_dst = @get_dsr(dsr_dest, {a.dsr_rx});")
        add(f"const rx_src = @get_dsr(dsr_src1, {a.dsr_rx});")
        add(f"const rx_acc = @get_dsr(dsr_src0, {a.dsr_rx}); // receives that add")
        add(f"const tx_dst = @get_dsr(dsr_dest, {a.dsr_tx});")
        add(f"const tx_src = @get_dsr(dsr_src1, {a.dsr_tx});")
        add("")
        add("// ---- buffers: kernel input x, output y, chain partner p; resident state w")
        add(f"var x = @zeros([{self.cap['x']}]{T});")
        add(f"var y = @zeros([{self.cap['y']}]{T});")
        if self.has_p:
            add(f"var p = @zeros([{self.cap['p']}]{T});")
        if self.nw:
            out.extend(self.host_buffer("w", self.nw, T, "weights / KV tiles / embedding rows (host-loaded)"))
        if self.nwq:
            out.extend(self.host_buffer("wq", self.nwq, "u16", "packed sub-16-bit weights (host-loaded)"))
        add(f"var scale = @zeros([{self.b}]f32); // per-slot inverse RMS of a norm")
        for name, n in sorted(self.values.saved.items()):
            add(f"var {name} = @zeros([{n}]{T}); // a value a later kernel reads (values.py)")
        for name, n in sorted(self.shadows.items()):
            add(f"var {name} = @zeros([{n}]f32); // float32 copy the compute bodies run on")
        add(f"var sc = @zeros([{self.b * self.attn_rows}]{T}); // attention scores of this core's KV rows")
        for name, arr in sorted(self.level.arrays.items()):
            if arr.own:
                kernel, buf = name.split("::", 1)
                add(f"var {self.ident(name)} = @zeros([{arr.elems}]{arr.elem}); // @{kernel}'s {buf} (PE level)")
        for kind, n in sorted(self.meta_in.items()):
            add(f"var meta_in_{kind} = @zeros([{n}]u32); // {kind} metainfo that arrived ahead of the data")
        for kind, n in sorted(self.meta_out_words.items()):
            add(f"var meta_out_{kind} = @zeros([{n}]u32); // metainfo this class produces")
        if self.has_rdt:
            out.extend(self.host_buffer("rdt", self.slots * 4, "i32", "request descriptor table: id, status, length, -"))
            add("var mb = @zeros([1]i32); // micro-batch whose slots the current step serves")
        if self.has_rt:
            add(f"var rt_expert = @zeros([{self.b * self.choices}]i32); // routing table: expert per (token, choice)")
        if self.moe:
            for decl in self.routed_vars.values():
                add(decl)
        if self.has_rt:
            add(f"var rt_weight = @zeros([{self.b * self.choices}]f32); // gate weight per (token, choice)")
        if self.moe:
            add(f"var mine = @zeros([{self.b}]u16); // tokens whose expert lives in this core's region")
        admits, emits_tokens = self.admits, self.emits_tokens
        if admits:
            out.extend(self.host_buffer("req", self.slots * REQ_WORDS, "u32", "waiting requests the host pushes: "
                                        "handle, prompt length, output budget, first token"))
            out.extend(self.host_buffer("prm", self.slots * self.prompt_ring, "i32", "each slot's next "
                                        f"prompt tokens, position p at p mod {self.prompt_ring} (the host "
                                        "refills it)"))
            out.extend(self.host_buffer("prm_have", self.slots * HAVE_WORDS, "i32", "per slot: prompt "
                                        "positions below this are in prm, for this request handle"))
            add(f"var admit_tok = @zeros([{self.b}]i32); // the token fed in place of the sampled one (-1: none)")
        if emits_tokens:
            out.extend(self.host_buffer("tok", self.slots * self.token_ring * TOK_WORDS, "u32",
                                        "sampled tokens for the host: request handle, position fed, "
                                        f"token; position p at p mod {self.token_ring} of its slot's"))
        xw_in, xw_out = self.xw_in, self.xw_out
        for k in xw_in:
            out.extend(self.host_buffer(f"xin_{k}", self.xw_elems[k], self.xw_elem[k],
                                        "message from the previous wafer (host relay)"))
            out.extend(self.host_buffer(f"xin_meta_{k}", self.xw_meta[k], "u32", "its metainfo"))
            add(f"var xin_seq_{k}: u16 = 0;")
            add(f"var xin_seen_{k}: u16 = 0;")
        for k in xw_out:
            out.extend(self.host_buffer(f"xout_{k}", self.xw_elems[k], self.xw_elem[k],
                                        "message for the next wafer (host relay)"))
            out.extend(self.host_buffer(f"xout_meta_{k}", self.xw_meta[k], "u32", "its metainfo"))
            out.extend(self.host_buffer(f"xout_seq_{k}", 1, "u32", "messages staged so far (the host polls it)"))
        for name, (words, meta) in self.primed.items():
            f = self.p.flows[name]
            g = self.groups
            add(f"// @{name} is loop-carried: the host loads its first message of each of the {g} micro-batch(es)")
            add("// in flight (run.py); the receive takes them from here, later steps from the fabric.")
            add(f"var prime_left_{f.ident}: u16 = {g};")
            if words:
                out.extend(self.host_buffer(f"prime_{f.ident}", g * words, self.flow_elem.get(name, T), "data"))
            if meta:
                out.extend(self.host_buffer(f"prime_meta_{f.ident}", g * meta, "u32", f"{f.meta_kind} metainfo"))
        if self.primed:
            add("var primed: bool = false; // this state took a host-loaded message (no transfer to wait for)")
        add("var pc: u16 = 0; // state of the event table")
        add("var steps: u32 = 0; // decode steps completed")
        if self.lp_used:
            add("var lp_i: u32 = 0; // message counter of a multi-message transfer")
        meta = MetaCode(self).lines()  # before the constants: it may declare some
        if self.consts:
            add("")
            add("// ---- per-core constants (comptime: px, py are params)")
            out.extend(self.consts)
        if self.td_colors:
            add("")
            add("// ---- route handshakes: end-of-flow teardowns per colour (docs/csl-backend.md)")
            add("var td_wait: bool = false; // the event table waits for a teardown")
            seg0 = cls.segments[0]
            for k in sorted(self.td_colors):
                flows = self.td_colors[k]
                granted = [f for f in flows if f in seg0.grants and f in seg0.routes and f in self.drains]
                frozen = [f for f in flows if f in self.frozen]
                hold = self.td_count(p.flows[granted[0]]) if granted else "0"
                if frozen:
                    fl = p.flows[frozen[0]]
                    pieces = percore.clip_to(self.plan(fl).td_counts(), cls.boxes)
                    held = percore.expr([(b, 1) for b, _ in pieces], cls.boxes, 0,
                                        lambda v: "true" if v else "false")
                else:
                    held = "false"
                add(f"var td_seen_{k}: u32 = 0; // teardowns of colour {k} that passed this router "
                    f"({', '.join('@' + f for f in flows[:3])}{' ...' if len(flows) > 3 else ''})")
                add(f"var td_hold_{k}: u32 = {hold}; // keep the colour in teardown at this count (0: never)")
                add(f"var td_held_{k}: bool = {held}; // in teardown until this class installs its next flow")
                add(f"var td_mark_{k}: u32 = 0; // teardowns due before this router's next phase switch")
        if self.meta_in and a.data_tasks:
            first = sorted(self.meta_in)[0]
            add(f"var meta_dst: [*]u32 = &meta_in_{first}; // where the metainfo data task writes")
            add("var meta_need: u16 = 0;")
            add("var meta_got: u16 = 0;")
        if a.marker_task is not None:
            add("var markers: u16 = 0; // markers received (control wavelets)")
            add("var marker_need: u16 = 0;")
            add("var marker_wait: bool = false;")
        add("")
        add("// ---- DSDs: memory (buffers) and fabric (one per flow and segment: queues may differ)")
        out.extend(self.dsds[k] for k in sorted(self.dsds, key=lambda n: (not n.startswith("m_"), n)))
        add("")
        add("// ---- transfers, route and queue changes: meshrt_rt.csl, shared by the programs")
        add('const rt = @import_module("meshrt_rt.csl", .{ .step_id = step_id, .rx_dst = rx_dst, '
            '.rx_src = rx_src, .rx_acc = rx_acc, .tx_dst = tx_dst, .tx_src = tx_src });')
        add("")
        if self.meta_in and a.data_tasks:
            add("// ---- metainfo wavelets, one data task per queue / colour that carries them")
            for key in sorted(a.data_tasks):
                add(f"task meta_rx_{key}(wv: u32) void {{")
                add("  meta_dst[meta_got] = wv;")
                add("  meta_got += 1;")
                add("  if (meta_got >= meta_need) {")
                add(f"    @block(meta_tid_{key}); // the data behind the metainfo stays queued for the DSD")
                add("    @activate(step_id);")
                add("  }")
                add("}")
            add("")
        out.extend(meta)
        add("")
        add("// ---- kernel compute")
        out.extend(self.fns)
        add("")
        for k in sorted(self.td_colors):
            add(f"// colour {k}: a teardown passed; hold the colour if it ends what this class drains")
            add(f"fn td_{k}() void {{")
            add(f"  td_seen_{k} += 1;")
            add(f"  if (td_hold_{k} != 0 and td_seen_{k} == td_hold_{k}) {{")
            add(f"    td_held_{k} = true;")
            add("  } else {")
            add(f"    tc.teardown.exit({self.color(k)});")
            add("  }")
            add("  if (td_wait) {")
            add("    td_wait = false;")
            add("    @activate(step_id);")
            add("  }")
            add("}")
            add("")
        if a.marker_task is not None:
            add("// ---- marker sync: markers are control wavelets that activate this task")
            add("task on_marker() void {")
            add("  markers += 1;")
            add("  if (marker_wait and markers >= marker_need) {")
            add("    marker_wait = false;")
            add("    @activate(step_id);")
            add("  }")
            add("}")
            add("")
        add(f"// ---- the event table: {len(self.states)} states; true = go on at once,")
        add("// false = an asynchronous transfer (or a wait) re-activates step")
        add("fn advance() bool {")
        for i, (body, waits, comment, raw) in enumerate(self.states):
            if comment:
                add(f"  // [{i}] {comment}")
            add(f"  if (pc == {i}) {{")
            last = i == len(self.states) - 1
            for line in body:
                add("    " + line)
            if raw:
                add("  }")
                continue
            if last:
                add("    pc = 0; // the table repeats every decode step")
                add("    steps += 1;")
            else:
                add(f"    pc = {i + 1};")
            ret = waits if isinstance(waits, str) else ("false" if waits else "true")
            add(f"    return {ret};")
            add("  }")
        add("  return false;")
        add("}")
        add("")
        add("task step() void {")
        add("  while (advance()) {")
        add("  }")
        add("}")
        add("")
        add("// The host launches this once the weights are in (memcpy); it returns at once")
        add("// so the host can keep pushing requests while the table runs.")
        add("fn start() void {")
        add("  @activate(step_id);")
        add("  sys_mod.unblock_cmd_stream();")
        add("}")
        for k in xw_in:
            add(f"fn xin_{k}_ready() void {{")
            add(f"  xin_seq_{k} += 1;")
            add("  @activate(step_id);")
            add("  sys_mod.unblock_cmd_stream();")
            add("}")
        add("")
        add("comptime {")
        add("  @bind_local_task(step, step_id);")
        for k in sorted(self.td_colors):
            add(f"  @set_teardown_handler(td_{k}, {self.color(k)});")
        if a.marker_task is not None:
            add("  @bind_control_task(on_marker, marker_id);")
        if self.meta_in and a.data_tasks:
            for key in sorted(a.data_tasks):
                add(f"  @bind_data_task(meta_rx_{key}, meta_tid_{key});")
                add(f"  @block(meta_tid_{key});")
        if sh.arch == "wse3":  # wse2: the fabric DSD names the colour, queues are not bound
            for q, c in sorted(a.iq.initial.items()):
                add(f"  @initialize_queue({self.iq(q)}, .{{ .color = {self.color(c)} }});")
            for q, c in sorted(a.oq.initial.items()):
                add(f"  @initialize_queue({self.oq(q)}, .{{ .color = {self.color(c)} }});")
        for sym, var, _ in self.exports:
            add(f'  @export_symbol({var}, "{sym}");')
        add("  @export_symbol(start);")
        for k in xw_in:
            add(f"  @export_symbol(xin_{k}_ready);")
        add("}")
        mine = sh.exports.setdefault(cls.wafer, {})
        for sym, _, typ in self.exports:
            mine.setdefault(sym, typ)
        for k in xw_in:
            mine.setdefault(f"xin_{k}_ready", "fn()void")
        text = "\n".join(out) + "\n"
        # Decode tables and scale buffers of packed weights (known once the bodies are written).
        decls = [*(_DECODE_TABLES[t] for t in sorted(self.tables))]
        if self.wscale:
            decls.append(f"var wscale = @zeros([{self.wscale}]f32); // block scales of the packed tile")
        if decls:
            anchor = "// ---- buffers: kernel input x, output y, chain partner p; resident state w\n"
            text = text.replace(anchor, anchor + "\n".join(decls) + "\n", 1)
        # Imports used by code emitted after the header was written.
        if self.uses_math and '@import_module("<math>")' not in text:
            text = text.replace('const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);',
                                'const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);\n'
                                'const math = @import_module("<math>");', 1)
        return text


def _arrays_of(fn) -> list[tuple[str, int]]:
    """(array, elements) of every array a body names."""
    return [(op.name_.root_reference.data, op.memref.type.get_shape()[0])
            for op in fn.walk() if isinstance(op, memref.GetGlobalOp)]


def _float32_arrays(fn) -> set[str]:
    """The arrays a body reads or writes as float32."""
    return {op.name_.root_reference.data for op in fn.walk()
            if isinstance(op, memref.GetGlobalOp) and op.memref.type.element_type == ELEM_TYPES["f32"]}


def _table(name: str, values) -> str:
    body = ", ".join(f"{0.0 if v != v else float(v)!r}" for v in values)  # NaN codes: never stored
    return f"const {name} = [{len(values)}]f32 {{ {body} }}; // value of each code (meshrt.quant)"


_DECODE_TABLES = {"E2M1": _table("E2M1", quant.E2M1.tolist()), "E4M3": _table("E4M3", quant.E4M3.tolist())}


def write_program(cls: CoreClass, alloc: ClassAlloc, sh: Shared,
                  level: ClassLevel) -> tuple[str, list[tuple[str, str, int, int]]]:
    """The class's program, from its PE-level module (`level`), and its resident regions:
    (kernel, array, offset, elements)."""
    writer = ProgramWriter(cls, alloc, sh, level)
    text = writer.emit()
    limit = sh.lim.target.sram_bytes - sh.lim.target.reserved_sram_bytes
    if alloc.sram_bytes > limit:
        raise MeshrtError(
            f"core class @{cls.name} needs {alloc.sram_bytes} SRAM bytes of arrays but target "
            f"{sh.lim.target.name} leaves {limit} per core beside the program image", cls.op)
    return text, writer.regions
