"""`synthesize-schedules`: Algorithm 1, mesh_kernel -> event.

Walk the kernels in topological order. For every role of every kernel:
a metainfo resolver first where the role receives dynamism, then the
kernel's own events (GetCoreSche, the kind's `roles`, `meshrt.kernels`) with the receives
of its inputs and the sends of its outputs filled in, and a metainfo
producer right before the send its metainfo rides on where the role
produces dynamism; all guarded by the kernel's predecessors. Then cores
that share exactly the same roles are grouped into one core class
(`meshrt.core_classes`), whose table is the concatenation of its roles'
sub-schedules in topological order.

Metainfo never gets a message of its own: it is `meta` bytes on a send the
data already makes. The continuous-batching payload (request id, status
per slot) rides the sampler's token send back to the first stage, every
handoff to the next stage, and the activation into attention; routing
metainfo rides the tokens from the gate through dispatch, the experts and
combine.

A value moves from its producer's layout to its consumer's as
`_redistribution` says. Where an `all` gather's sending line lies inside
its receivers (several senders' multicast trees through each other's
routers: no router configuration forwards that), the line's end core
gathers the line first and multicasts the whole value alone
(`_needs_relay`, `_relayed`).
"""

from __future__ import annotations

import gc
from collections import defaultdict
from dataclasses import dataclass, field, replace
from functools import cache

from xdsl.context import Context
from xdsl.dialects.builtin import (
    ArrayAttr,
    DenseArrayBase,
    DictionaryAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
    UnitAttr,
    i64,
)
from xdsl.ir import Attribute, Block, Region
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import VerifyException

from meshrt.activations import act_value_bytes
from meshrt.kernels import interface as kr
from meshrt.core_classes import partition
from meshrt.kernels.reduce_tree import StreamCosts
from meshrt.diagnostics import MeshrtError
from meshrt.dialects import event as ev
from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import kernel_deps, require_programs, topological_order
from meshrt.dialects.graph import ActType, RoutingType
from meshrt.dialects.mesh import (
    RESOURCE_NAMES,
    CoreSetAttr,
    RectAttr,
    ResourceAttr,
    Resources,
)
from meshrt.routing import RectSet, line_count, line_relay_obstacle
from meshrt.shape import HParams
from meshrt.targets import Target, target_for


def kernel_context(program: mk.ProgramOp, target: Target | None = None,
                   reduce_group: int = 0, reduce_tree: str = "chain") -> kr.KernelContext:
    """What the kernels of `program` need to know; `target` brings the streaming costs
    reduction trees are planned with, `reduce_group` forces their group size,
    `reduce_tree` says which trees the plan may choose (see `SynthesizeSchedules`)."""
    hp = HParams.of(program)
    return kr.KernelContext(
        micro_batch=program.rows,
        # The mapper records the KV slots it sized for; without it, one
        # micro-batch in flight per stage.
        slots=hp.kv_slots(program),
        weight_bytes=hp.dtype_bytes,
        expert_weight_bytes=hp.expert_dtype_bytes,
        kv_bytes=hp.kv_bytes,
        top_k=hp.int("top_k"),
        dynamism=program.dynamism_kinds,
        stream=StreamCosts.of(target) if target is not None else None,
        reduce_group=reduce_group,
        reduce_tree=reduce_tree,
        quant_block=(hp.int("quant_block_in"), hp.int("quant_block_out"))
        if "quant_block_in" in hp and hp.int("quant_block_in") else None,
        shared_experts=hp.int("shared_experts", 0),
        shared_expert_gate=bool(hp.int("shared_expert_gate", 0)),
        act_bytes=act_value_bytes(hp.act_format),
        chunk=program.chunk,
    )


@dataclass
class _Flow:
    spec: kr.FlowSpec
    kernel: str
    wafer: int
    cross_wafer: bool = False
    meta: int = 0
    meta_kind: str | None = None
    gathered_by: str | None = None  # a relay: the flow its one sender gathers the value on first
    routed: bool = False  # only the expert regions a step routed to send data (see event.flow)


@dataclass
class _KernelPlan:
    op: mk.KernelOp
    roles: list[kr.Role]
    inputs: list[_Flow]
    outputs: list[_Flow]
    output_cores: CoreSetAttr
    stage_entry: bool = False
    local_inputs: list[_KernelPlan] = field(default_factory=list)  # producers read in place

    @property
    def input_cores(self) -> CoreSetAttr:
        """Cores of the roles that receive the kernel's inputs."""
        rects = [r for role in self.roles if kr.INPUTS in role.events for r in role.cores.rects.data]
        return CoreSetAttr(rects) if rects else self.op.region

    @property
    def resident_cores(self) -> CoreSetAttr:
        """Cores that hold the result: reductions relay it back to their whole
        region; relays hold it only where it leaves."""
        if self.op.HOLDS_RESULT_AT_OUTPUTS:
            return self.output_cores
        return self.op.result_cores()


