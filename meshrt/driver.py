"""The compiler driver: a model, or printed IR of any level, to any level.

Every tool (`meshrt compile / run / bench / viz`, the placement benchmark),
the runtime and the benchmarks compile through here:

    target = load_target("test32")                    # or a .toml path
    module = compile("examples/tiny_moe.mrt", target, to="events")
    module = lower(module, "segments", target)        # restart where it stands
    program = segment_program("seg.mlir")             # IR: its own target

A source is a model file (a `.mrt` spec or a Hugging Face `config.json`),
a printed IR file (`.mlir`, any level: its level is the one of its top op,
see `level_of`) or a parsed `ModuleOp`. Printed segment IR is already
coloured, so going on from it runs `check-segments` only.

The Target object given is passed along to every pass that needs one, so a
user target file given by path works at every level whatever its `name`.
The IR keeps that name and, for a target that is not the bundled one of its
name, the file it was read from and the digest of its figures
(`target "test32" file "/abs/t.toml" digest "..."`). Without a Target (IR
only, as meshrt-opt runs it) each pass finds that same target again, or
fails located if the file is gone or changed (`meshrt.targets.target_for`);
a target given for IR it cannot hold (a larger mesh, budgets or user
colours beyond its own) is a located error too.

Errors: a bad model, config or target file is a `FrontendError`; bad IR, or
a pass refusing it, a `MeshrtError`; a level whose passes do not exist yet
`LevelNotReady`. All are one located line.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import ModuleOp

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import segment as sg
from meshrt.dialects.base import MappedProgramOp
from meshrt.frontend.errors import FrontendError
from meshrt.passes.pipeline import LEVELS, NO_PROGRAM, LevelNotReady, level_of, lower_to
from meshrt.targets import Target, load_target, target_for

__all__ = [
    "LEVELS", "LevelNotReady", "compile", "is_ir", "level_of", "load_model", "load_spec", "load_target",
    "lower", "parse_ir", "program_of", "read_ir", "segment_program", "target_of",
]

if TYPE_CHECKING:
    from meshrt.frontend.model import ModelSpec

Source = str | Path | ModuleOp


def is_ir(path: str | Path) -> bool:
    """Whether `path` names printed IR (`.mlir`) rather than a model."""
    return str(path).endswith(".mlir")


def load_spec(path: str | Path) -> ModelSpec:
    """A model file read, not mapped: a `.json` is a Hugging Face config.json,
    a directory a checkpoint (its config.json), anything else a .mrt spec
    (FrontendError on bad input)."""
    from meshrt.frontend.hf_config import load_hf_config
    from meshrt.frontend.spec import parse_spec_file

    p = Path(path)
    if p.is_dir():
        if not (p / "config.json").is_file():
            raise FrontendError("a model directory needs a config.json", str(path))
        p = p / "config.json"
    if not p.is_file():
        raise FrontendError("no such model file" if not p.exists() else "not a file", str(path))
    try:
        return load_hf_config(p) if p.suffix == ".json" else parse_spec_file(p)
    except (json.JSONDecodeError, UnicodeDecodeError, OSError) as e:  # belt and braces
        raise FrontendError(f"cannot read model: {e}", str(path)) from None


def load_model(path: str | Path, target: Target | str | Path, *, micro_batch: int | None = None,
               wafers: int | None = None, dynamism: Sequence[str] | None = None,
               chunk: int | str = 1, context: int | str | None = None, spill: int = 0) -> ModuleOp:
    """A model file (.mrt spec or config.json) mapped on `target`: graph IR.

    `micro_batch`, `wafers` and `dynamism` (`()` is the static build)
    override the spec's; `chunk`: prompt tokens a prefilling slot feeds a step;
    `context`: KV positions a request slot holds ("auto": what the SRAM holds);
    `spill`: KV positions MoE layers keep on their attention regions, the rest on
    their expert cores (0: all kept); FrontendError on bad input (the model is read
    before the target)."""
    from meshrt.frontend.mapper import map_model

    spec = load_spec(path)
    return map_model(spec, load_target(target), micro_batch, wafers, dynamism, chunk, context, spill)


def parse_ir(text: str, filename: str = "<input>") -> ModuleOp:
    """A module of meshrt IR at any level, parsed and verified (located errors)."""
    from xdsl.context import Context
    from xdsl.dialects.builtin import Builtin

    from meshrt.diagnostics import parse_module
    from meshrt.dialects import get_all_dialects, xdsl_dialects

    ctx = Context()
    ctx.load_dialect(Builtin)
    for load in get_all_dialects().values():
        ctx.load_dialect(load())
    for dialect in xdsl_dialects():  # the PE level's bodies
        ctx.load_dialect(dialect)
    return parse_module(ctx, text, filename)


def read_ir(path: str | Path) -> ModuleOp:
    """`parse_ir` of a file; one that cannot be read or holds no program is a
    located MeshrtError."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise MeshrtError.located(f"{path}: error: cannot read: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise MeshrtError.located(f"{path}: error: not UTF-8 at byte {e.start}") from None
    module = parse_ir(text, str(path))
    if level_of(module) is None:
        raise MeshrtError.located(f"{path}: error: {NO_PROGRAM}")
    return module


