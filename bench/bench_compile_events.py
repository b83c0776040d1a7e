"""Time and peak memory of `meshrt compile MODEL --emit events` (issue 4).

Run by hand, never as a timed test:

    python bench/bench_compile_events.py [MODEL ...] [--target wse3]

Each model is compiled in a fresh process (so peak RSS is that compile's
own); the table shows wall time, the time of each phase, ops in the event
IR, core classes, and peak resident memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

DEFAULT_MODELS = [
    "examples/tiny_moe.mrt",
    "examples/configs/gpt-oss-20b.json",
    "examples/configs/qwen3-30b-a3b.json",
    "examples/configs/gpt-oss-120b.json",
]

CHILD = r"""
import gc, io, json, resource, sys, time
from xdsl.context import Context
from xdsl.printer import Printer
from meshrt.driver import load_model
from meshrt.passes.lower_to_mesh_kernels import LowerToMeshKernels
from meshrt.passes.synthesize_schedules import SynthesizeSchedules
from meshrt.diagnostics import verify_located
from meshrt.dialects import event as ev

model, target = sys.argv[1], sys.argv[2]
t = {}
s = time.perf_counter(); m = load_model(model, target); t["map"] = time.perf_counter() - s
s = time.perf_counter(); LowerToMeshKernels().apply(Context(), m); t["lower"] = time.perf_counter() - s
s = time.perf_counter(); SynthesizeSchedules().apply(Context(), m); t["synthesize"] = time.perf_counter() - s
s = time.perf_counter(); verify_located(m); t["verify"] = time.perf_counter() - s
s = time.perf_counter(); out = io.StringIO(); Printer(stream=out).print_op(m); t["print"] = time.perf_counter() - s
ops = sum(1 for _ in m.walk())
classes = sum(1 for op in m.walk() if isinstance(op, ev.CoreClassOp))
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"phases": t, "ops": ops, "classes": classes, "rss_mb": rss, "bytes": len(out.getvalue())}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("models", nargs="*", default=DEFAULT_MODELS)
    ap.add_argument("--target", default="wse3")
    args = ap.parse_args()
    print(f"{'model':42} {'wall s':>7} {'map':>6} {'lower':>6} {'synth':>6} {'verify':>6} "
          f"{'print':>6} {'ops':>8} {'classes':>8} {'peak MB':>8}")
    for model in args.models:
        start = time.perf_counter()
        res = subprocess.run([sys.executable, "-c", CHILD, model, args.target],
                             capture_output=True, text=True)
        wall = time.perf_counter() - start
        if res.returncode:
            print(f"{model:42} failed: {res.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(res.stdout)
        p = r["phases"]
        print(f"{model:42} {wall:7.1f} {p['map']:6.1f} {p['lower']:6.1f} {p['synthesize']:6.1f} "
              f"{p['verify']:6.1f} {p['print']:6.1f} {r['ops']:8d} {r['classes']:8d} {r['rss_mb']:8.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
