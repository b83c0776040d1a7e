"""`meshrt run`: serve a workload on the simulated mesh and check it against NumPy.

MODEL is a .mrt spec, a config.json or a checkpoint directory (config.json
and *.safetensors, as the hub stores a model: its weights replace the
seeded random ones) compiled to coloured segment IR for the target
(`--static` compiles the WaferLLM-style baseline without dynamism), or
printed IR (.mlir) of any level as `meshrt compile --emit`
prints it: segment IR is checked and run as it is, IR of a higher level is
lowered for its own target (or --target) first. `--compare` runs the static
baseline and the compiled model side by side in one invocation.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
from pathlib import Path


class UsageError(Exception):
    """A bad command line: one complete line for stderr."""


SEED_MAX = (1 << 63) - 1
REQUEST_BYTES = 600  # a Request, its record and the reference's output, beside 8 B a token


def add_arguments(p: argparse.ArgumentParser) -> None:
    from meshrt.runtime.workloads import WORKLOADS
    from meshrt.tools.common import add_build_options
    from meshrt.targets import available_targets

    p.add_argument("model", metavar="MODEL|DIR|IR",
                   help="a .mrt spec, a Hugging Face config.json, a checkpoint directory "
                        "(config.json + *.safetensors) or printed IR (.mlir) of any level")
    p.add_argument("--target", metavar="T",
                   help=f"a bundled target ({', '.join(available_targets())}) or a target .toml "
                        "file (default: the IR's, or test32)")
    p.add_argument("--workload", default="chat", metavar="NAME|FILE",
                   help=f"{', '.join(WORKLOADS)} (synthetic, scaled to the model's KV capacity) or "
                        "a .jsonl file (default chat)")
    p.add_argument("--requests", type=int, default=8, metavar="N",
                   help="requests to serve, at least 1 (default 8; a .jsonl file: its first N)")
    p.add_argument("--rate", type=float, default=20.0, metavar="R",
                   help="arrivals per million cycles (synthetic workloads; 0: all at once; "
                        "default 20)")
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help="seed of the asynchrony (core speeds, jitter), 0 or more (default 0)")
    p.add_argument("--workload-seed", type=int, default=0, metavar="S",
                   help="seed of the synthetic workload's lengths, arrivals and tokens (default 0)")
    p.add_argument("--weights-seed", type=int, default=None, metavar="S",
                   help="seed of the random weights (default 0; not with a checkpoint directory)")
    p.add_argument("--pushed-kv", action="store_true",
                   help="requests arrive with the KV cache of their prompt but its last token, "
                        "prefilled elsewhere (here by the NumPy reference): the host writes it "
                        "into the slot's tiles and the mesh decodes from there (a .jsonl "
                        "workload names its caches itself: its \"kv\" field)")
    p.add_argument("--queue", type=int, default=16, metavar="N",
                   help="waiting-queue capacity, at least 1 (default 16)")
    add_build_options(p)  # a model's, not IR's
    p.add_argument("--static", action="store_true",
                   help="run the static baseline build (compiled with --dynamism none)")
    p.add_argument("--compare", action="store_true", help="run static and compiled side by side")
    p.add_argument("--unsafe", action="store_true",
                   help="ablation: no marker syncs or route handshakes (shows the checks can fail)")
    p.add_argument("--max-cycles", type=int, default=200_000_000, metavar="N",
                   help="bound on simulated time in cycles: the run stops there with a time-bound "
                        "report (default 200,000,000)")
    p.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                   help="bound on the wall time of each simulated run: it stops there with a "
                        "time-bound report, the requests not done counted unfinished (default: none)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--trace", metavar="FILE", help="write a Chrome / Perfetto trace of the run")
    p.add_argument("--trace-by-class", action="store_true",
                   help="with --trace: one trace track per core class")


def _fail(msg: str) -> int:
    print(msg, file=sys.stderr)
    return 1


def _program(model: str, target: str | None, static: bool, chunk: int | str | None = None,
             context: int | str | None = None, spill: int | None = None):
    """(segment program, Target) for MODEL or IR (IR: its own target unless --target)."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError

    from meshrt.diagnostics import op_location
    from meshrt.runtime.serving import check_runnable
    from meshrt.shape import HParams, ModelShape

    if driver.is_ir(model):
        if static:
            raise MeshrtError.located(f"{model}: error: --static and --compare need a model, not IR "
                                      "(compile one with --dynamism none)")
        for flag, v in (("--prefill-chunk", chunk), ("--context", context), ("--kv-spill", spill)):
            if v is not None:
                raise MeshrtError.located(f"{model}: error: {flag} is chosen when a model is "
                                          f"compiled (meshrt compile {flag}), not on IR")
        module = driver.read_ir(model)
        tgt = driver.target_of(module, target)
        program = driver.program_of(module)
        shape, where = ModelShape.from_hparams(program, program.program_name), op_location(program)
    else:
        tgt = driver.load_target(target or "test32")
        shape, where = driver.load_spec(model).shape, model  # its fields' positions
        module = driver.load_model(model, tgt, dynamism=() if static else None, chunk=chunk or 1,
                                   context=context, spill=spill or 0)
        program = driver.program_of(module)
    # Before lowering and before anything is allocated: can this machine run it?
    check_runnable(shape, HParams.of(program).kv_slots(program), where)
    return driver.segment_program(module, tgt), tgt


