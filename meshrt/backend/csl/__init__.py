"""The CSL backend: segment IR -> layout.csl + one program per core class.

`emit_csl(module, arch)` returns the files (relative path -> text) and the
per-class allocation report; `CslTarget` publishes it as the `meshrt-csl`
output target of meshrt-opt / xdsl-opt (`-t csl` in meshrt-opt), printing
every file behind a `// ----- FILE: <name>` line.

Modules: model (IR -> plain plan), routes (per-router configurations as
boxes), streams (how each flow's wavelets travel: trees, shifts, switch
chains, relays), handshakes (drains / installs as teardown), alloc
(colours, queues, task IDs, DSRs within the target's limits), sync (marker
counts), program / layout / host (the text), output (the files emitted).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import IO, ClassVar

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.utils.target import Target

from meshrt.backend.csl.output import CslOutput
from meshrt.diagnostics import MeshrtError
from meshrt.kernels.sample.pe import eos_tokens
from meshrt.shape import HParams

ARCHS = ("wse2", "wse3")


def resolve_arch(arch: str | None, target_name: str, where) -> str:
    if arch in (None, "", "auto"):
        return target_name if target_name in ARCHS else "wse3"
    if arch not in ARCHS:
        raise MeshrtError(f"unknown CSL arch '{arch}', expected one of {', '.join(ARCHS)} (or auto)", where)
    return arch


def emit_csl(module: ModuleOp, arch: str | None = None, target=None, weights=None) -> CslOutput:
    """The CSL files of `module`'s segment programs. `target` (a meshrt
    Target) is the one they were compiled for; None: the one each names.
    `weights` (`reference.Weights`): also each class's resident tiles for the host
    (`weights/<class>.w.npy`, `weights.py`)."""
    from meshrt.backend.csl import alloc as al
    from meshrt.backend.csl.host import compile_sh, report_table, report_txt, run_py
    from meshrt.backend.csl.layout import (
        RouteStats,
        idle_cores,
        idle_teardown_colors,
        rectangle,
        write_layout,
    )
    from meshrt.backend.csl.model import read_program, segment_programs
    from meshrt.backend.csl.program import Shared, write_program
    from meshrt.backend.csl.runtime import idle_program, runtime_module
    from meshrt.backend.csl.handshakes import drained_flows
    from meshrt.backend.csl.sync import marker_counts
    from meshrt.targets import target_for

    from meshrt.backend.csl.pe_level import class_modules, lower_to_pe, module_name, program_elem, read_class_module

    result = CslOutput()
    ops = segment_programs(module)
    mods = class_modules(module)
    if any(module_name(op.program_name, c.sym_name.data) not in mods for op in ops for c in op.core_classes()):
        # segment IR: its classes' PE-level modules first (the lower-to-pe pass)
        module = module.clone()
        lower_to_pe(module)
        ops, mods = segment_programs(module), class_modules(module)
    programs = []
    for op in ops:
        if op.chunk > 1:  # its request table and sampler keep one token a slot
            raise MeshrtError(f"@{op.program_name}: prefill chunk {op.chunk}: the CSL printed keeps one "
                              "token a slot a step (its request table, its sampler); a chunked "
                              "program is interpreted, costed and printed at the PE level, not as "
                              "CSL (issue 18)", op)
        prefix = f"{op.program_name}/" if len(ops) > 1 else ""
        program = read_program(op)
        programs.append(program)
        tgt = target_for(target, op)
        a = resolve_arch(arch, program.target, op)
        lim = al.limits(program, tgt, a)
        elem = program_elem(program)
        sh = Shared(program, lim, a, elem)
        sh.drained = drained_flows(program)
        sh.marker_counts = marker_counts(program)
        marker = al.marker_task_id(program, lim)
        allocs = [al.allocate(c, program, lim, marker) for c in program.classes]
        texts: dict[str, str] = {}
        plane = None
        if weights is not None:
            from meshrt.runtime.dataplane import DataPlane

            plane = DataPlane(op, weights, None)
        for alloc in allocs:
            level = read_class_module(mods[module_name(op.program_name, alloc.cls.name)], program, alloc.cls)
            texts[alloc.cls.ident], regions = write_program(alloc.cls, alloc, sh, level)
            result.regions[alloc.cls.name] = regions
            if plane is not None:
                from meshrt.backend.csl.weights import class_weights

                w = class_weights(alloc.cls, alloc.symbols.get("w", (0,))[0], regions, plane)
                if w is not None:
                    result.arrays[f"{prefix}weights/{alloc.cls.name}.w.npy"] = w
        stats = RouteStats()
        rects = {}
        files: dict[str, str] = {}
        for wafer in range(program.wafers):
            where = prefix + (f"wafer{wafer}/" if program.wafers > 1 else "")
            rects[wafer] = rectangle(program, wafer)
            files[where + "layout.csl"] = write_layout(program, wafer, a, sh.exports.get(wafer, {}), stats)
            for alloc in allocs:
                if alloc.cls.wafer == wafer:
                    files[where + alloc.cls.file] = texts[alloc.cls.ident]
            files[where + "meshrt_rt.csl"] = runtime_module()
            idle = idle_cores(program, wafer)
            if idle:
                files[where + "idle.csl"] = idle_program(idle_teardown_colors(program, wafer, idle, sh.drained))
        files[prefix + "compile.sh"] = compile_sh(program, a, rects, (tgt.width, tgt.height), elem)
        files[prefix + "run.py"] = run_py(program, allocs, elem, rects, eos_tokens(HParams.of(program.op)))
        report = report_txt(program, a, lim, allocs, stats, list(files))
        files[prefix + "report.txt"] = report
        result.files.update(files)
        result.report += report
        result.table += report_table(allocs, lim)
    # The programs must run the tables the interpreter runs; a mismatch is a backend bug.
    from meshrt.backend.csl.check import agreement

    problems = agreement(module, result, programs)
    if problems:
        raise MeshrtError(f"internal error: a CSL program does not run its event table: {problems[0]}",
                          ops[0])
    return result


@dataclass(frozen=True)
class CslTarget(Target):
    """`-t meshrt-csl{arch=wse2}`: CSL files of segment IR, behind FILE lines.

    arch: wse2 | wse3 | auto (the program's target when it is wse2 / wse3,
    else wse3 syntax).
    """

    name: ClassVar[str] = "meshrt-csl"

    arch: str = "auto"

    @classmethod
    def from_spec(cls, spec):
        # meshrt-opt also offers this target as `-t csl` (no clash there).
        if spec.name == "csl":
            spec = dataclasses.replace(spec, name=cls.name)
        return super().from_spec(spec)

    def emit(self, ctx: Context, module: ModuleOp, output: IO[str]) -> None:
        output.write(emit_csl(module, self.arch).as_text())
