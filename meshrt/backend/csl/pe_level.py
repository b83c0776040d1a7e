"""The PE-program level: one `csl.module` per core class (see meshrt.dialects.pe).

`class_module` builds it from the segment program (the `lower-to-pe` pass):
the value plan of the class (`values.py`) becomes its `pe.table`, the arrays
the plan adds (kept values) and each kernel's resident arrays become
`memref.global`s, and every compute event of a kind with PE bodies
(`KernelOp.pe_bodies`) gets its `csl.func`, the kind's body with its buffers
renamed onto the class's arrays. `read_class_module` gives the CSL backend
the plan and bodies back, checked against the class's events.

The working arrays x, y, p and scale are the program's own: the backend sizes
them from the transfers, so the module does not declare them.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.dialects import csl, memref
from xdsl.dialects.builtin import (
    ArrayAttr,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    i64,
)
from xdsl.ir import Block, Region

from meshrt.backend.csl import percore, streams
from meshrt.backend.csl.model import CoreClass, Event, Program, read_program, segment_programs
from meshrt.backend.csl.values import Step, ValuePlan, is_kernel_array, kernel_array, message_array, plan_values
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import pe
from meshrt.dialects.pe import ref_name
from meshrt.kernels.pe import ELEM_TYPES, PROGRAM_ARRAYS, activation_elem
from meshrt.shape import HParams

def program_elem(p: Program) -> str:
    """The element type of a program's activation arrays."""
    hp = HParams.of(p.op)
    # its activation format; IR without one (nor dtype_bytes) is an fp32 program
    return activation_elem(hp.act_format if "act_format" in hp or "dtype_bytes" in hp else "f32")


def module_name(program: str, cls: str) -> str:
    """The symbol of class `cls`'s module (unique among the programs of one file)."""
    return f"{program}.{cls}"


# The program's own arrays (the backend declares and sizes them) and the names bodies
# give their operands (renamed onto where the plan holds them).
WORKING = frozenset({*PROGRAM_ARRAYS, "x1"})


def has_partner(p: Program, cls: CoreClass) -> bool:
    """Whether the class receives on a chain of its own into p (and so has the array p)."""
    return any(e.kind == "recv" and p.flows[e.flow].role.internal
               and message_array(p, sub, p.flows[e.flow], send=False) is None
               for seg in cls.segments for sub in seg.subs for e in sub.events)


def relays(p: Program, cls: CoreClass):
    """flow -> whether the class's cores relay it (a relayed flow's receive sums into x)."""
    plans = streams.plans(p)
    cache: dict[str, bool] = {}

    def relayed(flow) -> bool:
        got = cache.get(flow.name)
        if got is None:
            plan = plans.get(flow.name)
            got = cache[flow.name] = plan is not None and plan.scheme == streams.RELAY and any(
                cfg.names()[0] in streams.RELAY_PHASES for _, cfg in percore.clip_to(plan.cells, cls.boxes))
        return got
    return relayed


def class_bodies(p: Program, cls: CoreClass, sub, cache: dict | None = None):
    """The PE bodies of `sub`'s kernel on this class's tile (the rectangle of the kernel's
    region holding the class's first core), or None. `cache`: bodies already built, by
    kernel and tile (the classes of one rectangle share them)."""
    info = p.record(sub)
    x0, y0 = cls.boxes[0][0], cls.boxes[0][1]
    tile = next((r.tuple[:4] for r in info.region.rects.data
                 if r.tuple[0] <= x0 < r.tuple[0] + r.tuple[2]
                 and r.tuple[1] <= y0 < r.tuple[1] + r.tuple[3]), None)
    if tile is None:
        return None
    key = (sub.kernel, tile)
    if cache is not None and key in cache:
        return cache[key]
    bodies = p.kind_of(sub).pe_bodies(info, max(1, p.micro_batch), HParams.of(p.op), tile)
    if cache is not None:
        cache[key] = bodies
    return bodies


def _sym(name: str | None) -> SymbolRefAttr:
    return SymbolRefAttr(name if name is not None else pe.UNKNOWN)


