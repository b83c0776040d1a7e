"""The `event` dialect: per-core-class event tables (Algorithm 1's output).

    event.schedule @m target ... {
      event.flow @l0.r.up kernel @l0.r role "up" wafer 0 from <(1, 0, 3, 4)> to <(0, 0, 3, 4)> pattern "shift" by -1, 0 bytes 256
      event.flow @l0.r.in0 kernel @l0.r role "input" operand 0 wafer 0 from <(0, 0, 3, 1)> to <(0, 0, 3, 4)> pattern "col" bytes 256
      event.core_class @c3 cores <(0, 1, 1, 4)> {
        event.sub @l0.r "edge" after [@l0.qkv] demand <colors = 2, iq = 1> collective {
          event.recv @l0.r.in0 bytes 256 meta 0
          event.recv @l0.r.up bytes 256 meta 0
        }
      }
    }

A core class is a set of cores that run the same table; a sub-schedule is
one (kernel, role) part of it, guarded by the kernel's predecessors. Flows
are class-level patterns (every sender shifts to a neighbour, or multicasts
along its row / column), so nothing here grows with mesh area. A flow's
`role` says what it carries for its kernel (see `FlowRole`); its name is
only a symbol.
"""

from __future__ import annotations


from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    FloatAttr,
    IntegerAttr,
    StringAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
    UnitAttr,
)
from xdsl.ir import Dialect, Operation
from xdsl.irdl import (
    IRDLOperation,
    irdl_op_definition,
    opt_prop_def,
    prop_def,
    region_def,
    traits_def,
)
from xdsl.traits import NoTerminator, SymbolOpInterface
from xdsl.utils.exceptions import VerifyException

from meshrt.dialects.base import MappedProgramOp, body_ops, enclosing_program, int_value
from meshrt.dialects.mesh import DYNAMISM_KINDS, FLOW_ROLES, CoreSetAttr, FlowRole, ResourceAttr
from meshrt.kernels import registry


@irdl_op_definition
class ScheduleOp(MappedProgramOp):
    """Flows and per-core-class event tables of one model on one target."""

    name = "event.schedule"

    def flows(self) -> list[FlowOp]:
        return [op for op in body_ops(self.body) if isinstance(op, FlowOp)]

    def core_classes(self) -> list[CoreClassOp]:
        return [op for op in body_ops(self.body) if isinstance(op, CoreClassOp)]

    def kernels(self) -> list[KernelInfoOp]:
        return [op for op in body_ops(self.body) if isinstance(op, KernelInfoOp)]

    def verify_body(self) -> None:
        for op in body_ops(self.body):
            if not isinstance(op, KernelInfoOp | FlowOp | CoreClassOp):
                raise VerifyException(
                    f"schedule @{self.program_name} may only hold event.kernel, event.flow and "
                    f"event.core_class, found '{op.name}'"
                )


@irdl_op_definition
class KernelInfoOp(IRDLOperation):
    """What one mesh kernel computes, kept beside the tables that run it.

    Event tables say when each core computes, sends and receives; this says
    on what: the kernel's kind, region (and same-shaped tiles, e.g. expert
    regions), the kernels whose values it reads, and its shape parameters
    (widths, heads, vocabulary, placement, ...). It is what lets the
    interpreter move real tensors from the lowest IR alone. One op per
    kernel, so IR size does not grow with the mesh.
    """

    name = "event.kernel"

    sym_name = prop_def(SymbolNameConstraint())
    kind = prop_def(StringAttr)
    region = prop_def(CoreSetAttr)
    inputs = prop_def(ArrayAttr[SymbolRefAttr])
    params = prop_def(DictionaryAttr)

    traits = traits_def(SymbolOpInterface())
    assembly_format = "$sym_name $kind `on` $region `inputs` $inputs `params` $params attr-dict"

    @property
    def kernel_name(self) -> str:
        return self.sym_name.data

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(r.root_reference.data for r in self.inputs.data)

    @property
    def packed_weights(self) -> str | None:
        """The format the kernel's cores hold its weight tiles in (`quant.packed_format`)."""
        from meshrt.quant import packed_format

        return packed_format(self.param("weights"), self.param("decoded"))

    @property
    def stage_index(self) -> int:
        """The pipeline stage the kernel runs in (its `stage` parameter, as KernelOp's)."""
        return int(self.param("stage", 0))

    def param(self, key: str, default=None):
        """An integer, float, string or integer-array parameter as a Python value."""
        a = self.params.data.get(key)
        if a is None:
            return default
        if isinstance(a, IntegerAttr | FloatAttr):
            return a.value.data
        if isinstance(a, StringAttr):
            return a.data
        if isinstance(a, DenseArrayBase):
            return tuple(a.get_values())
        if isinstance(a, ArrayAttr):
            return tuple(x for x in a.data)
        return a

    def verify_(self) -> None:
        try:
            registry.kind(self.kind.data)
        except registry.UnknownKernel as e:
            raise VerifyException(f"kernel @{self.kernel_name}: {e}") from None
        _check_in_mesh(self, f"kernel @{self.kernel_name} region", self.region)


