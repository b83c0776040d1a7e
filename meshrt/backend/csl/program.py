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

At a segment boundary: markers behind the last message of the closing
segment (when it has a marker sync), the wait for the expected markers, then
the run-time route change of this core's own router (release / install),
and the queue rebinds the allocation asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrt.backend.csl import percore
from meshrt.backend.csl.alloc import ClassAlloc, Limits, format_table, report_rows
from meshrt.backend.csl.kernels import ComputeBody
from meshrt.backend.csl.metainfo import MetaCode
from meshrt.backend.csl.model import CoreClass, Event, Flow, Program, Segment
from meshrt.backend.csl.routes import word
from meshrt.diagnostics import MeshrtError
from meshrt.routing import Box

X_READERS = ("fmac", "embed", "square_sum", "scale", "qk", "argmax")
CHAIN_FLOWS = ("down", "up", "hop")  # kernel_roles' names for a kernel's own chain flows


@dataclass
class Shared:
    """What all programs of one emission share."""

    program: Program
    lim: Limits
    arch: str
    elem: str  # "f32" | "f16"
    marker_counts: dict[tuple[str, int], list[tuple[Box, int]]] = field(default_factory=dict)
    marker_senders: dict[tuple[str, str, int], bool] = field(default_factory=dict)
    exports: dict[int, dict[str, str]] = field(default_factory=dict)  # wafer -> symbol -> layout type

    @property
    def sfx(self) -> str:
        return "s" if self.elem == "f32" else "h"

    @property
    def elem_bytes(self) -> int:
        return 4 if self.elem == "f32" else 2


def hx(v: int) -> str:
    return f"0x{v:03x}"