def _global(name: str, elems: int, elem: str, **attrs) -> memref.GlobalOp:
    g = memref.GlobalOp.get(StringAttr(name), MemRefType(ELEM_TYPES[elem], [max(1, elems)]), UnitAttr(),
                            sym_visibility=StringAttr("private"))
    for k, v in attrs.items():
        g.attributes[k] = v
    return g


def _uses(fn: csl.FuncOp, buf: str) -> bool:
    return any(isinstance(op, memref.GetGlobalOp) and op.name_.root_reference.data == buf for op in fn.walk())


def _renamed_body(fn: csl.FuncOp, name: str, renames: dict[str, str]) -> csl.FuncOp:
    """A copy of body `fn` named `name`, its buffers renamed onto the class's arrays."""
    out = fn.clone()
    out.sym_name = StringAttr(name)
    for op in out.walk():
        if isinstance(op, memref.GetGlobalOp):
            new = renames.get(op.name_.root_reference.data)
            if new is not None:
                op.name_ = SymbolRefAttr(new)
    return out


def class_module(p: Program, cls: CoreClass, cache: dict | None = None) -> csl.CslModuleOp:
    """The PE-program level of core class `cls` of program `p` (`cache`: `class_bodies`')."""
    plan = plan_values(p, cls, has_partner(p, cls), relays(p, cls))
    elem = program_elem(p)
    decls: list = [_global(name, n, elem) for name, n in sorted(plan.saved.items())]
    # the kernels' own arrays: message buffers (as long as their longest message) and the
    # bodies' state, each as long as its longest use
    private: dict[str, tuple[int, str]] = {}

    def own(name: str, n: int, typ: str, op) -> None:
        have = private.get(name)
        if have is not None and have[1] != typ:
            raise MeshrtError(f"core class @{cls.name}: array {name} is used as {have[1]} and as {typ}", op)
        private[name] = (max(n, have[0] if have else 0), typ)

    for seg in cls.segments:
        for sub in seg.subs:
            for e in sub.events:
                if e.kind in ("recv", "send"):
                    st = plan.step(e)
                    name = st.target if e.kind == "recv" else st.source
                    if is_kernel_array(name):  # of the type its bodies declare (32-bit words if none)
                        bodies = class_bodies(p, cls, sub, cache) if sub.kernel in p.records else None
                        buf = name.split("::", 1)[1]
                        typ = next((b.elem for b in bodies.buffers if b.name == buf), "i32") if bodies else "i32"
                        own(name, e.elems, typ, p.flows[e.flow].op)
    funcs: list[csl.FuncOp] = []
    bodies_of: dict[str, object] = {}
    segments = []
    n_compute = 0
    for seg in cls.segments:
        ops = []
        for sub in seg.subs:
            for e in sub.events:
                st = plan.step(e)
                if e.kind == "recv":
                    ops.append(pe.RecvOp(properties=_props(flow=SymbolRefAttr(e.flow), into=SymbolRefAttr(st.target),
                                                           holds=st.holds and SymbolRefAttr(st.holds))))
                elif e.kind == "send":
                    ops.append(pe.SendOp(properties=_props(flow=SymbolRefAttr(e.flow),
                                                           source=SymbolRefAttr(st.source))))
                elif e.kind in ("resolve", "produce"):
                    ops.append(pe.MetaOp(properties=_props(kind=StringAttr(e.kind), flow=SymbolRefAttr(e.flow))))
                elif e.kind == "compute":
                    call = None
                    if sub.kernel not in bodies_of:
                        bodies_of[sub.kernel] = class_bodies(p, cls, sub, cache) if sub.kernel in p.records else None
                        bodies = bodies_of[sub.kernel]
                        if bodies is not None:
                            off = 0
                            for b in bodies.resident:
                                decls.append(_global(kernel_array(sub.kernel, b.name), b.elems, b.elem,
                                                     resident_offset=IntegerAttr(off, i64)))
                                off += b.elems
                    bodies = bodies_of[sub.kernel]
                    fn = bodies.funcs.get(e.name) if bodies is not None else None
                    if fn is not None:
                        renames = {b.name: kernel_array(sub.kernel, b.name) for b in bodies.buffers
                                   if b.name not in WORKING}
                        for k, buf in enumerate(("x", "x1")):
                            if k < len(st.operands) and st.operands[k] not in (None, buf):
                                renames[buf] = st.operands[k]
                        call = f"k{n_compute}_{e.name}"
                        funcs.append(_renamed_body(fn, call, renames))
                        for b in bodies.buffers:  # the kernel's own arrays this body uses
                            if not b.resident and b.name not in WORKING and _uses(fn, b.name):
                                own(kernel_array(sub.kernel, b.name), b.elems, b.elem, sub.op)
                    n_compute += 1
                    ops.append(pe.ComputeOp(properties=_props(
                        kernel=SymbolRefAttr(sub.kernel), op=StringAttr(e.name),
                        reads=ArrayAttr([_sym(b) for b in st.operands]) if st.operands else None,
                        promote=st.promote and SymbolRefAttr(st.promote),
                        received=st.received and SymbolRefAttr(st.received),
                        call=call and SymbolRefAttr(call))))
                for src, into, n in st.saves:
                    ops.append(pe.KeepOp(properties=_props(source=SymbolRefAttr(src), into=SymbolRefAttr(into),
                                                           elems=IntegerAttr(n, i64))))
        segments.append(pe.SegmentOp(properties={"index": IntegerAttr(seg.index, i64)},
                                     regions=[Region(Block(ops))]))
    decls += [_global(name, n, typ) for name, (n, typ) in sorted(private.items())]
    table = pe.TableOp(regions=[Region(Block(segments))])
    return csl.CslModuleOp(regions=[Region(Block([*_outer_values(funcs), *decls, *funcs, table]))], properties={
        "kind": csl.ModuleKindAttr(csl.ModuleKind.PROGRAM),
        "sym_name": StringAttr(module_name(p.op.program_name, cls.name))})


