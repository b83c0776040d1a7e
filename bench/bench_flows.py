"""Which cores gather: every `all` flow of the bundled configs' builds (run by hand).

    python bench/bench_flows.py                          # every config, micro-batch 1, 2, 4, 8
    python bench/bench_flows.py --models gpt-oss-120b --micro-batch 1 --wafers 8
    python bench/bench_flows.py --jobs 2

An `all` flow is a gather: every receiver hears every sender's multicast and
keeps its part. The wafer-speed design (docs/design: layout-aware
redistribution) allows it only from one line of cores (a column or row that
holds one replica of the value, e.g. a norm's root column into the next
band) or one core, never from a region; this script compiles each build to
the events level and prints, per flow name (layer numbers folded), how many
such flows there are, the most senders and receivers of one, and the
senders' extent. A flow whose senders span both more than one row and more
than one column is listed as a region gather; the exit status is 1 if any
build has one (or did not compile).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from meshrt.tools.workers import run_jobs

REPO = Path(__file__).resolve().parents[1]
CONFIGS = REPO / "examples" / "configs"


def gathers(job: tuple[str, int, int | None]) -> dict:
    """The `all` flows of one build, folded by name: {name: [count, senders, receivers,
    (width, height) of the largest sender set, cross-wafer count]}."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.dialects import event as ev
    from meshrt.frontend.errors import FrontendError

    model, mb, wafers = job
    try:
        module = driver.compile(CONFIGS / f"{model}.json", "wse3", "events", micro_batch=mb,
                                wafers=wafers)
    except (MeshrtError, FrontendError) as e:
        return {"error": str(e).splitlines()[0]}
    program = driver.program_of(module)
    out: dict[str, list] = {}
    for op in program.walk():
        if not isinstance(op, ev.FlowOp) or op.pattern.data != "all":
            continue
        x0, y0, x1, y1 = op.src.extent
        row = out.setdefault(re.sub(r"\d+", "#", op.sym_name.data), [0, 0, 0, (0, 0), 0])
        row[0] += 1
        if op.src.count > row[1]:
            row[1], row[3] = op.src.count, (x1 - x0, y1 - y0)
        row[2] = max(row[2], op.dst.count)
        row[4] += bool(op.cross_wafer)
    return {"flows": out, "wafers": program.num_wafers}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=sorted(p.stem for p in CONFIGS.glob("*.json")))
    ap.add_argument("--micro-batch", default="1,2,4,8")
    ap.add_argument("--wafers", type=int, default=None, help="wafer budget (default: fewest)")
    ap.add_argument("--jobs", type=int, default=1)
    args = ap.parse_args(argv)
    mbs = [int(m) for m in args.micro_batch.split(",")]
    jobs = [(m, mb, args.wafers) for m in args.models for mb in mbs]
    bad = 0
    print("| model | mb | wafers | flow | count | senders | sender extent | receivers | cross-wafer |")
    print("| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |")
    for i, res in run_jobs(gathers, jobs, args.jobs):
        model, mb, _ = jobs[i]
        if "error" in res:
            bad += 1
            print(f"| {model} | {mb} | - | did not compile: {res['error']} | | | | | |")
            continue
        for name, (n, s, r, (w, h), cross) in sorted(res["flows"].items(), key=lambda kv: -kv[1][1]):
            region = w > 1 and h > 1
            bad += region
            kind = f"{w} x {h}" + (" REGION" if region else "")
            print(f"| {model} | {mb} | {res['wafers']} | {name} | {n} | {s:,} | {kind} | {r:,} | {cross} |",
                  flush=True)
    print(f"\n{len(jobs)} builds; {bad} region gathers or failed builds")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