def _output_cores(op: mk.KernelOp, roles: list[kr.Role]) -> CoreSetAttr:
    """Cores that send the kernel's result on (all of its region if it keeps it in place)."""
    rects = [r for role in roles if role.sends_output for r in role.cores.rects.data]
    return CoreSetAttr(rects) if rects else op.region


def _same_shape(a: CoreSetAttr, b: CoreSetAttr) -> tuple[int, int] | None:
    """The offset that maps `a` onto `b` if they are translates, else None."""
    ra, rb = a.rects.data, b.rects.data
    if len(ra) != len(rb):
        return None
    offsets = {(q.x.data - p.x.data, q.y.data - p.y.data) for p, q in zip(ra, rb)}
    same = all(p.tuple[2:] == q.tuple[2:] for p, q in zip(ra, rb))
    return offsets.pop() if same and len(offsets) == 1 else None


def _nearest(lines: list[tuple[int, int]], lo: int, hi: int) -> int:
    """Of the first and last positions of the ranges [a, b) (columns or rows), the one
    nearest to [lo, hi). Only the ends: a sending line inside a region would split its
    reduction chains' core classes in two."""
    def distance(p: int) -> int:
        return max(0, lo - p, p - (hi - 1))
    return min((p for a, b in lines for p in (a, b - 1)), key=lambda p: (distance(p), p))


def _redistribution(producer: _KernelPlan, consumer: mk.KernelOp, src: CoreSetAttr,
                    dst: CoreSetAttr, cross_wafer: bool) -> tuple[CoreSetAttr, str, str | None]:
    """Who sends a value laid out over the producer's grid to the consumer, the pattern,
    and how the senders of an `all` gather hold the value ("rows", "cols", "full"; None
    where each message is the receiver's share).

    Only one replica of the value sends: a value split over rows and the same
    in every column is sent by one column, one split over columns by one row
    (the line nearest the consumer). Where the producer's split lines up with
    the consumer's (the same rows, or the same columns) and each core holds
    its slice for every token, each sender
    multicasts its slice along its row (column) to exactly the receivers that
    need it: one message per receiver. Otherwise every receiver gathers the
    replica's slices (an `all` flow from that one line): one multicast per
    sender, of which each receiver keeps its part. A message is the slice the
    sender holds (`held_share`) where that is smaller than a receiver's share
    (many senders of small slices); else it is counted as the receiver's share,
    which undercounts the multicast every receiver hears (a receiver buffers
    only its share). A value every core holds whole is sent by one core. A
    kernel whose tiles each hold a value of their own (the expert regions'
    outputs) sends from every tile. Across wafers every flow is `all` (the
    wafer link carries it).
    """
    op = producer.op
    px, py, pw, ph = op.tiles()[0]
    cx, cy, cw, ch = consumer.tiles()[0]
    held = kr.effective_layout(op.output_layout(), pw, ph)
    need = kr.effective_layout(consumer.input_layout(), cw, ch)
    out = RectSet.from_cores(src)
    tiles = op.tiles()
    if op.TILES_HOLD_OWN_VALUES and len(tiles) > 1:
        # every tile holds a value of its own (an expert's output): all of them send;
        # along their rows when each tile's rows are the consumer's
        aligned = (held == "rows" and need == "rows" and not cross_wafer
                   and all((ty, th) == (cy, ch) for _, ty, _, th in tiles))
        return src, "row" if aligned else "all", None
    if held not in ("rows", "cols", "full") or not producer.resident_cores.covers(src):
        return src, "all", None
    x0, y0, x1, y1 = dst.extent
    whole = op.holds_all_tokens()  # else a line's cores hold other lines' tokens: gather
    if held == "full":
        b = next(iter(out))
        return (CoreSetAttr.of(_nearest([(b[0], b[2])], x0, x1), _nearest([(b[1], b[3])], y0, y1), 1, 1),
                "all", held)
    if held == "rows":  # one column of the producer holds all of it
        full = [(b[0], b[2]) for b in out if b[1] <= py and b[3] >= py + ph]
        if not full:
            return src, "all", None
        x = _nearest(full, x0, x1)
        line = CoreSetAttr.of(x, py, 1, ph)
        aligned = need == "rows" and (py, ph) == (cy, ch) and not cross_wafer and whole
        return (line, "row", None) if aligned else (line, "all", held)
    full = [(b[1], b[3]) for b in out if b[0] <= px and b[2] >= px + pw]
    if not full:
        return src, "all", None
    y = _nearest(full, y0, y1)
    line = CoreSetAttr.of(px, y, pw, 1)
    aligned = need == "cols" and (px, pw) == (cx, cw) and not cross_wafer and whole
    return (line, "col", None) if aligned else (line, "all", held)


