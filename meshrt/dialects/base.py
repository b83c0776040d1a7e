"""What every level's IR shares: a program header and mapped kernel instances.

Each level (graph, mesh_kernel, event, segment) has a container op that
records the target's mesh, the wafer and stage counts, the micro-batch size,
the dynamism to handle and the model's hyper-parameters, so that IR can be
printed at any level and restarted from there with nothing else at hand.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DictionaryAttr,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    i64,
)
from xdsl.ir import Attribute, Block, Operation, Region
from xdsl.irdl import (
    IRDLOperation,
    ParsePropInAttrDict,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import NoTerminator, SymbolOpInterface, SymbolTable
from xdsl.utils.exceptions import VerifyException

from meshrt.dialects.mesh import CoreSetAttr, DynamismAttr

if TYPE_CHECKING:
    from meshrt.targets import Target


def int_value(attr: IntegerAttr) -> int:
    return attr.value.data


HEADER_FORMAT = (
    "$sym_name `target` $target (`file` $target_file^)? (`digest` $target_digest^)? "
    "`mesh` $width `x` $height `wafers` $wafers "
    "`stages` $stages `micro_batch` $micro_batch `dynamism` $dynamism "
    "`hparams` $hparams"
)


class MappedProgramOp(IRDLOperation):
    """Container of one level's IR for a model mapped onto one target."""

    sym_name = prop_def(SymbolNameConstraint())
    target = prop_def(StringAttr)
    # Only for a target that is not the bundled one of its name (see
    # `meshrt.targets.Target.identity`): the file it was read from and the
    # digest of its figures, so that the same target is found again or missed
    # loudly, never replaced by another of the same name.
    target_file = opt_prop_def(StringAttr)
    target_digest = opt_prop_def(StringAttr)
    width = prop_def(IntegerAttr[I64])
    height = prop_def(IntegerAttr[I64])
    wafers = prop_def(IntegerAttr[I64])
    stages = prop_def(IntegerAttr[I64])
    micro_batch = prop_def(IntegerAttr[I64])
    dynamism = prop_def(ArrayAttr[DynamismAttr])
    hparams = prop_def(DictionaryAttr)

    body = region_def()

    traits = traits_def(SymbolOpInterface(), SymbolTable(), NoTerminator())
    assembly_format = HEADER_FORMAT + " attr-dict-with-keyword $body"

    def __init__(
        self,
        name: str,
        *,
        target: str,
        width: int,
        height: int,
        wafers: int,
        stages: int,
        micro_batch: int,
        dynamism: Sequence[str],
        hparams: dict[str, Attribute] | DictionaryAttr,
        body: Region | None = None,
        extra: dict[str, Attribute] | None = None,
    ):
        props: dict[str, Attribute] = {
            "sym_name": StringAttr(name),
            "target": StringAttr(target),
            "width": IntegerAttr(width, i64),
            "height": IntegerAttr(height, i64),
            "wafers": IntegerAttr(wafers, i64),
            "stages": IntegerAttr(stages, i64),
            "micro_batch": IntegerAttr(micro_batch, i64),
            "dynamism": ArrayAttr([DynamismAttr(d) for d in dynamism]),
            "hparams": hparams if isinstance(hparams, DictionaryAttr) else DictionaryAttr(hparams),
        }
        props.update(extra or {})
        super().__init__(properties=props, regions=[body if body is not None else Region([Block()])])

    @classmethod
    def like(cls, other: MappedProgramOp, body: Region | None = None, **extra: Attribute):
        """A container of this level with `other`'s header."""
        op = cls(
            other.sym_name.data,
            target=other.target.data,
            width=int_value(other.width),
            height=int_value(other.height),
            wafers=int_value(other.wafers),
            stages=int_value(other.stages),
            micro_batch=int_value(other.micro_batch),
            dynamism=other.dynamism_kinds,
            hparams=other.hparams,
            body=body,
            extra=extra or None,
        )
        op.target_file, op.target_digest = other.target_file, other.target_digest
        return op

    def stamp_target(self, target: Target) -> None:
        """Record `target` as the one this IR is compiled for: its name, and
        for a target that is not the bundled one of its name, its file and
        digest (`Target.identity`)."""
        file, digest = target.identity()
        self.target = StringAttr(target.name)
        self.target_file = None if file is None else StringAttr(file)
        self.target_digest = None if digest is None else StringAttr(digest)

    def exceeds(self, target: Target, on: str) -> str | None:
        """Why this IR cannot run on `target` (named `on` in the message), or
        None: its mesh must fit the target's (levels add their own figures)."""
        w, h = self.mesh_size
        if w > target.width or h > target.height:
            return (f"the IR is compiled for a {w} x {h} mesh, larger than the "
                    f"{target.width} x {target.height} cores of {on}")
        return None

    @property
    def program_name(self) -> str:
        return self.sym_name.data

    @property
    def mesh_size(self) -> tuple[int, int]:
        return int_value(self.width), int_value(self.height)

    @property
    def num_stages(self) -> int:
        return int_value(self.stages)

    @property
    def num_wafers(self) -> int:
        return int_value(self.wafers)

    @property
    def micro_batch_size(self) -> int:
        return int_value(self.micro_batch)

    @property
    def chunk(self) -> int:
        """Prompt tokens a prefilling slot feeds a step (hparam `prefill_chunk`, absent: 1)."""
        return self.hparam("prefill_chunk", 1)

    @property
    def rows(self) -> int:
        """Token rows a micro-batch carries: every kernel's values are this many vectors."""
        return self.micro_batch_size * self.chunk

    @property
    def dynamism_kinds(self) -> tuple[str, ...]:
        return tuple(d.kind.data for d in self.dynamism)

    def hparam(self, key: str, default: int | None = None) -> int:
        attr = self.hparams.data.get(key)
        if isinstance(attr, IntegerAttr):
            return attr.value.data
        if default is not None:
            return default
        raise VerifyException(f"@{self.program_name} has no integer hparam '{key}'")

    def verify_(self) -> None:
        for what, v in (
            ("width", self.mesh_size[0]),
            ("height", self.mesh_size[1]),
            ("wafers", self.num_wafers),
            ("stages", self.num_stages),
            ("micro_batch", self.micro_batch_size),
        ):
            if v <= 0:
                raise VerifyException(f"@{self.program_name}: {what} must be > 0, got {v}")
        from meshrt.shape import hparams_problem

        problem = hparams_problem(self.hparams)
        if problem:
            raise VerifyException(f"@{self.program_name}: hparams: {problem}")
        if self.num_stages < self.num_wafers:
            raise VerifyException(
                f"@{self.program_name}: {self.num_wafers} wafers need at least as many "
                f"pipeline stages, got {self.num_stages}"
            )
        self.verify_body()

    def verify_body(self) -> None:
        """Level-specific checks of the contained ops."""


