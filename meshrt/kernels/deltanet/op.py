"""Gated DeltaNet decode: value heads over the columns, each head's v_dim over the rows.

Each request slot keeps, per layer, a (k_dim, v_dim) recurrent state per value
head and the last conv - 1 inputs of the short causal conv: resident like a KV
cache, updated every decode step. Column i holds value heads part(v_heads, w, i)
(and the key heads they read), row j the slice part(v_dim, h, j) of each of
them: the delta rule is independent per v_dim element, so the rows need no
reduction to update the state, but each row needs the whole q and k of its key
heads. So the column's q / k channels are split over its rows too: each core
convolves its share of them (and its v slice) over its own conv state, and the
column all-gathers the convolved q / k (`qk_merge`, streaming to the root and
multicast back: `interface.Gather`) before the rule; the conv state of those
channels is then split over the rows rather than repeated on each (1.8 KB a
slot per core for Qwen3.5-9B, which left no room for 8 slots). Each core runs
the rule on its slice and sends its slice of the head outputs down the column
(`delta_merge` gathers them); the root applies the gated RMSNorm over whole
heads and relays the result back up. Continuous batching resolves here: a slot
whose request starts (position 0) starts from zero state, so a freed and
re-admitted slot forgets its previous request.

A region wider than the value heads (`groups` > 1) is that many column groups
side by side, each tiled as above: group c runs the micro-batch's tokens
c, c + groups, ... and keeps the state of their request slots only (slot kv
sits at micro-batch position kv mod micro_batch, so its group is kv mod
groups). The groups share nothing: no flow between them, and each core's
state, buffers and work are 1 / groups of a single group's. A column holds
at least one whole value head, so this is how a DeltaNet uses more cores
than its value heads have columns (the per-slot state would otherwise fill a
32-column band at micro-batch 4).
"""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, opt_prop_def, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.base import enclosing_program, int_value
from meshrt.dialects.graph import ActType
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.deltanet import csl
from meshrt.kernels.deltanet.numerics import DeltaNet, group_slots
from meshrt.kernels.interface import (
    ACT_BYTES,
    UNARY_FORMAT,
    Footprint,
    Gather,
    KernelContext,
    KernelOp,
    ceil_div,
    chain,
)
from meshrt.shape import HParams

CONV = ComputeOp("delta_conv", "fmac", csl.conv, reads_input=True)
"""The short causal conv of this core's channels over the slot's conv state, then silu."""
QK_MERGE = ComputeOp("qk_merge", "add", csl.qk_merge)
"""Gather a partner's slices of the column's convolved q / k into this core's."""
DELTA = ComputeOp("delta", "fmac_f32", csl.delta)
"""The gated delta rule on this core's v_dim slice: decay, read, write, read out (fp32 state)."""
DELTA_MERGE = ComputeOp("delta_merge", "add", csl.delta_merge)
"""Gather a partner's slices of the head outputs into this core's."""
NORM_GATE = ComputeOp("norm_gate", "exp", csl.norm_gate)
"""At the root: RMSNorm over each head's v_dim with its gain, times silu(z)."""


