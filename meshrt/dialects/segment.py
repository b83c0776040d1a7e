"""The `segment` dialect: event tables cut into segments that fit a core.

    segment.program @m target ... budget <colors = 6, iq = 2, ...> colors 8 reserved [6, 7] {
      event.flow ...
      segment.core_class @c3 wafer 0 cores <(0, 1, 1, 4)> {
        segment.segment 0 use <colors = 4, iq = 2> routes [@f1] { event.sub ... }
        segment.marker_sync 0 to 1 over <(0, 1, 4, 4)>
        segment.reconfigure 0 to 1 release [@f1] install [@f2]
        segment.segment 1 use <colors = 3, iq = 1> routes [@f2] { event.sub ... }
        segment.reconfigure 1 to 0 release [@f2] install [@f1]
      }
      segment.route @f1 color 3 via <(0, 1, 4, 4)>
    }

A segment's recorded `use` is what its sub-schedules bind together and must
fit the class's budget; its optional `routes` are the flows whose routes the
class's routers hold while it is current (its own flows and flows passing
through). `reconfigure` releases the routes of the previous segment and
installs the next; a `marker_sync` over a compile-time-known region precedes
it when the previous segment did not end on a collective. The table repeats
every decode step: a class with several segments ends with the boundary
`reconfigure N-1 to 0` (and its marker sync) back to the first segment.
`route` binds a flow's colour over the routers it crosses.
"""

from __future__ import annotations

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    SymbolNameConstraint,
    SymbolRefAttr,
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

from meshrt.dialects.base import (
    HEADER_FORMAT,
    MappedProgramOp,
    body_ops,
    enclosing_program,
    int_value,
)
from meshrt.dialects.event import FlowOp, SubScheduleOp, lookup_flow
from meshrt.dialects.mesh import RESOURCE_NAMES, CoreSetAttr, ResourceAttr, Resources


@irdl_op_definition
class ProgramOp(MappedProgramOp):
    """Segmented, coloured schedules: what the chip is configured with."""

    name = "segment.program"

    budget = prop_def(ResourceAttr)
    num_colors = prop_def(IntegerAttr[I64])
    reserved_colors = prop_def(DenseArrayBase[I64])

    assembly_format = (
        HEADER_FORMAT
        + " `budget` $budget `colors` $num_colors `reserved` $reserved_colors"
        + " attr-dict-with-keyword $body"
    )

    @property
    def reserved(self) -> tuple[int, ...]:
        return tuple(self.reserved_colors.get_values())

    @property
    def user_colors(self) -> tuple[int, ...]:
        return tuple(c for c in range(int_value(self.num_colors)) if c not in self.reserved)

    def flows(self) -> list[FlowOp]:
        return [op for op in body_ops(self.body) if isinstance(op, FlowOp)]

    def core_classes(self) -> list[CoreClassOp]:
        return [op for op in body_ops(self.body) if isinstance(op, CoreClassOp)]

    def routes(self) -> list[RouteOp]:
        return [op for op in body_ops(self.body) if isinstance(op, RouteOp)]

    def verify_body(self) -> None:
        n = int_value(self.num_colors)
        if n <= 0:
            raise VerifyException(f"program @{self.program_name}: colours must be > 0")
        bad = [c for c in self.reserved if not 0 <= c < n]
        if bad:
            raise VerifyException(
                f"program @{self.program_name}: reserved colours {bad} are outside 0..{n - 1}"
            )
        for op in body_ops(self.body):
            if not isinstance(op, FlowOp | CoreClassOp | RouteOp):
                raise VerifyException(
                    f"program @{self.program_name} may only hold event.flow, "
                    f"segment.core_class and segment.route, found '{op.name}'"
                )


def _program(op: Operation) -> ProgramOp | None:
    program = enclosing_program(op)
    return program if isinstance(program, ProgramOp) else None