FLOW_PATTERNS = ("shift", "row", "col", "all")
"""shift: each sender (x, y) sends to (x + dx, y + dy);
row / col: each sender multicasts to the receivers in its row / column;
all: each sender multicasts to every receiver."""


def _check_in_mesh(op: Operation, what: str, cores: CoreSetAttr) -> None:
    program = enclosing_program(op)
    if program is None:
        return
    w, h = program.mesh_size
    if not cores.fits_mesh(w, h):
        raise VerifyException(f"{what} {cores} lie outside the {w} x {h} mesh")




@irdl_op_definition
class FlowOp(IRDLOperation):
    """A class-level message pattern of one kernel: who sends to whom, how much."""

    name = "event.flow"

    sym_name = prop_def(SymbolNameConstraint())
    kernel = prop_def(SymbolRefAttr)
    # A FlowRole; `operand` (the kernel's operand index) with role "input" only.
    role = prop_def(StringAttr)
    operand = opt_prop_def(IntegerAttr[I64])
    src = prop_def(CoreSetAttr)
    dst = prop_def(CoreSetAttr)
    pattern = prop_def(StringAttr)
    bytes = prop_def(IntegerAttr[I64])
    dx = opt_prop_def(IntegerAttr[I64])
    dy = opt_prop_def(IntegerAttr[I64])
    # Senders on wafer `wafer`; receivers on `wafer`, or on the next wafer
    # when `cross_wafer` is set (the flow then uses the wafer-to-wafer link).
    wafer = prop_def(IntegerAttr[I64])
    cross_wafer = opt_prop_def(UnitAttr)
    # `streams`: the flow's messages stream wavelet by wavelet through its
    # receivers. A core that receives a streaming message and then sends on a
    # streaming flow (with at most its reduce op between) forwards the wavelets
    # as they pass (a fabric-in DSD added into a fabric-out DSD): its message
    # starts a stage latency after the input's head and ends no earlier than a
    # stage latency after the input's tail (`meshrt.kernels.reduce_tree`);
    # a core that only receives one takes it in as it arrives. Shift, row and
    # col flows on one wafer only (a row / col multicast streams the result
    # of a reduction back along its line).
    streams = opt_prop_def(UnitAttr)
    # `routed`: the senders are expert regions' root columns; in a step only
    # the regions the step routed a token to (and shared experts' regions)
    # send, the others pass only their switch advance, and a recv gathers one
    # message from each sender of a chosen region that targets the core
    # (`meshrt.kernels.expert_reduce.routed`).
    routed = opt_prop_def(UnitAttr)

    traits = traits_def(SymbolOpInterface())
    assembly_format = (
        "$sym_name `kernel` $kernel `role` $role (`operand` $operand^)? "
        "`wafer` $wafer `from` $src `to` $dst (`cross_wafer` $cross_wafer^)? "
        "`pattern` $pattern (`by` $dx^ `,` $dy)? `bytes` $bytes (`streams` $streams^)? "
        "(`routed` $routed^)? attr-dict"
    )

    @property
    def flow_name(self) -> str:
        return self.sym_name.data

    @property
    def flow_role(self) -> FlowRole:
        return FlowRole(self.role.data)

    @property
    def operand_index(self) -> int | None:
        """The kernel operand an "input" flow feeds (None for the other roles)."""
        return int_value(self.operand) if self.operand is not None else None

    @property
    def wafer_index(self) -> int:
        return int_value(self.wafer)

    @property
    def crosses_wafer(self) -> bool:
        return self.cross_wafer is not None

    @property
    def is_streaming(self) -> bool:
        return self.streams is not None

    @property
    def is_routed(self) -> bool:
        return self.routed is not None

    @property
    def offset(self) -> tuple[int, int]:
        dx = int_value(self.dx) if self.dx is not None else 0
        dy = int_value(self.dy) if self.dy is not None else 0
        return dx, dy

    def verify_(self) -> None:
        where = f"flow @{self.flow_name}"
        pattern = self.pattern.data
        if pattern not in FLOW_PATTERNS:
            raise VerifyException(
                f"{where}: unknown pattern '{pattern}', expected one of {', '.join(FLOW_PATTERNS)}"
            )
        role = self.role.data
        if role not in FLOW_ROLES:
            raise VerifyException(
                f"{where}: unknown role '{role}', expected one of {', '.join(FLOW_ROLES)}"
            )
        if (role == FlowRole.INPUT) != (self.operand is not None):
            raise VerifyException(f"{where}: an operand index goes with role \"input\", and only with it")
        if self.operand is not None and int_value(self.operand) < 0:
            raise VerifyException(f"{where}: operand must be >= 0, got {int_value(self.operand)}")
        if int_value(self.bytes) <= 0:
            raise VerifyException(f"{where}: bytes must be > 0, got {int_value(self.bytes)}")
        _check_in_mesh(self, f"{where}: senders", self.src)
        _check_in_mesh(self, f"{where}: receivers", self.dst)
        if pattern == "shift":
            if self.dx is None or self.dy is None:
                raise VerifyException(f"{where}: a shift flow needs dx and dy")
            dx, dy = self.offset
            if (dx, dy) == (0, 0):
                raise VerifyException(f"{where}: a shift by (0, 0) sends to itself")
            shifted = [
                (r.x.data + dx, r.y.data + dy, r.w.data, r.h.data, r.sx.data, r.sy.data)
                for r in self.src.rects
            ]
            if shifted != [r.tuple for r in self.dst.rects]:
                raise VerifyException(
                    f"{where}: receivers {self.dst} are not the senders {self.src} "
                    f"shifted by ({dx}, {dy})"
                )
        elif self.dx is not None or self.dy is not None:
            raise VerifyException(f"{where}: only shift flows take dx / dy")
        if self.crosses_wafer and pattern == "shift":
            raise VerifyException(f"{where}: a flow across the wafer link cannot be a shift")
        if self.is_streaming and (pattern == "all" or self.crosses_wafer):
            raise VerifyException(f"{where}: only shift, row and col flows on one wafer stream "
                                  f"(pattern '{pattern}'{', across the wafer link' if self.crosses_wafer else ''})")
        if self.is_routed and (self.is_streaming or pattern not in ("row", "all")):
            raise VerifyException(f"{where}: only row and all flows that do not stream are routed "
                                  f"(pattern '{pattern}'{', streaming' if self.is_streaming else ''})")


