"""Time the CSL backend: segment IR -> CSL files, and csl-lint over them.

    python bench/bench_csl.py                          # every bundled config, wse3 and wse2
    python bench/bench_csl.py MODEL --target T [--arch wse2|wse3]
    python bench/bench_csl.py --profile MODEL --target T

Lowers each model to coloured segment IR first (timed apart), then times
`emit_csl` (transport plans, allocation, layout, programs, the agreement
check against the event tables) and `check_csl` over every file written,
and prints classes, files and bytes. Not a timed test: run it by hand and
compare two builds on the same machine in one sitting.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def bench_one(model: str, target: str, arch: str | None, profile: bool) -> dict:
    from meshrt.backend.csl import emit_csl
    from meshrt.backend.csl_lint import check_csl
    from meshrt.passes.pipeline import lower_to
    from meshrt.driver import load_model

    t0 = time.perf_counter()
    module = lower_to(load_model(model, target), "csl")
    t1 = time.perf_counter()
    prof = cProfile.Profile() if profile else None
    if prof:
        prof.enable()
    out = emit_csl(module, arch)
    if prof:
        prof.disable()
    t2 = time.perf_counter()
    errors = [e for name, text in out.files.items() if name.endswith(".csl") for e in check_csl(text, name)]
    t3 = time.perf_counter()
    if prof:
        pstats.Stats(prof).sort_stats("cumulative").print_stats(20)
    csl = [n for n in out.files if n.endswith(".csl")]
    return {"model": Path(model).name, "target": target, "arch": arch or target,
            "lower_s": t1 - t0, "emit_s": t2 - t1, "lint_s": t3 - t2,
            "files": len(csl), "kbytes": sum(len(out.files[n]) for n in csl) / 1024,
            "lint_errors": len(errors)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model", nargs="?", help="a .mrt spec or config.json (default: every bundled config)")
    ap.add_argument("--target", default=None)
    ap.add_argument("--arch", choices=("wse2", "wse3"))
    ap.add_argument("--profile", action="store_true", help="cProfile emit_csl")
    a = ap.parse_args(argv)
    if a.model:
        runs = [(a.model, a.target or "wse3")]
    else:
        configs = sorted((REPO / "examples" / "configs").glob("*.json"))
        runs = [(str(c), t) for t in ("wse3", "wse2") for c in configs]
    print(f"{'model':<22} {'target':<7} {'lower s':>8} {'emit s':>8} {'lint s':>8} {'files':>6} {'KiB':>8} lint")
    for model, target in runs:
        r = bench_one(model, target, a.arch, a.profile)
        print(f"{r['model']:<22} {r['target']:<7} {r['lower_s']:8.1f} {r['emit_s']:8.1f} {r['lint_s']:8.1f} "
              f"{r['files']:6d} {r['kbytes']:8.0f} {'ok' if not r['lint_errors'] else r['lint_errors']}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
