"""lower-to-pe: the PE-program level of each core class (meshrt.dialects.pe).

Adds, beside each `segment.program`, one `csl.module` per core class: its
event table over the program's arrays (`pe.table`: which array each receive
writes, each send reads, each compute reads its operands from; the copies
that keep a value a later kernel reads), the arrays it adds, and the compute
bodies of the kinds written at the PE level (`csl.func`). The CSL backend
prints each class's program from its module. Idempotent: a module already
there is built again.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass


@dataclass(frozen=True)
class LowerToPe(ModulePass):
    name = "lower-to-pe"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        from meshrt.backend.csl.pe_level import lower_to_pe

        lower_to_pe(op)
