"""Named pipelines: which passes take IR of one level down to another.

`lower_to(module, level, target)` starts from the level of the module's top
op (`level_of`), so printed IR of any level restarts where it stands; the
Target object given, if any, is handed to every pass that takes a `target`
(otherwise each pass finds the target the IR records, `targets.target_for`). The compiler driver
(`meshrt.driver`) is the front door to this.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from xdsl.dialects.builtin import ModuleOp

if TYPE_CHECKING:
    from meshrt.targets import Target

LEVELS: tuple[str, ...] = ("graph", "kernels", "events", "segments", "pe", "csl")

_SEGMENTS = (
    "lower-to-mesh-kernels,synthesize-schedules,materialize-segments,color-routes,"
    "insert-route-handshakes,check-segments{handshakes=true}"
)

# Pass pipelines (meshrt-opt syntax) that take graph IR to each level.
# A level whose passes do not exist yet maps to None.
LEVEL_PIPELINES: dict[str, str | None] = {
    "graph": "",
    "kernels": "lower-to-mesh-kernels",
    "events": "lower-to-mesh-kernels,synthesize-schedules",
    "segments": _SEGMENTS,
    # each core class's program (meshrt.dialects.pe), beside the segment program
    "pe": _SEGMENTS + ",lower-to-pe",
    # CSL is a printing target on top of the PE level (meshrt.backend.csl), not a pass.
    "csl": _SEGMENTS + ",lower-to-pe",
}


# The top-level op of printed IR of each level.
TOP_OPS: dict[str, str] = {
    "graph.model": "graph",
    "mesh_kernel.program": "kernels",
    "event.schedule": "events",
    "segment.program": "segments",
}

NO_PROGRAM = "no graph.model, mesh_kernel.program, event.schedule or segment.program"

# Printed segment IR is already coloured: restarting from it only checks it.
_CHECK_SEGMENTS = "check-segments{handshakes=true}"


class LevelNotReady(Exception):
    """The requested level's passes are not built yet."""

    def __init__(self, level: str):
        super().__init__(
            f"--emit {level}: lowering to the '{level}' level is not implemented yet "
            f"(available: {', '.join(l for l in LEVELS if LEVEL_PIPELINES[l] is not None)})"
        )


def level_of(module: ModuleOp) -> str | None:
    """The level of the first top-level program op of `module` (None: there is none):
    segment IR with its classes' `csl.module`s beside it is the PE level."""
    level = next((TOP_OPS[op.name] for op in module.body.block.ops if op.name in TOP_OPS), None)
    if level == "segments" and any(op.name == "csl.module" for op in module.body.block.ops):
        return "pe"
    return level


def pipeline_between(start: str, stop: str) -> str:
    """The passes (meshrt-opt syntax) that take IR of level `start` to level `stop`.

    Restarting from segment IR runs the check only (then lower-to-pe, to `pe` or
    `csl`); from the PE level, the check only.
    """
    for level in (start, stop):
        if level not in LEVELS:
            raise ValueError(f"unknown level '{level}', expected one of {', '.join(LEVELS)}")
    if LEVEL_PIPELINES[stop] is None:
        raise LevelNotReady(stop)
    if (start, stop) == ("pe", "segments"):  # the PE level keeps its segment program
        return _CHECK_SEGMENTS
    if LEVELS.index(stop) < LEVELS.index(start):
        raise ValueError(f"cannot take {start} IR up to the {stop} level")
    if start in ("segments", "pe", "csl"):  # printed IR is already coloured: check it
        return _CHECK_SEGMENTS + (",lower-to-pe" if start == "segments" and stop != "segments" else "")
    done, todo = _passes(LEVEL_PIPELINES[start]), _passes(LEVEL_PIPELINES[stop])
    assert todo[:len(done)] == done, (start, stop)  # each level's pipeline extends the one above
    return ",".join(todo[len(done):])


def _passes(pipeline: str | None) -> list[str]:
    return pipeline.split(",") if pipeline else []


def lower_to(module: ModuleOp, level: str, target: Target | None = None, *,
             verify: bool = True) -> ModuleOp:
    """Run the passes from the module's level (graph IR, or printed IR of any
    level) down to `level` in place and return the module.

    `target` is given to the passes as it is; None: each loads the IR's.
    `verify=False` skips verifying the IR between passes (the mapper's probes,
    whose IR the passes build from a verified graph)."""
    from meshrt.diagnostics import MeshrtError

    start = level_of(module)
    if start is None:
        raise MeshrtError(f"{NO_PROGRAM} to lower", module)
    pipeline = pipeline_between(start, level)
    if pipeline:
        run_pipeline(module, pipeline, target, verify=verify)
    return module


def run_pipeline(module: ModuleOp, spec: str, target: Target | None = None, *,
                 verify: bool = True) -> None:
    """Run a meshrt-opt style pass pipeline (`a,b{opt=1}`) on `module` in place.

    `target` (a Target) goes to every pass with a `target` option the spec
    leaves unset; `verify` checks the IR after each pass."""
    from xdsl.context import Context
    from xdsl.passes import PassPipeline

    from meshrt.diagnostics import verify_located
    from meshrt.passes import get_all_passes

    verify_ir = verify

    def verify(_prev, mod: ModuleOp, _next) -> None:
        verify_located(mod)

    ctx = Context(allow_unregistered=False)
    pipeline = PassPipeline.parse_spec(get_all_passes(), spec, verify if verify_ir else None)
    if target is not None:
        pipeline = dataclasses.replace(
            pipeline, passes=tuple(_with_target(p, target) for p in pipeline.passes))
    pipeline.apply(ctx, module)


def _with_target(p, target: Target):
    takes = any(f.name == "target" for f in dataclasses.fields(p))
    return dataclasses.replace(p, target=target) if takes and p.target is None else p
