"""Decode attention over KV tiles; per-slot sequence lengths come from the RDT."""

from __future__ import annotations

from dataclasses import replace
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, UnitAttr
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.base import int_value
from meshrt.dialects.graph import ActType, spill_problem
from meshrt.dialects.mesh import CoreSetAttr, FlowRole, RectAttr
from meshrt.kernels.attention import csl, pe
from meshrt.kernels.attention.layout import (
    heads_share,
    kv_share,
    lays_out,
    q_share,
    qkv_share,
    split_by_rows,
    split_layout,
    splits_heads,
    tile_span,
)
from meshrt.kernels.attention.numerics import Attention, qkv_blocks
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.interface import (
    ACT_BYTES,
    UNARY_FORMAT,
    FlowSpec,
    Footprint,
    Gather,
    KernelContext,
    KernelOp,
    INPUTS,
    OUTPUTS,
    Role,
    ceil_div,
    chain,
    in_sequence,
)
from meshrt.rope import Rope, rotary_dim
from meshrt.shape import HParams, request_state

ROW_QUEUES = 4
"""Input queues a core inside a head split's row chain binds: its row's values going and
coming back (partial scores and their sums; or the gathered q | k | v and then the merged
partials, on the same flows), its column's partials and result (and its input, where it
does not read its q | k | v in place)."""

QK = ComputeOp("qk", "fmac", csl.qk, reads_input=True, over_kv_rows=True)
"""Scores of this core's KV rows: q . K[r]."""
EXP = ComputeOp("exp", "exp", csl.exp, over_kv_rows=True)
"""exp(s - max) of the scores and their sum."""
AV = ComputeOp("av", "fmac", csl.av, over_kv_rows=True)
"""The scores' weighted sum of this core's V rows."""
SCORE_ADD = ComputeOp("score_add", "add", csl.score_add)
"""A row neighbour's partial scores added (a head split by features, `layout`)."""
QKV_GATHER = ComputeOp("qkv_gather", "add", csl.qkv_gather)
"""A row neighbour's units of the group's q | k | v added into the whole head's (a head
split by rows, `layout`: disjoint units, so the sum is their union)."""


