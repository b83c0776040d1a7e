"""Benchmark of the discrete-event mesh simulation (meshrt.runtime.mesh_sim).

    python bench/bench_mesh_sim.py                      # tiny_moe on test32, 3 steps
    python bench/bench_mesh_sim.py --model tiny_dense --target test16 --steps 2
    python bench/bench_mesh_sim.py --profile            # plus a cProfile summary
    python bench/bench_mesh_sim.py --model my.mrt --target my_target.toml   # any model / target

Reports the simulator's events/s and the wall and CPU time of one simulated
decode step (compile time excluded); compare builds by CPU time per step (the
closed-form network makes fewer, larger events, so events/s alone misleads). The safe build executes
the compiled route handshakes (install credits, route drains; see
meshrt.passes.insert_route_handshakes) and must report nothing; `--unsafe`
runs the ablation (no marker syncs, no handshakes, eager reconfigure) in the
diagnostic mode that records every corruption and lets the messages pass.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

from meshrt.driver import segment_program
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.targets import load_target

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny_moe", help="a bundled example's name or a .mrt path")
    ap.add_argument("--target", default="test32")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs")
    ap.add_argument("--profile", action="store_true", help="print a cProfile summary of one run")
    ap.add_argument("--unsafe", action="store_true", help="the ablation, in diagnostic mode")
    args = ap.parse_args(argv)

    t0 = time.perf_counter()
    model = args.model if args.model.endswith(".mrt") else str(EXAMPLES / f"{args.model}.mrt")
    program = segment_program(model, args.target)
    target = load_target(args.target)
    t_compile = time.perf_counter() - t0
    best = None
    for _ in range(args.repeat):
        t1 = time.perf_counter()
        sim = MeshSim(program, target, seed=args.seed, safe=not args.unsafe,
                      stop_on_corruption=not args.unsafe)
        t_build = time.perf_counter() - t1
        c0 = time.process_time()
        res = sim.run(args.steps)
        cpu = time.process_time() - c0
        if best is None or cpu < best[2]:
            best = (t_build, res, cpu)
    t_build, res, cpu = best
    cores = len(res.cores)
    print(f"{args.model} on {args.target}: {cores} cores, {args.steps} decode steps, seed {args.seed}, "
          f"{'unsafe ablation' if args.unsafe else 'safe build'}")
    print(f"  compile to segments      {t_compile:8.2f} s")
    print(f"  build simulator          {t_build:8.3f} s")
    print(f"  simulate                 {res.wall_seconds:8.3f} s  ({res.events:,} events, "
          f"{res.events_per_second:,.0f} events/s, {res.messages:,} messages)")
    print(f"  wall time per step       {res.wall_seconds / max(res.steps, 1) * 1e3:8.1f} ms")
    print(f"  CPU time per step        {cpu / max(res.steps, 1) * 1e3:8.1f} ms  (best of {args.repeat})")
    print(f"  simulated cycles / step  {res.step_cycles}")
    st = res.stall_totals()
    print(f"  handshake stalls         credit {st['credit']:,}, route drain {st['route_drain']:,} "
          f"core-cycles (marker {st['marker']:,}, drain {st['drain']:,})")
    print(f"  reports                  {len(res.reports)} "
          f"({len(res.corruptions())} corruption, {len(res.deadlocks())} deadlock)")
    if args.profile:
        sim = MeshSim(program, target, seed=args.seed, safe=not args.unsafe,
                      stop_on_corruption=not args.unsafe)
        prof = cProfile.Profile()
        prof.enable()
        sim.run(args.steps)
        prof.disable()
        pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(12)
    return 0 if args.unsafe or not res.reports else 1


if __name__ == "__main__":
    raise SystemExit(main())