def lookup_flow(op: Operation, ref: SymbolRefAttr) -> FlowOp:
    """The flow `ref` names, from the enclosing schedule or segment program.

    Programs hold tens of thousands of events, so the name index is kept on
    the program and rebuilt only when it no longer answers truthfully.
    """
    program = enclosing_program(op)
    if program is None:
        raise VerifyException(f"references flow {ref} outside any program")
    name = ref.root_reference.data
    index: dict[str, FlowOp] | None = getattr(program, "_meshrt_flow_index", None)
    found = index.get(name) if index is not None else None
    if found is None or found.parent_op() is not program or found.flow_name != name:
        index = {f.flow_name: f for f in body_ops(program.body) if isinstance(f, FlowOp)}
        object.__setattr__(program, "_meshrt_flow_index", index)
        found = index.get(name)
    if found is None:
        raise VerifyException(f"references unknown flow {ref}")
    return found


@irdl_op_definition
class CoreClassOp(IRDLOperation):
    """A set of cores that run the same event table."""

    name = "event.core_class"

    sym_name = prop_def(SymbolNameConstraint())
    wafer = prop_def(IntegerAttr[I64])
    cores = prop_def(CoreSetAttr)
    params = opt_prop_def(DictionaryAttr)
    body = region_def()

    traits = traits_def(SymbolOpInterface(), NoTerminator())
    assembly_format = (
        "$sym_name `wafer` $wafer `cores` $cores (`params` $params^)? attr-dict-with-keyword $body"
    )

    @property
    def wafer_index(self) -> int:
        return int_value(self.wafer)

    @property
    def class_name(self) -> str:
        return self.sym_name.data

    def subs(self) -> list[SubScheduleOp]:
        return [op for op in body_ops(self.body) if isinstance(op, SubScheduleOp)]

    def verify_(self) -> None:
        _check_in_mesh(self, f"core class @{self.class_name}: cores", self.cores)
        for op in body_ops(self.body):
            if not isinstance(op, SubScheduleOp):
                raise VerifyException(
                    f"core class @{self.class_name} may only hold event.sub, found '{op.name}'"
                )