def merge_cycles(costs, work: int, param) -> float:
    """One flash-decoding merge of `work` message elements: per head (head_dim outputs, max,
    sum) a max of the two maxima and two exps (the rescale factors), then a multiply and an
    FMAC over the head's outputs and sum (rescale own, add partner's rescaled).

    Heads merged = ceil(work / (head_dim + 2)): exact when the columns hold whole heads (the
    layout the interpreter computes); a core holding part of a head counts it once.
    """
    d = param("head_dim")
    if d is None:
        raise ValueError("softmax_merge is priced per head: its kernel needs a head_dim parameter")
    heads = -(-work // (d + 2))
    return (heads * (costs["argmax"] + 2 * costs["exp"])
            + (work - heads) * (costs["mul"] + costs["fmac"]))


SOFTMAX_MERGE = ComputeOp("softmax_merge", ("argmax", "exp", "mul", "fmac"), csl.softmax_merge,
                          price=merge_cycles)
"""Flash-decoding merge of a partner's (out, max, sum) into this core's (`merge_cycles`)."""
GROUP_MERGE = ComputeOp("group_merge", ("argmax", "exp", "mul", "fmac"), csl.group_merge,
                        price=merge_cycles)
"""A head split's merge along the row: a neighbour's partial of the same KV head group
(`layout`)."""
NORMALIZE = ComputeOp("normalize", "mul", csl.normalize)
"""Divide by the softmax sum at the root."""


def kv_rows(heads: int, kv_heads: int, d: int, max_seq: int, slots: int, kv_bytes: float,
            micro_batch: int, w: int, h: int) -> int:
    """KV rows of a slot the fullest core of a w x h attention holds: its row's block of
    the ring's max_seq entries (`numerics.part`), or a head split's share of it
    (`layout.split_layout`)."""
    if splits_heads(kv_heads, w):
        return split_layout(heads, kv_heads, d, max_seq, slots, kv_bytes, micro_batch, w, h).kv_rows
    return ceil_div(max_seq, h)


def reads_qkv_in_place(attn: graph.AttentionOp, qkv_region) -> bool:
    """Whether graph attention `attn` runs on the columns of the GEMV producing its q | k | v
    (a dense layer's one region): that GEMV then lays its output out blocked per column,
    so after the column reduction every core of a column holds its heads' q, k and v and
    no flow is needed; elsewhere each core gathers its share from the whole vector."""
    a0, _, a1, _ = attn.region.extent
    p0, _, p1, _ = qkv_region.extent
    return (a0, a1) == (p0, p1)


@irdl_op_definition
class AttentionOp(KernelOp):
    """Decode attention over KV tiles; per-slot sequence lengths come from the RDT."""

    name = "mesh_kernel.attention"
    heads = prop_def(IntegerAttr[I64])
    kv_heads = prop_def(IntegerAttr[I64])
    head_dim = prop_def(IntegerAttr[I64])
    max_seq = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64])
    qkv_in_place = opt_prop_def(UnitAttr)  # its input is a blocked q | k | v on its columns
    gated = opt_prop_def(IntegerAttr[I64])  # 1: out * sigmoid(gate), the gate after q, k, v
    # KV spill: ring entries from spill_from on live on the region's other rectangles
    # (spill tiles on the layer's FFN cores, shaped like the first), attended there in
    # parallel (`held`)
    spill_from = opt_prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#ff7f00"
    VIZ_RANK: ClassVar[int] = 1
    COMPUTE: ClassVar[tuple] = (QK, EXP, AV, SCORE_ADD, QKV_GATHER, SOFTMAX_MERGE, GROUP_MERGE, NORMALIZE)
    NUMERICS: ClassVar[type] = Attention
    LOWERS: ClassVar[tuple] = (graph.AttentionOp,)
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"continuous_batching"})  # per-slot KV lengths
    CF_ON_INPUTS: ClassVar[bool] = True
    ATTENDS_KV: ClassVar[bool] = True

    def grid(self) -> tuple[int, int, int, int]:
        """(x, y, w, h) of the attention's own rectangle: the region's first (a spilling
        attention's others are its spill tiles, `held`)."""
        r = self.region.rects.data[0]
        if not r.is_unit_step() or (len(self.region.rects.data) > 1) != self.spills:
            raise self.fail(f"needs one dense rectangle as its region"
                            f"{' and more for its spill tiles' if self.spills else ''}, got {self.region}")
        return r.x.data, r.y.data, r.w.data, r.h.data

    @property
    def spills(self) -> bool:
        return self.spill_from is not None

    def held(self) -> list[tuple[tuple[int, int, int, int], int]]:
        """(tile, ring entries it holds) of its region and each spill tile (`tile_span`)."""
        rects = [r.tuple[:4] for r in self.region.rects.data]
        spill = None if self.spill_from is None else int_value(self.spill_from)
        return [(t, tile_span(int_value(self.max_seq), spill, len(rects), i)[1]) for i, t in enumerate(rects)]

    def result_cores(self) -> CoreSetAttr:
        return CoreSetAttr([RectAttr(*self.grid())])  # not the spill tiles

    def verify_kernel(self) -> None:
        _, _, w, h = self.grid()
        if self.spills:
            spill = CoreSetAttr(self.region.rects.data[1:])
            problem = spill_problem(CoreSetAttr([self.region.rects.data[0]]), spill,
                                    int_value(self.spill_from), int_value(self.max_seq))
            if problem:
                raise self.fail(problem)
            if self.qkv_in_place is None:
                raise self.fail("a spilling attention reads its q | k | v in place (its spill "
                                "tiles receive each column's share from its own columns)")
        kv = int_value(self.kv_heads)
        if not lays_out(kv, w):
            raise self.fail(f"{w} columns split {kv} KV heads unevenly: the width must divide "
                            "kv_heads (whole heads a column) or exceed it (head_dim split)")
        if int_value(self.slots) <= 0:
            raise self.fail("slots must be > 0")
        if kv <= 0 or int_value(self.heads) % kv:
            raise self.fail("heads must be a positive multiple of kv_heads")
        # KV positions are split over rows (rows past max_seq hold none: a layer's region
        # may be taller than its context), KV heads x head_dim over columns.
        if int_value(self.max_seq) <= 0:
            raise self.fail(f"max_seq must be > 0, got {int_value(self.max_seq)}")
        if kv * int_value(self.head_dim) < w:
            raise self.fail(
                f"{kv * int_value(self.head_dim)} KV columns cannot be tiled over {w} columns"
            )
        if int_value(self.head_dim) % 2 and splits_heads(kv, w):
            raise self.fail(f"head_dim {int_value(self.head_dim)} split over {w} columns must be "
                            "even (a column holds whole RoPE pairs)")

    @staticmethod
    def footprint(slots: int, max_seq: int, heads: int, kv_heads: int, head_dim: int,
                  kv_bytes: float, micro_batch: int, w: int, h: int, *, rot: int = 0,
                  qk_norm: bool = False, sinks: bool = False, gated: bool = False,
                  chunk: int = 1, split_rows: bool | None = None) -> Footprint:
        """K and V rows max_seq/h of each slot's cache (a head split: as its layout keeps
        them, `layout.split_layout`) and the model's values beside it (RoPE's turns of
        `rot` rotated features, q/k norm gains, sinks), and the PE bodies' working arrays
        (`pe.py`; a chunked program's row table: each of the `micro_batch` rows' KV slot and
        position), of the fullest column (`layout`; `split_rows` forces a head split's)."""
        hq = heads_share(heads, kv_heads, w)
        params = pe.param_buffers(head_dim, rot, qk_norm, hq if sinks else 0)
        table = 2 * 4 * micro_batch if chunk > 1 else 0
        if splits_heads(kv_heads, w):  # the group's layout: by features or by rows
            lay = split_layout(heads, kv_heads, head_dim, max_seq, slots, kv_bytes, micro_batch, w, h,
                               by=split_rows)
            return Footprint(lay.kv_bytes + 4 * sum(b.elems for b in params), lay.work_bytes + table)
        rows = ceil_div(max_seq, h)
        kv = slots * rows * kv_share(kv_heads, head_dim, w) * 2 * kv_bytes
        work = sum(b.elems for b in pe.working_buffers(micro_batch, hq, kv_heads // w, head_dim,
                                                       rows, rot, gated))
        return Footprint(kv + 4 * sum(b.elems for b in params), ACT_BYTES * work + table)

    @staticmethod
    def control(micro_batch: int, slots: int) -> int:
        """Control state per core: the micro-batch's descriptors and every slot's context length
        (where its next KV row goes, how far it attends)."""
        return request_state(micro_batch, slots)

    def split_rows(self, kctx: KernelContext) -> bool | None:
        """Whether a head split's groups split the rows (`layout.split_by_rows`), chosen for
        the region's share of the ring and kept by the spill tiles; None: whole heads."""
        _, _, w, h = self.grid()
        return split_by_rows(int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim),
                             self.held()[0][1], kctx.slots, kctx.kv_bytes, kctx.micro_batch, w, h)

    def partial_bytes(self, kctx: KernelContext) -> int:
        """A core's partial softmax (out, max, sum of its heads or group) on the merge down
        a column, and from the spill tile's root into the region's."""
        _, _, w, _ = self.grid()
        heads, kv, d = int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim)
        b, feats, by_rows = kctx.micro_batch, q_share(heads, kv, d, w), self.split_rows(kctx)
        if by_rows is None:
            return b * (feats + 2 * heads_share(heads, kv, w)) * ACT_BYTES
        g = heads // kv
        return b * g * (d + 2) * ACT_BYTES if by_rows else b * (feats + 2 * g) * ACT_BYTES

    def roles(self, kctx: KernelContext):
        held = self.held()
        _, _, w, _ = self.grid()
        heads, kv, d = int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim)
        normalize = [("compute", "normalize", kctx.micro_batch * q_share(heads, kv, d, w))]
        if not self.spills:
            roles, flows = self._tile_roles(kctx, *held[0], "", normalize)
        else:
            roles, flows = self._spill_roles(kctx, held, normalize)
        for r in roles:
            r.ctrl = self.control(kctx.in_hand, kctx.slots)
        return roles, flows

    def _spill_roles(self, kctx: KernelContext, held, normalize):
        """The region's roles and each spill tile's, the same chains on each (the tiles
        share a shape, so their roots sit at the same place): every core of the region
        sends its column's q | k | v to its twin on the first spill tile, which passes it
        on to the next (`.spillN.in`, the continuous-batching table riding it), and the
        partials come back the same way: each spill tile's root merges the next tile's
        into its own and sends it on toward the region's root (`.spillN`), which merges it
        before it normalizes (one send and one receive more a core, however many tiles)."""
        (tile, entries), spills = held[0], held[1:]
        k, w = self.kernel_name, tile[2]
        msg = self.partial_bytes(kctx)
        heads, kv, d = int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim)
        gated = self.gated is not None and bool(int_value(self.gated))
        share = kctx.micro_batch * qkv_share(heads, kv, d, w, gated) * kctx.act_bytes
        cf = kctx.cf_bytes if "continuous_batching" in kctx.dynamism else 0
        names = [(f"{k}.spill{n}", f"{k}.spill{n}.in") for n in range(1, len(spills) + 1)]

        def merge(n: int) -> list:  # the partial of spill tiles n.. into this root's
            return [("recv", names[n - 1][0], msg), ("compute", "softmax_merge", msg // ACT_BYTES)]

        roles, flows = self._tile_roles(kctx, tile, entries, "", [*merge(1), *normalize])
        first = ("send", names[0][1], share, cf)
        roles = [replace(r, events=[e2 for e in r.events for e2 in ([e, first] if e == INPUTS else [e])])
                 for r in roles]
        prev = tile
        for n, ((spill, rest), (out, into)) in enumerate(zip(spills, names), 1):
            finish = (merge(n + 1) if n < len(names) else []) + [("send", out, msg)]
            sroles, sflows = self._tile_roles(kctx, spill, rest, f"spill{n}", finish, relay_back=False)
            arrive = [("recv", into, share, cf)] + ([("send", names[n][1], share, cf)] if n < len(names) else [])
            sroles = [replace(r, sends_output=False,
                              events=[e2 for e in r.events if e != OUTPUTS
                                      for e2 in (arrive if e == INPUTS else [e])])
                      for r in sroles]
            sx, sy = spill[:2]
            px, py = prev[:2]
            src = CoreSetAttr([rect for r in sroles if ("send", out, msg) in r.events for rect in r.cores.rects.data])
            dst = CoreSetAttr([RectAttr(r.x.data + px - sx, r.y.data + py - sy, r.w.data, r.h.data)
                               for r in src.rects.data])
            roles += sroles
            flows += sflows + [
                FlowSpec(into, CoreSetAttr([RectAttr(*prev)]), CoreSetAttr([RectAttr(*spill)]), "shift",
                         share, sx - px, sy - py, role=FlowRole.SPILL),
                FlowSpec(out, src, dst, "shift", msg, px - sx, py - sy, role=FlowRole.DOWN)]
            prev = spill
        return roles, flows

    def _tile_roles(self, kctx: KernelContext, tile, entries: int, part: str, finish,
                    relay_back: bool = True):
        """Roles and flows of the attention on `tile` holding `entries` ring entries of
        each slot: the partials merged down each column into its root, which runs
        `finish` (`part`: the prefix of the tile's chains, where the kernel has two)."""
        x, y, w, h = tile
        heads, kv, d = int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim)
        b = kctx.micro_batch
        by_rows = self.split_rows(kctx)
        state = int(self.footprint(kctx.slots, entries, heads, kv, d, kctx.kv_bytes, b, w, h,
                                   **self.model_features(), chunk=kctx.chunk, split_rows=by_rows).state)
        if by_rows is not None:
            lay = split_layout(heads, kv, d, entries, kctx.slots, kctx.kv_bytes, b, w, h, by=by_rows)
            return self._split_roles(kctx, tile, lay, state, part, finish, relay_back)
        rows, hs, feats = ceil_div(entries, h), heads_share(heads, kv, w), q_share(heads, kv, d, w)
        local = [("compute", "qk", b * rows * feats), ("compute", "exp", b * rows * hs),
                 ("compute", "av", b * rows * feats)]
        return chain(self, local, "softmax_merge", self.partial_bytes(kctx), finish, state, kctx=kctx,
                     tiles=[tile], part=part, relay_back=relay_back)

    def _split_roles(self, kctx: KernelContext, tile, lay, state: int, part: str, finish,
                     relay_back: bool):
        """A head split (`layout`): its group's exchanges along each row (by features:
        the partial scores summed; by rows: the units gathered into whole heads, then the
        partials merged), the merge down each column as in any attention."""
        x, y, w, h = tile
        heads, kv, d = int_value(self.heads), int_value(self.kv_heads), int_value(self.head_dim)
        b, g, c, rows = kctx.micro_batch, heads // kv, w // kv, lay.kv_rows
        feats = q_share(heads, kv, d, w)  # its units of q and of the output
        stream = kctx.stream if kctx is not None else None
        # an input that arrives on a flow (not read in place) takes one queue more
        whole_rows = stream is None or stream.queues >= ROW_QUEUES + (self.qkv_in_place is None)

        def named(name: str) -> str:
            return f"{part}_{name}" if part else name

        def along_rows(local, op: str, msg: int, row_part: str, gather: Gather | None, idle: str):
            """The segmented chain along each whole row into its end, relayed back (it
            takes the route of the o projection's reduction along the same rows where
            that is a chain into the end, so the two share a colour and a queue); on a
            target whose roles bind fewer queues, a chain per group into its end (a group
            of one or two columns has no core that receives on both row flows)."""
            if whole_rows:
                return chain(self, local, op, msg, [], 0, axis="row", kctx=kctx, root=w - 1,
                             part=named(row_part), relay=True, gather=gather, tiles=[tile])
            out, flows = chain(self, local, op, msg, [], 0, axis="row", kctx=kctx,
                               tiles=[(x + k * c, y, c, h) for k in range(kv)],
                               root=c - 1 if c > 1 else None, part=named(row_part), relay=True,
                               gather=gather)
            if kv * c < w:  # columns past the groups: no heads, nothing along the row
                out.append(Role(named(idle), CoreSetAttr([RectAttr(x + kv * c, y, w - kv * c, h)]),
                                [INPUTS, *local, OUTPUTS]))
            return out, flows

        def column(local):
            return chain(self, local, "softmax_merge", self.partial_bytes(kctx), finish, state,
                         kctx=kctx, tiles=[tile], part=part, relay_back=relay_back)

        if lay.rows:  # whole heads over every c-th row: gather, attend, merge in the group
            partial = b * g * (d + 2) * ACT_BYTES
            local = [("compute", "qk", b * rows * g * d), ("compute", "exp", b * rows * g),
                     ("compute", "av", b * rows * g * d)]
            row, flows = along_rows(local, "group_merge", partial, "group",
                                    Gather([], "qkv_gather", b * (g + 2) * d * ACT_BYTES), "group_idle")
            col, col_flows = column([])
            return in_sequence(row, col, []), flows + col_flows
        # by features: each row's partial scores (and sums of squares for q/k norm) summed
        # within the group first, then the softmax of its rows and the usual merge
        softmax = [("compute", "exp", b * rows * g), ("compute", "av", b * rows * feats)]
        col, flows = column(softmax)
        row, row_flows = along_rows([], "score_add", b * (g * rows + g + 1) * ACT_BYTES, "scores", None,
                                    "idle")
        return in_sequence(row, col, [("compute", "qk", b * rows * feats)]), flows + row_flows

    def model_features(self) -> dict:
        """What of the model (the program's hparams) sizes the footprint beyond the op's
        properties: RoPE's rotated features, q/k norm, sinks, the output gate."""
        d, program = int_value(self.head_dim), self.parent_op()
        gated = self.gated is not None and bool(int_value(self.gated))
        if getattr(program, "hparams", None) is None:  # an op on its own: a plain model's
            return dict(rot=d, gated=gated)
        hp = HParams.of(program)
        return dict(rot=rotary_dim(Rope(partial=hp.float("rope_partial")), d),
                    qk_norm=bool(hp.int("qk_norm")), sinks=bool(hp.int("attn_sinks")), gated=gated)

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return pe.bodies_for(info, micro_batch, hp, tile)

    @classmethod
    def reads_in_place(cls, info, op):
        return op == "qk"  # q | k | v where the qkv reduction left them; it writes its own arrays

    @classmethod
    def writes_own(cls, info, hp, op):
        return op != "normalize" and pe.in_pe(info, hp)  # scores, the cache, the partial softmax

    @classmethod
    def message_buffer(cls, info, hp, role, send):
        # the partial (out, max, sum) down each column, where the bodies compute it
        if role is FlowRole.DOWN and pe.in_pe(info, hp):
            return "acc" if send else "acc_in"
        return None

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][2])

    def input_layout(self) -> str:
        # in place: the column's blocked slice where the qkv reduction left it; otherwise
        # read in place only from a producer holding it whole, else a flow brings input_share
        return "cols" if self.qkv_in_place is not None else "full"

    def output_layout(self) -> str:
        return "cols"

    def is_collective(self) -> bool:
        return True

    @classmethod
    def lower(cls, op, operands, make):
        # the spill tiles are the region's rectangles after its own (`grid`, `held`)
        props = cls.lower_props(op)
        region = op.region if op.spill is None else CoreSetAttr([*op.region.rects.data, *op.spill.rects.data])
        k = make(cls, op, operands, op.results[0].type, region=region, **props)
        return [k], k.results[0]

    @classmethod
    def lower_props(cls, op):
        model = op.parent_op()
        assert isinstance(model, graph.ModelOp)
        props = dict(heads=op.heads, kv_heads=op.kv_heads, head_dim=op.head_dim, max_seq=op.max_seq,
                     slots=HParams.of(model).kv_slots(model))
        if op.is_gated:
            props["gated"] = op.gated
        if op.spill_from is not None:
            props["spill_from"] = op.spill_from
        producer = op.input.owner
        if isinstance(producer, graph.MatmulOp) and reads_qkv_in_place(op, producer.region):
            props["qkv_in_place"] = UnitAttr()
        return props