class ProgramWriter:
    def __init__(self, cls: CoreClass, alloc: ClassAlloc, sh: Shared):
        self.cls = cls
        self.a = alloc
        self.sh = sh
        self.p = sh.program
        self.lines: list[str] = []
        self.decls: list[str] = []
        self.fns: list[str] = []
        self.dsds: dict[str, str] = {}  # name -> declaration
        self.states: list[tuple[list[str], bool, str]] = []  # (body, waits, comment)
        self.notes: list[str] = []
        self._own: dict[str, list] = {}
        self.b = max(1, self.p.micro_batch)
        self.resident: list[tuple[str, int, int, str]] = []  # (array, offset, length, kernel)
        self.exports: list[tuple[str, str, str]] = []  # (symbol, csl var, layout type)
        self.uses_math = False
        self.uses_ctrl = alloc.marker_task is not None
        self.phased_flows: dict[str, tuple[str, str]] = {}  # flow -> (recv word expr, send word expr)
        self._plan_buffers()

    # ------------------------------------------------------------------ sizes
    def _flows_used(self) -> list[Flow]:
        seen = []
        for seg in self.cls.segments:
            for e in seg.events():
                if e.flow and self.p.flows[e.flow] not in seen:
                    seen.append(self.p.flows[e.flow])
        return seen

    def _internal(self, e: Event, kernel: str) -> bool:
        """A flow of the kernel's own chain (reduction down / up, relay hop), not an input."""
        flow = self.p.flows[e.flow]
        return flow.kernel == kernel and flow.name.rsplit(".", 1)[-1] in CHAIN_FLOWS

    def _plan_buffers(self) -> None:
        nx = np_ = ny = 1
        meta_in: dict[str, int] = {}  # kind -> words of the largest metainfo received / forwarded
        meta_out: dict[str, int] = {}
        producers = {e.name for seg in self.cls.segments for e in seg.events() if e.kind == "produce"}
        for seg in self.cls.segments:
            for sub in seg.subs:
                for e in sub.events:
                    if e.kind == "recv":
                        if self._internal(e, sub.kernel):
                            np_ = max(np_, e.elems)
                        else:
                            nx = max(nx, e.elems)
                        if e.meta:
                            k = self.p.flows[e.flow].meta_kind
                            meta_in[k] = max(meta_in.get(k, 0), e.meta_words)
                    elif e.kind == "resolve":
                        meta_in[e.name] = max(meta_in.get(e.name, 0), e.meta_words)
                    elif e.kind == "send":
                        ny = max(ny, e.elems)
                        kind = self.p.flows[e.flow].meta_kind
                        if e.meta and kind in producers:
                            meta_out[kind] = max(meta_out.get(kind, 0), e.meta_words)
                        elif e.meta:
                            meta_in[kind] = max(meta_in.get(kind, 0), e.meta_words)
                    elif e.kind == "produce":
                        meta_out[e.name] = max(meta_out.get(e.name, 0), e.meta_words)
        self.nx, self.np, self.ny = nx, np_, max(ny, nx, np_)
        self.cap = {"x": self.nx, "y": self.ny, "p": self.np}  # grown by the transfers below
        self.has_p = any(e.kind == "recv" and self._internal(e, sub.kernel)
                         for seg in self.cls.segments for sub in seg.subs for e in sub.events)
        self.meta_in = meta_in
        self.meta_in_words = max(meta_in.values(), default=0)  # the cross-wafer staging size
        cross = [(e.kind, self.p.flows[e.flow].xw_index) for seg in self.cls.segments for e in seg.events()
                 if e.flow and self.p.flows[e.flow].cross]
        self.xw_in = sorted({k for kind, k in cross if kind in ("recv", "resolve")})
        self.xw_out = sorted({k for kind, k in cross if kind == "send"})
        self.xw_elems: dict[int, int] = {}  # staging size per cross-wafer flow: its largest message
        self.xw_meta: dict[int, int] = {}
        for seg in self.cls.segments:
            for e in seg.events():
                if e.flow and self.p.flows[e.flow].cross:
                    k = self.p.flows[e.flow].xw_index
                    self.xw_elems[k] = max(self.xw_elems.get(k, 1), e.elems)
                    self.xw_meta[k] = max(self.xw_meta.get(k, 1), e.meta_words)
        self.meta_out_words = meta_out
        kinds = {e.name for seg in self.cls.segments for e in seg.events() if e.kind in ("resolve", "produce")}
        self.cf = "continuous_batching" in kinds
        self.moe = "moe_routing" in kinds
        self.slots = int(self.p.hp("inflight_slots", self.p.hp("kv_slots", self.b)))
        self.top_k = max(1, int(self.p.hp("top_k", 1)))
        # Resident state per sub (weights, KV tiles, embedding rows).
        wq_off = w_off = 0
        self.sub_region: dict[int, tuple[str, int, int]] = {}
        for seg in self.cls.segments:
            for sub in seg.subs:
                if sub.state_bytes <= 0 or id(sub) in self.sub_region:
                    continue
                dtype = self.p.hp("expert_dtype_bytes", 2) if "experts" in sub.kernel else (
                    self.p.hp("kv_bytes", 2) if "attn" in sub.kernel else self.p.hp("dtype_bytes", 2))
                if dtype < 2:  # packed (e.g. 4-bit) weights: 16-bit words, dequantized on use
                    n = -(-sub.state_bytes // 2)
                    self.sub_region[id(sub)] = ("wq", wq_off, n)
                    wq_off += n
                else:
                    n = -(-sub.state_bytes // self.sh.elem_bytes)
                    self.sub_region[id(sub)] = ("w", w_off, n)
                    w_off += n
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
        n += (2 + 4 + 2) * self.b * self.top_k if self.moe else 0
        n += eb * self.b * (self.attn_rows + 2)
        for k in self.xw_in + self.xw_out:
            n += eb * self.xw_elems[k] + 4 * self.xw_meta[k]
        return n

    # ------------------------------------------------------------------ names
    def color(self, c: int) -> str:
        return f"col_{c}"

    def iq(self, q: int) -> str:
        return f"iq_{q}"

    def oq(self, q: int) -> str:
        return f"oq_{q}"

    def mem(self, buf: str, n: int, offset: int = 0) -> str:
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
    def own_router(self, flow: Flow) -> list[tuple[Box, object]]:
        """The flow's configurations at this class's routers (cached per flow)."""
        if flow.name not in self._own:
            cfgs = flow.configs(self.p.width, self.p.height)
            self._own[flow.name] = percore.clip_to(cfgs, self.cls.boxes)
        return self._own[flow.name]

    def route_word_expr(self, flow: Flow, phase: str) -> str:
        """This core's router word for `flow` (phase: recv / send / static)."""
        pieces = []
        for box, cfg in self.own_router(flow):
            if cfg.phased and phase != "static":
                rx, tx = cfg.recv_phase() if phase == "recv" else cfg.send_phase()
            else:
                rx, tx = cfg.static()
            pieces.append((box, word(rx, tx)))
        return percore.expr(pieces, self.cls.boxes, 0, hx)

    def is_phased_here(self, flow: Flow) -> bool:
        return any(cfg.phased for _, cfg in self.own_router(flow))

    def first_use(self, seg: Segment, flow: str) -> str:
        for e in seg.events():
            if e.flow == flow:
                return "send" if e.kind in ("send", "produce") else "recv"
        return "recv"

    # ---------------------------------------------------------------- states
    def state(self, body: list[str], waits: bool, comment: str = "") -> None:
        if self.notes:  # remarks that belong before the next state's code
            body = self.notes + body
            self.notes = []
        self.states.append((body, waits, comment))

    def emit(self) -> str:
        for s, seg in enumerate(self.cls.segments):
            self.emit_segment(s, seg)
            for b in self.cls.boundaries:
                if b.source == seg.index:
                    self.emit_boundary(b)
        self.a.sram_bytes = self.sram_bytes()
        return self.render()

    def emit_segment(self, s: int, seg: Segment) -> None:
        label = f"segment {seg.index} ({len(seg.subs)} sub-schedule(s))"
        if seg.awaits or seg.grants:
            self.notes.append("// route handshake of the IR, not emitted (no reverse-route colour): "
                              + " ".join(f"{k} [{', '.join(v if k == 'await' else ['@' + f for f in v])}]"
                                         for k, v in (("await", seg.awaits), ("grant", seg.grants)) if v))
        sync_here = any(b.source == seg.index and b.sync is not None for b in self.cls.boundaries)
        last_send = {}
        for i, e in enumerate(seg.events()):
            if e.kind == "send":
                last_send[e.flow] = i
        written = "y"
        pending_meta: set[str] = set()
        idx = 0
        for sub in seg.subs:
            got_x = got_p = False
            promoted = False
            for e in sub.events:
                first = idx == 0
                idx += 1
                comment = f"{label}: " if first else ""
                comment += f"@{sub.kernel} \"{sub.role}\": "
                flow = self.p.flows.get(e.flow) if e.flow else None
                if e.kind == "resolve":
                    self.emit_resolve(s, e, flow, comment)
                    pending_meta.add(e.flow)
                elif e.kind == "recv":
                    internal = self._internal(e, sub.kernel)
                    target = "p" if internal or (got_x and self.has_p) else "x"
                    self.emit_recv(s, e, flow, target, e.flow in pending_meta, comment)
                    pending_meta.discard(e.flow)
                    if target == "p":
                        got_p = True
                    else:
                        got_x = True
                    written = target
                elif e.kind == "compute":
                    if e.name in X_READERS and not got_x and not promoted and written != "x":
                        n = min(self.nx, self.ny)
                        self.state([f"@fmov{self.sh.sfx}({self.mem('x', n)}, {self.mem('y', n)});"], False,
                                   comment + "input is the previous kernel's output")
                        comment = ""
                        promoted = True
                    src = "p" if got_p else ("x" if got_x else None)
                    fn = self.emit_compute(e, sub, src)
                    self.state([f"{fn}();"], False, comment + f"compute \"{e.name}\" ({e.work} ops)")
                    if e.name not in ("route", "eos_check", "topk", "rsqrt"):
                        written = "y"
                elif e.kind == "produce":
                    self.state([f"produce_{e.name}();"], False,
                               comment + f"metainfo producer: {e.name} onto @{e.flow} ({e.meta} B)")
                elif e.kind == "send":
                    self.emit_send(s, e, flow, written, comment)
                    pos = list(seg.events()).index(e)
                    if sync_here and last_send.get(e.flow) == pos and flow.color is not None \
                            and self.a.marker_task is not None:
                        ctl = self.fab("fabout", flow, s, 1, "ctl")
                        self.state([f"@mov32({ctl}, ctrl.encode_control_task_payload(marker_id));"],
                                   False, f"marker behind the last message on @{flow.name}")

    # -------------------------------------------------------------- metainfo
    def meta_task(self, s: int, flow: Flow) -> str:
        key = flow.color if self.sh.arch == "wse2" else self.a.iq.queue(s, flow.color)
        return f"meta_tid_{key}"

    def emit_resolve(self, s: int, e: Event, flow: Flow, comment: str) -> None:
        n = e.meta_words
        if flow.cross:
            self.emit_xw_wait(flow, comment + f"resolver: take {n} metainfo wavelet(s) of @{flow.name} "
                              "ahead of its data (the host relays it over the wafer link)")
            self.state([f"rt.copy_words(&meta_in_{e.name}, &xin_meta_{flow.xw_index}, {n});",
                        f"resolve_{e.name}();"], False, f"resolver: {e.name}")
            return
        tid = self.meta_task(s, flow)
        self.state([f"meta_dst = &meta_in_{e.name};", f"meta_need = {n};", "meta_got = 0;",
                    f"@unblock({tid});"], True,
                   comment + f"resolver: take {n} metainfo wavelet(s) of @{flow.name} ahead of its data")
        self.state([f"resolve_{e.name}();"], False,
                   f"resolver: {e.name} (update the {'RDT' if e.name == 'continuous_batching' else 'routing table'})")

    # ------------------------------------------------------------ transfers
    def phase(self, flow: Flow, which: str) -> list[str]:
        if flow.color is None or not self.is_phased_here(flow):
            return []
        if flow.name not in self.phased_flows:
            self.phased_flows[flow.name] = (self.route_word_expr(flow, "recv"),
                                            self.route_word_expr(flow, "send"))
        w = self.phased_flows[flow.name][0 if which == "recv" else 1]
        return [f"rt.set_route({self.color(flow.color)}, {w}); // {which} phase of this router"]

    def emit_xw_wait(self, flow: Flow, comment: str) -> None:
        k = flow.xw_index
        self.state([f"if (xin_seq_{k} == xin_seen_{k}) {{", "  return false; // xin_{k}_ready() re-activates step",
                    "}", f"xin_seen_{k} += 1;"], False, comment)

    def need(self, buf: str, n: int) -> None:
        """A transfer of n elements uses `buf`: it is declared at least that long."""
        self.cap[buf] = max(self.cap[buf], n)

    def emit_recv(self, s: int, e: Event, flow: Flow, target: str, meta_taken: bool, comment: str) -> None:
        n = e.elems
        self.need(target, n)
        if flow.cross:
            self.emit_xw_wait(flow, comment + f"receive @{flow.name} from the host (wafer link)")
            body = [f"@fmov{self.sh.sfx}({self.mem(target, n)}, {self.mem(f'xin_{flow.xw_index}', n)});"]
            if e.meta and not meta_taken:
                body.append(f"rt.copy_words(&meta_in_{flow.meta_kind}, &xin_meta_{flow.xw_index}, {e.meta_words});")
            self.state(body, False, f"{e.nbytes} B into {target}")
            return
        pre = self.phase(flow, "recv")
        if e.meta and not meta_taken:
            fim = self.fab("fabin", flow, s, e.meta_words, "meta")
            self.state(pre + [f"rt.recv_words({self.mem('meta_in_' + flow.meta_kind, e.meta_words)}, {fim});"], True,
                       comment + f"receive @{flow.name}: {e.meta} B of metainfo ahead of the data")
            pre, comment = [], ""
        fi = self.fab("fabin", flow, s, n)
        self.state(pre + [f"rt.recv_{self.sh.elem}({self.mem(target, n)}, {fi});"], True,
                   comment + f"receive @{flow.name}: {e.nbytes} B into {target}")

    def emit_send(self, s: int, e: Event, flow: Flow, src: str, comment: str) -> None:
        n = e.elems
        self.need(src, n)
        kind = flow.meta_kind
        meta_buf = f"meta_out_{kind}" if kind in self.meta_out_words else f"meta_in_{kind}"
        if flow.cross:
            k = flow.xw_index
            body = [f"@fmov{self.sh.sfx}({self.mem(f'xout_{k}', n)}, {self.mem(src, n)});"]
            if e.meta:
                body.append(f"rt.copy_words(&xout_meta_{k}, &{meta_buf}, {e.meta_words});")
            body.append(f"xout_seq_{k}[0] += 1; // the host polls it, then relays the message")
            self.state(body, False, comment + f"send @{flow.name} to the next wafer via the host")
            return
        pre = self.phase(flow, "send")
        if e.meta:
            fom = self.fab("fabout", flow, s, e.meta_words, "meta")
            self.state(pre + [f"rt.send_words({fom}, {self.mem(meta_buf, e.meta_words)});"], True,
                       comment + f"send @{flow.name}: {e.meta} B of metainfo ahead of the data")
            pre, comment = [], ""
        fo = self.fab("fabout", flow, s, n)
        self.state(pre + [f"rt.send_{self.sh.elem}({fo}, {self.mem(src, n)});"], True,
                   comment + f"send @{flow.name}: {e.nbytes} B from {src}")

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
            body.append(f"rt.set_route({self.color(flow.color)}, 0); // release @{flow.name}")
        for c, flow in sorted(installed.items()):
            phase = self.first_use(dst, flow.name) if self.is_phased_here(flow) else "static"
            body.append(f"rt.set_route({self.color(c)}, {self.route_word_expr(flow, phase)}); "
                        f"// install @{flow.name}")
        dest_pos = [i for i, s in enumerate(self.cls.segments) if s.index == b.dest][0]
        for q, c in self.a.iq.rebinds.get(dest_pos, []):
            body.append(f"rt.rebind_input_queue({q}, {c});")
        for q, c in self.a.oq.rebinds.get(dest_pos, []):
            body.append(f"rt.rebind_output_queue({q}, {c});")
        if b.notify or b.drain:
            body.append("// route handshake of the IR, not emitted (no reverse-route colour): "
                        + " ".join(f"{k} [{', '.join('@' + f for f in v)}]"
                                   for k, v in (("notify", b.notify), ("drain", b.drain)) if v))
        if not body:
            body = ["// no route of this core's router changes"]
        self.state(body, False, f"{what}: reconfigure this core's router "
                   f"(release {len(b.release)}, install {len(b.install)})")

    # --------------------------------------------------------------- compute
    def region(self, sub) -> tuple[str, int, int] | None:
        return self.sub_region.get(id(sub))

    def emit_compute(self, e: Event, sub, src: str | None) -> str:
        i = len(self.fns)
        name = f"k{i}_{e.name}"
        body = ComputeBody(self, e, sub, src).lines()
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
        add(f"const tx_dst = @get_dsr(dsr_dest, {a.dsr_tx});")
        add(f"const tx_src = @get_dsr(dsr_src1, {a.dsr_tx});")
        add("")
        add("// ---- buffers: kernel input x, output y, chain partner p; resident state w")
        add(f"var x = @zeros([{self.cap['x']}]{T});")
        add(f"var y = @zeros([{self.cap['y']}]{T});")
        if self.has_p:
            add(f"var p = @zeros([{self.cap['p']}]{T});")
        if self.nw:
            add(f"var w = @zeros([{self.nw}]{T}); // weights / KV tiles / embedding rows (host-loaded)")
            add(f"var w_ptr: [*]{T} = &w;")
            self.exports.append(("w", "w_ptr", f"[*]{T}"))
        if self.nwq:
            add(f"var wq = @zeros([{self.nwq}]u16); // packed sub-16-bit weights (host-loaded)")
            add("var wq_ptr: [*]u16 = &wq;")
            self.exports.append(("wq", "wq_ptr", "[*]u16"))
        add(f"var scale = @zeros([{self.b}]{T}); // per-slot norm scale")
        add(f"var sc = @zeros([{self.b * self.attn_rows}]{T}); // attention scores of this core's KV rows")
        add(f"var done = @zeros([{self.b}]u16); // per-slot end-of-sequence flags")
        for kind, n in sorted(self.meta_in.items()):
            add(f"var meta_in_{kind} = @zeros([{n}]u32); // {kind} metainfo that arrived ahead of the data")
        for kind, n in sorted(self.meta_out_words.items()):
            add(f"var meta_out_{kind} = @zeros([{n}]u32); // metainfo this class produces")
        if self.cf:
            add(f"var rdt = @zeros([{self.slots * 4}]u32); // request descriptor table: id, status, length, -")
            add("var rdt_ptr: [*]u32 = &rdt;")
            add("var mb: u16 = 0; // micro-batch whose slots the current step serves")
            self.exports.append(("rdt", "rdt_ptr", "[*]u32"))
        if self.moe:
            add(f"var rt_expert = @zeros([{self.b * self.top_k}]u16); // routing table: expert per (token, choice)")
            add(f"var rt_weight = @zeros([{self.b * self.top_k}]f32); // gate weight per (token, choice)")
            add(f"var mine = @zeros([{self.b}]u16); // tokens whose expert lives in this core's region")
        admits = self.cf and any(e.kind == "compute" and e.name == "embed"
                                 for seg in cls.segments for e in seg.events())
        emits_tokens = any(e.kind == "produce" and e.name == "continuous_batching"
                           for seg in cls.segments for e in seg.events())
        if admits:
            add(f"var req = @zeros([{self.slots * 2}]u32); // waiting requests the host pushes: id, first token")
            add("var req_ptr: [*]u32 = &req;")
            self.exports.append(("req", "req_ptr", "[*]u32"))
        if emits_tokens:
            add(f"var tok = @zeros([{self.slots * 2}]u32); // sampled tokens for the host: request id, token")
            add("var tok_ptr: [*]u32 = &tok;")
            self.exports.append(("tok", "tok_ptr", "[*]u32"))
        xw_in, xw_out = self.xw_in, self.xw_out
        for k in xw_in:
            add(f"var xin_{k} = @zeros([{self.xw_elems[k]}]{T}); // message from the previous wafer (host relay)")
            add(f"var xin_meta_{k} = @zeros([{self.xw_meta[k]}]u32);")
            add(f"var xin_{k}_ptr: [*]{T} = &xin_{k};")
            add(f"var xin_meta_{k}_ptr: [*]u32 = &xin_meta_{k};")
            add(f"var xin_seq_{k}: u16 = 0;")
            add(f"var xin_seen_{k}: u16 = 0;")
            self.exports += [(f"xin_{k}", f"xin_{k}_ptr", f"[*]{T}"),
                             (f"xin_meta_{k}", f"xin_meta_{k}_ptr", "[*]u32")]
        for k in xw_out:
            add(f"var xout_{k} = @zeros([{self.xw_elems[k]}]{T}); // message for the next wafer (host relay)")
            add(f"var xout_meta_{k} = @zeros([{self.xw_meta[k]}]u32);")
            add(f"var xout_seq_{k} = @zeros([1]u32);")
            add(f"var xout_{k}_ptr: [*]{T} = &xout_{k};")
            add(f"var xout_meta_{k}_ptr: [*]u32 = &xout_meta_{k};")
            add(f"var xout_seq_{k}_ptr: [*]u32 = &xout_seq_{k};")
            self.exports += [(f"xout_{k}", f"xout_{k}_ptr", f"[*]{T}"),
                             (f"xout_meta_{k}", f"xout_meta_{k}_ptr", "[*]u32"),
                             (f"xout_seq_{k}", f"xout_seq_{k}_ptr", "[*]u32")]
        add("var pc: u16 = 0; // state of the event table")
        add("var steps: u32 = 0; // decode steps completed")
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
            '.rx_src = rx_src, .tx_dst = tx_dst, .tx_src = tx_src });')
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
        out.extend(MetaCode(self, admits, emits_tokens).lines())
        add("")
        add("// ---- kernel compute")
        out.extend(self.fns)
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
        for i, (body, waits, comment) in enumerate(self.states):
            if comment:
                add(f"  // [{i}] {comment}")
            add(f"  if (pc == {i}) {{")
            last = i == len(self.states) - 1
            for line in body:
                add("    " + line)
            if last:
                add("    pc = 0; // the table repeats every decode step")
                add("    steps += 1;")
            else:
                add(f"    pc = {i + 1};")
            add(f"    return {'false' if waits else 'true'};")
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
        if a.marker_task is not None:
            add("  @bind_control_task(on_marker, marker_id);")
        if self.meta_in and a.data_tasks:
            for key in sorted(a.data_tasks):
                add(f"  @bind_data_task(meta_rx_{key}, meta_tid_{key});")
                add(f"  @block(meta_tid_{key});")
        for q, c in sorted(a.iq.initial.items()):
            add(f"  @initialize_queue({self.iq(q)}, .{{ .color = {self.color(c)} }});")
        if sh.arch == "wse3":
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
        # Imports used by code emitted after the header was written.
        if self.uses_math and '@import_module("<math>")' not in text:
            text = text.replace('const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);',
                                'const sys_mod = @import_module("<memcpy/memcpy>", memcpy_params);\n'
                                'const math = @import_module("<math>");', 1)
        return text


def write_program(cls: CoreClass, alloc: ClassAlloc, sh: Shared) -> str:
    w = ProgramWriter(cls, alloc, sh)
    text = w.emit()
    limit = sh.lim.target.sram_bytes - sh.lim.target.reserved_sram_bytes
    if alloc.sram_bytes > limit:
        raise MeshrtError(
            f"core class @{cls.name} needs {alloc.sram_bytes} SRAM bytes of arrays but target "
            f"{sh.lim.target.name} leaves {limit} per core beside the program image", cls.op)
    return text
