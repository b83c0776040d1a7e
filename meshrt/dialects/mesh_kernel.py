"""The `mesh_kernel` dialect: the closed set of mesh kernels, each on a region.

`lower-to-mesh-kernels` turns graph ops into these. Each kernel is a
concrete spatial algorithm (tiled GEMV, reduction trees, attention over KV
tiles, ...) and knows its core roles, per-role resource demand, whether it is
a collective with all-or-nothing completion, and which roles receive or
produce runtime dynamism. The kernel ops themselves live in their kinds'
folders (`meshrt/kernels/<kind>/op.py`, the interface in
`meshrt.kernels.interface`); this module holds the program op and builds
the dialect from the registry, so a new kind needs no edit here.

Values reuse the graph types (`!graph.act`, `!graph.routing`,
`!graph.tokens`): the data is the same, only its placement is finer.
"""

from __future__ import annotations

from xdsl.ir import Dialect
from xdsl.irdl import irdl_op_definition
from xdsl.utils.exceptions import VerifyException

from meshrt.dialects.base import MappedProgramOp, body_ops
from meshrt.kernels import registry
from meshrt.kernels.interface import KernelOp

__all__ = ["KernelOp", "MeshKernel", "ProgramOp"]


@irdl_op_definition
class ProgramOp(MappedProgramOp):
    """The mesh-kernel program of one model on one target."""

    name = "mesh_kernel.program"

    def kernels(self) -> list[KernelOp]:
        return [op for op in body_ops(self.body) if isinstance(op, KernelOp)]

    def verify_body(self) -> None:
        for op in body_ops(self.body):
            if not isinstance(op, KernelOp):
                raise VerifyException(
                    f"program @{self.program_name} may only hold mesh kernels, found '{op.name}'"
                )


MeshKernel = Dialect("mesh_kernel", [ProgramOp, *registry.op_classes()], [])
