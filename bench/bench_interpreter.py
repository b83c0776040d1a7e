"""Interpreter speed and a long asynchrony sweep (run by hand, not by the tests).

    python bench/bench_interpreter.py                          # speed, side by side
    python bench/bench_interpreter.py --sweep                  # 1,000 seeds per model and target
    python bench/bench_interpreter.py --sweep 100 --jobs 2     # fewer seeds, 2 processes
    python bench/bench_interpreter.py --sweep 300 --first-seed 700   # seeds 700..999 (a split sweep)
    python bench/bench_interpreter.py --sweep 50 --unsafe      # the ablation: must fail on some
    python bench/bench_interpreter.py --sweep 100 --ray local  # as Ray tasks (the ray extra)
    python bench/bench_interpreter.py --profile                # + where the time goes

Speed: events per second and wall time per decode step of tiny_moe on the
32 x 32 test mesh, with numerics (the serving loop, tensors in every
message) and timing only (the same tables, no data plane), measured in one
run. A decode step here is one micro-batch through one core's table.

Sweep: every asynchrony seed serves the same staggered five-request workload
on tiny_dense and tiny_moe on test32 and test16 (their bundled dynamism:
continuous batching, micro-batch pipelining, MoE routing; tiny_moe spans two
test16 wafers), in parallel over `--jobs` processes (or Ray tasks with
`--ray ADDRESS`); each (model, target) is compiled once here and its printed
IR parsed by the workers. Each run is one of:
match (every completed request is NumPy's, every request completed or was
rejected for a reason), mismatch, deadlock, corruption, data error, time
bound or incomplete; the table gives the counts and the first seed of each
failure. `--unsafe` drops the marker syncs and route handshakes (no NumPy
check): the sweep then shows that the checks catch it on some seeds. Exit 1
when a safe sweep fails or an unsafe one never does. Speed figures are
skipped with --sweep (run them alone). The sweep ends with a digest of
every run's cycles, events and tokens: a sweep split with --first-seed
over sessions can show, by a short overlap run on both commits, that its
parts simulated the same program.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import pstats
import signal
import sys
import time
from collections import Counter

import numpy as np

from meshrt.runtime.cost_model import default_in_flight
from xdsl.printer import Printer

from meshrt.driver import compile as compile_model
from meshrt.driver import parse_ir, program_of, segment_program
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.runtime.serving import serve
from meshrt.runtime.workloads import Request
from meshrt.targets import load_target
from meshrt.tools.workers import WorkerError, default_workers, parse_ray_address, run_jobs


def workload(n: int, seed: int = 7) -> list[Request]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        p, o = int(rng.integers(1, 6)), int(rng.integers(2, 9))
        out.append(Request(i, i * 20e-6, rng.integers(2, 256, p).tolist(), p, o, o))
    return out


def speed(model: str, target_name: str, requests: int) -> None:
    t = load_target(target_name)
    prog = segment_program(f"examples/{model}.mrt", target_name)
    res = serve(prog, t, workload(requests), seed=0)
    s = res.summary()
    steps = s["decode_steps"]
    groups = default_in_flight(prog)
    timing = MeshSim(prog, t, seed=0, inflight=groups).run(steps)
    print(f"{model} on {target_name}: {steps} decode steps, {s['requests_completed']} requests, "
          f"outputs match NumPy: {s['outputs_match_reference']}")
    print(f"  {'':14} {'events':>10} {'wall s':>8} {'events/s':>10} {'ms/step':>8}")
    for name, ev, wall in (("numerics", s["events"], s["wall_seconds"]),
                           ("timing only", timing.events, timing.wall_seconds)):
        print(f"  {name:14} {ev:>10,} {wall:>8.2f} {ev / wall:>10,.0f} {1e3 * wall / max(steps, 1):>8.1f}")


SWEEP_MODELS = ("tiny_dense", "tiny_moe")
SWEEP_TARGETS = ("test32", "test16")
OUTCOMES = ("match", "mismatch", "deadlock", "corruption", "data_error", "time_bound", "incomplete")
SWEEP_REQUESTS = 5


def printed_program(model: str, target_name: str) -> str:
    """The segment IR of `model` on `target_name`, printed: compiled once, parsed by each
    worker (a compile of tiny_moe takes seconds, a parse a fraction of one)."""
    out = io.StringIO()
    Printer(stream=out).print_op(compile_model(f"examples/{model}.mrt", target_name))
    return out.getvalue()


_PARSED: dict[tuple[str, str, str], tuple] = {}  # per worker process


def _parsed(model: str, target_name: str, text: str):
    # a plain dict, not functools.cache: Ray ships this script's functions by value, and a
    # cache wrapper only by reference to a __main__ its workers do not have
    key = (model, target_name, text)
    if key not in _PARSED:
        _PARSED[key] = (program_of(parse_ir(text, f"<{model} on {target_name}>")),
                        load_target(target_name))
    return _PARSED[key]


def outcome(s: dict, requests: int) -> str:
    """What one run's summary shows, worst first."""
    for key in ("deadlock", "corruption", "data_error", "time_bound"):
        if s[key]:
            return key
    if not s["outputs_match_reference"]:
        return "mismatch"
    if s["requests_completed"] + s["requests_rejected"] != requests:
        return "incomplete"
    return "match"


