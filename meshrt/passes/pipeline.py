"""Named pipelines: which passes take graph IR down to each level."""

from __future__ import annotations

from xdsl.dialects.builtin import ModuleOp

LEVELS: tuple[str, ...] = ("graph", "kernels", "events", "segments", "csl")

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
    # CSL is a printing target on top of segment IR (meshrt.backend.csl), not a pass.
    "csl": _SEGMENTS,
}


class LevelNotReady(Exception):
    """The requested level's passes are not built yet."""

    def __init__(self, level: str):
        super().__init__(
            f"--emit {level}: lowering to the '{level}' level is not implemented yet "
            f"(available: {', '.join(l for l in LEVELS if LEVEL_PIPELINES[l] is not None)})"
        )


def lower_to(module: ModuleOp, level: str) -> ModuleOp:
    """Run the passes from graph IR down to `level` in place and return the module."""
    if level not in LEVELS:
        raise ValueError(f"unknown level '{level}', expected one of {', '.join(LEVELS)}")
    pipeline = LEVEL_PIPELINES[level]
    if pipeline is None:
        raise LevelNotReady(level)
    if pipeline:
        run_pipeline(module, pipeline)
    return module


def run_pipeline(module: ModuleOp, spec: str) -> None:
    """Run a meshrt-opt style pass pipeline (`a,b{opt=1}`) on `module` in place."""
    from xdsl.context import Context
    from xdsl.passes import PassPipeline

    from meshrt.diagnostics import verify_located
    from meshrt.passes import get_all_passes

    def verify(_prev, mod: ModuleOp, _next) -> None:
        verify_located(mod)

    ctx = Context(allow_unregistered=False)
    PassPipeline.parse_spec(get_all_passes(), spec, verify).apply(ctx, module)