LEVEL_ORDER: tuple[str, ...] = ("graph", "mesh_kernel", "event", "segment")
"""The IR levels from the top: the dialect of each level's program op."""


def require_programs(module: Operation, who: str, *classes: type[MappedProgramOp],
                     hint: str | None = None) -> list:
    """The top-level programs of the levels `classes` in `module`; a located error if none.

    Every pass (and the CSL backend) calls this, so that IR of the wrong level
    is the same one line everywhere: "`who` needs mesh_kernel IR (a
    'mesh_kernel.program'), found graph.model", with "; run `hint` first" when
    the IR found is of an earlier level than the one needed.
    """
    from meshrt.diagnostics import MeshrtError

    ops = body_ops(module.regions[0])
    found = [o for o in ops if isinstance(o, classes)]
    if found:
        return found
    names = [c.name for c in classes]
    levels = [n.split(".")[0] for n in names]
    article = "an" if names[0][0] in "aeiou" else "a"
    need = f"{' or '.join(levels)} IR ({article} {' or '.join(repr(n) for n in names)})"
    others = list(dict.fromkeys(o.name for o in ops))
    what = f"found {', '.join(others)}" if others else "found an empty module"
    rank = {lv: i for i, lv in enumerate(LEVEL_ORDER)}
    got = [rank[o.split(".")[0]] for o in others if o.split(".")[0] in rank]
    earlier = bool(got) and max(got) < min(rank.get(lv, 0) for lv in levels)
    then = f"; run {hint} first" if hint and earlier else ""
    raise MeshrtError(f"{who} needs {need}, {what}{then}", ops[0] if ops else module)


def enclosing_program(op: Operation) -> MappedProgramOp | None:
    parent = op.parent_op()
    while parent is not None and not isinstance(parent, MappedProgramOp):
        parent = parent.parent_op()
    return parent