def _forwarded(gate: mk.KernelOp, consumer: mk.KernelOp, cross_wafer: bool) -> str:
    """The pattern of the tokens a routing producer forwards (its input, as it received it):
    along the rows when a one-column gate holds them split over the rows the consumer
    needs them split over, else every consumer core gathers them."""
    gx, gy, gw, gh = gate.tiles()[0]
    cx, cy, cw, ch = consumer.tiles()[0]
    held = kr.effective_layout(gate.input_layout(), gw, gh)
    need = kr.effective_layout(consumer.input_layout(), cw, ch)
    aligned = gw == 1 and held == need == "rows" and (gy, gh) == (cy, ch) and not cross_wafer
    return "row" if aligned else "all"


def _needs_relay(src: CoreSetAttr, dst: CoreSetAttr) -> bool:
    """Whether an `all` gather from the line `src` into `dst` must go through one of its
    senders: several senders, some of them receivers, that no relay along the receivers
    can carry (`line_relay_obstacle`); the line's end core then gathers the line first
    and multicasts the whole value."""
    senders, receivers = RectSet.from_cores(src), RectSet.from_cores(dst)
    return (senders.count > 1 and bool(senders & receivers)
            and line_relay_obstacle(senders, receivers) is not None)


SWITCH_CHAIN_POSITIONS = 2
"""Switch positions of a router whose core's messages are serialised with other senders'
on one colour: forward the stream from upstream, or take its own ramp."""


def _serialised(flow: _Flow) -> bool:
    """Whether several senders' messages of `flow` meet on one colour (an `all` gather of
    several senders, or a `row` / `col` flow with several senders on a line): their
    routers take turns by switching (the CSL backend's switch chains)."""
    spec = flow.spec
    if flow.cross_wafer or spec.pattern == "shift":
        return False
    src = RectSet.from_cores(spec.src)
    if spec.pattern == "all":
        return src.count > 1
    return line_count(src, src, spec.pattern == "row") > 1


def _split_senders(plan: _KernelPlan) -> None:
    """Split every sending role of `plan` whose cores only partly send one of its output flows,
    so that each role either sends a flow on all its cores or on none."""
    for f in plan.outputs:
        src = RectSet.from_cores(f.spec.src)
        roles: list[kr.Role] = []
        for role in plan.roles:
            cores = RectSet.from_cores(role.cores)
            inside = cores & src
            if not role.sends_output or not inside or inside == cores:
                roles.append(role)
                continue
            part = f"{role.kind_role}.{len(plan.roles) + len(roles)}"
            roles.append(replace(role, name=part, cores=inside.to_coreset(), part_of=role.kind_role))
            roles.append(replace(role, cores=(cores - inside).to_coreset()))
        plan.roles = roles