def _serve(args, static: bool):
    from meshrt.runtime.serving import serve, tiny_workload
    from meshrt.shape import HParams

    program, target = _program(args.model, args.target, static, args.prefill_chunk, args.context,
                               args.kv_spill)
    hp = HParams.of(program)
    max_seq, vocab = hp.int("max_seq"), hp.int("vocab")
    weights = _checkpoint_weights(args, program)
    reqs = tiny_workload(args.workload, args.requests, args.workload_seed, max_seq, vocab,
                         target.clock_hz, args.rate or None)
    if args.pushed_kv:  # prefill done elsewhere: the reference stands in for that system
        from meshrt.runtime import kv_cache, reference as ref
        from meshrt.runtime.serving import reference_shape

        shape = reference_shape(program)
        if weights is None:
            weights = ref.Weights.random(shape, args.weights_seed or 0)
        kv_cache.prefilled_elsewhere(reqs, ref.ReferenceModel(shape, weights))
    with _progress(len(reqs), args.max_cycles) as progress:
        return serve(program, target, reqs, seed=args.seed, weight_seed=args.weights_seed or 0,
                     weights=weights, queue_capacity=args.queue, max_cycles=args.max_cycles,
                     max_seconds=args.time_limit, trace=bool(args.trace), safe=not args.unsafe,
                     progress=progress)


def _checkpoint_weights(args, program):
    """MODEL's checkpoint weights (read once for --compare), or None: random weights."""
    from meshrt.runtime.checkpoint import is_checkpoint, load_checkpoint
    from meshrt.runtime.serving import reference_shape

    if not is_checkpoint(args.model):
        return None
    if getattr(args, "_weights", None) is None:
        args._weights = load_checkpoint(args.model, reference_shape(program))
    return args._weights


@contextlib.contextmanager
def _progress(requests: int, max_cycles: int):
    """serve's progress callback: simulated cycles of --max-cycles and requests
    done, on a bar on stderr (a terminal only)."""
    from meshrt.tools.common import progress_bar

    with progress_bar("simulating", max_cycles) as update:
        yield None if update is None else lambda cycles, done: update(
            cycles, f"{cycles:,} / {max_cycles:,} cycles, {done} / {requests} requests done")


def check_flags(args: argparse.Namespace) -> None:
    """Every command-line check that needs no compilation, before any work:
    numbers in range, the workload and the target exist, and the requests
    can arrive before --max-cycles and fit this machine (UsageError)."""
    from meshrt import driver
    from meshrt.frontend.errors import FrontendError
    from meshrt.limits import check_memory
    from meshrt.runtime.workloads import WorkloadError, check_workload

    me = "meshrt run: error:"
    for flag, v, low, high in (
            ("--requests", args.requests, 1, None), ("--queue", args.queue, 1, None),
            ("--max-cycles", args.max_cycles, 1, 1 << 62), ("--rate", args.rate, 0, None),
            ("--seed", args.seed, 0, SEED_MAX), ("--workload-seed", args.workload_seed, 0, SEED_MAX),
            ("--weights-seed", args.weights_seed or 0, 0, SEED_MAX),
            ("--time-limit", 1.0 if args.time_limit is None else args.time_limit, 0.001, None)):
        if not math.isfinite(v):
            raise UsageError(f"{me} {flag} must be a finite number, got {v}")
        if v < low:
            raise UsageError(f"{me} {flag} must be at least {low}, got {v}")
        if high is not None and v > high:
            raise UsageError(f"{me} {flag} must be at most {high:,}, got {v:,}")
    from meshrt.runtime.checkpoint import is_checkpoint

    if args.weights_seed is not None and is_checkpoint(args.model):
        raise UsageError(f"{me} --weights-seed draws random weights; {args.model} is a checkpoint "
                         "with its own")
    if args.trace_by_class and not args.trace:
        raise UsageError(f"{me} --trace-by-class needs --trace FILE")
    if args.pushed_kv and args.workload.endswith(".jsonl"):
        raise UsageError(f"{me} --pushed-kv prefills a synthetic workload's requests; a .jsonl "
                         "workload names each request's cache in its \"kv\" field")
    try:
        check_workload(args.workload)
    except WorkloadError as e:
        raise UsageError(str(e) if e.path else f"{me} --workload: {e.reason}") from None
    if args.target is not None:
        try:
            driver.load_target(args.target)
        except FrontendError as e:  # a bad file is located in it; an unknown name is the flag's
            raise UsageError(str(e) if e.loc else f"{me} --target: {e.message}") from None
    synthetic = not args.workload.endswith(".jsonl")
    if synthetic and args.rate > 0:
        # Poisson arrivals at `rate` per Mcycle: the last comes after about n / rate Mcycles.
        span = args.requests / args.rate * 1e6
        if span > args.max_cycles:
            can = int(args.rate * args.max_cycles / 1e6)
            raise UsageError(
                f"{me} --requests {args.requests:,} at --rate {args.rate:g} per Mcycle arrive "
                f"over about {span:,.0f} cycles, past --max-cycles {args.max_cycles:,} (about "
                f"{can:,} arrive in time): lower --requests or raise --max-cycles or --rate")
    if synthetic:
        # Prompt and output tokens of each request, up to a slot's KV capacity (4096 at most).
        from meshrt.shape import DEFAULT_MAX_SEQ

        check_memory(args.requests * (REQUEST_BYTES + 8 * 2 * DEFAULT_MAX_SEQ),
                     f"the {args.requests:,} requests of --workload {args.workload} (up to "
                     f"{2 * DEFAULT_MAX_SEQ} tokens each)",
                     "lower --requests", "meshrt run")


def main(args: argparse.Namespace) -> int:
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.kernels.numerics import DataLayoutError
    from meshrt.runtime.workloads import WorkloadError

    try:
        check_flags(args)
    except UsageError as e:
        return _fail(str(e))
    except FrontendError as e:
        return _fail(str(e))
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
        ("requests with a pushed KV cache", "requests_pushed_kv", "{}"),
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
