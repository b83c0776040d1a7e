"""A corruption corpus: malformed inputs of every kind, each must be one located line.

    python bench/bench_corruption.py                        # 40 cases per kind, 2 processes
    python bench/bench_corruption.py --cases 200 --jobs 2   # more
    python bench/bench_corruption.py --kinds spec,target --show 3

Every input kind the tools read — a .mrt spec, a config.json, IR of each
level (graph, kernels, events, segments, as `meshrt compile --emit` prints
them), a target TOML, a workload JSONL, an expert profile and region models
(JSON), the command line — is corrupted by seeded random edits: a byte flipped,
the text truncated, a line deleted or duplicated, a number replaced by a huge,
negative, NaN, infinite or 1e300 value, a value nested thousands deep, bytes
that are not UTF-8. Each case runs the tool that reads it (`meshrt compile`,
`meshrt run`, `meshrt-opt`) in a subprocess with a time and memory bound, and
is judged: exit 1 with one located line on stderr and nothing else, or exit 0
when the input is still valid (a run must then match NumPy); `meshrt run`
may also exit 1 with its JSON summary when the interpreter caught a wrong
program (a mismatch with a report). Anything else — a traceback, an
"internal error", several lines, an unlocated line, a hang, a memory blow-up,
a mismatch without a report — is a failure, grouped by cause in the table.

test/unit/test_corruption.py runs a small fixed corpus of these in-process.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import re
import resource
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from functools import cache
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# WHERE: error: ... where WHERE is a file (with line and column when known) or, for a
# bad command line, the command ("meshrt run", "meshrt-opt")
LOCATED = re.compile(r"^(meshrt(-opt)?( [a-z-]+)?|\S+?(:\d+:\d+)?): error: \S")

SPECIALS = ("1e300", "-1e300", "nan", "inf", "-inf", "-1", "-7", "0", "99999999999999999999999",
            "2147483648", "18446744073709551616", "1e-300", "1.5", "-0.0", "1_000_000_000")
OPS = ("flip", "truncate", "delete_line", "duplicate_line", "number", "nest", "utf8")
NUMBER = re.compile(rb"(?<![A-Za-z0-9_%@#.])[-+]?\d+(\.\d+)?([eE][-+]?\d+)?")


def corrupt(data: bytes, op: str, r: random.Random, nest_kind: str = "json") -> bytes:
    """`data` with one edit of kind `op` at a position drawn from `r`."""
    if not data:
        return b"\xff"
    if op == "flip":
        i = r.randrange(len(data))
        return data[:i] + bytes([data[i] ^ (1 << r.randrange(8))]) + data[i + 1:]
    if op == "truncate":
        return data[:r.randrange(len(data))]
    lines = data.split(b"\n")
    if op == "delete_line":
        i = r.randrange(len(lines))
        return b"\n".join(lines[:i] + lines[i + 1:])
    if op == "duplicate_line":
        i = r.randrange(len(lines))
        return b"\n".join(lines[:i + 1] + lines[i:])
    nums = list(NUMBER.finditer(data))
    if op in ("number", "nest") and nums:
        m = nums[r.randrange(len(nums))]
        if op == "number":
            new = r.choice(SPECIALS).encode()
        else:
            depth = r.choice((200, 5000, 20000))
            new = b"[" * depth + m.group() + b"]" * depth
            if nest_kind == "argv":
                new = b"(" * depth + m.group() + b")" * depth
        return data[:m.start()] + new + data[m.end():]
    if op == "utf8":
        i = r.randrange(len(data) + 1)
        return data[:i] + r.choice((b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")) + data[i:]
    return data[:r.randrange(len(data))]  # op needs numbers and there are none: truncate


# ---------------------------------------------------------------------------
# base inputs and how each kind is read
# ---------------------------------------------------------------------------

TINY_CONFIG = {
    "model_type": "qwen3", "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 256,
    "eos_token_id": 1, "max_position_embeddings": 12, "torch_dtype": "float32",
}
WORKLOAD = "".join(json.dumps(x) + "\n" for x in (
    {"id": "a", "arrival": 0.0, "prompt": [5, 9, 17], "max_new_tokens": 4},
    {"id": "b", "arrival": 1e-5, "prompt_len": 2, "max_new_tokens": 3, "output_len": 2},
    {"arrival": 2e-5, "prompt": [3], "max_new_tokens": 5},
))


@dataclass(frozen=True)
class Kind:
    name: str
    suffix: str
    base: str  # name of the base file in the base directory
    # (corrupted file, base dir) -> (tool, argv)
    argv: Callable[[str, Path], tuple[str, list[str]]]
    runs: bool = False  # `meshrt run`: rc 0 must match NumPy, rc 1 may carry a JSON summary


def _compile(f: str, b: Path) -> tuple[str, list[str]]:
    return "meshrt", ["compile", f, "--target", "test32", "--emit", "segments"]


def _run(f: str, b: Path) -> tuple[str, list[str]]:
    return "meshrt", ["run", f, "--requests", "2", "--json"]


def _place(profile: str, models: str, b: Path) -> tuple[str, list[str]]:
    return "meshrt-opt", [str(b / "tiny_moe.graph.mlir"), "-p",
                          f'place-experts{{policy=vibe profile="{profile}" models="{models}"}}']


KINDS: dict[str, Kind] = {k.name: k for k in (
    Kind("spec", ".mrt", "tiny_moe.mrt", _compile),
    Kind("config", ".json", "tiny.json", _compile),
    Kind("graph", ".mlir", "tiny_dense.graph.mlir", _run, runs=True),
    Kind("kernels", ".mlir", "tiny_dense.kernels.mlir", _run, runs=True),
    Kind("events", ".mlir", "tiny_dense.events.mlir", _run, runs=True),
    Kind("segments", ".mlir", "tiny_dense.segments.mlir", _run, runs=True),
    Kind("moe_graph", ".mlir", "tiny_moe.graph.mlir", _run, runs=True),
    Kind("target", ".toml", "test32.toml",
         lambda f, b: ("meshrt", ["compile", "examples/tiny_dense.mrt", "--target", f, "--emit", "segments"])),
    Kind("workload", ".jsonl", "workload.jsonl",
         lambda f, b: ("meshrt", ["run", str(b / "tiny_dense.segments.mlir"), "--workload", f, "--json"]),
         runs=True),
    Kind("profile", ".json", "profile.json", lambda f, b: _place(f, str(b / "models.json"), b)),
    Kind("models", ".json", "models.json", lambda f, b: _place(str(b / "profile.json"), f, b)),
    # the command line: the corrupted "file" is the argv, one token a line
    Kind("run_flags", ".argv", "run.argv", lambda f, b: ("meshrt", _argv(f, b)), runs=True),
    Kind("compile_flags", ".argv", "compile.argv", lambda f, b: ("meshrt", _argv(f, b))),
)}


BASE = "{base}"  # where an argv names a base file (so the corruption does not depend on it)


def _argv(path: str, base: Path) -> list[str]:
    text = Path(path).read_bytes().decode("utf-8", "surrogateescape")
    return text.replace(BASE, str(base)).split("\n")


def make_base(d: Path) -> Path:
    """Write every kind's base input into `d` (valid: each runs clean)."""
    from meshrt.runtime.expert_profile import ExpertProfile, RegionModel, RegionModels
    from meshrt.tools.cli import main as cli

    d.mkdir(parents=True, exist_ok=True)
    for model in ("tiny_dense", "tiny_moe"):
        (d / f"{model}.mrt").write_text((REPO / "examples" / f"{model}.mrt").read_text())
    with contextlib.redirect_stdout(io.StringIO()):
        for model, levels in (("tiny_dense", ("graph", "kernels", "events", "segments")),
                              ("tiny_moe", ("graph",))):
            for level in levels:
                rc = cli(["compile", str(REPO / "examples" / f"{model}.mrt"), "--target", "test32",
                          "--emit", level, "-o", str(d / f"{model}.{level}.mlir")])
                assert rc == 0, (model, level)
    (d / "tiny.json").write_text(json.dumps(TINY_CONFIG, indent=1) + "\n")
    (d / "test32.toml").write_text((REPO / "meshrt" / "targets" / "test32.toml").read_text())
    (d / "workload.jsonl").write_text(WORKLOAD)
    ExpertProfile.zipf(8, [0, 1], s=1.1, seed=3, tokens=200, top_k=2).save(d / "profile.json")
    RegionModels({}, tuple(RegionModel(0.0, 1.0 + 0.5 * (i % 3)) for i in range(8)),
                 unit="relative").save(d / "models.json")
    seg = f"{BASE}/tiny_dense.segments.mlir"
    (d / "run.argv").write_text("\n".join(["run", seg, "--requests", "2", "--seed", "3", "--queue", "4",
                                           "--rate", "20", "--max-cycles", "5000000", "--workload-seed", "1",
                                           "--weights-seed", "2", "--json"]))
    (d / "compile.argv").write_text("\n".join(["compile", f"{BASE}/tiny_dense.mrt", "--target", "test32",
                                               "--micro-batch", "2", "--wafers", "1", "--dynamism",
                                               "continuous_batching,micro_batch_pipeline", "--emit", "events"]))
    return d


