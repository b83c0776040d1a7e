"""Interpreter speed and a long asynchrony sweep (run by hand, not by the tests).

    python bench/bench_interpreter.py                 # speed, side by side
    python bench/bench_interpreter.py --sweep 100     # + 100 seeds per tiny model vs NumPy
    python bench/bench_interpreter.py --profile       # + where the time goes

Speed: events per second and wall time per decode step of tiny_moe on the
32 x 32 test mesh, with numerics (the serving loop, tensors in every
message) and timing only (the same tables, no data plane), measured in one
run. A decode step here is one micro-batch through one core's table.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import time

import numpy as np

from meshrt.runtime.cost_model import default_in_flight
from meshrt.driver import segment_program
from meshrt.runtime.mesh_sim import MeshSim
from meshrt.runtime.serving import serve
from meshrt.runtime.workloads import Request
from meshrt.targets import load_target


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


def sweep(model: str, seeds: int) -> None:
    t = load_target("test32")
    prog = segment_program(f"examples/{model}.mrt", "test32")
    reqs = workload(5)
    bad, t0 = [], time.perf_counter()
    for seed in range(seeds):
        s = serve(prog, t, reqs, seed=seed).summary()
        # every request completed (and matches) or was rejected for a reason
        if not s["outputs_match_reference"] or s["requests_completed"] + s["requests_rejected"] != len(reqs):
            bad.append((seed, s["reports"][:1]))
    print(f"{model}: {seeds} seeds, {seeds - len(bad)} match NumPy for every completed request, "
          f"{s['requests_completed']} completed / {s['requests_rejected']} rejected each "
          f"({time.perf_counter() - t0:.0f} s); failures: {bad or 'none'}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=6)
    ap.add_argument("--sweep", type=int, default=0, metavar="SEEDS")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--models", default="tiny_dense,tiny_moe", help="models to sweep")
    args = ap.parse_args()
    speed("tiny_moe", "test32", args.requests)
    speed("tiny_dense", "test32", args.requests)
    if args.sweep:
        for model in args.models.split(","):
            sweep(model, args.sweep)
    if args.profile:
        t = load_target("test32")
        prog = segment_program("examples/tiny_moe.mrt", "test32")
        pr = cProfile.Profile()
        pr.enable()
        serve(prog, t, workload(args.requests), seed=0, check=False)
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main()