def _outer_values(funcs: list[csl.FuncOp]) -> list:
    """The class module's own `<math>` import and parameters, which the bodies (copied
    from their kinds' modules) are made to use: one op of each the bodies use."""
    made: dict = {}
    for f in funcs:
        for o in f.walk():
            for k, v in enumerate(o.operands):
                src = v.owner
                if isinstance(src, csl.ImportModuleConstOp):
                    key = ("import", src.module.data)
                    if key not in made:
                        made[key] = csl.ImportModuleConstOp(src.module.data)
                        made[key].result.name_hint = "math"
                elif isinstance(src, csl.ParamOp):
                    key = ("param", src.param_name.data)
                    if key not in made:
                        made[key] = csl.ParamOp(src.param_name.data, src.res.type)
                else:
                    continue
                if src is not made[key]:
                    o.operands = (*o.operands[:k], made[key].results[0], *o.operands[k + 1:])
    return list(made.values())


def lower_to_pe(module: ModuleOp) -> None:
    """Give every core class of `module`'s segment programs its PE-level module (a module
    already there is built again)."""
    old = class_modules(module)
    for prog_op in segment_programs(module):
        program = read_program(prog_op)
        cache: dict = {}
        for cls in program.classes:
            new = class_module(program, cls, cache)
            stale = old.pop(module_name(prog_op.program_name, cls.name), None)
            if stale is not None:
                stale.detach()
                stale.erase()
            module.body.block.add_op(new)


def _props(**kw) -> dict:
    return {k: v for k, v in kw.items() if v is not None}


@dataclass(frozen=True)
class Array:
    """An array the PE level declares: a kept value (`v_<kernel>`), a kernel's resident
    buffer (at `offset` in its sub-schedule's region) or a kernel's own array."""

    elems: int
    offset: int | None
    elem: str  # f32, bf16, f16, i32
    own: bool  # a kernel's own array (message words, a body's state)


@dataclass
class ClassLevel:
    """What the backend reads back: the plan, each compute event's body (or None), and
    the module's arrays by name."""

    plan: ValuePlan
    calls: dict[int, csl.FuncOp | None]
    arrays: dict[str, Array]


def class_modules(module: ModuleOp) -> dict[str, csl.CslModuleOp]:
    return {op.sym_name.data: op for op in module.body.block.ops if isinstance(op, csl.CslModuleOp)}


