"""Does each emitted program run the event table of its core class?

The reference interpreter (`meshrt.runtime`) executes the segment IR's
tables; `agreement` reads the state machine back out of each program's text
(the transfers it starts, in state order, with their fabric DSD extents; the
compute, resolver and producer calls) and compares it with the class's
events: same order, same flows, same wavelet counts. A mismatch is a
backend bug, reported per class.

The transports of `streams.py` are part of the expectation: a receive of a
switch-chained flow is one loop (one message per sender, each with its
metainfo), and on a relay line a send only stages the message ("stage")
while the receive runs the relay ("relay"), whose transfers are not events
of the table.
"""

from __future__ import annotations

import re

from meshrt.backend.csl.output import CslOutput
from meshrt.backend.csl.model import Program, read_program, segment_programs

_EXTENT = re.compile(r"const (f[io][mc]?_\w+) = @get_dsd\(fab(?:in|out)_dsd, \.\{ \.extent = (\d+)")


def expected_trace(program: Program, cls) -> list[tuple]:
    from meshrt.backend.csl.streams import CHAIN, RELAY, plans

    pl = plans(program)
    receives = {e.flow for seg in cls.segments for e in seg.events() if e.kind == "recv"}
    out: list[tuple] = []
    for seg in cls.segments:
        taken: set[str] = set()
        for e in seg.events():
            f = program.flows.get(e.flow) if e.flow else None
            plan = pl.get(e.flow) if e.flow else None
            relay = plan is not None and plan.scheme == RELAY and e.flow in receives
            if e.kind == "resolve":
                out.append(("resolve", e.name, f.ident, e.meta_words))
                taken.add(e.flow)
            elif e.kind == "recv" and relay:
                out.append(("relay", f.ident, e.elems))
            elif e.kind == "recv":
                gather = plan is not None and plan.scheme == CHAIN and plan.senders > 1
                if e.meta and (e.flow not in taken or gather) and not f.cross:
                    out.append(("recv_meta", f.ident, e.meta_words))
                taken.discard(e.flow)
                out.append(("recv", f.ident, e.elems))
            elif e.kind == "send" and relay:
                out.append(("stage", f.ident, e.elems))
            elif e.kind == "send":
                if e.meta and not f.cross:
                    out.append(("send_meta", f.ident, e.meta_words))
                out.append(("send", f.ident, e.elems))
            elif e.kind == "compute":
                out.append(("compute", e.name))
            elif e.kind == "produce":
                out.append(("produce", e.name))
    return out


_TAKE = re.compile(r"take (\d+) metainfo wavelet\(s\) of @(\S+) ahead")
_RELAY = re.compile(r"// \[relay\] @(\S+) (\d+)$")
_STAGE = re.compile(r"// \[stage\] @(\S+) (\d+)$")
_XOUT = re.compile(r"@(?:fmov[sh]|mov32)\(m_xout_(\d+)_(\d+), m_\w+\);")
_XIN = re.compile(r"@(?:fmov[sh]|mov32)\(m_\w+?_(\d+), m_xin_(\d+)_\d+\);")
_RESOLVE = re.compile(r"resolve_(\w+)\(\);")
_TRANSFERS = [  # (event, pattern whose group 1 is the fabric DSD)
    ("recv_meta", re.compile(r"rt\.recv_words\(m_\w+, (fim_\w+)\);")),
    ("recv", re.compile(r"rt\.recv_(?:add_)?(?:f32|fp16|words)\(m_\w+, (fi_\w+)\);")),
    ("send_meta", re.compile(r"rt\.send_words\((fom_\w+), m_\w+\);")),
    ("send", re.compile(r"rt\.send_(?:f32|fp16|words)\((fo_\w+), m_\w+\);")),
]
_COMPUTE = re.compile(r"k\d+_(\w+)\(\);")
_PRODUCE = re.compile(r"produce_(\w+)\(\);")
_DSD_SEGMENT = re.compile(r"_s\d+(?:_n\d+)?$")


def program_trace(text: str, program: Program) -> list[tuple]:
    extents = {name: int(n) for name, n in _EXTENT.findall(text)}
    xw = {f.xw_index: f.ident for f in program.flows.values() if f.cross}
    idents = {f.ident for f in program.flows.values()}

    def flow_of(dsd: str) -> str:
        ident = _DSD_SEGMENT.sub("", dsd.split("_", 1)[1])
        return ident if ident in idents else "?" + ident

    body = text[text.index("fn advance() bool {"):]
    body = body[:body.index("\ntask step()")]
    out: list[tuple] = []
    pending: tuple[int, str] = (0, "?")
    for line in body.splitlines():
        line = line.strip()
        if line.endswith("// relay"):
            continue  # a relay's own transfers (the "relay" entry stands for them)
        first = line[:1]
        if first == "/":  # comments: the resolver's metainfo count, the end of a relay
            if m := _TAKE.search(line):
                pending = (int(m.group(1)), m.group(2))
            if m := _RELAY.match(line):
                flow = program.flows.get(m.group(1))
                out.append(("relay", flow.ident if flow else "?", int(m.group(2))))
        elif first == "@":
            if m := _STAGE.search(line):
                flow = program.flows.get(m.group(1))
                out.append(("stage", flow.ident if flow else "?", int(m.group(2))))
            elif m := _XOUT.match(line):
                out.append(("send", xw[int(m.group(1))], int(m.group(2))))
            elif m := _XIN.match(line):
                out.append(("recv", xw[int(m.group(2))], int(m.group(1))))
        elif first == "r":
            if m := _RESOLVE.match(line):
                flow = program.flows.get(pending[1])
                out.append(("resolve", m.group(1), flow.ident if flow else "?", pending[0]))
            elif line.startswith("rt."):
                for kind, pattern in _TRANSFERS:
                    if m := pattern.match(line):
                        out.append((kind, flow_of(m.group(1)), extents[m.group(1)]))
                        break
        elif m := _COMPUTE.match(line) or _PRODUCE.match(line):
            out.append(("compute" if m.re is _COMPUTE else "produce", m.group(1)))
    return out


def agreement(module, output: CslOutput, programs: list[Program] | None = None) -> list[str]:
    """One message per class whose program does not run its table; [] when all agree.
    `programs`: the plans the emitter read (their transport plans are cached),
    one per `segment.program` of the module, in order."""
    problems = []
    ops = segment_programs(module)
    for k, op in enumerate(ops):
        program = programs[k] if programs is not None else read_program(op)
        prefix = f"{op.program_name}/" if len(ops) > 1 else ""
        for cls in program.classes:
            where = prefix + (f"wafer{cls.wafer}/" if program.wafers > 1 else "") + cls.file
            text = output.files.get(where)
            if text is None:
                problems.append(f"@{cls.name}: no program file {where}")
                continue
            want, got = expected_trace(program, cls), program_trace(text, program)
            if want != got:
                i = next((k for k, (a, b) in enumerate(zip(want, got, strict=False)) if a != b), min(len(want), len(got)))
                problems.append(f"@{cls.name} ({where}): event {i}: table has "
                                f"{want[i] if i < len(want) else 'nothing'}, program has "
                                f"{got[i] if i < len(got) else 'nothing'}")
    return problems