def sweep_chunk(job: tuple[str, str, str, tuple[int, ...], bool]) -> list[tuple]:
    """`sweep_one` of each seed of a chunk; job = (model, target, printed IR, seeds, unsafe)."""
    model, target_name, text, seeds, unsafe = job
    return [sweep_one(model, target_name, text, seed, unsafe) for seed in seeds]


def sweep_one(model: str, target_name: str, text: str, seed: int,
              unsafe: bool) -> tuple[str, str, int, str, str, float, str]:
    """(model, target, seed, outcome, first report line, CPU seconds, fingerprint) of one
    seeded run; the fingerprint is its cycles, events and every request's tokens."""
    t0 = time.process_time()
    prog, t = _parsed(model, target_name, text)
    res = serve(prog, t, workload(SWEEP_REQUESTS), seed=seed, safe=not unsafe, check=not unsafe)
    s = res.summary()
    what = outcome(s, SWEEP_REQUESTS)
    first = s["reports"][0].splitlines()[0] if s["reports"] else ""
    tokens = sorted((r.id, tuple(r.tokens)) for r in res.records)
    fingerprint = repr((model, target_name, seed, res.sim.cycles, res.sim.events, tokens))
    return model, target_name, seed, what, first, time.process_time() - t0, fingerprint


SWEEP_CHUNK = 8  # seeds per job: the printed IR travels (and is parsed) once per chunk