class Synthesizer:
    def __init__(self, program: mk.ProgramOp, target: Target, reduce_group: int = 0,
                 reduce_tree: str = "chain"):
        self.program = program
        self.target = target
        self.kctx = kernel_context(program, target, reduce_group, reduce_tree)
        self.flows: dict[str, _Flow] = {}
        self.plans: dict[mk.KernelOp, _KernelPlan] = {}
        self.by_name: dict[str, mk.KernelOp] = {k.kernel_name: k for k in program.kernels()}
        self.route_of: dict[tuple, str] = {}  # an internal flow's route -> the flow taking it
        self.alias: dict[str, str] = {}  # internal flow -> the flow of the same route it uses
        self.serialised: dict[str, bool] = {}  # flow -> its senders take turns (`_serialised`)

    # -- flows between kernels ------------------------------------------
    def _transfer(self, name: str, operand: int, producer: _KernelPlan, consumer: mk.KernelOp,
                  src: CoreSetAttr, data: int) -> _Flow | None:
        """The flow carrying a value from `producer` into `consumer`, or None if local."""
        if name in self.flows:
            return self.flows[name]
        dst = self.plans[consumer].input_cores
        cross = consumer.wafer_index != producer.op.wafer_index
        held = producer.resident_cores
        in_place = kr.holds_input(producer.op, consumer)
        if not cross and in_place and held.is_dense() and held.covers(dst):
            return None  # every consumer core already holds its part of the value
        offset = None if cross else _same_shape(src, dst)
        if offset == (0, 0) and in_place:
            return None
        if offset is not None and offset != (0, 0) and in_place:
            spec = kr.FlowSpec(name, src, dst, "shift", data, *offset, role=ev.FlowRole.INPUT, operand=operand)
        elif consumer.INPUT_FROM_ROUTING_PRODUCER:  # the gate forwards its input, not its output
            spec = kr.FlowSpec(name, src, dst, _forwarded(producer.op, consumer, cross), data,
                               role=ev.FlowRole.INPUT, operand=operand)
        else:
            src, pattern, held_as = _redistribution(producer, consumer, src, dst, cross)
            share, held = data, data
            if held_as is not None:  # a sender's slice, where smaller than a receiver's share
                width = consumer.operands[operand].type.width.data
                _, _, pw, ph = producer.op.tiles()[0]
                held = (self.kctx.micro_batch * producer.op.value_bytes(self.kctx)
                        * kr.held_share(width, held_as, pw, ph))
                data = min(data, held)
            if pattern == "all" and not cross and _needs_relay(src, dst):
                return self._relayed(name, operand, producer, consumer, src, dst, share, held)
            spec = kr.FlowSpec(name, src, dst, pattern, data, role=ev.FlowRole.INPUT, operand=operand)
        flow = _Flow(spec, consumer.kernel_name, producer.op.wafer_index, cross,
                     routed=(producer.op.SENDS_ONLY_ROUTED and "moe_routing" in self.kctx.dynamism
                             and spec.pattern in ("row", "all") and not spec.streams))
        self.flows[name] = flow
        producer.outputs.append(flow)
        return flow

    def _relayed(self, name: str, operand: int, producer: _KernelPlan, consumer: mk.KernelOp,
                  src: CoreSetAttr, dst: CoreSetAttr, share: int, held: int) -> _Flow:
        """An `all` gather through one sender (`_needs_relay`): the line's last core gathers
        the other senders' slices (`NAME.relay`, each message a sender's slice, `held`
        bytes), then multicasts the whole value to the receivers (`NAME`, a message of a
        receiver's `share`)."""
        senders = RectSet.from_cores(src)
        _, _, x1, y1 = max(senders.boxes, key=lambda b: (b[3], b[2]))
        head = CoreSetAttr.of(x1 - 1, y1 - 1, 1, 1)
        rest = (senders - RectSet.from_cores(head)).to_coreset()
        wafer = producer.op.wafer_index
        gather = _Flow(kr.FlowSpec(f"{name}.relay", rest, head, "all", held, role=ev.FlowRole.INPUT,
                                   operand=operand), consumer.kernel_name, wafer)
        flow = _Flow(kr.FlowSpec(name, head, dst, "all", share, role=ev.FlowRole.INPUT, operand=operand),
                     consumer.kernel_name, wafer, gathered_by=gather.spec.name)
        self.flows[gather.spec.name] = gather
        self.flows[name] = flow
        producer.outputs += [gather, flow]
        return flow

    def _received_before(self, producer: _KernelPlan, consumer: mk.KernelOp, data: int) -> bool:
        """Whether an input flow of `producer`'s value into an earlier kernel already brings
        every core of `consumer` the part it needs (one value is moved once, not per reader)."""
        dst = self.plans[consumer].input_cores
        for f in producer.outputs:
            if f.spec.role is not ev.FlowRole.INPUT or f.spec.bytes != data or f.kernel == consumer.kernel_name:
                continue
            other = self.by_name[f.kernel]
            if (other.input_layout() == consumer.input_layout() and other.tiles() == consumer.tiles()
                    and f.spec.dst.covers(dst)):
                return True
        return False

    def _wire_inputs(self, plan: _KernelPlan) -> None:
        op = plan.op
        cb = "continuous_batching" in self.kctx.dynamism
        moe = "moe_routing" in self.kctx.dynamism
        for i, value in enumerate(op.operands):
            producer_op = value.owner
            if isinstance(value.type, RoutingType) or not isinstance(producer_op, mk.KernelOp):
                continue  # routing metainfo rides the token data, never a flow of its own
            producer = self.plans[producer_op]
            data = (self.kctx.micro_batch * producer.op.value_bytes(self.kctx)
                    * op.input_share(value.type.width.data))
            if producer.op.TILES_HOLD_OWN_VALUES and len(producer.op.tiles()) > 1:
                data = producer.op.tile_value_bytes(self.kctx)  # each sends its own value whole
            src = producer.output_cores
            name = f"{op.kernel_name}.in{i}"
            if op.INPUT_FROM_ROUTING_PRODUCER:
                # The gate forwards the tokens it gated with its routing metainfo prepended.
                gate = self.plans[op.routing.owner]
                producer, src = gate, gate.output_cores
            route_meta = moe and op.ROUTED_INPUTS
            if not route_meta and self._received_before(producer, op, data):
                plan.local_inputs.append(producer)  # an earlier kernel on its cores received it
                continue
            flow = self._transfer(name, i, producer, op, src, data)
            if flow is None:
                plan.local_inputs.append(producer)
                if cb and op.CF_ON_INPUTS:
                    self._cb_upstream(producer, plan.input_cores)
                continue
            if route_meta:
                flow.meta, flow.meta_kind = self.kctx.route_bytes, "moe_routing"
            elif cb and (producer.op.STAGE_BOUNDARY or op.CF_ON_INPUTS):
                flow.meta, flow.meta_kind = self.kctx.cf_bytes, "continuous_batching"
            plan.inputs.append(flow)
            if producer.op.STAGE_BOUNDARY:
                plan.stage_entry = True

    def _cb_upstream(self, plan: _KernelPlan, cores: CoreSetAttr) -> None:
        """A kernel that needs the continuous-batching payload reads its input in place
        (`cores`): the payload rides the nearest input flow upstream, through producers
        read in place, that reaches all of those cores."""
        seen = set()
        todo = [plan]
        while todo:
            p = todo.pop(0)
            if id(p) in seen:
                continue
            seen.add(id(p))
            for f in p.inputs:
                if f.spec.dst.covers(cores) and f.meta_kind in (None, "continuous_batching"):
                    f.meta, f.meta_kind = self.kctx.cf_bytes, "continuous_batching"
                    return
            todo += p.local_inputs
        raise MeshrtError(f"kernel region {cores}: no input flow reaches all of it to carry the "
                          "continuous-batching payload")

    def _wire_token_loop(self, sample: _KernelPlan, embed: _KernelPlan) -> None:
        """The sampler's tokens (and the CF payload) go back to the first stage's embed."""
        name = f"{embed.op.kernel_name}.tokens"
        data = self.kctx.micro_batch * 4
        flow = _Flow(kr.FlowSpec(name, sample.output_cores, embed.op.region, "all", data,
                                 role=ev.FlowRole.TOKENS),
                     embed.op.kernel_name, sample.op.wafer_index,
                     cross_wafer=sample.op.wafer_index != embed.op.wafer_index)
        if "continuous_batching" in self.kctx.dynamism:
            flow.meta, flow.meta_kind = self.kctx.cf_bytes, "continuous_batching"
        self.flows[name] = flow
        sample.outputs.append(flow)
        embed.inputs.append(flow)

    def _carry_cf_payload(self) -> None:
        """Every core that forwards the CF payload must have received it this step.

        The payload leaves the sampler with the tokens and rides every handoff
        and every flow into attention. A kernel that sends it therefore needs
        it on one of its own input flows, or (when it reads a value in place)
        its producer needs it: walk back until a flow that carries it.
        """
        cf = self.kctx.cf_bytes
        producer_of = {id(f): p for p in self.plans.values() for f in p.outputs}
        need = [p for p in self.plans.values()
                if any(f.meta_kind == "continuous_batching" for f in p.outputs)
                and not p.op.TOKEN_SOURCE]
        seen: set[int] = set()
        while need:
            plan = need.pop()
            if id(plan) in seen:
                continue
            seen.add(id(plan))
            if any(f.meta_kind == "continuous_batching" for f in plan.inputs):
                continue
            data_flows = [f for f in plan.inputs if f.meta_kind is None]
            if data_flows:
                data_flows[0].meta, data_flows[0].meta_kind = cf, "continuous_batching"
                need.append(producer_of[id(data_flows[0])])  # which now forwards it too
            need.extend(plan.local_inputs)

    def _add_internal(self, spec: kr.FlowSpec, op: mk.KernelOp) -> None:
        """A kernel's own chain or relay flow; one flow serves every kernel whose chain takes
        the same route (the reductions of a layer's kernels on one region run one after
        another down the same columns), so they share its colour and input queue."""
        key = (spec.role, spec.src, spec.dst, spec.pattern, spec.dx, spec.dy, op.wafer_index)
        same = self.route_of.get(key)
        if same is None:
            self.route_of[key] = spec.name
            self.flows[spec.name] = _Flow(spec, op.kernel_name, op.wafer_index)
            return
        self.alias[spec.name] = same
        shared = self.flows[same]
        if spec.bytes > shared.spec.bytes:
            shared.spec = replace(shared.spec, bytes=spec.bytes)

    def _serialised(self, name: str) -> bool:
        """`_serialised` of flow `name`, once per flow (every role sending it asks)."""
        got = self.serialised.get(name)
        if got is None:
            flow = self.flows.get(name)
            got = self.serialised[name] = flow is not None and _serialised(flow)
        return got

    # -- Algorithm 1 ------------------------------------------------------
    def run(self) -> ev.ScheduleOp:
        try:
            order = topological_order(self.program.kernels())
        except VerifyException as e:
            raise MeshrtError(str(e), self.program) from e
        for op in order:
            roles, internal = op.roles(self.kctx)
            for spec in internal:
                self._add_internal(spec, op)
            plan = _KernelPlan(op, roles, [], [], _output_cores(op, roles))
            self.plans[op] = plan
            self._wire_inputs(plan)
        samples = [p for p in self.plans.values() if p.op.TOKEN_SOURCE]
        embeds = [p for p in self.plans.values() if p.op.TOKEN_SINK]
        if samples and embeds:
            self._wire_token_loop(samples[-1], embeds[0])
        if "continuous_batching" in self.kctx.dynamism:
            self._carry_cf_payload()
        for plan in self.plans.values():
            _split_senders(plan)

        budget = self.target.budget()
        subs_by_key: dict[tuple[int, str], ev.SubScheduleOp] = {}
        members: dict[int, list[tuple[tuple[int, int, int, int], tuple[int, str]]]] = defaultdict(list)
        for index, op in enumerate(order):
            plan = self.plans[op]
            guard = ArrayAttr([SymbolRefAttr(d.kernel_name) for d in kernel_deps(op)])
            for role in plan.roles:
                sub = self._sub_schedule(plan, role, guard, budget)
                subs_by_key[(index, role.name)] = sub
                for r in role.cores.rects.data:
                    if not r.is_unit_step():
                        raise MeshrtError(
                            f"kernel @{op.kernel_name} role \"{role.name}\": strided core sets "
                            "cannot be partitioned into core classes yet", op)
                    members[op.wafer_index].append((r.tuple[:4], (index, role.name)))

        block = Block()
        for op in order:
            block.add_op(kernel_info(op))
        for name in sorted(self.flows, key=list(self.flows).index):
            block.add_op(self._flow_op(self.flows[name]))
        used_names: set[str] = set()
        for wafer in sorted(members):
            for rects, keys in partition(members[wafer]):
                keys_sorted = sorted(keys)
                # Named after the last role it runs: what sets it apart from
                # the classes it shares earlier kernels with.
                last = keys_sorted[-1]
                name = f"{order[last[0]].kernel_name}.{last[1]}"
                if wafer:
                    name = f"w{wafer}.{name}"
                base, n = name, 1
                while name in used_names:
                    n += 1
                    name = f"{base}.{n}"
                used_names.add(name)
                cls = ev.CoreClassOp.create(
                    properties={
                        "sym_name": StringAttr(name),
                        "wafer": IntegerAttr(wafer, i64),
                        "cores": CoreSetAttr([RectAttr(*r) for r in rects]),
                    },
                    regions=[Region([Block([subs_by_key[k].clone() for k in keys_sorted])])],
                )
                cls.location = order[keys_sorted[0][0]].location
                block.add_op(cls)
        hparams = dict(self.program.hparams.data)
        hparams["inflight_slots"] = IntegerAttr(self.kctx.slots, i64)
        schedule = ev.ScheduleOp.like(self.program, body=Region([block]))
        schedule.properties["hparams"] = DictionaryAttr(hparams)
        schedule.location = self.program.location
        return schedule

    def _sub_schedule(self, plan: _KernelPlan, role: kr.Role, guard: ArrayAttr,
                      budget: Resources) -> ev.SubScheduleOp:
        op = plan.op
        recv_kinds = op.receives_dynamism(role.kind_role, self.kctx, plan.stage_entry)
        prod_kinds = op.produces_dynamism(role.kind_role, self.kctx)
        events: list = []
        # The kernel's own events, inputs and outputs filled in
        sends: set[str] = set()
        recvs: set[str] = set()
        max_msg = 0
        for e in role.events:
            if e == kr.INPUTS:
                for f in plan.inputs:
                    if self._reaches(f, role):
                        events.append(_recv(f.spec.name, f.spec.bytes, f.meta))
                        recvs.add(f.spec.name)
                        max_msg = max(max_msg, f.spec.bytes + f.meta)
            elif e == kr.OUTPUTS:
                if not role.sends_output:
                    continue
                for f in plan.outputs:
                    if not f.spec.src.overlaps(role.cores):
                        continue  # another line of the kernel sends this one
                    if f.gathered_by is not None:  # a relay: the other senders' slices first
                        g = self.flows[f.gathered_by].spec
                        events.append(_recv(g.name, g.bytes, 0))
                        recvs.add(g.name)
                        max_msg = max(max_msg, g.bytes)
                    # Metainfo producers, right before the send the metainfo rides on
                    if f.meta_kind in prod_kinds:
                        events.append(ev.MetaProduceOp.create(properties={
                            "kind": _str(f.meta_kind), "flow": _sym(f.spec.name), "bytes": _int(f.meta)}))
                    events.append(_send(f.spec.name, f.spec.bytes, f.meta))
                    sends.add(f.spec.name)
                    max_msg = max(max_msg, f.spec.bytes + f.meta)
            elif e[0] == "compute":
                events.append(ev.ComputeOp.create(properties={"op": _str(e[1]), "work": _int(int(e[2]))}))
            else:
                kind, flow, nbytes, *rest = e
                flow = self.alias.get(flow, flow)
                meta = rest[0] if rest else 0
                events.append((_recv if kind == "recv" else _send)(flow, nbytes, meta))
                (recvs if kind == "recv" else sends).add(flow)
                max_msg = max(max_msg, nbytes + meta)
        # (1) metainfo resolvers go first: each reads the metainfo that rides
        # ahead of the first message the role receives on the kernel's path.
        resolvers = []
        for kind in recv_kinds:
            carrier = next((e for e in events if isinstance(e, ev.RecvOp) and e.meta.value.data > 0), None)
            if carrier is None:
                continue  # the role shares its cores' table, updated by an earlier resolver
            resolvers.append(ev.MetaResolveOp.create(properties={
                "kind": _str(kind), "flow": carrier.flow, "bytes": carrier.meta}))
        events = resolvers + events
        flows_used = recvs | sends
        demand = Resources(
            colors=len(flows_used),
            iq=len(recvs),
            oq=len(sends),
            routes=len(flows_used),
            switches=max([role.switches, *(SWITCH_CHAIN_POSITIONS for f in sends if self._serialised(f))])
            if flows_used else 0,
            sram=role.state_sram + max_msg,  # resident state + the largest message buffer
            ctrl=role.ctrl,
        )
        for res in ("sram", "ctrl"):
            need, cap = getattr(demand, res), getattr(budget, res)
            if need > cap:
                raise MeshrtError(
                    f"kernel @{op.kernel_name} role \"{role.name}\" needs {need} {RESOURCE_NAMES[res]} "
                    f"per core on region {op.region}, but {self.target.name} has {cap}: the region is "
                    "too small for the kernel's tiling", op)
        props = {
            "kernel": SymbolRefAttr(op.kernel_name),
            "role": StringAttr(role.name),
            "after": guard,
            "demand": ResourceAttr(demand),
        }
        if op.is_collective():
            props["collective"] = UnitAttr()
        sub = ev.SubScheduleOp.create(properties=props, regions=[Region([Block(events)])])
        sub.location = op.location
        return sub

    @staticmethod
    def _reaches(flow: _Flow, role: kr.Role) -> bool:
        return flow.spec.dst.overlaps(role.cores)

    def _flow_op(self, flow: _Flow) -> ev.FlowOp:
        s = flow.spec
        props = {
            "sym_name": StringAttr(s.name),
            "kernel": SymbolRefAttr(flow.kernel),
            "role": StringAttr(s.role.value),
            "wafer": IntegerAttr(flow.wafer, i64),
            "src": s.src,
            "dst": s.dst,
            "pattern": StringAttr(s.pattern),
            "bytes": IntegerAttr(max(s.bytes, 1), i64),
        }
        if s.operand is not None:
            props["operand"] = IntegerAttr(s.operand, i64)
        if s.dx is not None:
            props["dx"] = IntegerAttr(s.dx, i64)
            props["dy"] = IntegerAttr(s.dy, i64)
        if flow.cross_wafer:
            props["cross_wafer"] = UnitAttr()
        if s.streams:
            props["streams"] = UnitAttr()
        if flow.routed:
            props["routed"] = UnitAttr()
        return ev.FlowOp.create(properties=props)