@irdl_op_definition
class SubScheduleOp(IRDLOperation):
    """The events of one role of one kernel, guarded by the kernel's predecessors.

    `demand` is what the role needs bound while it runs; `collective` marks
    kernels whose all-or-nothing completion makes their end a consistent cut.
    """

    name = "event.sub"

    kernel = prop_def(SymbolRefAttr)
    role = prop_def(StringAttr)
    after = prop_def(ArrayAttr[SymbolRefAttr])
    demand = prop_def(ResourceAttr)
    collective = opt_prop_def(UnitAttr)
    body = region_def()

    traits = traits_def(NoTerminator())
    assembly_format = (
        "$kernel $role `after` $after `demand` $demand (`collective` $collective^)? "
        "attr-dict-with-keyword $body"
    )

    @property
    def kernel_name(self) -> str:
        return self.kernel.root_reference.data

    @property
    def role_name(self) -> str:
        return self.role.data

    @property
    def is_collective(self) -> bool:
        return self.collective is not None

    def events(self) -> list[EventOp]:
        return [op for op in body_ops(self.body) if isinstance(op, EventOp)]

    def verify_(self) -> None:
        if not self.role.data:
            raise VerifyException(f"sub-schedule of @{self.kernel_name} has an empty role")
        for op in body_ops(self.body):
            if not isinstance(op, EventOp):
                raise VerifyException(
                    f"sub-schedule @{self.kernel_name} \"{self.role_name}\" may only hold "
                    f"events, found '{op.name}'"
                )
        if self.kernel in self.after.data:
            raise VerifyException(f"sub-schedule @{self.kernel_name} is guarded by itself")


class EventOp(IRDLOperation):
    """One entry of an event table."""


class FlowEventOp(EventOp):
    """An event tied to a flow: the flow must exist in the enclosing program."""

    flow = prop_def(SymbolRefAttr)
    bytes = prop_def(IntegerAttr[I64])

    @property
    def flow_name(self) -> str:
        return self.flow.root_reference.data

    @property
    def num_bytes(self) -> int:
        return int_value(self.bytes)

    def verify_(self) -> None:
        if int_value(self.bytes) < 0:
            raise VerifyException(f"{self.name} on @{self.flow_name}: bytes must be >= 0")
        lookup_flow(self, self.flow)


@irdl_op_definition
class RecvOp(FlowEventOp):
    """Receive one message of `flow`: `bytes` of data plus `meta` of metainfo."""

    name = "event.recv"
    meta = prop_def(IntegerAttr[I64])
    assembly_format = "$flow `bytes` $bytes `meta` $meta attr-dict"


@irdl_op_definition
class SendOp(FlowEventOp):
    """Send one message on `flow`; `meta` bytes of metainfo ride ahead of the data."""

    name = "event.send"
    meta = prop_def(IntegerAttr[I64])
    assembly_format = "$flow `bytes` $bytes `meta` $meta attr-dict"


@irdl_op_definition
class ComputeOp(EventOp):
    """Local work: `work` elementary operations of kind `op` (costed by the target)."""

    name = "event.compute"
    op = prop_def(StringAttr)
    work = prop_def(IntegerAttr[I64])
    assembly_format = "$op `work` $work attr-dict"

    def verify_(self) -> None:
        if int_value(self.work) < 0:
            raise VerifyException(f"compute '{self.op.data}': work must be >= 0")
        if self.op.data not in registry.compute_ops():
            sub = self.parent_op()
            where = ""
            if isinstance(sub, SubScheduleOp):
                info = _kernel_info(sub, sub.kernel_name)
                kind = f" (kind {info.kind.data})" if info is not None else ""
                where = f" of kernel @{sub.kernel_name}{kind}"
            raise VerifyException(f"compute '{self.op.data}'{where}: no kernel kind declares this "
                                  "compute op, so it has no cost key")


@irdl_op_definition
class MetaResolveOp(FlowEventOp):
    """Parse the metainfo that arrived with `flow` and act on it (before the data)."""

    name = "event.meta_resolve"
    kind = prop_def(StringAttr)
    assembly_format = "$kind `from` $flow `bytes` $bytes attr-dict"

    def verify_(self) -> None:
        super().verify_()
        _check_kind(self)


@irdl_op_definition
class MetaProduceOp(FlowEventOp):
    """Build metainfo from local results; it rides the next send on `flow`."""

    name = "event.meta_produce"
    kind = prop_def(StringAttr)
    assembly_format = "$kind `onto` $flow `bytes` $bytes attr-dict"

    def verify_(self) -> None:
        super().verify_()
        _check_kind(self)


def _check_kind(op: MetaResolveOp | MetaProduceOp) -> None:
    if op.kind.data not in DYNAMISM_KINDS:
        raise VerifyException(
            f"{op.name} on @{op.flow_name}: unknown dynamism kind '{op.kind.data}', "
            f"expected one of {', '.join(DYNAMISM_KINDS)}"
        )


Event = Dialect(
    "event",
    [
        ScheduleOp,
        KernelInfoOp,
        FlowOp,
        CoreClassOp,
        SubScheduleOp,
        RecvOp,
        SendOp,
        ComputeOp,
        MetaResolveOp,
        MetaProduceOp,
    ],
    [],
)


def _kernel_info(op: Operation, name: str) -> KernelInfoOp | None:
    """The `event.kernel` record named `name` in the program around `op` (a linear search:
    only diagnostics use it)."""
    program = enclosing_program(op)
    if program is None:
        return None
    return next((k for k in body_ops(program.body) if isinstance(k, KernelInfoOp)
                 and k.kernel_name == name), None)