@dataclass(frozen=True)
class Case:
    kind: str
    seed: int

    @property
    def op(self) -> str:
        return OPS[self.seed % len(OPS)]

    def __str__(self) -> str:
        return f"{self.kind}#{self.seed}({self.op})"

    def write(self, base: Path, out: Path) -> tuple[str, list[str]]:
        """The corrupted input written into `out`; returns (tool, argv) that reads it."""
        k = KINDS[self.kind]
        data = (base / k.base).read_bytes()
        bad = corrupt(data, self.op, random.Random(f"{self.kind}:{self.seed}"),
                      "argv" if k.suffix == ".argv" else "json")
        f = out / f"{self.kind}-{self.seed}{k.suffix}"
        f.write_bytes(bad)
        return k.argv(str(f), base)


@dataclass
class Verdict:
    ok: bool
    cause: str  # why not ok (grouping key), or how it passed
    rc: int | None
    stderr: str


def judge(kind: str, rc: int | None, out: str, err: str, crash: str | None = None) -> Verdict:
    """Whether one run behaved: see the module docstring."""
    lines = err.splitlines()
    if crash:
        return Verdict(False, f"traceback: {crash}", rc, err)
    if rc is None:
        return Verdict(False, "hang (time or CPU bound)", rc, err)
    if "Traceback (most recent call last)" in err:
        return Verdict(False, f"traceback: {_last_frame(err)}", rc, err)
    if rc < 0 or rc == 137:
        return Verdict(False, f"killed (signal {-rc if rc < 0 else 9}: memory bound?)", rc, err)
    runs = KINDS[kind].runs
    summary = None
    if runs and out.strip().startswith("{"):
        try:
            summary = json.loads(out)
        except json.JSONDecodeError:
            summary = None
    if rc == 0:
        if lines:
            return Verdict(False, "exit 0 with stderr", rc, err)
        if runs and (summary is None or not summary.get("outputs_match_reference")):
            return Verdict(False, "exit 0 without matching NumPy", rc, err)
        return Verdict(True, "exit 0 (still valid)", rc, err)
    if rc != 1:
        return Verdict(False, f"exit {rc}", rc, err)
    if summary is not None and not lines:
        if summary.get("reports"):
            return Verdict(True, "exit 1, the run reports what went wrong", rc, err)
        return Verdict(False, "exit 1, outputs differ and no report says where (item 6)", rc, err)
    if len(lines) != 1:
        return Verdict(False, f"{len(lines)} lines on stderr", rc, err)
    if "internal error" in lines[0]:
        return Verdict(False, "internal error: " + _shape(lines[0]), rc, err)
    if not LOCATED.match(lines[0]):
        return Verdict(False, "unlocated: " + _shape(lines[0]), rc, err)
    if out.strip():
        return Verdict(False, "exit 1 with output on stdout", rc, err)
    return Verdict(True, "exit 1, one located line", rc, err)