def kernel_info(op: mk.KernelOp) -> ev.KernelInfoOp:
    """The `event.kernel` record of `op`: kind, region, inputs and shape parameters."""
    # layer, stage and wafer first, then the kind's own: the same order whether
    # `op` was built by lower-to-mesh-kernels or parsed from printed IR (which
    # reads properties of the assembly format, e.g. elementwise's kind, first).
    common = ("layer", "stage", "wafer")
    params: dict[str, Attribute] = {k: op.properties[k] for k in common if k in op.properties}
    for key, attr in op.properties.items():
        if key not in ("sym_name", "region", *common):
            params[key] = attr
    widths = [v.type.width.data for v in op.operands if isinstance(v.type, ActType)]
    params["in_widths"] = DenseArrayBase.from_list(i64, widths)
    if op.results and isinstance(op.results[0].type, ActType):
        params["out_width"] = _int(op.results[0].type.width.data)
    program = op.parent_op()
    if "moe_routing" in op.RESOLVES and "moe_routing" in getattr(program, "dynamism_kinds", ()):
        params["routed"] = _int(1)  # its bodies read the routing table (else: the static build)
    if op.results and isinstance(op.results[0].type, RoutingType):
        params["experts"] = _int(op.results[0].type.experts.data)
        params["top_k"] = _int(op.results[0].type.top_k.data)
    info = ev.KernelInfoOp.create(properties={
        "sym_name": StringAttr(op.kernel_name),
        "kind": StringAttr(op.kernel_kind()),
        "region": op.region,
        "inputs": ArrayAttr([SymbolRefAttr(v.owner.kernel_name) for v in op.operands
                             if isinstance(v.owner, mk.KernelOp)]),
        "params": DictionaryAttr(params),
    })
    info.location = op.location
    return info


