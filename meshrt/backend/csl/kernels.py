"""The compute of one `event.compute`, as CSL DSD operations and short loops.

The body of each compute op lives with the kernel kind that declares it
(`meshrt/kernels/<kind>/csl.py`, shared ones in `meshrt.kernels.compute`);
this is what those bodies are given. x is the kernel's input, y its output,
p the partner's partial of a reduction / relay chain, w (or wq, packed) the
sub-schedule's resident weights, KV tiles or embedding rows. Shapes follow
the event's operation count and are clamped to the buffers; see
docs/csl-backend.md for what is simplified.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshrt.backend.csl.model import Event
from meshrt.diagnostics import MeshrtError
from meshrt.kernels import registry

if TYPE_CHECKING:
    from meshrt.backend.csl.program import ProgramWriter


class ComputeBody:
    """DSD code of one `event.compute`: the writer, the event and the kernel kind it belongs to.

    x: the kernel's input, y: its output, p: the partner's partial (chains);
    w: this sub-schedule's resident region. Element counts follow the
    event's work and are clamped to the buffers.
    """

    def __init__(self, w: ProgramWriter, e: Event, sub, src: str | None):
        self.w, self.e, self.sub, self.src = w, e, sub, src
        self.T = w.sh.elem
        self.s = w.sh.sfx
        self.fn = w.sh.math_sfx
        self.b = w.b
        self.kind = w.p.kind_of(sub)

    def lines(self) -> list[str]:
        # a kind with compute bodies at the PE level prints the body the interpreter runs
        pe = self.w.pe_lines(self.sub, self.e)
        if pe is not None:
            return pe
        op = registry.compute_op(self.e.name, self.kind.kernel_kind())
        if op.csl is None:
            raise MeshrtError(f"internal error: compute op {op.name} of kernel @{self.sub.kernel} has "
                              "neither a PE body for this core class nor a CSL body", self.sub.op)
        return op.csl(self)

    # helpers the bodies share
    def param(self, key: str):
        """A shape parameter of the event's kernel (its `event.kernel` record)."""
        return self.w.p.record(self.sub).param(key)

    def n(self, cap: int) -> int:
        return max(1, min(self.e.work or 1, cap))

    def zero(self) -> str:
        return "0.0"

    def passthrough(self) -> list[str]:
        """y = x, where a body has no resident data to compute with."""
        n = min(self.w.nx, self.w.ny)
        return [f"@fmov{self.s}({self.w.mem('y', n)}, {self.w.mem('x', n)}); // {self.e.name}: pass-through"]

    def reduce_n(self) -> int:
        """Elements a chain's combine step covers: the work, clamped to y and the source."""
        caps = [self.w.ny, self.w.np if self.src == "p" else self.w.nx]
        return max(1, min(self.e.work or 1, *caps))