def _shape(line: str) -> str:
    """A message with its file names and numbers blanked: the grouping key of a cause."""
    line = re.sub(r"\S*/\S+", "F", line)
    line = re.sub(r"\d+", "N", line)
    return line[:110]


def _last_frame(err: str) -> str:
    frames = re.findall(r'File "([^"]+)", line (\d+), in (\S+)', err)
    last = err.strip().splitlines()[-1] if err.strip() else "?"
    where = next((f"{Path(f).name}:{n} {fn}" for f, n, fn in reversed(frames) if "/meshrt/" in f),
                 frames[-1][2] if frames else "?")
    return f"{last.split(':')[0]} in {where}"


# ---------------------------------------------------------------------------
# running a case: in-process (the tests) or in a subprocess (this benchmark)
# ---------------------------------------------------------------------------

def _entry(tool: str):
    if tool == "meshrt":
        from meshrt.tools.cli import main
    else:
        from meshrt.tools.meshrt_opt import main
    return main


class _Timeout(BaseException):
    pass


def run_in_process(kind: str, tool: str, argv: list[str], timeout: int = 60) -> Verdict:
    """The tool's main in this process, bounded by SIGALRM after `timeout` seconds."""
    out, err = io.StringIO(), io.StringIO()

    def alarm(signum, frame):
        raise _Timeout

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(timeout)
    crash = None
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = _entry(tool)(argv)
    except _Timeout:
        rc = None
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    except BaseException as e:  # noqa: BLE001 - the point is to catch everything
        rc = 1
        tb = traceback.extract_tb(e.__traceback__)
        where = next((f"{Path(f.filename).name}:{f.lineno} {f.name}" for f in reversed(tb)
                      if "/meshrt/" in f.filename), tb[-1].name if tb else "?")
        crash = f"{type(e).__name__} in {where}"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return judge(kind, rc, out.getvalue(), err.getvalue(), crash)


