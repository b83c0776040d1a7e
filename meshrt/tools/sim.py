"""`python -m meshrt.tools.sim`: the GALS mesh simulation of one model, timing only.

MODEL is a .mrt spec or a config.json (compiled to coloured segment IR for
--target), or printed IR (.mlir): segment IR runs as it is (unchecked, so a
racy program shows its corruption), IR of a higher level is lowered first.
`meshrt run` adds the numerics and the serving loop.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.runtime.mesh_sim import MeshSim

    ap = argparse.ArgumentParser(
        prog="python -m meshrt.tools.sim",
        description="GALS discrete-event simulation of a model's segment IR (timing only; "
                    "`meshrt run` adds the numerics and the serving loop)")
    ap.add_argument("model", help="model spec (.mrt / config.json) or IR (.mlir)")
    ap.add_argument("--target", default=None, help="target (default: the IR's, or test32)")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--unsafe", action="store_true", help="ablation: no marker syncs, eager reconfigure")
    ap.add_argument("--max-cycles", type=int, default=50_000_000, metavar="N",
                    help="bound on simulated time in cycles (default 50,000,000)")
    ap.add_argument("--time-limit", type=float, default=None, metavar="SECONDS",
                    help="bound on the run's wall time (default: none)")
    ap.add_argument("--trace", metavar="FILE", help="write a Chrome / Perfetto trace")
    ap.add_argument("--by-class", action="store_true", help="one trace track per core class")
    args = ap.parse_args(argv)
    for flag, v, low in (("--steps", args.steps, 1), ("--seed", args.seed, 0),
                         ("--max-cycles", args.max_cycles, 1),
                         ("--time-limit", 1.0 if args.time_limit is None else args.time_limit, 0.001)):
        if not math.isfinite(v) or v < low:
            print(f"{ap.prog}: error: {flag} must be a finite number of at least {low:g}, got {v}",
                  file=sys.stderr)
            return 1

    try:
        if driver.is_ir(args.model):
            module = driver.read_ir(args.model)
            target = driver.target_of(module, args.target)
            if driver.level_of(module) != "segments":
                driver.lower(module, "segments", target)
            program = driver.program_of(module)
        else:
            target = driver.load_target(args.target or "test32")
            program = driver.segment_program(args.model, target)
    except (MeshrtError, FrontendError) as e:  # bad input: one located line
        print(e, file=sys.stderr)
        return 1
    res = MeshSim(program, target, seed=args.seed, safe=not args.unsafe,
                  max_cycles=args.max_cycles, max_seconds=args.time_limit,
                  trace=bool(args.trace)).run(args.steps)
    print(res.summary())
    if args.trace:
        from meshrt.runtime.trace import write_trace

        write_trace(res, args.trace, by_class=args.by_class)
    return 0 if res.completed else 1


if __name__ == "__main__":
    raise SystemExit(main())