@irdl_op_definition
class CoreClassOp(IRDLOperation):
    """A core class's segments and the reconfigurations between them."""

    name = "segment.core_class"

    sym_name = prop_def(SymbolNameConstraint())
    wafer = prop_def(IntegerAttr[I64])
    cores = prop_def(CoreSetAttr)
    params = opt_prop_def(DictionaryAttr)  # role-derived parameters, as in event.core_class
    budget = opt_prop_def(ResourceAttr)  # overrides the program's budget
    body = region_def()

    traits = traits_def(SymbolOpInterface(), NoTerminator())
    assembly_format = (
        "$sym_name `wafer` $wafer `cores` $cores (`params` $params^)? (`budget` $budget^)? "
        "attr-dict-with-keyword $body"
    )

    @property
    def wafer_index(self) -> int:
        return int_value(self.wafer)

    @property
    def class_name(self) -> str:
        return self.sym_name.data

    def effective_budget(self) -> Resources | None:
        if self.budget is not None:
            return self.budget.value
        program = _program(self)
        return program.budget.value if program is not None else None

    def segments(self) -> list[SegmentOp]:
        return [op for op in body_ops(self.body) if isinstance(op, SegmentOp)]

    def verify_(self) -> None:
        where = f"core class @{self.class_name}"
        program = _program(self)
        if program is not None:
            w, h = program.mesh_size
            if not self.cores.fits_mesh(w, h):
                raise VerifyException(f"{where}: cores {self.cores} lie outside the {w} x {h} mesh")
        # Segments are numbered 0, 1, ... and every boundary is a reconfigure
        # (optionally preceded by a marker sync) between neighbours; the
        # table loops, so several segments may end with `N-1 to 0`.
        expected = 0
        pending: tuple[int, int] | None = None
        wrapped = False
        for op in body_ops(self.body):
            if wrapped:
                raise VerifyException(
                    f"{where}: '{op.name}' after the closing reconfigure back to segment 0"
                )
            if isinstance(op, SegmentOp):
                if op.index_value != expected:
                    raise VerifyException(f"{where}: segment {op.index_value} found where {expected} was expected")
                if expected > 0 and pending != (expected - 1, expected):
                    raise VerifyException(
                        f"{where}: segment {expected} is not preceded by 'segment.reconfigure "
                        f"{expected - 1} to {expected}'"
                    )
                expected += 1
                pending = None
            elif isinstance(op, ReconfigureOp):
                if (op.source, op.dest) not in ((expected - 1, expected), (expected - 1, 0)):
                    raise VerifyException(
                        f"{where}: reconfigure {op.source} to {op.dest} found after segment {expected - 1}"
                    )
                pending = (op.source, op.dest)
                wrapped = op.dest == 0
            elif isinstance(op, MarkerSyncOp):
                if (op.source, op.dest) not in ((expected - 1, expected), (expected - 1, 0)) or pending is not None:
                    raise VerifyException(
                        f"{where}: marker sync {op.source} to {op.dest} must come right after "
                        f"segment {op.source} and before its reconfigure"
                    )
            else:
                raise VerifyException(f"{where} may not hold '{op.name}'")
        if expected == 0:
            raise VerifyException(f"{where} has no segment")
        if pending is not None and not wrapped:
            raise VerifyException(f"{where}: reconfigure after the last segment leads nowhere")

    def boundaries(self) -> list[tuple[int, int, MarkerSyncOp | None, ReconfigureOp]]:
        """(from, to, marker sync or None, reconfigure) of every boundary, in order."""
        out: list[tuple[int, int, MarkerSyncOp | None, ReconfigureOp]] = []
        sync: MarkerSyncOp | None = None
        for op in body_ops(self.body):
            if isinstance(op, MarkerSyncOp):
                sync = op
            elif isinstance(op, ReconfigureOp):
                out.append((op.source, op.dest, sync, op))
                sync = None
        return out


@irdl_op_definition
class SegmentOp(IRDLOperation):
    """A run of sub-schedules whose peak resource use fits the class's budget."""

    name = "segment.segment"

    index = prop_def(IntegerAttr[I64])
    use = prop_def(ResourceAttr)
    # Flows whose routes this class's routers hold while the segment is current.
    routes = opt_prop_def(ArrayAttr[SymbolRefAttr])
    body = region_def()

    traits = traits_def(NoTerminator())
    assembly_format = "$index `use` $use (`routes` $routes^)? attr-dict-with-keyword $body"

    @property
    def index_value(self) -> int:
        return int_value(self.index)

    def route_names(self) -> list[str]:
        return [r.root_reference.data for r in self.routes.data] if self.routes is not None else []

    def subs(self) -> list[SubScheduleOp]:
        return [op for op in body_ops(self.body) if isinstance(op, SubScheduleOp)]

    def verify_(self) -> None:
        parent = self.parent_op()
        cls = parent.class_name if isinstance(parent, CoreClassOp) else "?"
        for op in body_ops(self.body):
            if not isinstance(op, SubScheduleOp):
                raise VerifyException(f"segment {self.index_value} of @{cls} may only hold event.sub")
        if isinstance(parent, CoreClassOp):
            budget = parent.effective_budget()
            if budget is not None:
                over = self.use.value.exceeded(budget)
                if over:
                    res, demand, cap = over[0]
                    raise VerifyException(
                        f"segment {self.index_value} of core class @{cls} uses {demand} "
                        f"{RESOURCE_NAMES[res]} but the budget is {cap}"
                    )
        if self.routes is not None:
            for ref in self.routes.data:
                lookup_flow(self, ref)


