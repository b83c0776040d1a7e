"""Every bundled config built on a target at each micro-batch (and wafer count), timed by the cost model.

    python bench/bench_mapper.py                                  # all configs, wse3, mb 1,2,4,8
    python bench/bench_mapper.py --micro-batch 1 --wafers 1,2     # TPOT against wafer count
    python bench/bench_mapper.py examples/configs/qwen3-8b.json --target wse3

For each (model, micro-batch, wafers) it maps the model (the default
mapper: stages bounded by the request table's control state, packings
chosen by the cost model's step time on a probe), lowers it to checked
segment IR and runs the cost model: a row with wafers, stages, the
mapper's modelled step (from its probe) beside the full build's step and
TPOT, and the compile time; or the one-line error the build stops with.
Exits 1 if any build fails. Not a timed test: the full-size builds take
seconds to a minute each.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = sorted((REPO / "examples" / "configs").glob("*.json"))


def _ints(text: str) -> list[int]:
    try:
        vals = [int(x) for x in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got '{text}'") from None
    if not vals or min(vals) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got '{text}'")
    return vals


def build(model: str, target, mb: int, wafers: int | None) -> dict:
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend import mapper
    from meshrt.frontend.errors import FrontendError
    from meshrt.runtime.cost_model import estimate

    row = {"model": Path(model).name, "micro_batch": mb, "wafers_asked": wafers}
    t0 = time.perf_counter()
    try:
        spec = driver.load_spec(model)
        m = mapper._Mapper(spec, target, mb, wafers)
        lay = m.explicit_layout() if spec.mapping.explicit else m.default_layout()
        module = mapper._Emitter(m, lay).emit()
        program = driver.segment_program(module, target)
        est = estimate(program, target)
    except (FrontendError, MeshrtError) as e:
        row["error"] = str(e).splitlines()[0]
        row["seconds"] = time.perf_counter() - t0
        return row
    row.update(wafers=est.wafers, stages=est.stages, probe_cycles=lay.step_cycles,
               step_cycles=est.latency.cycles_per_step, tpot_us=1e6 * est.tpot_cycles / target.clock_hz,
               seconds=time.perf_counter() - t0)
    return row


def main(argv: list[str] | None = None) -> int:
    from meshrt import driver

    ap = argparse.ArgumentParser(prog="bench_mapper.py", description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", help="specs or config.json files (default: the bundled configs)")
    ap.add_argument("--target", default="wse3")
    ap.add_argument("--micro-batch", type=_ints, default=[1, 2, 4, 8])
    ap.add_argument("--wafers", type=_ints, default=None,
                    help="wafer counts to map onto (default: the fewest that fit)")
    args = ap.parse_args(argv)
    target = driver.load_target(args.target)
    models = args.models or [str(p) for p in CONFIGS]
    failed = 0
    print(f"{'model':<20} {'mb':>3} {'wafers':>6} {'stages':>6} {'probe step':>14} "
          f"{'build step':>14} {'TPOT us':>11} {'s':>6}")
    for model in models:
        for mb in args.micro_batch:
            for wafers in args.wafers or [None]:
                r = build(model, target, mb, wafers)
                if "error" in r:
                    failed += 1
                    print(f"{r['model']:<20} {mb:>3} {wafers or '-':>6}  error: {r['error']}")
                    continue
                probe = f"{r['probe_cycles']:,.0f}" if r["probe_cycles"] else "-"
                print(f"{r['model']:<20} {mb:>3} {r['wafers']:>6} {r['stages']:>6} {probe:>14} "
                      f"{r['step_cycles']:>14,.0f} {r['tpot_us']:>11,.1f} {r['seconds']:>6.1f}",
                      flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