def sweep(models: list[str], targets: list[str], seeds: int, jobs: int, unsafe: bool = False,
          first_seed: int = 0, ray_address: str | None = None) -> int:
    """Seeds first_seed..first_seed+seeds-1 on every (model, target); prints the table,
    returns the exit code."""
    t_compile = time.perf_counter()
    texts = {(m, t): printed_program(m, t) for m in models for t in targets}
    t_compile = time.perf_counter() - t_compile
    # chunk by chunk over the configurations, so an interrupted sweep (Ctrl-C, SIGTERM)
    # still covers them all evenly: it prints the table of the runs done
    all_seeds = list(range(first_seed, first_seed + seeds))
    work = [(m, t, texts[m, t], tuple(all_seeds[i:i + SWEEP_CHUNK]), unsafe)
            for i in range(0, len(all_seeds), SWEEP_CHUNK) for m in models for t in targets]
    n_runs = seeds * len(texts)
    counts: dict[tuple[str, str], Counter] = {(m, t): Counter() for m in models for t in targets}
    first: dict[tuple[str, str, str], tuple[int, str]] = {}
    cpu, t0, done = 0.0, time.perf_counter(), 0
    prints: list[str] = []
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt))
    interrupted = False
    results = run_jobs(sweep_chunk, work, jobs, ray_address)
    try:
        for _, runs in results:
            for model, tgt, seed, what, report, secs, fp in runs:
                counts[model, tgt][what] += 1
                prints.append(fp)
                cpu += secs
                if what != "match":
                    first.setdefault((model, tgt, what), (seed, report))
                done += 1
                if done % 200 == 0:
                    print(f"  {done}/{n_runs} runs, {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    except KeyboardInterrupt:
        interrupted = True
    finally:
        results.close()  # cancels the jobs not started
    wall = time.perf_counter() - t0
    mode = "unsafe (no marker syncs or handshakes, no NumPy check)" if unsafe else "safe"
    where = f"Ray at {ray_address}" if ray_address else f"{jobs} process(es)"
    print(f"sweep, {mode}: {seeds} seeds ({first_seed}..{first_seed + seeds - 1}) x {len(counts)} "
          f"(model, target), {done} of {n_runs} runs"
          f"{' (interrupted)' if interrupted else ''}, {where}: wall {wall:.0f} s, "
          f"CPU {cpu:.0f} s in the runs, speed-up over one process {cpu / max(wall, 1e-9):.2f}x "
          f"(compiled once in {t_compile:.0f} s, the workers parse the printed IR)")
    print(f"  {'model':12} {'target':8} " + " ".join(f"{o:>10}" for o in OUTCOMES))
    for (model, tgt), c in counts.items():
        print(f"  {model:12} {tgt:8} " + " ".join(f"{c[o]:>10}" for o in OUTCOMES))
    for (model, tgt, what), (seed, report) in sorted(first.items()):
        print(f"  first {what} of {model} on {tgt}: seed {seed}: {report[:160]}")
    # Two commits (or machines) that simulate alike give the same digest over the same seeds:
    # what lets a sweep split over sessions show that the parts ran the same program.
    digest = hashlib.sha256("\n".join(sorted(prints)).encode()).hexdigest()[:16]
    print(f"  digest of the {done} runs (cycles, events, tokens): {digest}")
    failed = sum(c[o] for c in counts.values() for o in OUTCOMES if o != "match")
    if interrupted:
        return 1
    return (0 if failed else 1) if unsafe else (1 if failed else 0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--sweep", type=int, nargs="?", const=1000, default=0, metavar="SEEDS",
                    help="asynchrony seeds per model and target (default 1000)")
    ap.add_argument("--first-seed", type=int, default=0, metavar="S",
                    help="the sweep's first seed (split a sweep over machines or sessions)")
    ap.add_argument("--jobs", type=int, default=default_workers(),
                    help="sweep processes")
    ap.add_argument("--ray", type=parse_ray_address, metavar="ADDRESS",
                    help="sweep as tasks on the Ray cluster at ADDRESS ('local': start one here)")
    ap.add_argument("--unsafe", action="store_true", help="sweep the ablation: must fail on some seeds")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--models", default=",".join(SWEEP_MODELS), help="models to sweep")
    ap.add_argument("--targets", default=",".join(SWEEP_TARGETS), help="targets to sweep")
    args = ap.parse_args()
    if args.sweep:
        if args.jobs < 1:
            ap.error(f"--jobs must be at least 1, got {args.jobs}")
        if args.first_seed < 0:
            ap.error(f"--first-seed must be at least 0, got {args.first_seed}")
        try:
            return sweep(args.models.split(","), args.targets.split(","), args.sweep, args.jobs,
                         args.unsafe, args.first_seed, args.ray)
        except WorkerError as e:
            print(f"bench_interpreter: error: {e}", file=sys.stderr)
            return 1
    speed("tiny_moe", "test32", args.requests)
    speed("tiny_dense", "test32", args.requests)
    if args.profile:
        t = load_target("test32")
        prog = segment_program("examples/tiny_moe.mrt", "test32")
        pr = cProfile.Profile()
        pr.enable()
        serve(prog, t, workload(args.requests), seed=0, check=False)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)
    return 0


if __name__ == "__main__":
    sys.exit(main())
