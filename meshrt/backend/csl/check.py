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

from meshrt.backend.csl import CslOutput
from meshrt.backend.csl.model import Program, read_program, segment_programs

_EXTENT = re.compile(r"const (f[io][mc]?_\w+) = @get_dsd\(fab(?:in|out)_dsd, \.\{ \.extent = (\d+)")
_MEM = re.compile(r"m_(\w+?)_(\d+)(?:_at\d+)?\b")


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


def program_trace(text: str, program: Program) -> list[tuple]:
    extents = {name: int(n) for name, n in _EXTENT.findall(text)}
    xw = {f.xw_index: f.ident for f in program.flows.values() if f.cross}
    idents = {f.ident for f in program.flows.values()}

    def flow_of(dsd: str) -> str:
        ident = re.sub(r"_s\d+$", "", dsd.split("_", 1)[1])
        return ident if ident in idents else "?" + ident

    body = text[text.index("fn advance() bool {"):]
    body = body[:body.index("\ntask step()")]
    out: list[tuple] = []
    pending: tuple[int, str] = (0, "?")
    mem = r"m_\w+"
    for line in body.splitlines():
        line = line.strip()
        if m := re.search(r"take (\d+) metainfo wavelet\(s\) of @(\S+) ahead", line):
            pending = (int(m.group(1)), m.group(2))
        if line.endswith("// relay"):
            continue  # a relay's own transfers (the "relay" entry stands for them)
        if m := re.match(r"// \[relay\] @(\S+) (\d+)$", line):
            flow = program.flows.get(m.group(1))
            out.append(("relay", flow.ident if flow else "?", int(m.group(2))))
        elif m := re.search(r"// \[stage\] @(\S+) (\d+)$", line):
            flow = program.flows.get(m.group(1))
            out.append(("stage", flow.ident if flow else "?", int(m.group(2))))
        elif m := re.match(r"resolve_(\w+)\(\);", line):
            flow = program.flows.get(pending[1])
            out.append(("resolve", m.group(1), flow.ident if flow else "?", pending[0]))
        elif m := re.match(rf"rt\.recv_words\({mem}, (fim_\w+)\);", line):
            out.append(("recv_meta", flow_of(m.group(1)), extents[m.group(1)]))
        elif m := re.match(rf"rt\.recv_(?:add_)?f(?:32|16)\({mem}, (fi_\w+)\);", line):
            out.append(("recv", flow_of(m.group(1)), extents[m.group(1)]))
        elif m := re.match(rf"rt\.send_words\((fom_\w+), {mem}\);", line):
            out.append(("send_meta", flow_of(m.group(1)), extents[m.group(1)]))
        elif m := re.match(rf"rt\.send_f(?:32|16)\((fo_\w+), {mem}\);", line):
            out.append(("send", flow_of(m.group(1)), extents[m.group(1)]))
        elif m := re.match(r"@fmov[sh]\(m_xout_(\d+)_(\d+), m_\w+\);", line):
            out.append(("send", xw[int(m.group(1))], int(m.group(2))))
        elif m := re.match(r"@fmov[sh]\(m_\w+?_(\d+), m_xin_(\d+)_\d+\);", line):
            out.append(("recv", xw[int(m.group(2))], int(m.group(1))))
        elif m := re.match(r"k\d+_(\w+)\(\);", line):
            out.append(("compute", m.group(1)))
        elif m := re.match(r"produce_(\w+)\(\);", line):
            out.append(("produce", m.group(1)))
    return out


def agreement(module, output: CslOutput) -> list[str]:
    """One message per class whose program does not run its table; [] when all agree."""
    problems = []
    for op in segment_programs(module):
        program = read_program(op)
        prefix = f"{op.program_name}/" if len(segment_programs(module)) > 1 else ""
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