def _shares(k_heads: int, v_heads: int, v_dim: int, w: int, h: int) -> tuple[int, int, int]:
    """(value heads, key heads, v_dim elements) one core's column and row hold at most."""
    nv = ceil_div(v_heads, w)
    rep = max(1, v_heads // k_heads)
    # a column's nv value heads start at a multiple of nv: they straddle a key-head
    # boundary only when neither of nv and rep divides the other
    straddles = nv % rep and rep % nv
    return nv, min(k_heads, ceil_div(nv, rep) + bool(straddles)), ceil_div(v_dim, h)


@irdl_op_definition
class DeltaNetOp(KernelOp):
    """Gated DeltaNet decode over per-slot recurrent and conv state."""

    name = "mesh_kernel.deltanet"
    k_heads = prop_def(IntegerAttr[I64])
    v_heads = prop_def(IntegerAttr[I64])
    k_dim = prop_def(IntegerAttr[I64])
    v_dim = prop_def(IntegerAttr[I64])
    conv = prop_def(IntegerAttr[I64])
    slots = prop_def(IntegerAttr[I64])
    groups = opt_prop_def(IntegerAttr[I64])  # column groups splitting the tokens (absent: 1)
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#e7298a"
    VIZ_RANK: ClassVar[int] = 1
    COMPUTE: ClassVar[tuple] = (CONV, QK_MERGE, DELTA, DELTA_MERGE, NORM_GATE)
    NUMERICS: ClassVar[type] = DeltaNet
    LOWERS: ClassVar[tuple] = (graph.DeltaNetOp,)
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"continuous_batching"})  # per-slot state resets
    CF_ON_INPUTS: ClassVar[bool] = True

    def dims(self) -> tuple[int, int, int, int, int]:
        return tuple(int_value(p) for p in (self.k_heads, self.v_heads, self.k_dim, self.v_dim,
                                             self.conv))

    def token_groups(self) -> int:
        return 1 if self.groups is None else int_value(self.groups)

    def verify_kernel(self) -> None:
        _, _, w, _ = self.grid()
        kh, vh, _, _, conv = self.dims()
        g = self.token_groups()
        if g < 1:
            raise self.fail(f"groups must be >= 1, got {g}")
        if w % g:
            raise self.fail(f"{w} columns do not split into {g} equal token groups")
        prog = enclosing_program(self)
        if prog is not None and prog.rows % g:
            raise self.fail(f"{g} token groups do not divide micro-batch {prog.rows}")
        if int_value(self.slots) <= 0:
            raise self.fail("slots must be > 0")
        if kh <= 0 or vh % kh:
            raise self.fail("v_heads must be a positive multiple of k_heads")
        if conv < 2:
            raise self.fail(f"the conv needs at least 2 taps, got {conv}")
        if vh < w // g:
            raise self.fail(f"{vh} value heads cannot be tiled over {w // g} columns"
                            + (f" (one of {g} token groups of {w} columns)" if g > 1 else ""))

    @staticmethod
    def channels(k_heads: int, v_heads: int, k_dim: int, v_dim: int, w: int, h: int
                 ) -> tuple[int, int, int, int]:
        """(value heads, the column's q / k channels, the channels one core convolves: its
        share of those and its v slice, the v_dim elements of its slice) at most."""
        nv, nk, vs = _shares(k_heads, v_heads, v_dim, w, h)
        qk = 2 * nk * k_dim
        return nv, qk, ceil_div(qk, h) + nv * vs, vs

    @staticmethod
    def footprint(slots: int, k_heads: int, v_heads: int, k_dim: int, v_dim: int, conv: int,
                  state_bytes: float, weight_bytes: float, micro_batch: int, w: int,
                  h: int, groups: int = 1) -> Footprint:
        """Per slot the recurrent state of the core's heads' v_dim slice and the conv state of
        its channels (at `state_bytes`, like a KV cache), the conv taps and per-head
        parameters (at `weight_bytes`); buffers: the column's share of the input (its q / k
        channels, where the gathered convolved q / k land, its v slice, the z and gate
        inputs of its heads), the head outputs. With token groups, a group's slots and
        tokens on its w / groups columns."""
        slots, micro_batch = group_slots(slots, groups), ceil_div(micro_batch, groups)
        nv, qk, own, vs = DeltaNetOp.channels(k_heads, v_heads, k_dim, v_dim, w // groups, h)
        state = slots * (nv * k_dim * vs + own * (conv - 1)) * state_bytes
        state += (own * conv + 2 * nv + v_dim) * weight_bytes
        inputs = micro_batch * (qk + nv * vs + nv * v_dim + 2 * nv) * ACT_BYTES
        outputs = 2 * micro_batch * nv * v_dim * ACT_BYTES
        return Footprint(state, inputs + outputs)

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        kh, vh, kd, vd, conv = self.dims()
        g = self.token_groups()
        b = kctx.micro_batch // g  # the tokens of one group (the verifier saw g divide it)
        nv, qk, own, vs = self.channels(kh, vh, kd, vd, w // g, h)
        state = self.footprint(kctx.slots, kh, vh, kd, vd, conv, kctx.kv_bytes, kctx.weight_bytes,
                               kctx.micro_batch, w, h, g).state
        # the column's convolved q / k, fp32 like any partial on its way through a chain
        qk_gather = Gather([("compute", "delta_conv", b * own * conv)], "qk_merge",
                           b * qk * ACT_BYTES)
        local = [("compute", "delta", b * nv * kd * vs * 4)]  # decay, read, write, read out
        msg = b * nv * vd * ACT_BYTES  # the column's head outputs, the slices filled so far
        roles, flows = chain(self, local, "delta_merge", msg,
                             [("compute", "norm_gate", b * nv * vd)], int(state), gather=qk_gather)
        for r in roles:
            r.ctrl = group_slots(kctx.slots, g) * 16  # request descriptor table: its slots' positions
        return roles, flows

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][2])

    def input_layout(self) -> str:
        return "full"

    def output_layout(self) -> str:
        return "cols"  # with token groups: each column its heads for its group's tokens

    def holds_all_tokens(self) -> bool:
        return self.token_groups() == 1

    def is_collective(self) -> bool:
        return True

    @classmethod
    def lower_props(cls, op):
        model = op.parent_op()
        assert isinstance(model, graph.ModelOp)
        props = dict(k_heads=op.k_heads, v_heads=op.v_heads, k_dim=op.k_dim, v_dim=op.v_dim,
                     conv=op.conv, slots=HParams.of(model).kv_slots(model))
        w, vh = op.region.extent[2] - op.region.extent[0], op.v_heads.value.data
        if w > vh:  # wider than its value heads: side-by-side token groups of them
            props["groups"] = IntegerAttr(w // vh, 64)
        return props
