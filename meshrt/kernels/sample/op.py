"""Argmax over vocabulary tiles, EOS detection; produces the CF payload."""

from __future__ import annotations

from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr
from xdsl.irdl import irdl_op_definition, operand_def, prop_def, result_def

from meshrt.dialects import graph
from meshrt.dialects.graph import ActType, TokensType
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels.compute import ComputeOp
from meshrt.kernels.interface import ACT_BYTES, UNARY_FORMAT, KernelContext, KernelOp, ceil_div, chain
from meshrt.kernels.sample.numerics import Sample
from meshrt.kernels.sample.pe import bodies_for

# The sampler's compute is its PE bodies (sample/pe.py), which the CSL prints.
ARGMAX = ComputeOp("argmax", "argmax", None, reads_input=True)
"""(value, index) of the largest of this core's logits."""
ARGMAX_MERGE = ComputeOp("argmax_merge", "argmax", None)
"""Keep the larger of two (value, index) candidates."""
EOS_CHECK = ComputeOp("eos_check", "add", None)
"""Whether each slot's token ends its request."""


@irdl_op_definition
class SampleOp(KernelOp):
    """Argmax over vocabulary tiles, EOS detection; produces the CF payload."""

    name = "mesh_kernel.sample"
    eos = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(TokensType)
    assembly_format = UNARY_FORMAT

    VIZ_COLOR: ClassVar[str] = "#e41a1c"
    VIZ_RANK: ClassVar[int] = 4
    COMPUTE: ClassVar[tuple] = (ARGMAX, ARGMAX_MERGE, EOS_CHECK)
    NUMERICS: ClassVar[type] = Sample
    LOWERS: ClassVar[tuple] = (graph.SampleOp,)
    PRODUCES_AT_ROOT: ClassVar[frozenset[str]] = frozenset({"continuous_batching"})
    TOKEN_SOURCE: ClassVar[bool] = True

    def roles(self, kctx: KernelContext):
        # The logits are split over the columns (the same in every row):
        # the bottom row merges its columns' candidates left to right.
        x, y, w, h = self.grid()
        vocab = self.input.type.width.data
        b = kctx.micro_batch
        return chain(self, [("compute", "argmax", b * ceil_div(vocab, w))], "argmax_merge",
                     b * 2 * ACT_BYTES, [("compute", "eos_check", b)], 0, axis="row",
                     tiles=[(x, y + h - 1, w, 1)], relay_back=False, kctx=kctx)

    @classmethod
    def pe_bodies(cls, info, micro_batch, hp, tile):
        return bodies_for(info, micro_batch, hp, tile)

    @classmethod
    def reads_in_place(cls, info, op):
        return op == "argmax"  # it reads the logits and writes only its candidates

    @classmethod
    def message_buffer(cls, info, hp, role, send):
        # candidates (logit bits, token id) along the row; the token ids to the embed
        if role is FlowRole.DOWN:
            return "cand" if send else "cand_in"
        return "tokens" if role is FlowRole.TOKENS and send else None

    def input_share(self, width: int) -> int:
        return ceil_div(width, self.tiles()[0][2])

    def input_layout(self) -> str:
        return "cols"

    def output_layout(self) -> str:
        return "full"

    def is_collective(self) -> bool:
        return True

    @classmethod
    def lower_props(cls, op):
        return {"eos": op.eos}