# Attributes are immutable: one instance per value serves every op, which
# saves most of the construction time of large schedules.
@cache
def _int(v: int) -> IntegerAttr:
    return IntegerAttr(v, i64)


@cache
def _str(v: str) -> StringAttr:
    return StringAttr(v)


@cache
def _sym(v: str) -> SymbolRefAttr:
    return SymbolRefAttr(v)


def _recv(flow: str, nbytes: int, meta: int) -> ev.RecvOp:
    return ev.RecvOp.create(properties={"flow": _sym(flow), "bytes": _int(nbytes), "meta": _int(meta)})


def _send(flow: str, nbytes: int, meta: int) -> ev.SendOp:
    return ev.SendOp.create(properties={"flow": _sym(flow), "bytes": _int(nbytes), "meta": _int(meta)})


@dataclass(frozen=True)
class SynthesizeSchedules(ModulePass):
    """mesh_kernel.program -> event.schedule (per-core-class event tables).

    `target` overrides the target named in the program (a bundled name or a
    .toml path; from Python, also the Target itself, as the driver passes it).
    """

    name = "synthesize-schedules"

    target: str | Target | None = None
    # reduction trees: 0 lets each kernel's plan choose its group size from the
    # target's stream costs (`ReduceTree.plan`); 1 forces one chain per side,
    # S >= 2 groups of S cores (how bench/bench_reduce.py builds chain and two-phase)
    reduce_group: int = 0
    # "chain": every reduction streams along its line into a root at the line's end
    # (the default: the fewest roles and flows, so compiling a full-size model stays
    # fast); "tree": the plan may also centre the root and add a second level where
    # its closed form is faster (`ReduceTree.plan`; many more core classes)
    reduce_tree: str = "chain"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.reduce_group < 0:
            raise MeshrtError(f"{self.name}: reduce-group must be >= 0, got {self.reduce_group}")
        if self.reduce_tree not in ("chain", "tree"):
            raise MeshrtError(f"{self.name}: reduce-tree must be chain or tree, got {self.reduce_tree!r}")
        for program in require_programs(op, self.name, mk.ProgramOp, hint="lower-to-mesh-kernels"):
            target = target_for(self.target, program)
            gc_was_enabled = gc.isenabled()
            gc.disable()  # bulk IR construction: the cyclic GC only costs time here
            try:
                schedule = Synthesizer(program, target, self.reduce_group, self.reduce_tree).run()
            finally:
                if gc_was_enabled:
                    gc.enable()
            schedule.stamp_target(target)
            op.body.block.insert_op_before(schedule, program)
            op.body.block.erase_op(program, safe_erase=False)