def program_of(module: ModuleOp | MappedProgramOp) -> MappedProgramOp:
    """The first top-level program of `module` (graph, mesh_kernel, event or
    segment; a program is its own)."""
    if isinstance(module, MappedProgramOp):
        return module
    for op in module.body.block.ops:
        if isinstance(op, MappedProgramOp):
            return op
    raise MeshrtError(NO_PROGRAM, module)


def target_of(module: ModuleOp | MappedProgramOp, target: Target | str | Path | None = None) -> Target:
    """`target` loaded (a Target as it is), or, if None, the target the IR
    records; a MeshrtError when the IR is not compiled for it (`target_for`)."""
    return target_for(target, program_of(module))


def lower(module: ModuleOp, to: str, target: Target | str | Path | None = None) -> ModuleOp:
    """Take `module` (IR of any level) down to level `to`, in place.

    `target` goes to the passes (None: each finds the one the IR records);
    `to="csl"` gives the segment IR the CSL backend prints."""
    return lower_to(module, to, None if target is None else load_target(target))


def compile(source: Source, target: Target | str | Path | None = None, to: str = "segments", *,
            micro_batch: int | None = None, wafers: int | None = None,
            dynamism: Sequence[str] | None = None, chunk: int | None = None) -> ModuleOp:
    """`source` (a model file, a printed IR file or a module) compiled to level `to`.

    A model needs `target`; IR defaults to the target it names. The mapping
    options (`micro_batch`, `wafers`, `dynamism`, the prefill `chunk`) apply to
    models only."""
    tgt = None if target is None else load_target(target)
    if isinstance(source, ModuleOp) or is_ir(source):
        if (micro_batch, wafers, dynamism, chunk) != (None, None, None, None):
            where = source if not isinstance(source, ModuleOp) else "<module>"
            raise MeshrtError.located(f"{where}: error: micro-batch, wafers, dynamism and the "
                                      "prefill chunk are chosen when a model is compiled, not on IR")
        module = source if isinstance(source, ModuleOp) else read_ir(source)
    else:
        if tgt is None:
            raise FrontendError("compiling a model needs a target", str(source))
        module = load_model(source, tgt, micro_batch=micro_batch, wafers=wafers, dynamism=dynamism,
                            chunk=chunk or 1)
    return lower(module, to, tgt)


def segment_program(source: Source, target: Target | str | Path | None = None, *,
                    micro_batch: int | None = None, wafers: int | None = None,
                    dynamism: Sequence[str] | None = None, chunk: int | None = None) -> sg.ProgramOp:
    """The checked, coloured segment program of `source`: what the interpreter,
    the serving loop and the cost model run (`dynamism=()`: the static build)."""
    module = compile(source, target, "segments", micro_batch=micro_batch, wafers=wafers,
                     dynamism=dynamism, chunk=chunk)
    program = program_of(module)
    assert isinstance(program, sg.ProgramOp)
    return program