class MappedKernelOp(IRDLOperation):
    """A kernel instance k with its mapping R_k, layer, stage and wafer."""

    sym_name = prop_def(SymbolNameConstraint())
    region = prop_def(CoreSetAttr)
    layer = prop_def(IntegerAttr[I64])  # -1 for kernels outside any layer
    stage = prop_def(IntegerAttr[I64])
    wafer = prop_def(IntegerAttr[I64])

    traits = traits_def(SymbolOpInterface())
    irdl_options = (ParsePropInAttrDict(),)

    @property
    def kernel_name(self) -> str:
        return self.sym_name.data

    @property
    def layer_index(self) -> int:
        return int_value(self.layer)

    @property
    def stage_index(self) -> int:
        return int_value(self.stage)

    @property
    def wafer_index(self) -> int:
        return int_value(self.wafer)

    def fail(self, message: str) -> VerifyException:
        return VerifyException(f"kernel @{self.kernel_name}: {message}")

    def verify_(self) -> None:
        program = enclosing_program(self)
        if program is not None:
            w, h = program.mesh_size
            for what, cores in self.core_sets():  # region, and e.g. expert_regions[3]
                if not cores.fits_mesh(w, h):
                    x0, y0, x1, y1 = cores.extent
                    raise self.fail(
                        f"{what} {cores} spans columns {x0}..{x1 - 1} and rows "
                        f"{y0}..{y1 - 1}, outside the {w} x {h} mesh"
                    )
            if not 0 <= self.stage_index < program.num_stages:
                raise self.fail(f"stage {self.stage_index} is not in 0..{program.num_stages - 1}")
            if not 0 <= self.wafer_index < program.num_wafers:
                raise self.fail(f"wafer {self.wafer_index} is not in 0..{program.num_wafers - 1}")
        self.verify_kernel()

    def verify_kernel(self) -> None:
        """Kernel-specific structural checks."""

    def core_sets(self):
        """(name, CoreSetAttr) of every core set among the properties: `region`,
        and the entries of arrays of them (`expert_regions[i]`)."""
        for name, attr in self.properties.items():
            if isinstance(attr, CoreSetAttr):
                yield name, attr
            elif isinstance(attr, ArrayAttr):
                for i, a in enumerate(attr.data):
                    if isinstance(a, CoreSetAttr):
                        yield f"{name}[{i}]", a

    @staticmethod
    def common_props(
        name: str, region: CoreSetAttr, layer: int, stage: int, wafer: int
    ) -> dict[str, Attribute]:
        return {
            "sym_name": StringAttr(name),
            "region": region,
            "layer": IntegerAttr(layer, i64),
            "stage": IntegerAttr(stage, i64),
            "wafer": IntegerAttr(wafer, i64),
        }


def kernel_deps(op: Operation) -> list[MappedKernelOp]:
    """Predecessor kernels of `op`: the edges E into it."""
    deps: list[MappedKernelOp] = []
    for operand in op.operands:
        owner = operand.owner
        if isinstance(owner, MappedKernelOp) and owner not in deps:
            deps.append(owner)
    return deps


def topological_order(kernels: Sequence[MappedKernelOp]) -> list[MappedKernelOp]:
    """Kernels in dependency order; raises VerifyException naming a cycle."""
    state: dict[MappedKernelOp, int] = {}  # 1 = on the DFS stack, 2 = done
    order: list[MappedKernelOp] = []
    for root in kernels:
        if root in state:
            continue
        stack: list[tuple[MappedKernelOp, int]] = [(root, 0)]
        state[root] = 1
        while stack:
            op, i = stack[-1]
            deps = kernel_deps(op)
            if i == len(deps):
                state[op] = 2
                order.append(op)
                stack.pop()
                continue
            stack[-1] = (op, i + 1)
            dep = deps[i]
            if state.get(dep) == 1:
                on_stack = [k for k, _ in stack]
                cycle = on_stack[on_stack.index(dep):] + [dep]
                raise VerifyException(
                    "kernel graph has a cycle: " + " -> ".join(f"@{k.kernel_name}" for k in cycle)
                )
            if dep not in state:
                state[dep] = 1
                stack.append((dep, 0))
    return order


def body_ops(region: Region) -> list[Operation]:
    """Ops of a single-block body; `{ }` parses as a region with no block."""
    if len(region.blocks) > 1:
        raise VerifyException(f"'{region.parent_op().name}' body must have one block")
    return list(region.blocks[0].ops) if region.blocks else []
