"""`meshrt run`: serve a workload on the simulated mesh and check it against NumPy.

MODEL is a .mrt spec or a config.json (compiled to coloured segment IR for
the target; `--static` compiles the WaferLLM-style baseline without
dynamism), or segment IR (.mlir) as `meshrt compile --emit segments` prints
it, run as it is. `--compare` runs the static baseline and the compiled
model side by side in one invocation.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL|IR")
    p.add_argument("--target", metavar="T", help="target (default: the IR's, or test32)")
    p.add_argument("--workload", default="chat", metavar="NAME|FILE",
                   help="chat, reasoning (synthetic, scaled to the model's KV capacity) or a .jsonl file")
    p.add_argument("--requests", type=int, default=8, metavar="N")
    p.add_argument("--rate", type=float, default=20.0, metavar="R",
                   help="arrivals per million cycles (synthetic workloads; 0: all at once)")
    p.add_argument("--seed", type=int, default=0, metavar="S", help="seed of the asynchrony (speeds, jitter)")
    p.add_argument("--workload-seed", type=int, default=0, metavar="S")
    p.add_argument("--weights-seed", type=int, default=0, metavar="S")
    p.add_argument("--queue", type=int, default=16, metavar="N", help="waiting-queue capacity")
    p.add_argument("--static", action="store_true", help="run the static baseline build")
    p.add_argument("--compare", action="store_true", help="run static and compiled side by side")
    p.add_argument("--unsafe", action="store_true",
                   help="ablation: no marker syncs or route handshakes (shows the checks can fail)")
    p.add_argument("--max-cycles", type=int, default=200_000_000, metavar="N")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome / Perfetto trace of the run")
    p.add_argument("--trace-by-class", action="store_true", help="one trace track per core class")


def _fail(msg: str) -> int:
    print(msg, file=sys.stderr)
    return 1


def _program(model: str, target: str | None, static: bool):
    """(segment program, target name) for MODEL or IR."""
    from meshrt.diagnostics import MeshrtError
    from meshrt.runtime.mesh_sim import compile_program, parse_ir, program_of

    if model.endswith(".mlir"):
        try:
            text = Path(model).read_text()
        except OSError as e:
            raise MeshrtError.located(f"{model}: error: cannot read: {e.strerror or e}") from None
        if static:
            raise MeshrtError.located(f"{model}: error: --static and --compare need a model, not IR "
                                      "(compile one with --dynamism none)")
        program = program_of(_lower_to_segments(parse_ir(text, model), model))
        return program, target or program.target.data
    tname = target or "test32"
    return compile_program(model, tname, dynamism=() if static else None), tname


# The first pass still to run on IR of each level to reach checked, coloured segments.
_REST = {
    "graph.model": "segments",
    "mesh_kernel.program": "synthesize-schedules",
    "event.schedule": "materialize-segments",
    "segment.program": "color-routes",
}


def _lower_to_segments(module, filename: str):
    """Take IR of any level down to verified, coloured segment IR (restart anywhere)."""
    from meshrt.diagnostics import MeshrtError
    from meshrt.passes.pipeline import LEVEL_PIPELINES, run_pipeline

    top = [op.name for op in module.body.block.ops]
    level = next((n for n in top if n in _REST), None)
    if level is None:
        raise MeshrtError.located(f"{filename}: error: no graph.model, mesh_kernel.program, "
                                  "event.schedule or segment.program to run")
    passes = LEVEL_PIPELINES["segments"].split(",")
    if level == "segment.program":
        # run as compiled; only check it (colouring must already have happened)
        run_pipeline(module, "check-segments{handshakes=true}")
        return module
    first = 0 if level == "graph.model" else next(i for i, p in enumerate(passes) if p == _REST[level])
    run_pipeline(module, ",".join(passes[first:]))
    return module


def _serve(args, static: bool):
    from meshrt.runtime.serving import serve, tiny_workload
    from meshrt.targets import load_target

    program, tname = _program(args.model, args.target, static)
    target = load_target(tname)
    hp = program.hparams.data
    max_seq, vocab = int(hp["max_seq"].value.data), int(hp["vocab"].value.data)
    reqs = tiny_workload(args.workload, args.requests, args.workload_seed, max_seq, vocab,
                         target.clock_hz, args.rate or None)
    return serve(program, target, reqs, seed=args.seed, weight_seed=args.weights_seed,
                 queue_capacity=args.queue, max_cycles=args.max_cycles, trace=bool(args.trace),
                 safe=not args.unsafe)


def main(args: argparse.Namespace) -> int:
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.kernels.numerics import DataLayoutError
    from meshrt.runtime.workloads import WorkloadError

    for flag, v, low in (("--requests", args.requests, 1), ("--queue", args.queue, 1),
                         ("--max-cycles", args.max_cycles, 1), ("--rate", args.rate, 0)):
        if v < low:
            return _fail(f"meshrt run: error: {flag} must be at least {low}, got {v}")
    runs = [("static", True), ("meshrt", False)] if args.compare else [
        ("static" if args.static else "meshrt", args.static)]
    results = {}
    try:
        for name, static in runs:
            results[name] = _serve(args, static)
    except (FrontendError, WorkloadError) as e:
        return _fail(str(e))
    except MeshrtError as e:
        return _fail(str(e))
    except DataLayoutError as e:
        return _fail(f"{args.model}: error: {e}")
    summaries = {name: r.summary() for name, r in results.items()}
    if args.trace:
        from meshrt.runtime.trace import write_trace

        last = results[runs[-1][0]]
        try:
            write_trace(last.sim, args.trace, by_class=args.trace_by_class)
        except OSError as e:
            return _fail(f"{args.trace}: error: cannot write trace: {e.strerror or e}")
    if args.compare:
        s, m = summaries["static"], summaries["meshrt"]
        out = {"static": s, "meshrt": m, "speedup_system_throughput":
               m["system_tokens_per_mcycle"] / s["system_tokens_per_mcycle"]
               if s["system_tokens_per_mcycle"] else None}
    else:
        out = summaries[runs[0][0]]
    if args.json:
        print(json.dumps(out, default=str))
    else:
        _print(summaries)
    ok = all(r.outputs_match_reference and not r.mismatches for r in results.values())
    return 0 if ok else 1


def _print(summaries: dict[str, dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    names = list(summaries)
    t = Table(title="meshrt run")
    t.add_column("metric")
    for n in names:
        t.add_column(n, justify="right")
    rows = [
        ("outputs match NumPy", "outputs_match_reference", "{}"),
        ("requests completed", "requests_completed", "{}"),
        ("requests rejected", "requests_rejected", "{}"),
        ("requests unfinished", "requests_unfinished", "{}"),
        ("cycles", "cycles", "{:,}"),
        ("TPOT (cycles)", "tpot_cycles", "{:,.0f}"),
        ("TTFT (cycles)", "ttft_cycles", "{:,.0f}"),
        ("system tokens / Mcycle", "system_tokens_per_mcycle", "{:.2f}"),
        ("padding fraction", "padding_fraction", "{:.1%}"),
        ("events", "events", "{:,}"),
        ("events / s", "events_per_second", "{:,.0f}"),
    ]
    for label, key, fmt in rows:
        t.add_row(label, *[fmt.format(summaries[n][key]) if summaries[n][key] is not None else "-"
                           for n in names])
    for k in summaries[names[0]]["stall_cycles"]:
        t.add_row(f"core cycles waiting: {k}", *[f"{summaries[n]['stall_cycles'][k]:,}" for n in names])
    Console().print(t)
    for n in names:
        for r in summaries[n]["reports"]:
            print(f"{n}: {r}")
        for r in summaries[n]["rejections"]:
            print(f"{n}: rejected {r}")
