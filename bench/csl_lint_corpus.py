"""Hold `meshrt csl-lint` to real CSL: every file of a directory tree is accepted, and
every copy with one bracket or one semicolon deleted is rejected with one located line.

    python bench/csl_lint_corpus.py DIR [DIR ...] [--stride N]

DIR is a checkout of CSL written elsewhere (Cerebras/csl-examples, MeshInfra/WaferLLM):
their files are not in this repository. `--stride N` tries every N-th deletion only (the
exhaustive run parses each file once per bracket and semicolon). Prints the files
accepted, the deletions tried and those wrongly accepted, with the first of them; exits
1 if any check fails. Run by hand (it needs the checkouts): the unit tests hold the same
properties on snippets written for them.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

# comments, strings and character literals: their brackets and semicolons are text
_SKIP = re.compile(r"//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'")


def deletion_offsets(text: str) -> list[int]:
    code = _SKIP.sub(lambda m: " " * len(m[0]), text)
    return [i for i, ch in enumerate(code) if ch in "()[]{};"]


def main(argv: list[str] | None = None) -> int:
    from meshrt.backend.csl_lint import check_csl

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--stride", type=int, default=1, help="try every N-th deletion (default 1)")
    args = ap.parse_args(argv)
    files = sorted(f for d in args.dirs for f in d.rglob("*.csl"))
    t0, c0 = time.perf_counter(), time.process_time()
    rejected, tried, accepted_broken = [], 0, []
    for f in files:
        text = f.read_text(encoding="utf-8", errors="replace")
        errors = check_csl(text, str(f))
        if errors:
            rejected.append(errors[0])
            continue
        for off in deletion_offsets(text)[::max(1, args.stride)]:
            tried += 1
            msgs = check_csl(text[:off] + text[off + 1:], str(f))
            if len(msgs) != 1:
                line = text.count("\n", 0, off) + 1
                accepted_broken.append(f"{f}:{line}: deleting {text[off]!r} gives "
                                       f"{len(msgs)} messages")
    print(f"{len(files)} files: {len(files) - len(rejected)} accepted, {len(rejected)} rejected")
    for r in rejected[:10]:
        print("  rejected:", r)
    print(f"{tried} single deletions of a bracket or ';': "
          f"{tried - len(accepted_broken)} reported once, {len(accepted_broken)} not")
    for a in accepted_broken[:10]:
        print("  not reported once:", a)
    print(f"{time.perf_counter() - t0:.1f} s wall, {time.process_time() - c0:.1f} s CPU")
    return 1 if rejected or accepted_broken or not files else 0


if __name__ == "__main__":
    sys.exit(main())
