"""Which buffer holds which kernel value, event by event, on one core class.

A core class's program has three working buffers: `x` (what the running
kernel receives, and what a body that reads its input reads), `y` (what it
computes, and by default what it sends) and `p` (a chain partner's partial,
or a chain's result coming back up). A kernel value lives in one of them
until an event overwrites it, but a kernel may read a value computed or
received several kernels earlier: a residual add reads the layer's input,
received at the start of the layer, beside the attention output's reduced
value, which an edge core of the reduction has in `p`. This plan walks the
class's events in the order the core runs them (segments in order, one step)
and says where each event reads and writes; a value that a later compute
reads but that an event in between overwrote is saved right after it is
defined, into a buffer of its own (`v_<kernel>`).

The interpreter keeps values by name (`meshrt.kernels.numerics.CoreData`):
this is how the program keeps the same values in its few buffers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshrt.backend.csl.model import CoreClass, Event, Program, Sub, plain_identifier
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels import registry
from meshrt.shape import HParams

# compute ops whose CSL writes no working buffer a value is kept in (state of their own)
KEEPS_Y = frozenset({"route", "eos_check", "topk", "argmax", "argmax_merge"})
# compute ops whose result is not what the kernel sends (its send reads the buffer before)
WRITES_NO_VALUE = KEEPS_Y | {"rsqrt"}


def save_buffer(value: str) -> str:
    """The CSL array a saved value lives in."""
    return "v_" + plain_identifier(value)


def kernel_array(kernel: str, buf: str) -> str:
    """The class's array holding buffer `buf` of kernel `kernel`'s PE bodies (resident
    weights, a message buffer of 32-bit words, a body's own state)."""
    return f"{kernel}::{buf}"


def is_kernel_array(name: str) -> bool:
    return "::" in name


def message_array(p: Program, sub: Sub, flow, send: bool) -> str | None:
    """The kernel array a send (`send`) or receive of `flow` in `sub` uses where the
    sub's kind names one (`KernelOp.message_buffer`), else None."""
    if sub.kernel not in p.records:
        return None
    buf = p.kind_of(sub).message_buffer(p.record(sub), HParams.of(p.op), flow.role, send)
    return None if buf is None else kernel_array(sub.kernel, buf)


@dataclass
class Step:
    """What one event does with the class's buffers."""

    target: str | None = None  # recv: the buffer it writes
    holds: str | None = None  # recv: the kernel whose value it receives (None: a partial, a relay)
    operands: tuple[str | None, ...] = ()  # compute: the buffer each operand is read from (None: unknown)
    promote: str | None = None  # compute: copy this buffer into x first (its body reads x)
    source: str | None = None  # send: the buffer it sends
    received: str | None = None  # compute: where the sub's own receive put its data (p, else x)
    saves: list[tuple[str, str, int]] = field(default_factory=list)  # after it: (from, into, elements)


@dataclass
class ValuePlan:
    steps: dict[int, Step]  # id(event) -> its step
    saved: dict[str, int]  # save buffer -> elements

    def step(self, e: Event) -> Step:
        return self.steps[id(e)]


def operand_count(p: Program, sub: Sub, op: str) -> int:
    """How many of the kernel's operands compute op `op` reads where they are held
    (`KernelOp.operands_read`; for a sub without a kernel record, the default rule)."""
    rec = p.records.get(sub.kernel)
    if rec is None:
        return 1 if registry.compute_op(op).reads_input else 0
    return registry.kind(rec.kind.data).operands_read(rec, op)


def plan_values(p: Program, cls: CoreClass, has_p: bool, relays) -> ValuePlan:
    """The buffer plan of core class `cls` (`has_p`: the class has a partner buffer;
    `relays(flow)`: this class relays the flow, summing what passes into x)."""
    need: set[str] = set()
    sizes = _read_sizes(p, cls)
    while True:
        plan, missing = _walk(p, cls, has_p, relays, need, sizes)
        if not missing - need:
            return plan
        need |= missing


def _walk(p: Program, cls: CoreClass, has_p: bool, relays, save: set[str], sizes: dict[str, int]):
    """One pass over the class's events, keeping the values in `save`: the plan, and the
    values some compute read where no array held them any more though the class
    receives or computes them (the ones to keep)."""
    holds: dict[str, str] = {}  # buffer -> the value it holds
    steps: dict[int, Step] = {}
    saved: dict[str, int] = {}
    unheld: set[str] = set()  # values a compute found in no array
    defined: set[str] = set()  # values an event of the class put in an array

    aliases: dict[str, str] = {}  # a kernel whose value is its input's as held (no events here)

    def where(value: str) -> str | None:
        value = aliases.get(value, value)
        for buf in ("x", "y", "p"):
            if holds.get(buf) == value:
                return buf
        return save_buffer(value) if holds.get(save_buffer(value)) == value else None

    def define(buf: str, value: str | None, n: int, step: Step, bounds: bool = False) -> None:
        """`value` is now in `buf`, by an event of `n` elements or operations; `bounds`: n
        bounds what a keep copies (a compute's operations; a 16-bit value's elements are
        more than the wavelets a receive counts)."""
        for b in [b for b, v in holds.items() if v == value and not b.startswith("v_")]:
            del holds[b]  # an older copy of a value now redefined
        holds.pop(buf, None)
        if value is None:
            return
        holds[buf] = value
        defined.add(value)
        if value in save:
            into = save_buffer(value)
            m = sizes.get(value, n)  # as many as its readers read
            if bounds:
                m = min(m, n)
            saved[into] = max(saved.get(into, 0), m)
            step.saves.append((buf, into, m))
            holds[into] = value

    for seg in cls.segments:
        written = "y"  # the buffer the last event wrote: what a send sends
        for sub in seg.subs:
            got_x = got_p = False
            promoted = False
            rec = p.records.get(sub.kernel)  # hand-written IR may lack it (no PE bodies then)
            inputs = rec.input_names if rec is not None else ()
            if not sub.events and len(inputs) == 1 and _local_value(rec):
                aliases[sub.kernel] = aliases.get(inputs[0], inputs[0])
            for e in sub.events:
                st = steps[id(e)] = Step()
                if e.kind == "recv":
                    flow = p.flows[e.flow]
                    mine = message_array(p, sub, flow, send=False)
                    if mine is not None:  # words into an array of the kernel's own
                        st.target = written = mine
                        continue
                    internal = flow.role.internal
                    st.target = "p" if internal or (got_x and has_p) else "x"
                    got_x |= st.target == "x"
                    got_p |= st.target == "p"
                    written = st.target
                    st.holds = None if relays(flow) else _received(p, sub, flow)
                    define(st.target, st.holds, e.elems, st)
                elif e.kind == "compute":
                    st.received = "p" if got_p else ("x" if got_x else None)
                    n_ops = operand_count(p, sub, e.name)
                    st.operands = tuple(where(v) for v in inputs[:n_ops])
                    unheld.update(aliases.get(v, v) for v, buf in zip(inputs[:n_ops], st.operands)
                                  if buf is None)
                    in_place = rec is not None and p.kind_of(sub).reads_in_place(rec, e.name)
                    if n_ops == 1 and not got_x and not promoted and not (in_place and st.operands and st.operands[0]):
                        # its body reads x: the input from where it is held, else (a value
                        # this plan does not know) the previous kernel's output in y
                        src = st.operands[0] if st.operands else None
                        if src not in (None, "x") or (src is None and written != "x"):
                            st.promote = src or "y"
                            holds["x"] = holds.get(st.promote)  # type: ignore[assignment]
                            promoted = True
                        st.operands = ("x",) + st.operands[1:]
                    own = rec is not None and p.kind_of(sub).writes_own(rec, HParams.of(p.op), e.name)
                    if e.name not in KEEPS_Y and not own:
                        # a compute's work counts its operations: a GEMV's exceed the
                        # elements it leaves, so a keep copies no more than it did
                        define("y", sub.kernel, e.work, st, bounds=True)
                    if e.name not in WRITES_NO_VALUE and not own:
                        written = "y"
                elif e.kind == "send":
                    flow = p.flows[e.flow]
                    st.source = message_array(p, sub, flow, send=True)
                    sent = _sent_value(p, sub, flow)
                    if st.source is None and sent is not None:  # another kernel's value, where it is held
                        st.source = where(sent)
                        if st.source is None:
                            unheld.add(aliases.get(sent, sent))
                    st.source = st.source or written
    return ValuePlan(steps, saved), unheld & defined


def _sent_value(p: Program, sub: Sub, flow) -> str | None:
    """The kernel whose value a send of `flow` in `sub` carries where it is not the sub's
    own kernel's (`KernelOp.sends_value`: the gate passes the tokens it gated on), else
    None."""
    rec = p.records.get(sub.kernel)
    if rec is None:
        return None
    sent = p.kind_of(sub).sends_value(rec, flow.role)
    return None if sent == sub.kernel else sent


def _local_value(rec) -> bool:
    """Whether a kernel of this record's kind has a value where none of its events ran
    (a reduction along a line of one core: its input as it is, `KernelExec.local_value`)."""
    from meshrt.kernels.numerics import KernelExec

    return registry.kind(rec.kind.data).NUMERICS.local_value is not KernelExec.local_value


def _received(p: Program, sub: Sub, flow) -> str | None:
    """The kernel whose value a receive of `flow` in `sub` brings: a chain's result coming
    back up is the chain kernel's (chains of several kernels share a flow: it serves the
    kernel the core runs) where the kind sends its value up (`up_carries_value`), an
    input the producer of the consumer's operand; None for a partner's partial or a
    norm's inverse RMS."""
    if flow.role is FlowRole.UP:
        rec = p.records.get(sub.kernel)
        return sub.kernel if rec is None or p.kind_of(sub).up_carries_value(rec) else None
    if flow.role is FlowRole.INPUT and flow.op.operand is not None:
        consumer = p.records.get(flow.kernel)
        k = flow.op.operand.value.data
        if consumer is not None and k < len(consumer.input_names):
            return consumer.input_names[k]
    return None


def _read_sizes(p: Program, cls: CoreClass) -> dict[str, int]:
    """Elements of each value the class's computes read (a save holds that many)."""
    sizes: dict[str, int] = {}
    for seg in cls.segments:
        for sub in seg.subs:
            rec = p.records.get(sub.kernel)
            inputs = rec.input_names if rec is not None else ()
            for e in sub.events:
                if e.kind == "compute":
                    for v in inputs[:operand_count(p, sub, e.name)]:
                        sizes[v] = max(sizes.get(v, 0), e.work)
                elif e.kind == "send" and (v := _sent_value(p, sub, p.flows[e.flow])) is not None:
                    sizes[v] = max(sizes.get(v, 0), e.elems)
    return sizes
