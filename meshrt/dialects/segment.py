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

Route handshakes (optional)
---------------------------
Core classes switch segments asynchronously, so the liveness of
`color-routes` (which reasons in step positions, as if classes switched in
lockstep) is only true at run time if the compiled program also states two
handshakes. `insert-route-handshakes` emits them and `check-segments` proves
them complete; IR without them still parses (it then assumes lockstep).

    segment.segment 1 use <...> routes [@f, @g] await [@mid::@f] grant [@g] { ... }
    segment.reconfigure 0 to 1 release [@h] install [@f] notify [@f] drain [@h]

- `notify [@F, ...]` on a reconfigure (each F installed there): once the
  class's routers have switched, each router on F's route sends an *install
  credit* for F over the reverse route to every sender of F whose route
  crosses it (a control message with hop latency; it uses no data colour).
- `grant [@F, ...]` (segment 0 only, each F in its `routes`): the chip starts
  configured in segment 0, so the class's routers grant F's credit at program
  start. Only flows whose first step's traffic crosses the class while this
  first segment 0 is current are granted; a flow whose hold started in the
  previous step (a loop-carried flow that is only coming back) is not.
- `await [@T::@F, ...]` on the segment holding a class's first `event.send`
  of F in the step: before that send, each sender core waits for one credit
  per step from every router of class T on its route (its own router
  excepted). Credits count: step s of a sender consumes the (s+1)-th credit of
  each such router. Classes holding F in every segment never notify and are
  never awaited.
- `drain [@F, ...]` on a reconfigure (each F released there): before the
  reconfiguration, each router of the class on F's route waits until the last
  message of F (senders mark it: an end-of-flow wavelet) of every step it has
  credited has passed it, from every sender whose route crosses it.

Together: no sender uses a flow before every router on its route installed
it, and no router releases a flow before its traffic passed, whatever the
classes' relative speeds.
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
from meshrt.dialects.event import FlowOp, KernelInfoOp, SubScheduleOp, lookup_flow
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

    def exceeds(self, target, on: str) -> str | None:
        """As the header's, and the budgets (the program's and every core
        class's) and user colours must lie within the target's."""
        problem = super().exceeds(target, on)
        if problem is not None:
            return problem
        cap = target.budget()
        budgets = [("the program", self.budget.value)] + [
            (f"core class @{c.class_name}", c.budget.value) for c in self.core_classes()
            if c.budget is not None]
        for who, budget in budgets:
            over = budget.exceeded(cap)
            if over:
                res, d, c = over[0]
                return (f"the IR is compiled for {d} {RESOURCE_NAMES[res]} per core ({who}'s "
                        f"budget), but {on} has {c}")
        extra = [c for c in self.user_colors if c not in target.user_colors]
        if extra:
            return (f"the IR routes on user colour{'s' if len(extra) > 1 else ''} "
                    f"{', '.join(map(str, extra))}, which {on} does not have (its user colours: "
                    f"{', '.join(map(str, target.user_colors))})")
        return None

    def flows(self) -> list[FlowOp]:
        return [op for op in body_ops(self.body) if isinstance(op, FlowOp)]

    def kernels(self) -> list[KernelInfoOp]:
        return [op for op in body_ops(self.body) if isinstance(op, KernelInfoOp)]

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
            if not isinstance(op, KernelInfoOp | FlowOp | CoreClassOp | RouteOp):
                raise VerifyException(
                    f"program @{self.program_name} may only hold event.kernel, event.flow, "
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
    # Route handshakes (see the module docstring): `@class::@flow` install
    # credits awaited before this segment's first send of each flow, and the
    # flows whose credits the class grants at program start (segment 0 only).
    awaits = opt_prop_def(ArrayAttr[SymbolRefAttr], prop_name="await")
    grant = opt_prop_def(ArrayAttr[SymbolRefAttr])
    body = region_def()

    traits = traits_def(NoTerminator())
    assembly_format = (
        "$index `use` $use (`routes` $routes^)? (`await` $await^)? (`grant` $grant^)? "
        "attr-dict-with-keyword $body"
    )

    @property
    def index_value(self) -> int:
        return int_value(self.index)

    def route_names(self) -> list[str]:
        return [r.root_reference.data for r in self.routes.data] if self.routes is not None else []

    def subs(self) -> list[SubScheduleOp]:
        return [op for op in body_ops(self.body) if isinstance(op, SubScheduleOp)]

    def await_pairs(self) -> list[tuple[str, str]]:
        """(class, flow) of every awaited install credit."""
        if self.awaits is None:
            return []
        return [(r.root_reference.data, r.nested_references.data[0].data) for r in self.awaits.data]

    def grant_names(self) -> list[str]:
        return [r.root_reference.data for r in self.grant.data] if self.grant is not None else []

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
        where = f"segment {self.index_value} of @{cls}"
        if self.grant is not None:
            if self.index_value != 0:
                raise VerifyException(f"{where}: only segment 0 may grant credits at program start")
            held = set(self.route_names())
            for ref in self.grant.data:
                lookup_flow(self, ref)
                if ref.root_reference.data not in held:
                    raise VerifyException(f"{where} grants {ref} but does not hold its route")
        if self.awaits is not None:
            program = _program(self)
            classes = ({c.class_name for c in program.core_classes()} if program is not None else None)
            sent = {e.flow_name for sub in self.subs() for e in sub.events()
                    if e.name == "event.send"}
            for ref in self.awaits.data:
                if len(ref.nested_references.data) != 1:
                    raise VerifyException(f"{where}: await entry {ref} must be @class::@flow")
                flow = SymbolRefAttr(ref.nested_references.data[0])
                lookup_flow(self, flow)
                if classes is not None and ref.root_reference.data not in classes:
                    raise VerifyException(f"{where} awaits a credit from unknown core class "
                                          f"@{ref.root_reference.data}")
                if flow.root_reference.data not in sent:
                    raise VerifyException(f"{where} awaits credits for {flow} but sends no "
                                          f"{flow} in this segment")


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
    # Route handshakes (see the module docstring): installed flows whose
    # credits the class's routers send, released flows whose traffic they
    # wait for.
    notify = opt_prop_def(ArrayAttr[SymbolRefAttr])
    drain = opt_prop_def(ArrayAttr[SymbolRefAttr])

    assembly_format = (
        "$from `to` $to `release` $release `install` $install (`notify` $notify^)? "
        "(`drain` $drain^)? attr-dict"
    )

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
        for what, refs, among, verb in (("notify", self.notify, self.install, "install"),
                                        ("drain", self.drain, self.release, "release")):
            if refs is None:
                continue
            names = {r.root_reference.data for r in among.data}
            for ref in refs.data:
                lookup_flow(self, ref)
                if ref.root_reference.data not in names:
                    raise VerifyException(
                        f"reconfigure {self.source} to {self.dest}: {what} {ref} but it does not "
                        f"{verb} {ref}")

    def notify_names(self) -> list[str]:
        return [r.root_reference.data for r in self.notify.data] if self.notify is not None else []

    def rebound_names(self) -> list[str]:
        """The flows the boundary releases or installs."""
        return [r.root_reference.data for r in (*self.release.data, *self.install.data)]

    def drain_names(self) -> list[str]:
        return [r.root_reference.data for r in self.drain.data] if self.drain is not None else []


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