def _limits(cpu_seconds: int, memory_bytes: int):
    def set_limits():
        os.nice(5)
        resource.setrlimit(resource.RLIMIT_CPU, (cpu_seconds, cpu_seconds + 5))
        resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    return set_limits


def run_subprocess(kind: str, tool: str, argv: list[str], timeout: int, memory_gb: float) -> Verdict:
    """One case in a child bounded by `timeout` CPU seconds (a shared machine's wall
    clock says little) and `memory_gb` of address space."""
    module = "meshrt.tools.cli" if tool == "meshrt" else "meshrt.tools.meshrt_opt"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        p = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO, capture_output=True,
                           timeout=20 * timeout, env=env,
                           preexec_fn=_limits(timeout, int(memory_gb * 2**30)), check=False)
    except subprocess.TimeoutExpired as e:
        return judge(kind, None, "", (e.stderr or b"").decode("utf-8", "replace"))
    out, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if p.returncode == -signal.SIGXCPU:
        return judge(kind, None, out, err)
    if "MemoryError" in err:
        return Verdict(False, f"memory bound ({_last_frame(err)})", p.returncode, err)
    return judge(kind, p.returncode, out, err)


@cache
def _base(path: str) -> Path:
    return Path(path)


def _bench_one(job: tuple[str, int, str, str, int, float]) -> tuple[str, int, Verdict, float]:
    kind, seed, base, out, timeout, mem = job
    case = Case(kind, seed)
    tool, argv = case.write(_base(base), Path(out))
    t0 = time.perf_counter()
    v = run_subprocess(kind, tool, argv, timeout, mem)
    return kind, seed, v, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=40, help="cases per kind")
    ap.add_argument("--first", type=int, default=0, help="first seed")
    ap.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--timeout", type=int, default=60, help="CPU seconds per case")
    ap.add_argument("--memory-gb", type=float, default=3.0, help="address-space bound per case")
    ap.add_argument("--show", type=int, default=2, help="example cases per failure cause")
    ap.add_argument("--json", metavar="FILE", help="also write every verdict here")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    for k in kinds:
        if k not in KINDS:
            ap.error(f"unknown kind '{k}', expected one of {', '.join(KINDS)}")
    tmp = Path(tempfile.mkdtemp(prefix="meshrt-corpus-"))
    base = make_base(tmp / "base")
    out = tmp / "cases"
    out.mkdir()
    jobs = [(k, s, str(base), str(out), args.timeout, args.memory_gb)
            for s in range(args.first, args.first + args.cases) for k in kinds]
    causes: dict[str, list[str]] = defaultdict(list)
    passed: Counter = Counter()
    per_kind: dict[str, Counter] = defaultdict(Counter)
    rows = []
    t0 = time.perf_counter()
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        for kind, seed, v, secs in pool.map(_bench_one, jobs):
            per_kind[kind]["ok" if v.ok else "fail"] += 1
            if v.ok:
                passed[v.cause] += 1
            else:
                causes[v.cause].append(str(Case(kind, seed)))
            rows.append({"kind": kind, "seed": seed, "ok": v.ok, "cause": v.cause, "rc": v.rc,
                         "stderr": v.stderr[-2000:], "seconds": round(secs, 2)})
    print(f"{len(jobs)} cases ({args.cases} per kind) in {time.perf_counter() - t0:.0f} s; "
          f"inputs kept in {out}")
    for k in kinds:
        print(f"  {k:14} {per_kind[k]['ok']:>5} ok {per_kind[k]['fail']:>5} failed")
    for cause, n in passed.most_common():
        print(f"  ok: {n:>5}  {cause}")
    for cause, cases in sorted(causes.items(), key=lambda kv: -len(kv[1])):
        print(f"  FAIL {len(cases):>4}  {cause}   e.g. {', '.join(cases[:args.show])}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 1 if causes else 0


if __name__ == "__main__":
    sys.exit(main())
