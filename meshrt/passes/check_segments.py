"""`check-segments`: prove a segment program safe to install.

`check_segments(module, target)` runs the check of
`meshrt.analysis.segment_check` (message balance, capacity, colours,
boundaries, route handshakes, all re-derived from the segment IR) on every
`segment.program` and returns one located diagnostic line per violation; the `check-segments`
pass raises the first one.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from meshrt.analysis.segment_check import Problem, check_program
from meshrt.diagnostics import MeshrtError, format_diagnostic
from meshrt.dialects import segment as sg
from meshrt.dialects.base import require_programs
from meshrt.targets import Target, target_for


def check_segments(module: Operation, target: Target | str | None = None,
                   handshakes: bool | None = None) -> list[str]:
    """Located one-line diagnostics for every violation in `module` (empty = proved safe).

    `target` (a Target, a name or a path) defaults to each program's own;
    `handshakes` as the pass option (None: check them where stated).
    """
    out: list[str] = []
    for p in _problems(module, target, handshakes):
        out.append(format_diagnostic(p.message, p.op))
    return out


def _problems(module: Operation, target: Target | str | None,
              handshakes: bool | None = None) -> list[Problem]:
    programs = [o for o in module.walk() if isinstance(o, sg.ProgramOp)]
    problems: list[Problem] = []
    for program in programs:
        try:
            t = target_for(target, program)
        except MeshrtError as e:
            where = f" ({e.loc})" if e.loc is not None else ""
            problems.append(Problem(e.message + where, program))
            continue
        problems.extend(check_program(program, t, handshakes))
    return problems


@dataclass(frozen=True)
class CheckSegments(ModulePass):
    """Fail with the first violation `check_segments` finds (see the module docstring)."""

    name = "check-segments"

    target: str | Target | None = None
    handshakes: bool | None = None

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        require_programs(op, self.name, sg.ProgramOp, hint="materialize-segments,color-routes")
        problems = _problems(op, self.target, self.handshakes)
        if problems:
            first = problems[0]
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise MeshrtError(first.message + more, first.op)
