"""Variability-aware expert placement (issue 9): MoE time gap and TPOT per policy.

    python bench/bench_place_experts.py                  # tiny_moe16 on test32, chips 0,1
    python bench/bench_place_experts.py --seeds 0,1,2 --spreads 0,0.03,0.07
    python bench/bench_place_experts.py --model examples/tiny_moe.mrt   # 1 expert per region
    python bench/bench_place_experts.py --save-models M.json            # keep the fitted models

A thin wrapper: the benchmark itself (model, chips, routing, figures, drift
scenario) is meshrt/tools/placement_bench.py, whose docstring describes it;
`meshrt bench MODEL --target T --placement` runs the same experiment beside
the cost-model benchmarks and writes it to bench.json and placement.png.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from meshrt.tools.common import BenchError
from meshrt.tools.placement_bench import (  # noqa: F401  (run_policies, run_drift: the API)
    DEFAULT_STEPS,
    DEFAULT_ZIPF,
    POLICIES,
    compile_placement,
    print_text,
    run_drift,
    run_placement,
    run_policies,
    tiny_moe16,
)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", help="a .mrt spec (default: tiny_moe16, see "
                                    "meshrt/tools/placement_bench.py)")
    ap.add_argument("--target", default="test32")
    ap.add_argument("--seeds", default="0,1", help="chips (mesh_sim seeds), comma-separated")
    ap.add_argument("--spreads", default="0,0.03,0.07", help="per-region speed spreads")
    ap.add_argument("--steps", type=int, default=DEFAULT_STEPS,
                    help="simulated decode steps per run (1 warm-up)")
    ap.add_argument("--zipf", type=float, default=DEFAULT_ZIPF, help="skew of the routing profile")
    ap.add_argument("--drift-spread", type=float, default=0.07)
    ap.add_argument("--no-drift", action="store_true")
    ap.add_argument("--save-models", metavar="PATH", help="write the last fitted region models")
    args = ap.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    spreads = [float(s) for s in args.spreads.split(",")]

    t0 = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = args.model or str(tiny_moe16(Path(tmp)))
            c = compile_placement(model, args.target)
        res = run_placement(c, model=model, seeds=seeds, spreads=spreads, steps=args.steps,
                            zipf=args.zipf, drift_spread=None if args.no_drift else args.drift_spread,
                            save_models=args.save_models, compile_s=time.perf_counter() - t0)
    except BenchError as e:
        print(" ".join(str(e).split()), file=sys.stderr)
        return 1
    print_text(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
