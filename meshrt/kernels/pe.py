"""Compute bodies at the PE-program level: DSD operations in xDSL's `csl` dialect.

A kernel kind writes the compute of each of its compute ops once, as a
`csl.func` built here: memory DSDs over the kernel's buffers
(`csl.get_mem_dsd` with an affine `tensor_access`), the DSD builtins
(`@fmovs`, `@fadds`, `@fmuls`, `@fmacs`, ...) and, where a value needs a
function the fabric's vector units lack (a square root), a loop over
scalars calling CSL's `<math>` library. The interpreter executes these ops
on each core's buffers (`meshrt.runtime.pe_exec`) and the CSL backend
prints them with xDSL's CSL printer: one implementation of each kernel's
compute.

Buffers are named by what they hold for the kernel (`in`, `out`, `gain`,
...); a body's `csl.func` reads them through `memref.get_global`, and the
one `csl.module` of a kernel's bodies declares them (`memref.global`, with
the element count the fullest core of the class needs: cores holding less
leave the rest zero, which no body lets into a value). Element types are
the declared ones: float32 for values (16-bit activations round at the
kernel's boundary, where `meshrt.activations` says), i32 for token ids and
what travels with them (32-bit words; arith wants signless integers). A
body that needs its core's place in the kernel's region reads the program's
coordinate parameters (`Body.param`: px, py).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass

from xdsl.dialects import arith, csl, memref, scf
from xdsl.dialects.builtin import (
    AffineMapAttr,
    FloatAttr,
    IndexType,
    IntegerAttr,
    MemRefType,
    ModuleOp,
    StringAttr,
    UnitAttr,
    bf16,
    f16,
    f32,
    i16,
    i32,
)
from xdsl.ir import Block, Operation, Region, SSAValue
from xdsl.ir.affine import AffineExpr, AffineMap

ELEM_TYPES = {"f32": f32, "f16": f16, "bf16": bf16, "i32": i32}
MATH = "<math>"  # the CSL library of scalar functions the bodies call
# The core's coordinates, comptime parameters of every class's program (the layout
# sets them per core): a body that needs its core's place in the kernel's region
# (which rows of the vocabulary it holds) reads them.
CORE_PARAMS = ("px", "py")

# Arrays of the program itself that bodies may name (the CSL backend declares and sizes
# them; the PE level does not): the working arrays, a norm's per-slot scale, the
# routing table of a MoE class, and the request descriptor table (4 words a KV slot:
# request id, status, context length, -) with the micro-batch it serves (`mb`, one
# word). Their element type, None: the program's activations'.
PROGRAM_ARRAYS: dict[str, str | None] = {"x": None, "y": None, "p": None, "scale": "f32",
                                         "rt_expert": "i32", "rt_weight": "f32", "rdt": "i32",
                                         "mb": "i32"}


def activation_elem(act_format: str) -> str:
    """The element type a program keeps activations in: its activation format
    (`meshrt.activations`): f32, bf16, or f16 (a float16 checkpoint's). The CSL's 16-bit
    type is the one `cslc --fp16-format` selects, so the chip rounds as the interpreter."""
    if act_format not in ("f32", "f16", "bf16"):
        raise ValueError(f"no element type for activation format {act_format!r}")
    return act_format


@dataclass(frozen=True)
class Buffer:
    """A named array of a kernel's program: `elems` elements of type `elem`."""

    name: str
    elems: int
    elem: str = "f32"
    resident: bool = False  # loaded by the host, kept across steps (weights, gains)

    def type(self) -> MemRefType:
        return MemRefType(ELEM_TYPES[self.elem], [max(1, self.elems)])


class Body:
    """Builds one compute op's `csl.func`: DSDs over named buffers and DSD operations.

    A DSD is `dsd(buffer, sizes, strides, offset)`: the elements
    `buffer[offset + sum(i_k * strides[k])]` for every index (i_0, ...) below
    `sizes`; a stride of 0 repeats an element along that dimension (a scalar
    per slot broadcast over the slot's elements, or an accumulator a
    reduction adds into).
    """

    def __init__(self, name: str, buffers: Sequence[Buffer]):
        self.name = name
        self.buffers = {b.name: b for b in buffers}
        self.block = Block()
        self._globals: dict[str, SSAValue] = {}
        self._ints: dict[int, SSAValue] = {}
        self.math: SSAValue | None = None  # the module's `<math>` import, set by `Bodies`
        self.params: dict[str, SSAValue] = {}  # the module's `csl.param`s, set by `Bodies`

    def _add(self, op: Operation) -> Operation:
        self.block.add_op(op)
        return op

    def buffer(self, name: str) -> SSAValue:
        v = self._globals.get(name)
        if v is None:
            if name not in self.buffers:
                raise KeyError(f"body {self.name}: no buffer '{name}'")
            v = self._globals[name] = self._add(
                memref.GetGlobalOp(name, self.buffers[name].type())).memref
        return v

    def index(self, n: int) -> SSAValue:
        v = self._ints.get(n)
        if v is None:
            v = self._ints[n] = self._add(arith.ConstantOp(IntegerAttr(n, i16))).result
        return v

    def scalar(self, value: float) -> SSAValue:
        return self._add(arith.ConstantOp(FloatAttr(float(value), f32))).result

    def dsd(self, buf: str, sizes: Sequence[int], strides: Sequence[int] | None = None,
            offset: int = 0) -> SSAValue:
        sizes = tuple(int(s) for s in sizes)
        if strides is None:  # dense, row-major: the last index fastest
            strides = tuple(int(__import__("math").prod(sizes[k + 1:])) for k in range(len(sizes)))
        expr: AffineExpr = AffineExpr.constant(offset)
        for k, s in enumerate(strides):
            if s:
                expr = expr + AffineExpr.dimension(k) * s
        kind = csl.DsdKind.mem1d_dsd if len(sizes) == 1 else csl.DsdKind.mem4d_dsd
        d = self._add(csl.GetMemDsdOp.build(
            operands=[self.buffer(buf), [self.index(s) for s in sizes]],
            result_types=[csl.DsdType(kind)],
            properties={"tensor_access": AffineMapAttr(AffineMap(len(sizes), 0, (expr,)))})).result
        d.name_hint = f"{buf}_dsd"
        return d

    # the DSD builtins (dest first, as CSL writes them)
    def fmovs(self, dst: SSAValue, src: SSAValue) -> None:
        self._add(csl.FmovsOp(operands=[[dst, src]]))

    def fadds(self, dst: SSAValue, a: SSAValue, b: SSAValue) -> None:
        self._add(csl.FaddsOp(operands=[[dst, a, b]]))

    def fsubs(self, dst: SSAValue, a: SSAValue, b: SSAValue) -> None:
        self._add(csl.FsubsOp(operands=[[dst, a, b]]))

    def fmuls(self, dst: SSAValue, a: SSAValue, b: SSAValue) -> None:
        self._add(csl.FmulsOp(operands=[[dst, a, b]]))

    def fmacs(self, dst: SSAValue, a: SSAValue, b: SSAValue, s: SSAValue) -> None:
        """dst = a + b * s (s a float32 scalar)."""
        self._add(csl.FmacsOp(operands=[[dst, a, b, s]]))

    def each(self, n: int | SSAValue, fn) -> None:
        """for (i in 0..n) fn(body, i): a loop over scalars (`scf.for`); `n` a constant or
        an index computed at run time."""
        self.fold(n, [], lambda bd, i: fn(bd, i) or [])

    @contextmanager
    def _inside(self, block: Block):
        """Build into `block` (a loop's or a branch's body): the values it defines are its own."""
        outer, saved = self.block, (self._ints, self._globals)
        self.block, self._ints, self._globals = block, {}, {}
        try:
            yield
        finally:
            self.block, (self._ints, self._globals) = outer, saved

    def offset(self, dsd: SSAValue, by: SSAValue) -> SSAValue:
        """`dsd` moved `by` elements on (`@increment_dsd_offset`)."""
        off = self.cast(by, i16)
        return self._add(csl.IncrementDsdOffsetOp.build(
            operands=[dsd, off], properties={"elem_type": f32}, result_types=[dsd.type])).result

    def mul(self, i: SSAValue, n: int) -> SSAValue:
        """An integer (an index, an i32) times a constant."""
        return self._add(arith.MuliOp(i, self.const(n, i.type))).result

    def add(self, i: SSAValue, j: SSAValue) -> SSAValue:
        return self._add(arith.AddiOp(i, j)).result

    def plus(self, i: SSAValue, n: int) -> SSAValue:
        """An integer plus a constant."""
        return self.add(i, self.const(n, i.type))

    def load(self, buf: str, i: SSAValue) -> SSAValue:
        return self._add(memref.LoadOp.get(self.buffer(buf), [i])).res

    def store(self, value: SSAValue, buf: str, i: SSAValue) -> None:
        self._add(memref.StoreOp.get(value, self.buffer(buf), [i]))

    def call(self, fn: str, *args: SSAValue) -> SSAValue:
        """A scalar function of CSL's `<math>` library (`sqrt_f32`, `exp_f32`)."""
        if self.math is None:
            raise ValueError(f"body {self.name}: calls {fn} outside a module that imports {MATH}")
        return self._add(csl.MemberCallOp(fn, f32, self.math.owner, list(args))).result

    def divf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.DivfOp(a, b)).result

    def addf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.AddfOp(a, b)).result

    def subf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.SubfOp(a, b)).result

    def mulf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.MulfOp(a, b)).result

    def minf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        """The smaller of two scalars (a compare and a select: CSL has no float min)."""
        return self.select(self.cmpf(a, b, "olt"), a, b)

    def maxf(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self.select(self.cmpf(a, b, "ogt"), a, b)

    # integers (i32 token ids, index arithmetic) and control flow
    def const(self, value: int, type=None) -> SSAValue:
        """An integer constant (an index unless `type`)."""
        return self._add(arith.ConstantOp(IntegerAttr(int(value), type or IndexType()))).result

    def cast(self, v: SSAValue, type) -> SSAValue:
        """`@as(type, v)` between integer types (an index, i32, the i16 coordinates)."""
        if v.type == type:
            return v
        if isinstance(v.type, IndexType) or isinstance(type, IndexType):
            return self._add(arith.IndexCastOp(v, type)).result
        if type.width.data > v.type.width.data:
            return self._add(arith.ExtSIOp(v, type)).result
        return self._add(arith.TruncIOp(v, type)).result

    def widen(self, v: SSAValue) -> SSAValue:
        """A 16-bit float as float32 (exact), a float32 as it is."""
        return v if v.type == f32 else self._add(arith.ExtFOp(v, f32)).result

    def bitcast(self, v: SSAValue, type) -> SSAValue:
        """The same 32 bits as another type (`@bitcast`: a float32 travelling as an i32 word)."""
        return self._add(arith.BitcastOp(v, type)).result

    def subi(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.SubiOp(a, b)).result

    def remi(self, a: SSAValue, b: SSAValue) -> SSAValue:
        """a % b, of the sign of a (C's, and CSL's)."""
        return self._add(arith.RemSIOp(a, b)).result

    def to_float(self, v: SSAValue) -> SSAValue:
        """An i32 as float32 (`@as(f32, v)`: exact below 2**24)."""
        return self._add(arith.SIToFPOp(v, f32)).result

    def to_int(self, v: SSAValue) -> SSAValue:
        """A float32 as i32, rounded toward zero (`@as(i32, v)`)."""
        return self._add(arith.FPToSIOp(v, i32)).result

    def cmpi(self, a: SSAValue, b: SSAValue, pred: str) -> SSAValue:
        """An integer comparison ("eq", "ne", "slt", "sge", ...)."""
        return self._add(arith.CmpiOp(a, b, pred)).result

    def cmpf(self, a: SSAValue, b: SSAValue, pred: str) -> SSAValue:
        return self._add(arith.CmpfOp(a, b, pred)).result

    def both(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.AndIOp(a, b)).result

    def either(self, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.OrIOp(a, b)).result

    def select(self, c: SSAValue, a: SSAValue, b: SSAValue) -> SSAValue:
        return self._add(arith.SelectOp(c, a, b)).result

    def param(self, name: str) -> SSAValue:
        """A comptime parameter of the program (`CORE_PARAMS`: this core's coordinates)."""
        v = self.params.get(name)
        if v is None:
            raise ValueError(f"body {self.name}: no parameter '{name}' (the module declares "
                             f"{', '.join(self.params) or 'none'})")
        return v

    def when(self, cond: SSAValue, fn) -> None:
        """if (cond) fn(body) (`scf.if` without results)."""
        inner = Block()
        with self._inside(inner):
            fn(self)
            self._add(scf.YieldOp())
        self._add(scf.IfOp(cond, [], Region(inner), Region(Block([scf.YieldOp()]))))

    def fold(self, n: int | SSAValue, inits: Sequence[SSAValue], fn) -> list[SSAValue]:
        """for (i in 0..n) carried = fn(body, i, *carried), from `inits`: a loop carrying
        scalars from one iteration to the next (`scf.for` with iteration arguments); the
        last iteration's values. `n`: a constant, or an index computed at run time."""
        bounds = [v if isinstance(v, SSAValue) else self._add(arith.ConstantOp(IntegerAttr(v, IndexType()))).result
                  for v in (0, n, 1)]
        loop_body = Block(arg_types=[IndexType(), *(v.type for v in inits)])
        with self._inside(loop_body):
            self._add(scf.YieldOp(*fn(self, loop_body.args[0], *loop_body.args[1:])))
        return list(self._add(scf.ForOp(*bounds, list(inits), Region(loop_body))).results)

    def func(self) -> csl.FuncOp:
        self._add(csl.ReturnOp())
        return csl.FuncOp(self.name, ((), None), Region(self.block))


class Bodies:
    """A kernel's compute bodies in one `csl.module`: its buffers, the `<math>` import
    and one `csl.func` per compute op."""

    def __init__(self, kernel: str, buffers: Sequence[Buffer]):
        self.kernel = kernel
        self.buffers = list(buffers)
        self.math_import = csl.ImportModuleConstOp(MATH)
        self.math_import.result.name_hint = "math"
        self.params = {name: csl.ParamOp(name, i16) for name in CORE_PARAMS}
        self.funcs: dict[str, csl.FuncOp] = {}

    def buffer(self, name: str) -> Buffer:
        return next(b for b in self.buffers if b.name == name)

    @property
    def resident(self) -> list[Buffer]:
        """The buffers the host loads, in the order they sit in the class's resident region."""
        return [b for b in self.buffers if b.resident]

    def body(self, op: str) -> Body:
        b = Body(f"{self.kernel}_{op}", self.buffers)
        b.math = self.math_import.result
        b.params = {name: op.res for name, op in self.params.items()}
        return b

    def add(self, op: str, body: Body) -> None:
        self.funcs[op] = body.func()

    def module(self) -> csl.CslModuleOp:
        ops: list[Operation] = [self.math_import, *self.params.values()]
        ops += [memref.GlobalOp.get(StringAttr(b.name), b.type(), UnitAttr(),
                                    sym_visibility=StringAttr("private")) for b in self.buffers]
        ops += list(self.funcs.values())
        return csl.CslModuleOp(regions=[Region(Block(ops))], properties={
            "kind": csl.ModuleKindAttr(csl.ModuleKind.PROGRAM), "sym_name": StringAttr(self.kernel)})

    def as_module(self) -> ModuleOp:
        return ModuleOp([self.module()])