def read_class_module(mod: csl.CslModuleOp, p: Program, cls: CoreClass) -> ClassLevel:
    """The plan and bodies of `cls` from its module, event by event (a table that does
    not follow the class's events is an error naming both)."""
    arrays: dict[str, Array] = {}
    funcs: dict[str, csl.FuncOp] = {}
    table = None
    for op in mod.body.block.ops:
        if isinstance(op, memref.GlobalOp):
            off = op.attributes.get("resident_offset")
            typ = next((k for k, t in ELEM_TYPES.items() if t == op.type.element_type), None)
            if typ is None:
                raise MeshrtError(f"core class @{cls.name}: array {op.sym_name.data} has element type "
                                  f"{op.type.element_type}; arrays are {', '.join(ELEM_TYPES)}", op)
            name, off = op.sym_name.data, off.value.data if isinstance(off, IntegerAttr) else None
            arrays[name] = Array(op.type.get_shape()[0], off, typ, off is None and is_kernel_array(name))
        elif isinstance(op, csl.FuncOp):
            funcs[op.sym_name.data] = op
        elif isinstance(op, pe.TableOp):
            table = op
    if table is None:
        raise MeshrtError(f"core class @{cls.name}: its PE-level module has no pe.table", mod)
    events = [(e, sub) for seg in cls.segments for sub in seg.subs for e in sub.events]
    steps: dict[int, Step] = {}
    calls: dict[int, csl.FuncOp | None] = {}
    saved = {name: a.elems for name, a in arrays.items() if not is_kernel_array(name)}
    ops = [op for seg in table.segments() for op in seg.body.block.ops]
    k = 0
    last: Step | None = None
    for op in ops:
        if isinstance(op, pe.KeepOp):
            if last is None:
                raise MeshrtError(f"core class @{cls.name}: pe.keep before any event", op)
            last.saves.append((ref_name(op.source), ref_name(op.into), op.elems.value.data))
            continue
        if k >= len(events):
            raise MeshrtError(f"core class @{cls.name}: its pe.table has more events than its "
                              f"table ({len(events)})", op)
        e, sub = events[k]
        k += 1
        _match(op, e, sub, cls)
        st = last = steps[id(e)] = Step()
        if isinstance(op, pe.RecvOp):
            st.target, st.holds = ref_name(op.into), op.holds and ref_name(op.holds)
        elif isinstance(op, pe.SendOp):
            st.source = ref_name(op.source)
        elif isinstance(op, pe.ComputeOp):
            st.operands = op.operand_arrays()
            st.promote = op.promote and ref_name(op.promote)
            st.received = op.received and ref_name(op.received)
            calls[id(e)] = None
            if op.call is not None:
                fn = funcs.get(ref_name(op.call))
                if fn is None:
                    raise MeshrtError(f"core class @{cls.name}: calls @{ref_name(op.call)}, which the "
                                      "module does not define", op)
                calls[id(e)] = fn
    if k != len(events):
        raise MeshrtError(f"core class @{cls.name}: its pe.table has {k} events, its table "
                          f"{len(events)}", table)
    return ClassLevel(ValuePlan(steps, saved), calls, arrays)


_KIND = {pe.RecvOp: "recv", pe.SendOp: "send", pe.ComputeOp: "compute"}


def _match(op, e: Event, sub, cls: CoreClass) -> None:
    kind = op.kind.data if isinstance(op, pe.MetaOp) else _KIND[type(op)]
    ok = kind == e.kind
    if ok and isinstance(op, pe.RecvOp | pe.SendOp | pe.MetaOp):
        ok = ref_name(op.flow) == e.flow
    if ok and isinstance(op, pe.ComputeOp):
        ok = ref_name(op.kernel) == sub.kernel and op.op.data == e.name
    if not ok:
        what = f"{e.kind} of @{sub.kernel}" + (f" on @{e.flow}" if e.flow else f" \"{e.name}\"")
        raise MeshrtError(f"core class @{cls.name}: does not follow the class's event table, "
                          f"whose event here is the {what}", op)
