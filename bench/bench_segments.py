"""Time `materialize-segments` and `color-routes` (and the checker) on a large model.

    python bench/bench_segments.py                        # largest bundled config on wse3
    python bench/bench_segments.py MODEL --target T       # any spec / config.json
    python bench/bench_segments.py --events FILE.mlir     # event IR at hand
    python bench/bench_segments.py --profile              # cProfile the two passes

Builds event IR with the lead's pipeline (`lower-to-mesh-kernels`,
`synthesize-schedules`), then times each of the two passes and
`check_segments` once on it and prints sizes: core classes, flows,
segments, boundaries, marker syncs, colour splits. Not a timed test.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import pstats
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "examples" / "configs"
# Largest first: the first one that compiles to events on the target is used.
DEFAULT_MODELS = ["gpt-oss-120b.json", "qwen3-30b-a3b.json", "gpt-oss-20b.json", "qwen3-8b.json"]


def _ctx():
    from meshrt.tools.meshrt_opt import MeshrtOptMain

    return MeshrtOptMain(args=["-"]).ctx


def events_module(model: str, target: str):
    """Event IR of `model` on `target`, via the frontend and the lead's passes."""
    import subprocess

    from meshrt.diagnostics import parse_module
    from meshrt.tools.meshrt_opt import MeshrtOptMain

    graph = subprocess.run(  # noqa: PLW1510 - the return code is checked below
        [sys.executable, "-m", "meshrt.tools.cli", "compile", model, "--target", target, "--emit", "graph"],
        capture_output=True, text=True,
    )
    if graph.returncode != 0:
        raise RuntimeError(graph.stderr.strip())
    tool = MeshrtOptMain(args=["-"])
    module = parse_module(tool.ctx, graph.stdout, model)
    from xdsl.passes import PassPipeline

    PassPipeline.parse_spec(tool.available_passes, "lower-to-mesh-kernels,synthesize-schedules").apply(
        tool.ctx, module
    )
    return tool.ctx, module


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="spec or config.json (default: largest bundled config)")
    ap.add_argument("--target", default="wse3")
    ap.add_argument("--events", help="event IR file to start from instead of compiling")
    ap.add_argument("--profile", action="store_true")
    args = ap.parse_args(argv)

    from meshrt.diagnostics import parse_module
    from meshrt.dialects import segment as sg
    from meshrt.passes.check_segments import check_segments
    from meshrt.passes.color_routes import ColorRoutes
    from meshrt.passes.materialize_segments import MaterializeSegments

    t0 = time.perf_counter()
    if args.events:
        ctx = _ctx()
        module = parse_module(ctx, Path(args.events).read_text(), args.events)
        name = args.events
    else:
        candidates = [args.model] if args.model else [str(CONFIGS / m) for m in DEFAULT_MODELS]
        err = None
        for cand in candidates:
            try:
                ctx, module = events_module(cand, args.target)
                name = cand
                break
            except Exception as e:  # noqa: BLE001 - report and try the next model
                err = f"{cand}: {e}"
                print(f"skip {err}", file=sys.stderr)
        else:
            print(f"no model compiles to events on {args.target}: {err}", file=sys.stderr)
            return 1
    t_events = time.perf_counter() - t0
    sched = next(o for o in module.body.block.ops if o.name == "event.schedule")
    n_classes = len(sched.core_classes())
    n_flows = len(sched.flows())
    n_subs = sum(len(c.subs()) for c in sched.core_classes())

    prof = cProfile.Profile() if args.profile else None
    gc.collect()

    def timed(fn):
        t = time.perf_counter()
        if prof:
            prof.enable()
        fn()
        if prof:
            prof.disable()
        return time.perf_counter() - t

    t_mat = timed(lambda: MaterializeSegments().apply(ctx, module))
    program = next(o for o in module.body.block.ops if isinstance(o, sg.ProgramOp))
    segs_before = sum(len(c.segments()) for c in program.core_classes())
    t_col = timed(lambda: ColorRoutes().apply(ctx, module))
    t_chk = timed(lambda: check_segments(module))
    problems = check_segments(module)

    classes = program.core_classes()
    per_class = [len(c.segments()) for c in classes]
    bounds = [b for c in classes for b in c.boundaries()]
    colours = Counter(r.color_id for r in program.routes())
    print(f"model            {name} on {args.target}")
    print(f"event IR         {n_classes} core classes, {n_subs} subs, {n_flows} flows "
          f"(built in {t_events:.1f} s)")
    print(f"materialize      {t_mat:8.2f} s   {segs_before} segments")
    print(f"color-routes     {t_col:8.2f} s   {sum(per_class) - segs_before} segment splits, "
          f"{len(program.routes())} routes on {len(colours)} colours")
    print(f"check-segments   {t_chk:8.2f} s   {len(problems)} problems")
    print(f"segments/class   max {max(per_class)}, mean {sum(per_class) / len(per_class):.2f}, "
          f"histogram {sorted(Counter(per_class).items())}")
    print(f"boundaries       {len(bounds)}, marker syncs {sum(1 for b in bounds if b[2] is not None)}")
    if prof:
        s = io.StringIO()
        pstats.Stats(prof, stream=s).sort_stats("cumtime").print_stats(25)
        print(s.getvalue())
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
