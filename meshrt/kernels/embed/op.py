"""Embedding rows for the step's tokens; tokens arrive from the sampler."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, StringAttr
from xdsl.irdl import irdl_op_definition, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.base import int_value
from meshrt.dialects.graph import ActType
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.allreduce.op import AllReduceOp
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.embed import csl
from meshrt.kernels.embed.numerics import Embed
from meshrt.kernels.embed.pe import bodies_for
from meshrt.kernels.interface import (
    ACT_BYTES,
    INPUTS,
    OUTPUTS,
    Footprint,
    KernelContext,
    KernelOp,
    Role,
    ceil_div,
)
from meshrt.shape import request_state

EMBED = ComputeOp("embed", "add", csl.embed, admits_requests=True)
"""Copy this core's part of each token's embedding row, or zeros where another core of the
row holds it (costed as an add per element)."""


@irdl_op_definition
class EmbedOp(KernelOp):
    """Embedding rows for the step's tokens; tokens arrive from the sampler."""

    name = "mesh_kernel.embed"
    vocab = prop_def(IntegerAttr[I64])
    output = result_def(ActType)
    assembly_format = "$sym_name `on` $region attr-dict `:` type($output)"

    VIZ_COLOR: ClassVar[str] = "#a65628"
    VIZ_RANK: ClassVar[int] = 3
    COMPUTE: ClassVar[tuple] = (EMBED,)
    VALUE_IN_FP32: ClassVar[bool] = True  # partial sums: the allreduce after it sums them
    NUMERICS: ClassVar[type] = Embed
    LOWERS: ClassVar[tuple] = (graph.EmbedOp,)
    RESOLVES: ClassVar[frozenset[str]] = frozenset({"continuous_batching"})  # tokens and the CF payload from the sampler
    TOKEN_SINK: ClassVar[bool] = True

    @staticmethod
    def footprint(vocab: int, hidden: int, weight_bytes: float, micro_batch: int, w: int, h: int) -> Footprint:
        """Rows vocab/w of the table's slice hidden/h, and the output slice."""
        rows = ceil_div(hidden, h)
        return Footprint(ceil_div(vocab, w) * rows * weight_bytes, micro_batch * rows * ACT_BYTES)

    @staticmethod
    def control(micro_batch: int, slots: int) -> int:
        """Control state per core: the descriptors of the micro-batch whose tokens it embeds
        (it admits waiting requests into their freed slots); it keeps no per-slot lengths."""
        return request_state(micro_batch)

    def roles(self, kctx: KernelContext):
        _, _, w, h = self.grid()
        hidden = self.output.type.width.data
        state = self.footprint(int_value(self.vocab), hidden, kctx.weight_bytes, kctx.micro_batch, w, h).state
        return [Role("token", self.region,
                     [INPUTS, ("compute", "embed", kctx.micro_batch * ceil_div(hidden, h)), OUTPUTS],
                     int(state), ctrl=self.control(kctx.in_hand, kctx.slots), sends_output=True)], []

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return bodies_for(info, micro_batch, hp, tile)

    @classmethod
    def message_buffer(cls, info, hp, role, send):
        return "tokens" if role is FlowRole.TOKENS and not send else None  # i32 token ids

    def input_share(self, width: int) -> int:
        return 1  # one token id per slot

    def input_layout(self) -> str:
        return "full"  # no input vector: the tokens arrive on their own flow

    def output_layout(self) -> str:
        return "partial"

    @classmethod
    def lower(cls, op, operands, make):
        """The embedding and a row allreduce. Core (i, j) holds the table's rows of vocab
        part i, hidden part j: in each row the one core holding a token's row contributes
        its slice and the others zeros, so the sum along the row is the embedding (exact),
        split over the rows, and every core of a row ends up holding that row's slice: the
        stage's hand-off column reads it in place and a layer on the same rows receives it
        along its rows. (A gather from every core that might hold a row would move the
        region's size in messages per reader.)"""
        emb = make(cls, op, operands, op.results[0].type, vocab=op.vocab)
        red = make(AllReduceOp, op, emb.results, op.results[0].type, name=f"{op.kernel_name}.reduce",
                   axis=StringAttr("row"))
        return [emb, red], red.results[0]
