"""The default mapper: a ModelSpec on a Target becomes `graph` dialect IR.

Layout. Every *unit* (the embedding, each decoder layer, the LM head) is a
block of full-height *bands* in dataflow order. A dense layer is one band,
one region every kernel of the layer runs on (its four GEMVs 2D-tiled in
alternating orientations, attention's KV spread over every row, the norms,
residual adds and the SwiGLU product beside them); an MoE layer is
[layer | gate | relay | expert grid]: its attention half (norm, qkv,
attention, o, residual add) on one region as a dense layer's, then the
gate's column, the corridor and the expert regions. Blocks are packed in
layer order into rows of height H, boustrophedon, row after row, wafer
after wafer, so each wafer holds a
contiguous range of layers; on more wafers than the fewest (`wafers` given)
the units are cut into contiguous runs of balanced width, one per wafer.

Sizing. A band of height H gets the least width whose per-core bytes fit the
target's usable SRAM: a matmul tiles its weight (in x out) as
ceil(in/H) x ceil(out/W) per core plus its activation buffers; attention
tiles its KV cache (kv_slots x max_seq tokens) over sequence rows and
head-dim columns; experts get one disjoint region per expert (or per group
of experts when one expert would fill fewer than MIN_EXPERT_CORES cores),
as high as the block, in one row (their rows are then the corridor's and the
gate's: tokens and expert outputs move along the rows); where that row is
wider than the wafer, each region takes more experts (fewer, wider regions,
the same cores per expert), and only where no grouping fits are shorter
regions stacked, as narrow as they go.
The embedding also holds a buffer for the largest message it sends (the
share of the hidden vector a reader in the first layer takes). Where the
wafers have room, dense layers, the LM head and the MoE layers' expert
regions are widened past their least width (SCALES, as
far as the target's width allows; `mapping { width_scale = ... }` pins one):
more cores, less work per core.

Choice. Among the packings that fit (each block height H, each width
scale) the mapper takes the one with the least modelled decode step: the
cost model run on a probe of the candidate (`meshrt.frontend.step_time`),
so compute, collectives and the volume moved between regions are priced by
the one cost model, not by a formula of the mapper's own. Packings whose
attentions keep whole KV heads per column come first: an attention wider
than its KV heads splits head_dim (`meshrt.kernels.attention.layout`) and
sums its scores along the rows first, one more pair of flows and input
queues than tight targets hold.

Stages. With micro-batch pipelining every attention keeps KV for
micro_batch x stages request slots (one micro-batch in flight per stage), so
more stages need more SRAM, and each attention core a context length per
slot of control state (`AttentionOp.control`), which bounds the stages. The
mapper takes the fewest wafers that fit (or exactly the wafers asked for),
then as many stages as still fit (the most micro-batches in flight) unless
fewer give more modelled throughput (`pipelined_stages`: stages / modelled
step, trying halvings of the most), and cuts the units into stages
(contiguous, never spanning wafers) balancing their modelled cycles
(`step_time.unit_cycles`).

Conventions of the emitted IR (for the passes downstream):
- `hparams.kv_slots` is the number of request slots every attention holds
  KV for; `hparams.experts_per_region` the size of an expert group.
- `moe_experts.expert_regions` lists experts/experts_per_region routed
  regions (expert e on region placement[e], contiguous by default) followed
  by one region per shared expert; its `region` is the relay column the
  tokens enter and leave by, where the residual add also runs.
- A handoff's region is the sending kernel's edge column facing the next
  stage; `wafers` is the number of wafers used (at most the budget).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from xdsl.dialects.builtin import IntegerAttr, ModuleOp, i64
from xdsl.ir import Block, Region, SSAValue

from meshrt.dialects import graph as g
from meshrt.dialects.mesh import CoreSetAttr, RectAttr
from meshrt.frontend.errors import FrontendError, Loc
from meshrt.frontend.model import SCALES, MappingSpec, ModelShape, ModelSpec
from meshrt.kernels.attention.layout import lays_out, q_share, split_by_rows, splits_heads
from meshrt.kernels.attention.op import AttentionOp, qkv_blocks
from meshrt.kernels.deltanet.op import DeltaNetOp
from meshrt.kernels.dispatch.corridor import relay_footprint
from meshrt.kernels.embed.op import EmbedOp
from meshrt.kernels.expert_ffn.op import ExpertFFNOp
from meshrt.kernels.expert_ffn.pe import computes_in_pe
from meshrt.kernels.expert_reduce.op import expert_passes
from meshrt.kernels.gemv.op import GemvOp
from meshrt.kernels.gemv.tiles import tile_shape
from meshrt.kernels.topk_gate.op import TopKGateOp
from meshrt.rope import rotary_dim
from meshrt.kernels.interface import ACT_BYTES, ceil_div, cf_row_bytes, held_share
from meshrt.limits import format_bytes as _fmt_bytes
from meshrt.shape import MAX_CHUNK, MAX_DIM, kv_slots
from meshrt.targets import Target

MIN_EXPERT_CORES = 4  # below this an expert region has no room for distinct roles
MAX_ROW_CHOICES = 64  # candidate block heights tried per wafer
MAX_WAFERS = 2048  # the largest wafer budget mapped without a `wafers` given (a CS-3 cluster)
# Share of usable SRAM the mapper leaves free: the kernel lowering adds
# per-role message buffers and reduction scratch this byte model only
# approximates, so regions are sized to fill at most 95 %.
SRAM_HEADROOM = 0.05
# Kernels on a unit's critical path; every band is filled to the same SRAM
# level, so each takes about the same time and this is the unit's load.
UNIT_LOAD = {"embed": 1, "dense": 5, "moe": 6, "lm_head": 2}


# ---------------------------------------------------------------------------
# Per-core byte models: each band's kernel kind gives its own (meshrt.kernels)
# ---------------------------------------------------------------------------


def delta_shape(shape: ModelShape, w: int, micro_batch: int, chunk: int = 1) -> tuple[int, int]:
    """(columns, token groups) a Gated DeltaNet takes of a token-mixer band w wide: at most
    one column per value head in each group (its columns hold whole value heads), and as
    many groups side by side as fit and divide the micro-batch (each runs its share of
    the tokens and keeps their slots' state); the rest of the band idles in that layer.
    A chunked program has one group: its rows are lent to any slot, so a row's place in
    the micro-batch does not say whose state it updates."""
    vh = shape.linear_v_heads
    if w <= vh or chunk > 1:
        return min(w, vh), 1
    groups = max(g for g in range(1, micro_batch + 1) if micro_batch % g == 0 and g * vh <= w)
    return groups * vh, groups


@dataclass(frozen=True)
class Sizer:
    """Per-core bytes of each band kind as a function of its width w and height h."""

    shape: ModelShape
    micro_batch: int  # token rows: the micro-batch's slots x the prefill chunk
    kv_slots: int
    usable: int  # per-core SRAM for data
    chunk: int = 1
    spill: int = 0  # KV positions a slot keeps on an MoE layer's attention region (0: all)

    def matmul(self, n_in: int, n_out: int, dbytes: float, w: int, h: int, bias: bool = False) -> float:
        return GemvOp.footprint(n_in, n_out, dbytes, self.micro_batch, w, h, bias=bias).total

    @property
    def mixer_in(self) -> int:
        """The widest token-mixer input projection (attention's qkv, DeltaNet's in_proj):
        every layer's band is sized for it, so the layers stay alike."""
        s = self.shape
        return max(s.qkv_width, s.linear_in_width if s.linear_layers else 0)

    @property
    def mixer_out(self) -> int:
        """The widest token-mixer output projection's input (attention's heads, DeltaNet's
        value heads)."""
        s = self.shape
        return max(s.attn_width, s.linear_value_width if s.linear_layers else 0)

    def attention(self, w: int, h: int, entries: int, split_rows: bool | None = None) -> float:
        """Bytes per core of a w x h attention tile holding `entries` ring entries of each
        slot (`split_rows`: a head split's layout, forced)."""
        s = self.shape
        return AttentionOp.footprint(self.kv_slots, entries, s.heads, s.kv_heads, s.head_dim,
                                     s.kv_bytes, self.micro_batch, w, h, rot=rotary_dim(s.rope, s.head_dim),
                                     chunk=self.chunk, qk_norm=s.qk_norm, sinks=s.attn_sinks,
                                     gated=s.attn_gate, split_rows=split_rows).total

    @property
    def kv_held(self) -> int:
        """KV positions of a slot an attention region holds: all of them, or where they
        spill (`--kv-spill`), the first `spill`."""
        return min(self.shape.max_seq, self.spill) if self.spill else self.shape.max_seq

    def mixer(self, w: int, h: int) -> float:
        """Bytes per core of the token mixer band: attention (KV), or the larger of
        attention and Gated DeltaNet (recurrent and conv state) where the model has both."""
        s = self.shape
        attn = self.attention(w, h, self.kv_held)
        if not s.linear_layers:
            return attn
        cols, groups = delta_shape(s, w, self.micro_batch, self.chunk)
        return max(attn, DeltaNetOp.footprint(
            self.kv_slots, s.linear_k_heads, s.linear_v_heads, s.linear_k_dim, s.linear_v_dim,
            s.linear_conv, s.kv_bytes, s.dtype_bytes, self.micro_batch, cols, h, groups).total)

    def band(self, kind: str, w: int, h: int) -> float:
        """Bytes per core of the kernel a band holds, by the kernel kind's own formula."""
        s, d, mb = self.shape, self.shape.dtype_bytes, self.micro_batch
        q = s.linear_bytes  # the layers' projections (quantized or not)
        if kind == "qkv":
            return self.matmul(s.hidden, self.mixer_in, q, w, h, s.qkv_bias)
        if kind == "o":
            return self.matmul(self.mixer_out, s.hidden, q, w, h, s.o_bias)
        if kind == "up":
            return self.matmul(s.hidden, 2 * s.ffn, q, w, h, s.mlp_bias)
        if kind == "down":
            return self.matmul(s.ffn, s.hidden, q, w, h, s.mlp_bias)
        if kind == "gate":
            cols = TopKGateOp.logit_columns(s.experts, s.shared_experts, s.shared_expert_gate)
            return self.matmul(s.hidden, cols, d, w, h)
        if kind == "lm_head":
            return self.matmul(s.hidden, s.vocab, d, w, h)
        if kind == "embed":
            return EmbedOp.footprint(s.vocab, s.hidden, d, mb, w, h).total
        if kind == "attn":
            return self.mixer(w, h)
        if kind == "relay":
            return relay_footprint(s.top_k, s.hidden, mb, w, h).total
        raise ValueError(kind)

    def layer_gemvs(self, w: int, h: int, ffn: bool = True) -> float:
        """Bytes per core of a layer's GEMVs sharing one w x h region, in alternating
        orientations (qkv and up reduce down columns, o and down along rows): a dense
        layer's four, or (`ffn` off) an MoE layer's qkv and o."""
        s, d = self.shape, self.shape.linear_bytes
        qkv_cols, o_rows = ceil_div(self.mixer_in, w), ceil_div(self.mixer_out, w)
        if len(s.linear_layers) < s.layers:
            # full attention reads its q | k | v in place: blocked, or in its units where it
            # splits head_dim (`layout`), and o takes its rows in those units
            split = splits_heads(s.kv_heads, w)
            heads = (s.heads, s.kv_heads, s.head_dim, w) if split else None
            blocks = qkv_blocks(s.heads, s.kv_heads, s.head_dim, s.attn_gate)
            qkv_cols = max(qkv_cols, tile_shape(s.hidden, s.qkv_width, w, h, "col", blocks, heads, None)[1])
            if split:
                o_rows = max(o_rows, q_share(s.heads, s.kv_heads, s.head_dim, w))
        mb = self.micro_batch
        mixer = (GemvOp.footprint(s.hidden, self.mixer_in, d, mb, w, h, "col",
                                  (ceil_div(s.hidden, h), qkv_cols), s.qkv_bias).total
                 + GemvOp.footprint(self.mixer_out, s.hidden, d, mb, w, h, "row",
                                    (o_rows, ceil_div(s.hidden, h)), s.o_bias).total)
        if not ffn:
            return mixer
        return (mixer + self.matmul(s.hidden, 2 * s.ffn, d, w, h, s.mlp_bias)
                + GemvOp.footprint(s.ffn, s.hidden, d, self.micro_batch, w, h, "row",
                                   bias=s.mlp_bias).total)

    def control(self) -> int:
        """Control state per core of the kernels that keep request state (the embedding and
        attention), by their own formulas: what the target's `control_bytes` must hold."""
        mb, slots = self.micro_batch // self.chunk, self.kv_slots
        return max(EmbedOp.control(mb, slots), AttentionOp.control(mb, slots))

    def max_width(self, kind: str) -> int:
        s = self.shape
        return {
            "qkv": self.mixer_in, "o": s.hidden, "up": 2 * s.ffn, "down": s.hidden,
            "gate": s.experts, "lm_head": s.vocab, "embed": s.vocab,
            "attn": s.kv_heads * s.head_dim, "relay": 4,
        }[kind]

    def expert(self, group: int, w: int, h: int, weight_bytes: float | None = None) -> float:
        """Bytes per core of a w x h region of `group` experts, their weights held at
        `weight_bytes` (default: as stored)."""
        s = self.shape
        # Output partials for the static build's (token, expert) pairs, every expert of the
        # region on every token (routing leaves at most micro_batch x min(group, top_k)), so
        # a build and its `--dynamism none` counterpart get one mapping.
        mb = self.micro_batch
        pairs = mb * expert_passes(group, s.top_k, routed=False)
        wb = s.expert_dtype_bytes if weight_bytes is None else weight_bytes
        return ExpertFFNOp.footprint(group, s.hidden, s.expert_ffn, wb, mb, pairs, w, h, s.expert_bias,
                                     s.dtype_bytes, computes_in_pe(s.expert_quant, s.dtype_bytes, wb)).total

    def decoded_experts_fit(self, group: int, w: int, h: int) -> bool:
        """Whether quantized experts' tiles fit w x h regions decoded, as the model's
        floats: then they are decoded once, at load, not for every token."""
        return bool(self.shape.expert_quant) and \
            self.expert(group, w, h, self.shape.dtype_bytes) <= self.usable

    def expert_cores(self, group: int) -> int:
        """Cores one expert group needs by SRAM alone (square-ish tiling ignored)."""
        s = self.shape
        weights = ExpertFFNOp.footprint(group, s.hidden, s.expert_ffn, s.expert_dtype_bytes, 0, 0, 1, 1).state
        return max(1, ceil_div(weights, self.usable))


def _whole_kv_heads(w: int, kv_heads: int) -> int:
    """The least width from `w` whose columns hold whole KV heads (the attention needs no
    dot products across columns), else `w` (wider than kv_heads: head_dim split)."""
    return next((d for d in range(w, kv_heads + 1) if kv_heads % d == 0), w)


def _widened(w: int, scale: float, most: int) -> int:
    """`w` widened `scale` times, as far as `most` columns allow, never narrower than `w`."""
    return max(w, min(most, round(w * scale)))


def _least(ok: Callable[[int], bool], most: int) -> int | None:
    """Least n in 1..most with ok(n) (once true, true for every larger n), else None."""
    if most < 1 or not ok(most):
        return None
    lo, hi = 1, most
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _min_width(fn: Callable[[int], float], max_w: int, usable: int) -> int | None:
    """Least w in 1..max_w with fn(w) <= usable (fn is non-increasing), else None."""
    return _least(lambda w: fn(w) <= usable, max_w)


# ---------------------------------------------------------------------------
# Units and their widths at a given block height
# ---------------------------------------------------------------------------

WIDENS = ("dense", "moe", "lm_head")
"""Units the mapper widens past their least width when the wafers have room (the embedding,
whose every core sends, keeps its least width)."""
DENSE_BANDS = ("layer",)  # every kernel of the layer on one region
MOE_BANDS = ("layer", "gate", "relay")
"""An MoE layer: its attention half (qkv, attention, o, the residual add) on one region as a
dense layer's kernels are, then the gate's column and the corridor's, then the expert
regions. Only the expert regions widen with the wafers' room (the region keeps its least
width, which its KV sets); the gate and the corridor stay one column (the tokens move along
their rows)."""


@dataclass(frozen=True)
class Unit:
    kind: str  # embed | dense | moe | lm_head
    layer: int  # -1 outside layers

    @property
    def bands(self) -> tuple[str, ...]:
        return {"embed": ("embed",), "lm_head": ("lm_head",), "dense": DENSE_BANDS,
                "moe": MOE_BANDS}[self.kind]

    @property
    def label(self) -> str:
        return self.kind if self.layer < 0 else f"layer {self.layer}"


@dataclass(frozen=True)
class ExpertGrid:
    """An MoE layer's expert regions, `rows` high, filled column by column from the
    corridor's side: the routed experts' regions (w x h, `group` experts each), then the
    shared experts' (`shared_w` x h, one each: a shape of their own, sized for one expert;
    one expert_ffn kernel runs both shapes)."""

    regions: int  # routed-expert regions
    rows: int
    w: int
    h: int
    group: int = 1  # routed experts per region
    shared: int = 0  # shared-expert regions
    shared_w: int = 0

    def columns(self) -> list[list[int]]:
        """The widths of the regions in each column, routed then shared."""
        widths = [self.w] * self.regions + [self.shared_w] * self.shared
        return [widths[i:i + self.rows] for i in range(0, len(widths), self.rows)]

    @property
    def width(self) -> int:
        return sum(max(col) for col in self.columns())

    def rects(self) -> list[tuple[int, int, int, int]]:
        """(dx, dy, w, h) of each region, routed then shared: dx counted from the corridor's
        side of the grid (a region narrower than its column keeps to that side)."""
        out, dx = [], 0
        for col in self.columns():
            out += [(dx, row * self.h, w, self.h) for row, w in enumerate(col)]
            dx += max(col)
        return out


@dataclass(frozen=True)
class UnitShape:
    widths: tuple[int, ...]  # per band
    grid: ExpertGrid | None
    splits_heads: bool = False  # attention columns split head_dim (a row reduction of scores)

    @property
    def width(self) -> int:
        return sum(self.widths) + (self.grid.width if self.grid else 0)


class Planner:
    """Unit widths for one (model, target, micro-batch, kv_slots, group); units wider than
    `max_width` (the target's) do not fit. `merges`: whether an MoE grid may hold more
    experts per region than `group` (not when the spec pins `experts_per_region`)."""

    def __init__(self, sizer: Sizer, group: int, max_width: int | None = None,
                 merges: bool = True):
        self.sizer, self.group, self.max_width, self.merges = sizer, group, max_width, merges
        self.band_width = functools.lru_cache(maxsize=None)(self._band_width)
        self.stack = functools.lru_cache(maxsize=None)(self._stack)
        self.expert_width = functools.lru_cache(maxsize=None)(self._expert_width)
        self.unit_shape = functools.lru_cache(maxsize=None)(self._unit_shape)

    def regions(self, group: int) -> int:
        """Routed-expert regions of an MoE layer whose regions hold `group` experts each."""
        s = self.sizer.shape
        return s.experts // group if s.is_moe else 0

    def shared_width(self, h: int) -> int | None:
        """Least width of a shared expert's region `h` rows high: one expert, every token
        a step, its weights as floats where the model's experts are quantized (the routed
        regions may hold theirs decoded, `Sizer.decoded_experts_fit`, and the kernel holds
        every region's tiles the same way)."""
        s = self.sizer.shape
        return self.expert_width(h, 1, s.dtype_bytes if s.expert_quant else None)

    def _band_width(self, kind: str, h: int, msg: int = 0) -> int | None:
        """Least width of a `kind` band `h` rows high whose bytes per core, plus a buffer of
        `msg` bytes for the largest message its cores send, fit."""
        sz = self.sizer
        w = _min_width(lambda w: sz.band(kind, w, h) + msg, sz.max_width(kind), sz.usable)
        if kind == "attn" and w is not None:
            w = _whole_kv_heads(w, sz.shape.kv_heads)
        return w

    def _expert_width(self, h: int, group: int, weight_bytes: float | None = None) -> int | None:
        """Least width of an `h`-row region of `group` experts (`Sizer.expert`)."""
        sz, s = self.sizer, self.sizer.shape
        return _min_width(lambda w: sz.expert(group, w, h, weight_bytes),
                          max(s.hidden, 2 * s.expert_ffn), sz.usable)

    def groups(self, merge: bool = True) -> list[int]:
        """Experts per routed region the grid may take, fewest first: the planner's group,
        then (`merge` and `merges`) its multiples that divide the experts."""
        s, g = self.sizer.shape, self.group
        if not (merge and self.merges):
            return [g]
        return [g * m for m in range(1, s.experts // g + 1) if s.experts % (g * m) == 0]

    def grid(self, height: int, beside: int = 0, room: int | None = None,
             scale: float = 1.0, merge: bool = True) -> ExpertGrid | None:
        """The expert regions of an MoE unit `height` rows high beside `beside` columns of
        bands: one row of full-height regions, `scale` times their least width, where that
        fits `room` columns (the target's width unless given). Each region's rows then line
        up with the relay corridor's, so dispatch and combine move tokens and expert outputs
        along the rows (one message per routed region and row, no gather). Where the row
        does not fit with the planner's group, regions of more experts each (a multiple of
        the group: as many cores per expert, fewer and wider regions) are tried, fewest
        first (unless `merge` is off); only where none fits are shorter regions stacked, as
        narrow as they go (squarest on ties), whose outputs the corridor gathers. Which
        of the two is faster depends on the mesh (merged regions are narrow: their columns
        reduce long vectors over many rows), so the mapper probes both (`candidates`)."""
        room = room if room is not None else self.max_width
        s = self.sizer.shape
        shared = s.shared_experts

        def shared_w(h: int) -> int | None:
            return self.shared_width(h) if shared else 0

        for group in self.groups(merge):
            least = w = self.expert_width(height, group)
            sw = shared_w(height)
            if w is None or sw is None:
                continue
            regions = self.regions(group)
            if scale > 1.0:  # wider, as far as the row of regions still fits
                w = _widened(w, scale, max(s.hidden, 2 * s.expert_ffn))
                if room is not None:
                    w = max(least, min(w, (room - beside - shared * sw) // regions))
            full = ExpertGrid(regions, 1, w, height, group, shared, sw)
            if room is None or beside + full.width <= room:
                return full
        best: ExpertGrid | None = None
        regions = self.regions(self.group)
        for rows in range(1, min(regions + shared, height) + 1):
            h = height // rows
            w, sw = self.expert_width(h, self.group), shared_w(h)
            if w is None or sw is None:
                continue
            cand = ExpertGrid(regions, rows, w, h, self.group, shared, sw)
            if best is None or (cand.width, abs(w - h)) < (best.width, abs(best.w - best.h)):
                best = cand
        return best

    def _stack(self, height: int, scale: float = 1.0, ffn: bool = True) -> int | None:
        """Width of a dense layer `height` rows high (`ffn` off: an MoE layer's attention
        half), or None.

        The layer is one region and every kernel runs on all of it: each core
        holds its tiles of the four GEMVs (alternating orientations, so each
        reads its input where the previous one left it) and its share of
        attention's KV cache (none on rows past max_seq). KV spread over every
        row leaves each core a few positions of every slot, so the scores,
        softmax and weighted sum take few cycles per core and the partials
        merge along the column; the least width where both fit
        (square-ish at the heights the mapper tries), times `scale` when the
        mapping has room to spare (more cores per layer: less work per core).
        """
        sz, s = self.sizer, self.sizer.shape
        max_w = min(s.qkv_width, s.attn_width, s.kv_heads * s.head_dim)
        if ffn:
            max_w = min(max_w, s.ffn)

        def fits(w: int) -> bool:
            return sz.layer_gemvs(w, height, ffn) + sz.band("attn", w, height) <= sz.usable

        lo = _least(fits, max_w)
        if lo is None:
            return None
        w = _whole_kv_heads(lo, s.kv_heads)
        if scale > 1.0:  # as far as the target's width allows
            w = _widened(w, scale, min(max_w, self.max_width or max_w))
        return w if fits(w) else None

    def _unit_shape(self, kind: str, height: int, with_experts: bool = True, scale: float = 1.0,
                    msg: int = 0, room: int | None = None, merge: bool = True) -> UnitShape | None:
        """The shape of a `kind` unit `height` rows high: `scale` widens the units that widen
        (WIDENS) past their least width; `msg` is the largest message an embedding core sends;
        `room` the columns it may take (an explicit region's; default the target's)."""
        if kind == "dense":
            w = self.stack(height, scale)
            return None if w is None else UnitShape((w,), None, self.sizer.shape.kv_heads % w != 0)
        widths = []
        bands = Unit(kind, 0).bands
        for band in bands:
            if band == "layer":  # an MoE layer's attention half, on one region, its least
                w = self.stack(height, 1.0, False)  # width: the expert regions take the room
            else:
                w = self.band_width(band, height, msg if kind == "embed" else 0)
            if w is None:
                return None
            if kind in WIDENS and scale > 1.0 and kind != "moe":
                most = min(self.sizer.max_width(band), room or self.max_width or w)
                w = _widened(w, scale, most)
            widths.append(w)
        grid = None
        if kind == "moe" and with_experts:
            grid = self.grid(height, sum(widths), room, scale, merge)
            if grid is None:
                return None
        # attention splits head_dim where its columns do not hold whole KV heads
        splits = "layer" in bands and self.sizer.shape.kv_heads % widths[bands.index("layer")] != 0
        return UnitShape(tuple(widths), grid, splits_heads=splits)


# ---------------------------------------------------------------------------
# Packing units into wafers
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Placed:
    unit: Unit
    shape: UnitShape
    wafer: int
    x: int
    y: int
    h: int
    reverse: bool  # dataflow runs right to left (odd rows)
    widths: tuple[int, ...] = ()  # band widths after spare columns are handed out


@dataclass
class Layout:
    placed: list[Placed]
    wafers: int
    height: int
    kv_slots: int
    stages: list[int] = field(default_factory=list)  # stage of each placed unit
    scale: float = 1.0  # how much wider than their least width the widening units are
    step_cycles: float | None = None  # the modelled decode step it was chosen by, if timed

    @property
    def area(self) -> int:
        return sum(p.shape.width * p.h for p in self.placed)


def _pack(units: Sequence[Unit], shapes: Sequence[UnitShape], height: int, target: Target,
          wafer_of: Sequence[int] | None = None) -> Layout | None:
    """Units in order into rows `height` high, boustrophedon, row after row: onto the next
    wafer when one is full (the fewest wafers), or onto the wafers `wafer_of` gives each
    unit (non-decreasing); None if a unit, or a wafer's units, do not fit."""
    rows_per_wafer = target.height // height
    placed: list[Placed] = []
    wafer = row = x = 0
    for i, (unit, shape) in enumerate(zip(units, shapes)):
        w = shape.width
        if w > target.width:
            return None
        if wafer_of is not None and wafer_of[i] != wafer:
            wafer, row, x = wafer_of[i], 0, 0
        if x + w > target.width:
            row, x = row + 1, 0
            if row == rows_per_wafer:
                if wafer_of is not None:
                    return None
                wafer, row = wafer + 1, 0
        reverse = row % 2 == 1
        px = target.width - x - w if reverse else x
        placed.append(Placed(unit, shape, wafer, px, row * height, height, reverse))
        x += w
    return Layout(placed, wafer + 1, height, 0)


def _pack_onto(units: Sequence[Unit], shapes: Sequence[UnitShape], height: int, target: Target,
               wafers: int) -> Layout | None:
    """The units on exactly `wafers` wafers: the fewest-wafer packing if it uses that many,
    else contiguous runs of units of balanced total width, one run per wafer; None if that
    does not fit."""
    lay = _pack(units, shapes, height, target)
    if lay is None or lay.wafers > wafers:
        return None
    if lay.wafers == wafers:
        return lay
    if wafers > len(units):
        return None
    sizes = _partition([sh.width for sh in shapes], wafers)
    wafer_of = [k for k, n in enumerate(sizes) for _ in range(n)]
    return _pack(units, shapes, height, target, wafer_of)


def _splits(lay: Layout) -> int:
    """Attentions that split head_dim over columns (each sums its scores along the rows)."""
    return sum(p.shape.splits_heads for p in lay.placed)


def _heights(target: Target, shape: ModelShape, fixed: int | None = None) -> list[int]:
    """Block heights to try: `fixed` if the mapping gives one, else up to MAX_ROW_CHOICES
    heights target.height // k, at most the hidden size."""
    if fixed is not None:
        return [fixed] if fixed <= target.height else []
    cap = min(target.height, shape.hidden)
    first_k = ceil_div(target.height, cap)
    hs: list[int] = []
    for k in range(first_k, target.height + 1):
        h = target.height // k
        if h not in hs:
            hs.append(h)
        if len(hs) == MAX_ROW_CHOICES:
            break
    return hs


# ---------------------------------------------------------------------------
# The mapper
# ---------------------------------------------------------------------------


class _Mapper:
    def __init__(self, spec: ModelSpec, target: Target, micro_batch: int, wafers: int | None,
                 chunk: int = 1, spill: int = 0):
        self.spec, self.target, self.shape = spec, target, spec.shape
        self.mb, self.wafers = micro_batch, wafers
        self.spill = spill  # KV positions kept on MoE layers' attention regions (0: all)
        # a prefilling slot feeds `chunk` prompt tokens a step: every kernel's values are
        # `rows` vectors, while the request slots (KV, descriptors) follow the micro-batch
        self.chunk, self.rows = chunk, micro_batch * chunk
        # Blame the spec's `wafers = N` when the budget came from there.
        from_spec = wafers is not None and wafers == spec.wafers
        self.budget_loc = spec.locs.get("wafers") if from_spec else None
        self.budget_loc = self.budget_loc or Loc(spec.source)
        s = self.shape
        self._check_capacity()
        self.units = [Unit("embed", -1)] + [
            Unit("moe" if s.is_moe_layer(i) else "dense", i) for i in range(s.layers)
        ] + [Unit("lm_head", -1)]
        self.group = self._expert_group()
        self._fewest: dict[int, int | None] = {}

    def where(self) -> Loc:
        return Loc(self.spec.source)

    def _check_capacity(self) -> None:
        """Without a wafer budget, fail fast, before anything is built per
        layer, when the weights and one request slot of KV per layer exceed the
        SRAM of MAX_WAFERS wafers (a budget given is checked in detail later)."""
        if self.wafers is not None:
            return
        s, t = self.shape, self.target
        need = s.weight_bytes() + s.layers * s.max_seq * s.kv_bytes_per_token()
        wafer = t.cores * t.usable_sram_bytes
        unit = max(s.vocab * s.hidden * s.dtype_bytes, need / s.layers)  # embed, a mean layer
        if need > MAX_WAFERS * wafer and unit <= wafer:  # else no_fit_unit names the unit
            have = MAX_WAFERS * wafer
            raise FrontendError(
                f"model does not fit: its weights and one request's KV need at least "
                f"{_fmt_bytes(need)} of SRAM, more than the {_fmt_bytes(have)} of {MAX_WAFERS} "
                f"{t.name} wafers (the most the mapper tries without a wafer budget)", self.where())

    def _expert_group(self) -> int:
        s, m = self.shape, self.spec.mapping
        if not s.is_moe:
            return 1
        if m.experts_per_region:
            return m.experts_per_region
        sizer = self.sizer(self.mb)
        for group in range(1, s.experts + 1):
            if s.experts % group == 0 and sizer.expert_cores(group) >= MIN_EXPERT_CORES:
                return group
        return s.experts

    def kv_slots(self, stages: int) -> int:
        return kv_slots(self.mb, stages, self.spec.dynamism)

    @property
    def usable(self) -> int:
        return int(self.target.usable_sram_bytes * (1 - SRAM_HEADROOM))

    def sizer(self, kv_slots: int) -> Sizer:
        """Bytes per core of this model's kernels at this micro-batch, `kv_slots` request slots."""
        return Sizer(self.shape, self.rows, kv_slots, self.usable, self.chunk, self.spill)

    def planner(self, stages: int) -> Planner:
        return Planner(self.sizer(self.kv_slots(stages)), self.group, self.target.width,
                       merges=self.merges)

    @property
    def merges(self) -> bool:
        """Whether MoE grids may take more experts per region than the group (not where the
        spec pins `experts_per_region`)."""
        return self.shape.is_moe and not self.spec.mapping.experts_per_region

    # -- what every layout must fit ------------------------------------------
    def max_stages(self) -> int:
        """Most stages whose request slots (micro-batch x micro-batches in flight) fit the
        control state of every core (`Sizer.control`: each attention core keeps every slot's
        context length); 0 if even one stage's do not."""
        cap = self.target.control_bytes
        return max((n for n in range(1, len(self.units) + 1)
                    if self.planner(n).sizer.control() <= cap), default=0)

    def control_error(self, stages: int, why: str, loc: Loc | None = None) -> FrontendError:
        t, slots = self.target, self.kv_slots(stages)
        need = self.planner(stages).sizer.control()
        return FrontendError(
            f"{why}: {stages} stage(s) at micro-batch {self.mb} keep {slots} request slots, whose "
            f"request state (the micro-batch's descriptors and every slot's length) needs {need} "
            f"bytes of control state per core, but {t.name} has {t.control_bytes}; use a smaller "
            "micro-batch", loc or self.where())

    def embed_message(self, h: int) -> int:
        """Bytes of the largest message an embedding core buffers (besides its table), its
        root column `h` rows high holding the hidden vector split over its rows: the slice a
        root core holds (`held_share`: what it multicasts where a first-layer reader gathers;
        no reader splits the vector finer than the root's rows, so that slice is also the
        most any one receives), plus the continuous-batching payload riding on it (counted
        whether or not the build carries one, so a build and its static counterpart get one
        mapping)."""
        share = held_share(self.shape.hidden, "rows", 1, h)
        return self.rows * (share * ACT_BYTES + cf_row_bytes(self.chunk))

    def shapes(self, stages: int, h: int, scale: float = 1.0,
               merge: bool = True) -> list[UnitShape] | None:
        """Every unit's shape at block height `h`, the widening units `scale` times their least
        width (the embedding sized for the messages its first layer's readers take), MoE
        grids with more experts per region before they stack unless `merge` is off
        (`Planner.grid`); None if one does not fit."""
        planner = self.planner(stages)
        rest = []
        for u in self.units[1:]:
            sh = planner.unit_shape(u.kind, h, True, scale if u.kind in WIDENS else 1.0,
                                    0, None, merge)
            if sh is None:
                return None
            rest.append(sh)
        msg = self.embed_message(h)
        embed = planner.unit_shape("embed", h, True, 1.0, msg)
        return None if embed is None else [embed, *rest]

    # -- default layout --------------------------------------------------
    def fewest_wafers(self, stages: int) -> int | None:
        """The fewest wafers the units pack into at any block height when every attention
        holds KV for `stages` stages, or None if no height fits."""
        if stages not in self._fewest:
            packed = (_pack(self.units, sh, h, self.target)
                      for h in _heights(self.target, self.shape, self.spec.mapping.block_height)
                      for merge in self.grid_arrangements()
                      if (sh := self.shapes(stages, h, 1.0, merge)) is not None)
            self._fewest[stages] = min((lay.wafers for lay in packed if lay is not None),
                                       default=None)
        return self._fewest[stages]

    def grid_arrangements(self) -> tuple[bool, ...]:
        """The `merge` settings of `shapes` worth trying: both (more experts per region, or
        stacked regions) for an MoE model whose group is not pinned, else one."""
        return (True, False) if self.merges else (True,)

    def candidates(self, stages: int, wafers: int) -> list[Layout]:
        """Every packing onto exactly `wafers` wafers: each block height, at each width scale
        (SCALES) whose units still fit, each MoE grid arrangement (`grid_arrangements`)
        that gives other shapes."""
        out = []
        fixed = self.spec.mapping.width_scale
        seen: set[tuple] = set()
        heights = _heights(self.target, self.shape, self.spec.mapping.block_height)
        for h, merge in ((h, m) for h in heights for m in self.grid_arrangements()):
            for scale in SCALES if fixed is None else (fixed,):
                shapes = self.shapes(stages, h, scale, merge)
                if shapes is not None:
                    if (h, tuple(shapes)) in seen:
                        continue  # no unit got wider (rounding), or the other arrangement's
                    seen.add((h, tuple(shapes)))
                lay = None if shapes is None else _pack_onto(self.units, shapes, h, self.target,
                                                             wafers)
                if lay is None:
                    break  # wider units fit no better
                lay.scale, lay.kv_slots = scale, self.kv_slots(stages)
                out.append(lay)
        return out

    def probe_times(self, key: tuple):
        """The cycles of a probe of this model (`step_time.unit_cycles` says what `key` holds
        and what comes back); cached per process."""
        return _probe_times(*key)

    def layout(self, stages: int, wafers: int) -> Layout:
        """The fastest packing (by the modelled step) onto exactly `wafers` wafers, preferring
        ones whose attentions keep whole KV heads per column (no row reduction of scores)."""
        from meshrt.frontend.step_time import fastest, layout_cycles

        cands = self.candidates(stages, wafers)
        if not cands:
            raise FrontendError(
                f"the units do not pack onto exactly {wafers} {self.target.name} wafers at any "
                f"block height (the fewest they fit is {self.fewest_wafers(stages)})",
                self.budget_loc)
        fewest = min(_splits(lay) for lay in cands)
        best = [lay for lay in cands if _splits(lay) == fewest]
        pick = fastest(self, best)
        if len(best) < len(cands):
            # whole KV heads only where such a packing builds (its probe runs); else the
            # fastest of all
            if layout_cycles(self, pick) is None:
                pick = fastest(self, cands)
        return pick

    def default_layout(self) -> Layout:
        n_units = len(self.units)
        fixed = self.spec.mapping.stages
        stages_loc = self.spec.mapping.locs.get("stages") or self.where()
        if fixed is not None and fixed > n_units:
            raise FrontendError(f"stages = {fixed} exceeds the {n_units} units (embed, "
                                f"{self.shape.layers} layers, lm_head) a stage can hold", stages_loc)
        rows = self.spec.mapping.block_height
        if rows is not None and rows > self.target.height:
            raise FrontendError(f"block_height = {rows} exceeds the {self.target.height} rows of "
                                f"target {self.target.name}",
                                self.spec.mapping.locs.get("block_height") or self.where())
        cap = self.max_stages()
        if fixed is not None and fixed > cap:
            raise self.control_error(fixed, f"stages = {fixed} do not fit", stages_loc)
        if cap == 0:
            raise self.control_error(1, "the request slots do not fit")
        most = min(n_units, cap)
        # Fewest wafers: stages >= wafers, and more stages mean more KV.
        stages = fixed or 1
        need = self.fewest_wafers(stages)
        while need is not None and fixed is None and need > stages and stages < most:
            stages = min(need, most)
            need = self.fewest_wafers(stages)
        if need is None:
            raise self.no_fit_unit(stages)
        if self.wafers is not None and need > self.wafers:  # the budget asked for is the cause
            raise self.no_fit_wafers(need, stages)
        if need > stages:
            if fixed is not None:
                raise FrontendError(f"stages = {fixed} is fewer than the {need} wafers the "
                                    "model needs (a stage cannot span wafers)", stages_loc)
            raise self.control_error(need, f"the model needs {need} wafers, so as many stages "
                                     "(a stage cannot span wafers)")
        wafers = self.wafers or need
        if wafers > n_units:
            raise FrontendError(f"cannot use {wafers} wafers: the model has {n_units} units "
                                f"(embed, {self.shape.layers} layers, lm_head) and a wafer holds "
                                "at least one", self.budget_loc)
        if wafers > stages:  # more wafers asked than the fewest: a stage on each
            if fixed is not None:
                raise FrontendError(f"stages = {fixed} is fewer than the {wafers} wafers asked "
                                    "for (a stage cannot span wafers)", stages_loc)
            if wafers > cap:
                raise self.control_error(wafers, f"{wafers} wafers need as many stages")
            stages = wafers
            if (self.fewest_wafers(stages) or wafers + 1) > wafers:
                raise self.no_fit_wafers(self.fewest_wafers(stages) or wafers, stages)
        if fixed is None and self.spec.pipelined:
            # As many stages as still fit the wafers (more micro-batches in flight).
            lo, hi = stages, most
            while lo < hi:
                mid = (lo + hi + 1) // 2
                n = self.fewest_wafers(mid)
                if n is not None and n <= wafers:
                    lo = mid
                else:
                    hi = mid - 1
            stages = self.pipelined_stages(stages, lo, wafers)
        lay = self.layout(stages, wafers)
        n = max(stages, lay.wafers)
        # the cut into stages balances the units' modelled cycles where there is a choice
        loads = self.unit_loads(lay) if lay.wafers < n < len(lay.placed) else None
        lay.placed = [_spread(p) for p in lay.placed]
        lay.stages = _assign_stages(lay, n, loads)
        return lay

    def pipelined_stages(self, least: int, most: int, wafers: int) -> int:
        """Of `most` stages (the most that fit), `least` and the halvings of `most` between,
        the count whose fastest packing has the most micro-batch steps per cycle (stages /
        modelled step): more stages keep more micro-batches in flight, but every attention
        then holds KV for more request slots, which widens it and can crowd the expert
        regions out of one row (their outputs then gathered, not passed along the rows: a
        step several times longer, so the rate is not monotone in the stages). A step never
        shortens with more stages (more KV), so a halving s is timed only where s over the
        step at `least` could beat the best rate so far. `most` where its packing has no
        modelled step."""
        from meshrt.frontend.step_time import layout_cycles

        def step(n: int) -> float | None:
            try:
                return layout_cycles(self, self.layout(n, wafers))
            except FrontendError:
                return None

        top = step(most)
        if top is None or least >= most:
            return most
        best, rate = most, most / top
        floor = step(least)
        if floor is None:
            return most
        if least / floor > rate:
            best, rate = least, least / floor
        n = most // 2
        while n > least and n / floor > rate:
            t = step(n)
            if t is not None and n / t > rate:
                best, rate = n, n / t
            n //= 2
        return best

    def unit_loads(self, lay: Layout) -> list[float]:
        """Each unit's modelled cycles (`step_time.unit_cycles`), or, where its probe does not
        run, the kernels on the unit's critical path (UNIT_LOAD)."""
        from meshrt.frontend.step_time import unit_cycles

        return unit_cycles(self, lay) or [float(UNIT_LOAD[p.unit.kind]) for p in lay.placed]

    # -- explicit layout -------------------------------------------------
    def explicit_layout(self) -> Layout:
        m, t = self.spec.mapping, self.target
        n_units = len(self.units)
        rects = [m.embed] + [m.layers[i] for i in range(self.shape.layers)] + [m.lm_head]
        for r in [*rects, *(e for es in m.experts.values() for e in es)]:
            if r.x + r.w > t.width or r.y + r.h > t.height:
                raise FrontendError(f"region {r} lies outside the {t.width} x {t.height} mesh of "
                                    f"target {t.name}", r.loc)
        wafers_used = 1 + max(r.wafer for r in rects)
        if self.wafers is not None and wafers_used > self.wafers:
            raise FrontendError(f"the mapping uses {wafers_used} wafers but only {self.wafers} "
                                "are available", rects[-1].loc)
        prev = rects[0]
        for r in rects[1:]:
            if r.wafer < prev.wafer:
                raise FrontendError(f"region {r} is on wafer {r.wafer} after wafer {prev.wafer}: "
                                    "each wafer must hold a contiguous range of layers", r.loc)
            prev = r
        for i, es in m.experts.items():
            for e in es:
                if e.wafer != m.layers[i].wafer:
                    raise FrontendError(f"expert region {e} of layer {i} is not on the layer's "
                                        f"wafer {m.layers[i].wafer}", e.loc)
        stages = m.stages or (n_units if self.spec.pipelined else wafers_used)
        if not wafers_used <= stages <= n_units:
            raise FrontendError(f"stages = {stages} must be between the {wafers_used} wafer(s) "
                                f"used and the {n_units} units", m.locs.get("stages") or self.where())
        if stages > self.max_stages():
            raise self.control_error(stages, "the mapping's stages do not fit",
                                     m.locs.get("stages"))
        planner = self.planner(stages)
        placed = []
        msg = self.embed_message(rects[0].h)
        for unit, r in zip(self.units, rects):
            explicit_experts = unit.layer in m.experts
            shape = planner.unit_shape(unit.kind, r.h, not explicit_experts, 1.0,
                                       msg if unit.kind == "embed" else 0, r.w)
            if shape is None or shape.width > r.w:
                fit = (f"a region at least {shape.width} cores wide at height {r.h}" if shape
                       else f"more than {r.h} rows")
                raise FrontendError(
                    f"region {r} is too small for {unit.label}: its "
                    f"{_fmt_bytes(_unit_bytes(planner.sizer, unit))} of weights+KV need {fit} "
                    f"with {planner.sizer.usable} bytes per core for data", r.loc)
            attends = "layer" in unit.bands and unit.layer not in self.shape.linear_layers
            p = _spread(Placed(unit, shape, r.wafer, r.x, r.y, r.h, False), r.w,
                        self.shape.kv_heads if attends else 1)
            if attends:
                w = p.widths[unit.bands.index("layer")]
                kv = self.shape.kv_heads
                if not lays_out(kv, w):
                    raise FrontendError(
                        f"region {r} gives {unit.label}'s attention {w} columns, which split its "
                        f"{kv} KV heads unevenly: make it a width dividing {kv} or wider than {kv}",
                        r.loc)
            placed.append(p)
            explicit = m.experts.get(unit.layer, ())
            routed = len(explicit) - self.shape.shared_experts
            for i, e in enumerate(explicit):
                group = self.shape.experts // routed if i < routed else 1  # shared: one expert
                if planner.sizer.expert(group, e.w, e.h) > planner.sizer.usable:
                    raise FrontendError(
                        f"expert region {e} is too small for {group} expert(s): needs "
                        f"{planner.sizer.expert(group, e.w, e.h):.0f} bytes per core, the mapper "
                        f"fills at most {planner.sizer.usable}", e.loc)
        lay = Layout(placed, wafers_used, 0, self.kv_slots(stages))
        lay.stages = _assign_stages(lay, stages)
        return lay

    # -- not fitting -----------------------------------------------------
    def no_fit_unit(self, stages: int) -> FrontendError:
        """The unit that fits no wafer: one that tiles onto a wafer at no block height (the
        largest such), else the largest unit; with the request slots its KV is sized for."""
        t = self.target
        planner = self.planner(stages)
        cap = t.cores * t.usable_sram_bytes
        heights = list(_heights(t, self.shape, self.spec.mapping.block_height))

        def tiles(u: Unit) -> bool:
            for h in heights:
                sh = planner.unit_shape(u.kind, h, True, 1.0,
                                        self.embed_message(h) if u.kind == "embed" else 0)
                if sh is not None and sh.width <= t.width:
                    return True
            return False

        untiled = [u for u in self.units if not tiles(u)]
        worst = max(untiled or self.units, key=lambda u: _unit_bytes(planner.sizer, u))
        need = _unit_bytes(planner.sizer, worst)
        short = need - cap
        if short > 0:
            how = f"short by {_fmt_bytes(short)}"
        elif untiled:
            how = "its kernels tile onto one wafer's mesh at no block height"
        else:
            how = "no block height tiles every unit onto one wafer at once"
        slots = planner.sizer.kv_slots
        return FrontendError(
            f"model does not fit: {worst.label} needs {_fmt_bytes(need)} of SRAM for weights+KV "
            f"({slots} request slot{'s' if slots != 1 else ''} of KV: micro-batch "
            f"{self.mb} x {stages} stage{'s' if stages != 1 else ''}) but one {t.name} wafer has "
            f"{_fmt_bytes(cap)} usable ({t.cores} cores x {t.usable_sram_bytes} B); {how}, and a "
            "unit (a layer, the embedding or the LM head) cannot be split across wafers",
            self.where())

    def no_fit_wafers(self, fewest: int, stages: int) -> FrontendError:
        t = self.target
        sizer = self.planner(stages).sizer
        need = sum(_unit_bytes(sizer, u) for u in self.units)
        have = self.wafers * t.cores * t.usable_sram_bytes
        return FrontendError(
            f"model does not fit on {self.wafers} {t.name} wafer(s): SRAM bytes for weights+KV "
            f"needed {_fmt_bytes(need)}, available {_fmt_bytes(have)}"
            + (f" (short by {_fmt_bytes(need - have)})" if need > have else
               " (enough in total, but layers cannot be split into the leftover space)")
            + f"; the model needs at least {fewest} wafers", self.budget_loc)


def _unit_bytes(sizer: Sizer, unit: Unit) -> float:
    """Weight + KV bytes of one unit (what must live in SRAM)."""
    s, d = sizer.shape, sizer.shape.dtype_bytes
    if unit.kind in ("embed", "lm_head"):
        return s.vocab * s.hidden * d
    q = s.linear_bytes
    attn = (s.hidden * s.qkv_width + s.attn_width * s.hidden) * q \
        + sizer.kv_slots * s.max_seq * s.kv_bytes_per_token()
    if s.is_linear_layer(unit.layer):  # Gated DeltaNet: its recurrent and conv state per slot
        attn = (s.hidden * s.linear_in_width + s.linear_value_width * s.hidden) * d \
            + sizer.kv_slots * sum(s.linear_state_elements()) * s.kv_bytes
    if unit.kind == "dense":
        return attn + 3 * s.hidden * s.ffn * q
    return attn + s.hidden * s.experts * d + \
        (s.experts + s.shared_experts) * 3 * s.hidden * s.expert_ffn * s.expert_dtype_bytes


def _spread(p: Placed, width: int | None = None, kv_heads: int = 1) -> Placed:
    """Fix the unit's band widths, handing spare columns of an explicit rect to its bands
    (the attention's band, "layer", keeps a width attention lays out: one dividing
    `kv_heads` or wider, `attention.layout`; the columns it cannot take go to the next band)."""
    base = list(p.shape.widths)
    spare = 0 if width is None else width - p.shape.width
    extra = [spare * b // sum(base) for b in base]  # in proportion to each band's need
    for i in range(spare - sum(extra)):
        extra[i % len(extra)] += 1
    widths = [b + e for b, e in zip(base, extra)]
    if "layer" in p.unit.bands and len(widths) > 1:
        a = p.unit.bands.index("layer")
        w = widths[a]
        if not lays_out(kv_heads, w):
            keep = max(d for d in range(1, w + 1) if kv_heads % d == 0)
            widths[a], widths[(a + 1) % len(widths)] = keep, widths[(a + 1) % len(widths)] + w - keep
    return Placed(p.unit, p.shape, p.wafer, p.x, p.y, p.h, p.reverse, tuple(widths))


def _assign_stages(lay: Layout, stages: int, unit_loads: Sequence[float] | None = None) -> list[int]:
    """Stage of each unit: contiguous, never spanning wafers, balanced `unit_loads` (each
    unit's modelled cycles; by default the kernels on its critical path, UNIT_LOAD)."""
    unit = list(unit_loads) if unit_loads is not None else \
        [float(UNIT_LOAD[p.unit.kind]) for p in lay.placed]
    per_wafer: list[list[int]] = [[] for _ in range(lay.wafers)]
    for i, p in enumerate(lay.placed):
        per_wafer[p.wafer].append(i)
    per_wafer = [w for w in per_wafer if w]
    counts = [1] * len(per_wafer)  # each wafer at least one stage
    loads = [sum(unit[i] for i in w) for w in per_wafer]
    for _ in range(stages - len(per_wafer)):
        # next stage to the wafer whose stages are heaviest and can still split
        cands = [k for k, w in enumerate(per_wafer) if counts[k] < len(w)]
        if not cands:
            break
        k = max(cands, key=lambda k: loads[k] / counts[k])
        counts[k] += 1
    out: list[int] = []
    for w, n in zip(per_wafer, counts):
        first = out[-1] + 1 if out else 0
        for j, cut in enumerate(_partition([unit[i] for i in w], n)):
            out.extend([first + j] * cut)
    return out


def _partition(loads: Sequence[float], parts: int) -> list[int]:
    """Sizes of `parts` contiguous groups of `loads` minimising the heaviest group."""
    n = len(loads)
    pre = [0]
    for x in loads:
        pre.append(pre[-1] + x)
    inf = float("inf")
    # best[k][i]: min max-load splitting the first i loads into k groups
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0
    for k in range(1, parts + 1):
        for i in range(k, n + 1):
            for j in range(k - 1, i):
                v = max(best[k - 1][j], pre[i] - pre[j])
                if v < best[k][i]:
                    best[k][i], cut[k][i] = v, j
    sizes, i = [], n
    for k in range(parts, 0, -1):
        j = cut[k][i]
        sizes.append(i - j)
        i = j
    return sizes[::-1]


# ---------------------------------------------------------------------------
# IR emission
# ---------------------------------------------------------------------------


def symbol_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return s if s and not s[0].isdigit() else f"m_{s}"


class _Emitter:
    def __init__(self, mapper: _Mapper, lay: Layout):
        self.m, self.lay, self.s = mapper, lay, mapper.shape
        self.block = Block()

    def add(self, op):
        self.block.add_op(op)
        return op.results[0] if op.results else None

    def bands(self, p: Placed) -> dict[str, CoreSetAttr]:
        out: dict[str, CoreSetAttr] = {}
        names = list(p.unit.bands) + (["experts"] if p.shape.grid and p.widths else [])
        widths = list(p.widths) + ([p.shape.grid.width] if "experts" in names else [])
        total = sum(widths)
        x = p.x + total if p.reverse else p.x
        for name, w in zip(names, widths):
            if p.reverse:
                x -= w
                out[name] = CoreSetAttr.of(x, p.y, w, p.h)
            else:
                out[name] = CoreSetAttr.of(x, p.y, w, p.h)
                x += w
        return out

    def expert_regions(self, p: Placed, area: CoreSetAttr | None) -> list[CoreSetAttr]:
        explicit = self.m.spec.mapping.experts.get(p.unit.layer)
        if explicit:
            return [CoreSetAttr.of(*r.tuple) for r in explicit]
        grid = p.shape.grid
        assert grid is not None and area is not None
        x0, y0, x1, _ = area.extent
        return [CoreSetAttr.of(x1 - dx - w if p.reverse else x0 + dx, y0 + dy, w, h)
                for dx, dy, w, h in grid.rects()]

    def emit(self) -> ModuleOp:
        s, lay = self.s, self.lay
        x: SSAValue | None = None
        prev: Placed | None = None
        for idx, p in enumerate(lay.placed):
            stage = lay.stages[idx]
            if prev is not None and stage != lay.stages[idx - 1]:
                x = self.handoff(prev, x, lay.stages[idx - 1], stage, p.wafer)
            b = self.bands(p)
            common = {"stage": stage, "wafer": p.wafer}
            if p.unit.kind == "embed":
                x = self.add(g.EmbedOp("embed", b["embed"], layer=-1, vocab=s.vocab,
                                       hidden=s.hidden, **common))
            elif p.unit.kind == "lm_head":
                r = b["lm_head"]
                n = self.add(g.RMSNormOp("final_norm", r, x, layer=-1, **common))
                logits = self.add(g.MatmulOp("lm_head", r, n, s.vocab, layer=-1, **common))
                self.add(g.SampleOp("sample", r, logits, eos=-1 if s.eos_token is None else s.eos_token, layer=-1, **common))
            else:
                x = self.layer(p, b, x, common)
            prev = p
        return self.model()

    def layer(self, p: Placed, b: dict[str, CoreSetAttr], x, common) -> SSAValue:
        s, i = self.s, p.unit.layer
        kw = dict(layer=i, **common)
        # One region for every kernel of a dense layer and of an MoE layer's attention half
        # (rows past max_seq hold no KV positions): attention's chains take the GEMV
        # reductions' routes and its result, multicast back up the columns, is where the o
        # projection reads it.
        layer = b["layer"]
        b = {**b, "qkv": layer, "attn": layer, "o": layer}
        if p.unit.kind == "dense":
            b.update(up=layer, down=layer)
        n1 = self.add(g.RMSNormOp(f"l{i}_norm1", b["qkv"], x, **kw))
        q = s.linear_quant or None  # attention's and the FFN's stored format (not DeltaNet's)
        if s.is_linear_layer(i):  # Gated DeltaNet on the region's first columns
            qkv = self.add(g.MatmulOp(f"l{i}_qkv", b["qkv"], n1, s.linear_in_width, **kw))
            x0, y0, x1, y1 = b["attn"].extent
            w, _ = delta_shape(s, x1 - x0, self.m.rows, self.m.chunk)
            # its inner rows where there are three or more: the qkv reduction's end row
            # sends the DeltaNet its input and is not among the receivers (the CSL
            # backend routes no gather whose receivers are partly its senders)
            if p.unit.kind == "dense" and y1 - y0 >= 3:
                y0, y1 = y0 + 1, y1 - 1
            region = CoreSetAttr.of(x1 - w if p.reverse else x0, y0, w, y1 - y0)
            a = self.add(g.DeltaNetOp(f"l{i}_delta", region, qkv, k_heads=s.linear_k_heads,
                                      v_heads=s.linear_v_heads, k_dim=s.linear_k_dim,
                                      v_dim=s.linear_v_dim, conv=s.linear_conv, **kw))
        else:
            qkv = self.add(g.MatmulOp(f"l{i}_qkv", b["qkv"], n1, s.qkv_width, weights=q,
                                      bias=s.qkv_bias, **kw))
            cap = s.kv_capacity(i, self.m.chunk)
            spill = {}
            if spills(s, i, self.m.spill):
                spill = dict(spill=self.spill_tiles(p, b, layer, cap), spill_from=self.m.spill)
            a = self.add(g.AttentionOp(f"l{i}_attn", b["attn"], qkv, heads=s.heads,
                                       kv_heads=s.kv_heads, head_dim=s.head_dim,
                                       max_seq=cap, gated=s.attn_gate, **spill, **kw))
        o = self.add(g.MatmulOp(f"l{i}_o", b["o"], a, s.hidden,
                                weights=None if s.is_linear_layer(i) else q,
                                bias=s.o_bias and not s.is_linear_layer(i), **kw))
        h = self.add(g.AddOp(f"l{i}_add1", b["o"], x, o, **kw))
        if p.unit.kind == "dense":
            n2 = self.add(g.RMSNormOp(f"l{i}_norm2", b["up"], h, **kw))
            up = self.add(g.MatmulOp(f"l{i}_up", b["up"], n2, 2 * s.ffn, weights=q, bias=s.mlp_bias, **kw))
            act = self.add(g.ElementwiseOp(f"l{i}_act", b["up"], up, "silu_mul", **kw))
            y = self.add(g.MatmulOp(f"l{i}_down", b["down"], act, s.hidden, weights=q, bias=s.mlp_bias,
                                    **kw))
            return self.add(g.AddOp(f"l{i}_add2", b["down"], h, y, **kw))
        return self.moe_tail(p, b, h, kw)

    def spill_tiles(self, p: Placed, b: dict[str, CoreSetAttr], layer: CoreSetAttr, cap: int) -> CoreSetAttr:
        """Where MoE layer p's attention keeps the ring entries past `--kv-spill`: the
        fewest tiles of its expert cores shaped like the attention's region whose cores
        hold their experts' tiles and a balanced share of the spilled KV together, side by
        side from the end of the expert area nearest the attention (its q | k | v and
        partials travel least)."""
        m, s, i = self.m, self.s, p.unit.layer
        x0, y0, x1, y1 = layer.extent
        w, h = x1 - x0, y1 - y0
        regions = self.expert_regions(p, b.get("experts"))
        lo = min(r.extent[0] for r in regions)
        hi = max(r.extent[2] for r in regions)
        sizer = m.sizer(self.lay.kv_slots)
        split = split_by_rows(s.heads, s.kv_heads, s.head_dim, m.spill, sizer.kv_slots, s.kv_bytes,
                              sizer.micro_batch, w, h)
        group = s.experts // (len(regions) - s.shared_experts)
        ex0, ey0, ex1, ey1 = regions[0].extent
        experts = sizer.expert(group, ex1 - ex0, ey1 - ey0)
        rest, most = cap - m.spill, (hi - lo) // w
        n = next((n for n in range(1, min(most, rest) + 1)
                  if experts + sizer.attention(w, h, -(-rest // n), split) <= sizer.usable), None)
        if n is None:
            need = experts + sizer.attention(w, h, -(-rest // max(most, 1)), split)
            raise FrontendError(
                f"--kv-spill {m.spill}: layer {i}'s {rest:,} spilled KV positions a slot do not fit its "
                f"expert cores: {most} tiles of {w} x {h} beside their expert tiles need "
                f"{_fmt_bytes(need)} per core, more than the {_fmt_bytes(sizer.usable)} a core has",
                m.where())
        xs = [lo + k * w for k in range(n)] if lo >= x1 else [hi - (k + 1) * w for k in range(n)]
        tiles = CoreSetAttr([RectAttr(x, y0, w, h) for x in xs])
        if not CoreSetAttr([r for c in regions for r in c.rects.data]).covers(tiles):
            raise FrontendError(f"--kv-spill {m.spill}: layer {i}'s expert cores do not cover the "
                                f"spill tiles {tiles} beside its attention {layer}", m.where())
        return tiles

    def moe_tail(self, p: Placed, b: dict[str, CoreSetAttr], h, kw) -> SSAValue:
        s, i = self.s, p.unit.layer
        n2 = self.add(g.RMSNormOp(f"l{i}_norm2", b["gate"], h, **kw))
        route = self.add(g.GateTopKOp(f"l{i}_gate", b["gate"], n2, experts=s.experts,
                                      top_k=s.top_k, **kw))
        regions = self.expert_regions(p, b.get("experts"))
        routed = len(regions) - s.shared_experts
        group = s.experts // routed
        x0, y0, x1, y1 = regions[0].extent
        decoded = self.m.sizer(self.lay.kv_slots).decoded_experts_fit(group, x1 - x0, y1 - y0)  # else packed, decoded per token
        y = self.add(g.MoEExpertsOp(
            f"l{i}_moe", b["relay"], n2, route, expert_ffn=s.expert_ffn,
            shared_experts=s.shared_experts, expert_regions=regions,
            placement=[e // group for e in range(s.experts)], policy="contiguous",
            weights=s.expert_quant or None, decoded=decoded, **kw))
        return self.add(g.AddOp(f"l{i}_add2", b["relay"], h, y, **kw))

    def handoff(self, p: Placed, x, stage: int, to_stage: int, to_wafer: int) -> SSAValue:
        # The sending cores: the edge column of the unit's last band, facing onward.
        owner = x.owner
        x0, y0, x1, y1 = owner.region.extent
        col = x0 if p.reverse else x1 - 1
        region = CoreSetAttr.of(col, y0, 1, y1 - y0)
        return self.add(g.HandoffOp(f"handoff_s{stage}", region, x, layer=p.unit.layer,
                                    stage=stage, wafer=p.wafer, to_stage=to_stage,
                                    to_wafer=to_wafer))

    def model(self) -> ModuleOp:
        s, m, t, lay = self.s, self.m, self.m.target, self.lay
        group = next((p.shape.grid.group for p in lay.placed if p.shape.grid), m.group)
        hparams = s.to_hparams(lay.kv_slots, group if s.is_moe else 0)
        if m.chunk > 1:
            hparams["prefill_chunk"] = IntegerAttr(m.chunk, i64)
        if m.spill:
            hparams["kv_spill"] = IntegerAttr(m.spill, i64)
        op = g.ModelOp(
            symbol_name(s.name), target=t.name, width=t.width, height=t.height,
            wafers=lay.wafers, stages=max(lay.stages) + 1, micro_batch=m.mb,
            dynamism=list(m.spec.dynamism), hparams=hparams, body=Region([self.block]))
        op.stamp_target(t)
        return ModuleOp([op])


def map_model(spec: ModelSpec, target: Target, micro_batch: int | None = None,
              wafers: int | None = None, dynamism: Sequence[str] | None = None,
              chunk: int | str = 1, context: int | str | None = None, spill: int = 0) -> ModuleOp:
    """Graph IR for `spec` mapped on `target` (overrides: micro-batch, wafer
    budget, dynamism kinds; `dynamism=()` is the static build), a prefilling slot
    feeding `chunk` prompt tokens a step ("auto": `auto_chunk`), a request slot
    holding `context` positions of KV (None: the spec's; "auto": `with_context`), MoE
    layers' attention regions keeping the first `spill` of them, the rest spilled to
    their expert cores (0: none spill; docs/kernels.md, "KV spill")."""
    if dynamism is not None:
        spec = dataclasses.replace(spec, dynamism=tuple(dynamism))  # re-validated
    mb = micro_batch if micro_batch is not None else spec.micro_batch
    budget = wafers if wafers is not None else spec.wafers
    if mb < 1:
        raise FrontendError(f"micro-batch must be at least 1, got {mb}")
    if context is not None:
        spec, budget = with_context(spec, target, mb, budget, context)
    if chunk != "auto" and not 1 <= chunk <= MAX_CHUNK:
        raise FrontendError(f"prefill chunk must be 1..{MAX_CHUNK} tokens, got {chunk}", Loc(spec.source))
    if budget is not None and budget < 1:
        raise FrontendError(f"wafers must be at least 1, got {budget}")
    if spill:
        check_spill(spec, spill)
    if chunk == "auto":
        return auto_chunk(spec, target, mb, budget, spill)
    return _mapped(spec, target, mb, budget, chunk, spill)


def _mapped(spec: ModelSpec, target: Target, mb: int, budget: int | None, chunk: int,
            spill: int) -> ModuleOp:
    """Graph IR of `spec` with every option resolved (`map_model`)."""
    mapper = _Mapper(spec, target, mb, budget, chunk, spill)
    lay = mapper.explicit_layout() if spec.mapping.explicit else mapper.default_layout()
    return _Emitter(mapper, lay).emit()


def spills(s: ModelShape, i: int, spill: int) -> bool:
    """Whether `--kv-spill spill` spills layer i's KV: a full-attention layer (not a
    sliding window's bounded ring, not Gated DeltaNet) whose context passes it (an MoE
    layer's goes to its expert cores; a dense one has none, `check_spill`)."""
    return bool(spill) and not s.is_linear_layer(i) and not s.window(i) and s.kv_capacity(i) > spill


def check_spill(spec: ModelSpec, spill: int) -> None:
    """`--kv-spill N` spills to the expert cores of MoE layers: every full-attention
    layer with a context past N must be one (a sliding window's ring stays whole)."""
    s, where = spec.shape, Loc(spec.source)
    if spill < 1:
        raise FrontendError(f"--kv-spill must be at least 1 position, got {spill}", where)
    dense = [i for i in range(s.layers) if spills(s, i, spill) and not s.is_moe_layer(i)]
    if dense:
        raise FrontendError(f"--kv-spill {spill}: layer {dense[0]} is dense (its FFN shares the "
                            "attention's region, so it has no FFN cores to spill KV to)", where)


def with_context(spec: ModelSpec, target: Target, micro_batch: int, wafers: int | None,
                 context: int | str) -> tuple[ModelSpec, int | None]:
    """(`spec` with each request slot holding `context` positions of KV, at most the
    positions the model was trained for; the wafer budget to map it on). "auto": the
    most positions whose caches, a stage's request slots on each wafer, pack onto the
    budget `wafers`, or onto the wafers the spec's own capacity needs (then the budget):
    the context the mapping's SRAM holds, not a cap."""
    limit = spec.max_positions or MAX_DIM
    where = Loc(spec.source)
    if context != "auto":
        if context > limit:
            raise FrontendError(f"a context of {context:,} positions exceeds the model's "
                                f"max_position_embeddings ({limit:,})", where)
        return dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, max_seq=context)), wafers

    def mapper(n: int) -> _Mapper | None:
        s = dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, max_seq=n))
        try:
            return _Mapper(s, target, micro_batch, wafers)
        except FrontendError:
            return None

    def fewest(n: int) -> int | None:
        """The fewest wafers at n positions, a stage on each at least (as `default_layout`)."""
        m = mapper(n)
        stages, need = 1, m and m.fewest_wafers(1)
        while need is not None and need > stages:
            stages, need = need, m.fewest_wafers(need)
        return need

    def fits(n: int) -> bool:
        m = mapper(n)
        need = m and m.fewest_wafers(budget)
        return need is not None and need <= budget

    budget = wafers or fewest(spec.shape.max_seq) or fewest(1)
    if budget is None:
        raise FrontendError(f"model does not fit on {target.name} even at a context of 1 position", where)
    lo, hi = 1, limit  # fits(lo); the largest such n by bisection
    if not fits(lo):
        raise FrontendError(f"model does not fit on {budget} {target.name} wafer(s) even at a context "
                            "of 1 position", where)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, max_seq=lo)), budget


AUTO_CHUNKS = (2, 4, 8, 16, 32, 64)  # the chunks `auto_chunk` tries, in order


def auto_chunk(spec: ModelSpec, target: Target, micro_batch: int, wafers: int | None,
               spill: int = 0) -> ModuleOp:
    """The model mapped with the largest prefill chunk of AUTO_CHUNKS whose rows fit the
    cores' SRAM beside the weights (the model at one stage packs onto no more wafers than
    at one token a step) and whose program compiles to segments on `target`: a chunk's
    wider messages and regions can take more input queues, colours or control state than
    a small target has (the Qwen3.5 test checkpoint on test32: 16 rows fit the SRAM, only
    2 compile). Chunk 1 where none does."""
    from xdsl.utils.exceptions import VerifyException

    from meshrt.diagnostics import MeshrtError
    from meshrt.passes.pipeline import lower_to

    base = _Mapper(spec, target, micro_batch, wafers).fewest_wafers(1)
    fits = []
    for c in AUTO_CHUNKS:
        if c > spec.shape.max_seq:  # no prompt is longer
            break
        n = _Mapper(spec, target, micro_batch, wafers, c).fewest_wafers(1)
        if base is None or n is None or n > base:
            break
        fits.append(c)
    for c in reversed(fits):
        try:
            module = _mapped(spec, target, micro_batch, wafers, c, spill)
            lower_to(module.clone(), "segments", target)
        except (FrontendError, MeshrtError, VerifyException):
            continue
        return module
    return _mapped(spec, target, micro_batch, wafers, 1, spill)


_LAYER = re.compile(r"l(\d+)_")  # a kernel name's layer


@functools.lru_cache(maxsize=512)
def _probe_times(shape, target, mb, chunk, kv_slots, group, height, probe, shapes):
    """(embedding cycles, LM head cycles, {layer kind: cycles of its first layer},
    {layer kind: cycles of its second layer}) on the probe's critical path, or None."""
    from xdsl.utils.exceptions import VerifyException

    from meshrt.diagnostics import MeshrtError
    from meshrt.kernels.interface import KernelOp
    from meshrt.passes.pipeline import lower_to
    from meshrt.runtime.cost_model import CostModel, CostModelError

    from meshrt.frontend.step_time import LINEAR

    by_kind = dict(shapes)
    kinds, moe_layers, linear_layers, first_of, steady_of = [], [], [], {}, {}
    for kind, n in probe:  # probe kinds: a unit kind, LINEAR-suffixed for DeltaNet layers
        first_of[kind] = len(kinds)
        base = kind.removesuffix(LINEAR)
        for _ in range(n):
            if base == "moe":
                moe_layers.append(len(kinds))
            if kind != base:
                linear_layers.append(len(kinds))
            kinds.append(base)
        steady_of[kind] = len(kinds) - 1
    # (windows do not change the cost; the probe keeps those of its own layers)
    pshape = dataclasses.replace(shape, layers=len(kinds), moe_layers=tuple(moe_layers),
                                 linear_layers=tuple(linear_layers),
                                 window_layers=tuple(i for i in shape.window_layers if i < len(kinds)))
    mapping = MappingSpec(experts_per_region=group) if shape.is_moe else MappingSpec()
    try:
        # routed where the model routes: a static MoE probe has every expert compute and
        # send every token, which ranks the grid arrangements by a gather no routed build
        # makes (the mapping is still one for a build and its static counterpart)
        dynamism = ("moe_routing",) if shape.is_moe else ()
        spec = ModelSpec(pshape, dynamism=dynamism, micro_batch=mb, mapping=mapping,
                         source="<probe>")
        pm = _Mapper(spec, target, mb, None, chunk)
    except FrontendError:
        return None
    units = [Unit("embed", -1)] + [Unit(k, i) for i, k in enumerate(kinds)] + [Unit("lm_head", -1)]
    lay = _pack(units, [by_kind[u.kind] for u in units], height, target)
    if lay is None:
        return None
    lay.placed = [_spread(p) for p in lay.placed]
    lay.kv_slots = kv_slots
    lay.stages = [p.wafer for p in lay.placed]  # a stage cannot span wafers
    try:
        module = _Emitter(pm, lay).emit()
        # the kernels' own checks (a grid no larger than its matrix, ...): the probe skips
        # verifying the IR between passes, and a packing whose kernels the compile would
        # reject must not win
        lower_to(module, "kernels", target, verify=False)
        for op in module.walk():
            if isinstance(op, KernelOp):
                op.verify_kernel()
        # the probe's module holds one program (not driver.program_of: the driver maps
        # through this module, so the frontend does not import it)
        program = next(iter(lower_to(module, "segments", target, verify=False).body.block.ops))
        est = CostModel(program, target).estimate(1)
    except (MeshrtError, FrontendError, CostModelError, VerifyException):
        return None
    unit: dict[int, float] = {}  # layer index (-1: the embedding, -2: the LM head) -> cycles
    for name, cycles in est.kernel_path.items():
        m = _LAYER.match(name)
        i = int(m.group(1)) if m else -1 if name.partition(".")[0] == "embed" else -2
        unit[i] = unit.get(i, 0.0) + cycles
    # the critical path adds up to the step; its parts the probe charges to no kernel
    # (none today) go with the LM head, which closes the loop
    rest = est.cycles_per_step - sum(unit.values())
    return (unit.get(-1, 0.0), unit.get(-2, 0.0) + rest,
            {k: unit.get(i, 0.0) for k, i in first_of.items()},
            {k: unit.get(i, 0.0) for k, i in steady_of.items()})
