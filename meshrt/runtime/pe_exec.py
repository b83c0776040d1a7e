"""Executes compute bodies (`meshrt.kernels.pe`) on one core's buffers.

The ops are xDSL's: `csl.get_mem_dsd` and the DSD builtins, `arith`,
`scf.for` (with carried values) / `scf.if`, `memref.load` / `store` /
`get_global`, `csl.member_call` into CSL's `<math>` library and the
program's coordinate parameters (`csl.param` px, py: the core's, given to
`run`). Each has one implementation here, registered per op class,
computing in the declared element types (float32 values, i32 token ids,
integer index arithmetic): what the CSL printed from the same ops computes.

A body is compiled once (`compiled(fn)`): its DSDs are constants (buffer,
element indices), so each op becomes a step that reads and writes the
core's arrays. A DSD builtin streams its operands element by element, as
the hardware does: where the destination repeats an element (a stride-0
accumulator, `dst = dst + src`) the elements are added in stream order; a
destination whose elements are all distinct is computed at once; any other
overlap of the destination with a source runs element by element.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from xdsl.dialects import arith, csl, memref, scf
from xdsl.dialects.builtin import FloatAttr, IndexType, IntegerAttr, IntegerType, bf16, f16
from xdsl.ir import Block, Operation, OpResult, SSAValue

F32 = np.float32
Buffers = dict[str, np.ndarray]
Step = Callable[[Buffers, dict], None]


class PeExecError(Exception):
    """A body the executor cannot run (an op it does not know, a DSD out of its buffer)."""


@dataclass(frozen=True)
class Dsd:
    """A memory DSD: elements `idx` (stream order) of buffer `buf`, moved on at run time
    by the sum of `moves` (`@increment_dsd_offset`; none: a constant DSD)."""

    buf: str
    idx: np.ndarray  # int64, flat
    size: int  # elements the declared buffer has
    moves: tuple[Callable[[dict], int], ...] = ()

    @property
    def unique(self) -> bool:
        return len(np.unique(self.idx)) == len(self.idx)

    def index(self, env: dict) -> np.ndarray:
        """The elements it reaches in this run (its moves read from env)."""
        if not self.moves:
            return self.idx
        off = sum(m(env) for m in self.moves)
        if off and (self.idx.min() + off < 0 or self.idx.max() + off >= self.size):
            raise PeExecError(f"a DSD of {len(self.idx)} elements moved by {off} reaches past "
                              f"buffer '{self.buf}', which has {self.size}")
        return self.idx + off


# The `<math>` library's functions a body may call, float32 in and out.
MATH_FNS: dict[str, Callable[[F32], F32]] = {
    "sqrt_f32": lambda v: F32(np.sqrt(F32(v))),
    "exp_f32": lambda v: F32(np.exp(F32(v))),
}


class _Ctx:
    """What compiling a body knows: constant values (DSDs, numbers, buffers' sizes)."""

    def __init__(self, where: str):
        self.where = where
        self.const: dict[SSAValue, object] = {}
        self.in_order = False  # compiling the body of a loop run at once: its loops run in order
        self.read_only: set[str] = set()  # buffers held in a type this executor does not round to

    def writable(self, name: str, what: str) -> None:
        if name in self.read_only:
            raise self.fail(f"{what} writes bf16 buffer '{name}': the executor holds bf16 values "
                            "in float32 and does not round stores to them")

    def fail(self, msg: str) -> PeExecError:
        return PeExecError(f"{self.where}: {msg}")


_COMPILERS: dict[type[Operation], Callable[[Operation, _Ctx], Step | None]] = {}


def impl(*ops: type[Operation]):
    """Register the compiler of an op: (op, ctx) -> a step, or None when the op only
    defines constants."""
    def register(fn):
        for op in ops:
            _COMPILERS[op] = fn
        return fn
    return register


class Compiled:
    """A body's steps; calling it runs the body on one core's buffers, in place."""

    def __init__(self, fn: csl.FuncOp):
        self.name = fn.sym_name.data
        self.steps = _block(fn.body.block, _Ctx(self.name))

    def __call__(self, buffers: Buffers, params: dict[str, int] | None = None) -> None:
        env: dict = dict(params or {})
        for step in self.steps:
            step(buffers, env)


_CACHE: dict[csl.FuncOp, Compiled] = {}


def compiled(fn: csl.FuncOp) -> Compiled:
    c = _CACHE.get(fn)
    if c is None:
        c = _CACHE[fn] = Compiled(fn)
    return c


def run(fn: csl.FuncOp, buffers: Buffers, params: dict[str, int] | None = None) -> None:
    """Run `fn` (a body's `csl.func`) on `buffers` (name -> array of its element type), in
    place; `params`: the program parameters it reads (the core's px, py)."""
    compiled(fn)(buffers, params)


def dtype(type) -> type:
    """The NumPy type of an element / scalar type of the bodies."""
    if isinstance(type, IntegerType):
        return {1: np.bool_, 16: np.int16, 32: np.int32}[type.width.data]
    if isinstance(type, IndexType):
        return np.int64
    # bf16 (NumPy has none): float32 arrays holding the bf16 values that were staged into
    # them. Bodies only read 16-bit arrays (a program's 16-bit activations are computed on
    # float32 copies, `meshrt.backend.csl.program`), so nothing rounds a store into one.
    return np.float16 if type == f16 else F32


def _block(block: Block, ctx: _Ctx) -> list[Step]:
    return _ops(block.ops, ctx)


def _ops(ops, ctx: _Ctx) -> list[Step]:
    steps = []
    for op in ops:
        f = _COMPILERS.get(type(op))
        if f is None:
            raise ctx.fail(f"no executor for op {op.name}")
        step = f(op, ctx)
        if step is not None:
            steps.append(step)
    return steps


def _value(v: SSAValue, ctx: _Ctx) -> Callable[[dict], object]:
    """A reader of SSA value v at run time: its constant, or what a step put in env."""
    if v in ctx.const:
        c = ctx.const[v]
        return lambda env: c
    if isinstance(v.owner, csl.ImportModuleConstOp) and v.owner.module.data == "<math>":
        return lambda env: MATH_FNS
    if isinstance(v.owner, csl.ParamOp):
        name = v.owner.param_name.data

        def param(env):
            if name not in env:
                raise PeExecError(f"{ctx.where}: reads parameter {name}, which the run does not give")
            return env[name]
        return param
    key = id(v)  # env is keyed by the values' ids: an int hashes in C, an SSAValue in Python
    return lambda env: env[key]


@impl(csl.ReturnOp, scf.YieldOp)
def _end(op, ctx):
    return None  # a body's last op: nothing follows it


@impl(memref.GetGlobalOp)
def _get_global(op, ctx):
    name = op.name_.root_reference.data
    ctx.const[op.memref] = (name, op.memref.type.get_shape()[0])
    if op.memref.type.element_type == bf16:
        ctx.read_only.add(name)


@impl(arith.ConstantOp)
def _constant(op, ctx):
    v = op.value
    if isinstance(v, IntegerAttr):
        ctx.const[op.result] = int(v.value.data)
    elif isinstance(v, FloatAttr):
        ctx.const[op.result] = F32(v.value.data)
    else:
        raise ctx.fail(f"constant {v} is neither an integer nor a float")


def _binary(fn):
    def compile_op(op, ctx):
        a, b, res = _value(op.lhs, ctx), _value(op.rhs, ctx), id(op.result)

        def step(bufs, env):
            env[res] = F32(fn(F32(a(env)), F32(b(env))))
        return step
    return compile_op


def _integer(fn):
    def compile_op(op, ctx):
        a, b, res = _value(op.lhs, ctx), _value(op.rhs, ctx), id(op.result)
        if op.lhs in ctx.const and op.rhs in ctx.const:
            ctx.const[op.result] = int(fn(ctx.const[op.lhs], ctx.const[op.rhs]))
            return None

        def step(bufs, env):  # ints, or every iteration's at once (a fused loop)
            env[res] = fn(a(env), b(env))
        return step
    return compile_op


impl(arith.AddiOp)(_integer(lambda a, b: a + b))
impl(arith.SubiOp)(_integer(lambda a, b: a - b))
impl(arith.MuliOp)(_integer(lambda a, b: a * b))
impl(arith.AndIOp)(_integer(lambda a, b: a & b))
impl(arith.OrIOp)(_integer(lambda a, b: a | b))
impl(arith.RemSIOp)(_integer(np.fmod))  # the sign of the dividend, as C's %


@impl(arith.SIToFPOp)
def _sitofp(op, ctx):
    get, res = _value(op.input, ctx), id(op.result)

    def step(bufs, env):
        env[res] = np.asarray(get(env)).astype(F32)[()]
    return step


@impl(arith.FPToSIOp)
def _fptosi(op, ctx):
    get, res = _value(op.input, ctx), id(op.result)

    def step(bufs, env):  # toward zero
        env[res] = np.trunc(np.asarray(get(env), F32)).astype(np.int64)[()]
    return step


@impl(arith.IndexCastOp, arith.ExtSIOp, arith.TruncIOp)
def _index_cast(op, ctx):
    # integer values are exact here (a token id, an index, a coordinate): the cast keeps
    # the value; the result's type is what a store or a bitcast converts to
    if op.input in ctx.const:
        ctx.const[op.result] = ctx.const[op.input]
        return None
    get, res = _value(op.input, ctx), id(op.result)

    def step(bufs, env):
        env[res] = get(env)
    return step


@impl(arith.ExtFOp)
def _extf(op, ctx):
    get, res = _value(op.input, ctx), id(op.result)

    def step(bufs, env):  # exact: every 16-bit float is a float32
        env[res] = np.asarray(get(env)).astype(F32)[()]
    return step


@impl(arith.BitcastOp)
def _bitcast(op, ctx):
    get, res, to = _value(op.input, ctx), id(op.result), dtype(op.result.type)
    src = dtype(op.input.type)

    def step(bufs, env):
        env[res] = np.asarray(get(env), src).view(to)[()]
    return step


impl(arith.AddfOp)(_binary(lambda a, b: a + b))
impl(arith.SubfOp)(_binary(lambda a, b: a - b))
impl(arith.MulfOp)(_binary(lambda a, b: a * b))
impl(arith.DivfOp)(_binary(lambda a, b: a / b))


# predicate -> comparison; the bodies' integers are signed i32 (token ids, indices), so
# the unsigned predicates have no executor
_CMP = {"olt": np.less, "ole": np.less_equal, "ogt": np.greater, "oge": np.greater_equal,
        "oeq": np.equal, "one": np.not_equal, "eq": np.equal, "ne": np.not_equal,
        "slt": np.less, "sle": np.less_equal, "sgt": np.greater, "sge": np.greater_equal}


@impl(arith.CmpfOp, arith.CmpiOp)
def _cmp(op, ctx):
    floats = isinstance(op, arith.CmpfOp)
    names = arith.CMPF_COMPARISON_OPERATIONS if floats else arith.CMPI_COMPARISON_OPERATIONS
    pred = names[op.predicate.value.data]
    fn = _CMP.get(pred)
    if fn is None:
        raise ctx.fail(f"no executor for the {'float' if floats else 'integer'} comparison '{pred}'")
    a, b, res = _value(op.lhs, ctx), _value(op.rhs, ctx), id(op.result)
    if floats:
        def step(bufs, env):
            env[res] = fn(F32(a(env)), F32(b(env)))
    else:
        def step(bufs, env):
            env[res] = fn(a(env), b(env))
    return step


@impl(arith.SelectOp)
def _select(op, ctx):
    c, a, b, res = _value(op.cond, ctx), _value(op.lhs, ctx), _value(op.rhs, ctx), id(op.result)
    to = dtype(op.result.type)

    def step(bufs, env):
        env[res] = np.where(c(env), a(env), b(env)).astype(to)[()]
    return step


@impl(csl.MemberCallOp)
def _member_call(op, ctx):
    fn = MATH_FNS.get(op.field.data)
    if not (isinstance(op.struct.owner, csl.ImportModuleConstOp) and fn is not None):
        raise ctx.fail(f"no executor for {op.field.data} of the imported module")
    args, res = [_value(a, ctx) for a in op.args], id(op.result)

    def step(bufs, env):
        env[res] = fn(*[a(env) for a in args])
    return step


def _element(op, ctx) -> tuple[str, Callable[[dict], int]]:
    name, _ = ctx.const[op.memref]
    (i,) = [_value(v, ctx) for v in op.indices]
    return name, i


@impl(memref.LoadOp)
def _load(op, ctx):
    (name, i), res = _element(op, ctx), id(op.res)

    def step(bufs, env):  # one element, or every iteration's of a fused loop
        env[res] = bufs[name][i(env)]
    return step


@impl(memref.StoreOp)
def _store(op, ctx):
    (name, i), val = _element(op, ctx), _value(op.value, ctx)
    ctx.writable(name, "a store")

    def step(bufs, env):
        bufs[name][i(env)] = val(env)
    return step


def _range(op: scf.ForOp, ctx: _Ctx) -> Callable[[dict], range]:
    """The induction values of loop `op` in a run: fixed where its bounds are constants;
    where its end is computed (a loop over the entries a slot has reached), read then."""
    lb, step_ = (ctx.const[v] for v in (op.lb, op.step))
    if op.ub in ctx.const:
        fixed = range(lb, ctx.const[op.ub], step_)
        return lambda env: fixed
    end = _value(op.ub, ctx)

    def computed(env) -> range:
        ub = end(env)
        if isinstance(ub, np.ndarray):  # (`_parallel` runs such loops one iteration at a time)
            raise ctx.fail("a loop's end differs between the iterations run at once")
        return range(lb, int(ub), step_)
    return computed


def _iterations(op: scf.ForOp, ctx: _Ctx) -> Callable[[dict], np.ndarray]:
    """`_range` as an array, for the loops run at once (made once where it is fixed)."""
    values = _range(op, ctx)
    if op.ub in ctx.const:
        r = values({})
        ivs = np.arange(r.start, r.stop, r.step)
        return lambda env: ivs

    def computed(env) -> np.ndarray:
        r = values(env)
        return np.arange(r.start, r.stop, r.step)
    return computed


# The ops a loop may hold besides its one accumulation and still run as one (`_fused`).
_INDEX_OPS = (arith.ConstantOp, arith.AddiOp, arith.MuliOp, arith.IndexCastOp, memref.GetGlobalOp,
              memref.LoadOp, csl.GetMemDsdOp, csl.IncrementDsdOffsetOp, scf.YieldOp)


def _fused(op, ctx) -> Step | None:
    """A loop whose iterations each add a DSD (or a DSD times a loaded scalar: @fmacs) into
    one destination fixed outside the loop, with only index arithmetic and loads beside:
    run as one computation, every iteration's operands gathered at once and the additions
    made in iteration order (np.add.accumulate), so each element is rounded as the loop
    rounds it. None where the loop is not of that form."""
    block = op.body.block
    if op.iter_args:
        return None
    accs = [o for o in block.ops if not isinstance(o, _INDEX_OPS)]
    if len(accs) != 1 or not isinstance(accs[0], csl.FmacsOp | csl.FaddsOp):
        return None
    acc = accs[0]
    dst, src0, src1, *scalar = acc.ops
    if dst is not src0 or not isinstance(dst, OpResult) or dst.op.parent_block() is block:
        return None
    iterations = _iterations(op, ctx)
    iv = id(block.args[0])
    pre = _ops([o for o in block.ops if o is not acc], ctx)
    d, s1 = ctx.const.get(dst), ctx.const.get(src1)
    if not (isinstance(d, Dsd) and isinstance(s1, Dsd)) or s1.buf == d.buf or len(s1.idx) != len(d.idx):
        return None
    mult = _value(scalar[0], ctx) if scalar else None
    n = len(d.idx)
    gathers: dict[bytes, np.ndarray] = {}  # the moved DSD's elements, per offsets seen

    def step(bufs, env):
        ivs = iterations(env)
        if not len(ivs):
            return
        env[iv] = ivs
        for s in pre:
            s(bufs, env)
        off = np.zeros(len(ivs), np.int64)
        for m in s1.moves:
            off += m(env)
        key = off.tobytes()
        idx = gathers.get(key)
        if idx is None:
            idx = gathers[key] = s1.idx[None, :] + off[:, None]
            if idx.min() < 0 or idx.max() >= s1.size:
                raise PeExecError(f"{ctx.where}: a DSD of {len(s1.idx)} elements moved on reaches "
                                  f"past buffer '{s1.buf}', which has {s1.size}")
        stack = np.empty((len(ivs) + 1, n), F32)
        where = d.index(env)
        out = bufs[d.buf]
        stack[0] = out[where]
        if mult is None:
            stack[1:] = bufs[s1.buf][idx]
        else:
            np.multiply(bufs[s1.buf][idx], np.asarray(mult(env), F32).reshape(-1, 1), out=stack[1:])
        out[where] = np.add.accumulate(stack, axis=0, dtype=F32)[-1]
    return step


# The ops of a loop whose iterations are independent (`_parallel`).
_SCALAR_OPS = (arith.ConstantOp, arith.AddiOp, arith.SubiOp, arith.MuliOp, arith.IndexCastOp,
               arith.ExtSIOp, arith.TruncIOp, memref.GetGlobalOp, memref.LoadOp, memref.StoreOp,
               arith.AddfOp, arith.SubfOp, arith.MulfOp, arith.DivfOp, arith.CmpfOp, arith.CmpiOp,
               arith.AndIOp, arith.OrIOp, arith.SelectOp, arith.BitcastOp, arith.ExtFOp,
               arith.RemSIOp, arith.SIToFPOp, arith.FPToSIOp, csl.MemberCallOp, scf.YieldOp)


def _nested(block: Block):
    """The ops of `block` and of the loops in it."""
    for o in block.ops:
        yield o
        if isinstance(o, scf.ForOp):
            yield from _nested(o.body.block)


def _parallel(op, ctx) -> Step | None:
    """A loop over scalars whose iterations are independent - only scalar arithmetic,
    loads, stores each to an element that depends on the induction variable into buffers
    the loop reads only at that element, and loops carrying values (an argmax, a sum),
    which run in order - run as one computation on every iteration's values at once (the
    same operations, elementwise). None otherwise."""
    block = op.body.block
    if op.iter_args:
        return None
    ops = list(_nested(block))
    if not all(isinstance(o, _SCALAR_OPS) or isinstance(o, scf.ForOp) and o.iter_args for o in ops):
        return None  # (a nested loop carrying nothing runs best at once by itself)
    iv = block.args[0]
    varying = {iv}
    changed = True
    while changed:  # what depends on the induction variable, through carried values too
        changed = False
        for o in ops:
            if isinstance(o, scf.ForOp):
                pairs = zip(o.body.block.args[1:], o.iter_args, o.body.block.last_op.operands, o.results)
                new = [(a, r) for a, init, y, r in pairs if (init in varying or y in varying) and a not in varying]
            else:
                new = [o.results] if any(v in varying for v in o.operands) and not set(o.results) <= varying else []
            for vs in new:
                varying.update(vs)
                changed = True
    if any(isinstance(o, scf.ForOp) and o.ub in varying for o in ops):
        return None  # an inner loop as long as something of the iteration: one at a time

    def buffer(v: SSAValue) -> str | None:
        return v.owner.name_.root_reference.data if isinstance(v.owner, memref.GetGlobalOp) else None

    loads = [(buffer(o.memref), tuple(o.indices)) for o in ops if isinstance(o, memref.LoadOp)]
    for o in ops:
        if isinstance(o, memref.StoreOp):
            name, idx = buffer(o.memref), tuple(o.indices)
            if name is None or not all(i in varying for i in idx):
                return None
            # a buffer it stores into is read only at the element stored (this iteration's)
            if any(n == name and i != idx for n, i in loads):
                return None
    iterations = _iterations(op, ctx)
    ctx.in_order, outer = True, ctx.in_order  # its loops run in order, on every iteration's values
    body = _block(block, ctx)
    ctx.in_order = outer

    iv = id(iv)

    def step(bufs, env):
        ivs = iterations(env)
        if len(ivs):
            env[iv] = ivs
            for s in body:
                s(bufs, env)
    return step


@impl(scf.ForOp)
def _for(op, ctx):
    fused = None if ctx.in_order else _fused(op, ctx) or _parallel(op, ctx)
    if fused is not None:
        return fused
    iterations = _range(op, ctx)
    iv, *args = (id(a) for a in op.body.block.args)
    body = _block(op.body.block, ctx)
    if args:  # carried values: the yield's operands are the next iteration's arguments
        inits = [_value(v, ctx) for v in op.iter_args]
        yields = [_value(v, ctx) for v in op.body.block.last_op.operands]
        results = [id(r) for r in op.results]

        def step(bufs, env):
            for a, v in zip(args, inits):
                env[a] = v(env)
            for i in iterations(env):
                env[iv] = i
                for s in body:
                    s(bufs, env)
                nxt = [y(env) for y in yields]
                for a, v in zip(args, nxt):
                    env[a] = v
            for r, a in zip(results, args):
                env[r] = env[a]
        return step

    def step(bufs, env):
        for i in iterations(env):
            env[iv] = i
            for s in body:
                s(bufs, env)
    return step


@impl(scf.IfOp)
def _if(op, ctx):
    if op.output:
        raise ctx.fail("no executor for an scf.if with results")
    cond = _value(op.cond, ctx)
    then = _block(op.true_region.block, ctx)
    other = _block(op.false_region.block, ctx) if op.false_region.blocks else []

    def step(bufs, env):
        for s in then if cond(env) else other:
            s(bufs, env)
    return step


@impl(csl.GetMemDsdOp)
def _get_mem_dsd(op, ctx):
    name, size = ctx.const[op.base_addr]
    sizes = [ctx.const[s] for s in op.sizes]
    (expr,) = op.tensor_access.data.results
    grids = np.indices(sizes).reshape(len(sizes), -1)  # row-major: the last index fastest
    n = len(sizes)
    base = expr.eval([0] * n, [])
    coeff = np.array([expr.eval([int(k == d) for k in range(n)], []) - base for d in range(n)], np.int64)
    idx = (base + coeff @ grids).astype(np.int64)
    if len(idx) and (idx.min() < 0 or idx.max() >= size):
        raise ctx.fail(f"a DSD of {len(idx)} elements reaches element {int(idx.max())} of "
                       f"buffer '{name}', which has {size}")
    ctx.const[op.result] = Dsd(name, idx, size)


@impl(csl.IncrementDsdOffsetOp)
def _increment(op, ctx):
    d = ctx.const.get(op.op)
    if not isinstance(d, Dsd):
        raise ctx.fail("@increment_dsd_offset of something that is not a memory DSD")
    if op.offset in ctx.const:
        by = ctx.const[op.offset]
        ctx.const[op.result] = Dsd(d.buf, d.idx + by, d.size, d.moves)
        if (d.idx + by).min() < 0 or (d.idx + by).max() >= d.size:
            raise ctx.fail(f"a DSD moved by {by} reaches past buffer '{d.buf}', which has {d.size}")
    else:
        ctx.const[op.result] = Dsd(d.buf, d.idx, d.size, (*d.moves, _value(op.offset, ctx)))


def _reader(v: SSAValue, ctx: _Ctx, n: int) -> Callable[[Buffers, dict], np.ndarray | F32]:
    c = ctx.const.get(v)
    if isinstance(c, Dsd):
        if len(c.idx) != n:
            raise ctx.fail(f"DSD operands of {len(c.idx)} and {n} elements")
        name, idx = c.buf, c.idx
        if c.moves:
            return lambda bufs, env: bufs[name][c.index(env)]
        return lambda bufs, env: bufs[name][idx]
    get = _value(v, ctx)
    return lambda bufs, env: get(env)


def _builtin(combine, addend=None):
    """A DSD builtin dst = combine(src_1, ...); `addend(src_2, ...)` for those that compute
    src_1 + something, so that a repeated destination accumulates."""
    def compile_op(op, ctx):
        dst, *srcs = op.ops
        d = ctx.const.get(dst)
        if not isinstance(d, Dsd):
            raise ctx.fail(f"{op.name} writes to something that is not a memory DSD")
        n, name = len(d.idx), d.buf
        ctx.writable(name, op.name)
        reads = [_reader(s, ctx, n) for s in srcs]
        src_dsds = [ctx.const.get(s) for s in srcs]
        aliased = [isinstance(s, Dsd) and s.buf == name for s in src_dsds]
        # the same elements as the destination: the same DSD, or equal constant ones
        same = [a and (v is dst or not (s.moves or d.moves) and np.array_equal(s.idx, d.idx))
                for v, s, a in zip(srcs, src_dsds, aliased)]
        where = d.index
        if d.unique and all(s or not a for s, a in zip(same, aliased)):
            def step(bufs, env):
                bufs[name][where(env)] = combine(*[r(bufs, env) for r in reads])
            return step
        if addend is not None and same[0] and not any(aliased[1:]):
            rest = reads[1:]

            def step(bufs, env):  # dst = dst + addend, added in stream order
                np.add.at(bufs[name], where(env), np.broadcast_to(addend(*[r(bufs, env) for r in rest]), n))
            return step
        scalars = [None if isinstance(s, Dsd) else _value(v, ctx) for s, v in zip(src_dsds, srcs)]

        def step(bufs, env):  # any other overlap: one element at a time
            out, idx = bufs[name], where(env)
            elems = [(bufs[s.buf], s.index(env)) if isinstance(s, Dsd) else None for s in src_dsds]
            for k in range(n):
                vals = [np.asarray(e[0][e[1][k]] if e else sc(env), F32).reshape(1)
                        for e, sc in zip(elems, scalars)]
                out[idx[k]] = combine(*vals)[0]
        return step
    return compile_op


def _mul(a, b):
    return np.multiply(a, b, dtype=F32)


def _add(a, b):
    return np.add(a, b, dtype=F32)


impl(csl.FmovsOp)(_builtin(lambda a: np.asarray(a, F32)))
impl(csl.FaddsOp)(_builtin(_add, lambda b: np.asarray(b, F32)))
impl(csl.FsubsOp)(_builtin(lambda a, b: np.subtract(a, b, dtype=F32), lambda b: np.negative(b, dtype=F32)))
impl(csl.FmulsOp)(_builtin(_mul))
impl(csl.FmaxsOp)(_builtin(lambda a, b: np.maximum(a, b).astype(F32)))
impl(csl.FnegsOp)(_builtin(lambda a: np.negative(a, dtype=F32)))
# dst = a + b * s: the product rounded to float32, then the sum (not fused: see
# docs/csl-backend.md, "Numerics")
impl(csl.FmacsOp)(_builtin(lambda a, b, s: _add(a, _mul(b, s)), _mul))