def _next_or_loop(source: int, dest: int) -> bool:
    return dest == source + 1 or (dest == 0 and source > 0)


@irdl_op_definition
class ReconfigureOp(IRDLOperation):
    """Release the routes of segment `from` and install those of segment `to`."""

    name = "segment.reconfigure"

    from_index = prop_def(IntegerAttr[I64], prop_name="from")
    to_index = prop_def(IntegerAttr[I64], prop_name="to")
    release = prop_def(ArrayAttr[SymbolRefAttr])
    install = prop_def(ArrayAttr[SymbolRefAttr])

    assembly_format = "$from `to` $to `release` $release `install` $install attr-dict"

    @property
    def source(self) -> int:
        return int_value(self.from_index)

    @property
    def dest(self) -> int:
        return int_value(self.to_index)

    def verify_(self) -> None:
        if not _next_or_loop(self.source, self.dest):
            raise VerifyException(
                f"reconfigure {self.source} to {self.dest} must go to the next segment "
                "or, closing the table, back to segment 0"
            )
        for ref in (*self.release.data, *self.install.data):
            lookup_flow(self, ref)


@irdl_op_definition
class MarkerSyncOp(IRDLOperation):
    """Bounded marker exchange over `over` before a non-collective boundary.

    Every core of `over` sends a marker behind its last message of segment
    `from` and waits for its neighbours' markers, so no message of the old
    segment is in flight when routes change. `over` is compile-time known:
    the routers the reconfiguration touches, never the whole chip.
    """

    name = "segment.marker_sync"

    from_index = prop_def(IntegerAttr[I64], prop_name="from")
    to_index = prop_def(IntegerAttr[I64], prop_name="to")
    over = prop_def(CoreSetAttr)

    assembly_format = "$from `to` $to `over` $over attr-dict"

    @property
    def source(self) -> int:
        return int_value(self.from_index)

    @property
    def dest(self) -> int:
        return int_value(self.to_index)

    def verify_(self) -> None:
        if not _next_or_loop(self.source, self.dest):
            raise VerifyException(
                f"marker sync {self.source} to {self.dest} must go to the next segment "
                "or, closing the table, back to segment 0"
            )
        program = _program(self)
        if program is not None:
            w, h = program.mesh_size
            if not self.over.fits_mesh(w, h):
                raise VerifyException(f"marker sync region {self.over} lies outside the {w} x {h} mesh")
            if self.over.count >= w * h and w * h > 1:
                raise VerifyException("marker sync spans the whole chip; it must stay within the affected region")


@irdl_op_definition
class RouteOp(IRDLOperation):
    """Flow `flow` travels on colour `color` through the routers `via`."""

    name = "segment.route"

    flow = prop_def(SymbolRefAttr)
    color = prop_def(IntegerAttr[I64])
    via = prop_def(CoreSetAttr)

    assembly_format = "$flow `color` $color `via` $via attr-dict"

    @property
    def flow_name(self) -> str:
        return self.flow.root_reference.data

    @property
    def color_id(self) -> int:
        return int_value(self.color)

    def verify_(self) -> None:
        lookup_flow(self, self.flow)
        program = _program(self)
        if program is not None:
            c = self.color_id
            if c in program.reserved:
                raise VerifyException(f"route of @{self.flow_name} uses reserved colour {c}")
            if not 0 <= c < int_value(program.num_colors):
                raise VerifyException(
                    f"route of @{self.flow_name} uses colour {c}, outside 0..{int_value(program.num_colors) - 1}"
                )


Segment = Dialect(
    "segment",
    [ProgramOp, CoreClassOp, SegmentOp, ReconfigureOp, MarkerSyncOp, RouteOp],
    [],
)
