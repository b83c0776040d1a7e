"""Reduce / AllReduce over P cores: the cost model, the interpreter and Luczynski et al.'s model.

Luczynski, Gianinazzi, Iff, Wilson, De Sensi, Hoefler, "Near-Optimal
Wafer-Scale Reduce" (HPDC 2024, arXiv 2404.15888) measured Reduce and
AllReduce on the WSE-2 (chain, tree, two-phase, ...) and fit

    T = max(C, E / N + L) + (2 T_R + 1) D

within 4 %: E the energy (wavelets x hops, summed over messages), N the
links the algorithm uses, L the distance (hops) from the farthest core to
the root, D the depth (dependent receive-add-forward stages on the longest
path), C the contention (most wavelets through one link or one core's
ramp), T_R the processor <-> router latency. `luczynski_cycles` evaluates
it for the tree our IR actually builds (`meshrt.kernels.reduce_tree`):
"chain" is one chain per side of a centred root, "two-phase" groups of S
reducing in parallel into their leads, then the leads into the root (their
two-phase algorithm, on both sides of the root). An AllReduce adds their
broadcast: one multicast from the root (D = 1).

The reductions are real IR: a mesh_kernel program with one gemv and one
allreduce on a P x 1 column (1D) or an s x s square reducing along its columns
(2D here means s column reductions in parallel: our allreduce reduces along
one axis; a full 2D Reduce to one core is two such kernels and is not
built here), lowered by the normal passes (`synthesize-schedules` with
`reduce-group` fixed to the case) and timed by the cost model and, for
small P, the interpreter. Cycles are from the first partial sent to the
root's result (Reduce: when the sum's tail leaves the root; the root adds
its last side's stream into the multicast as it passes, so the broadcast
overlaps it) or to the last core's result (AllReduce). Their model's
AllReduce is Reduce + broadcast, without that overlap: the AllReduce column
is for information; `test/unit/test_reduce_model.py` checks Reduce.

    PYTHONPATH=. python bench/bench_reduce.py [--t-r CYCLES] [--target wse3]

T_R defaults to the target's `recv_wavelet` (a wavelet's trip between the
router and the core; the WSE-2 measurement's own value is not among our
target's figures).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass

from meshrt.driver import parse_ir
from meshrt.kernels.reduce_tree import ReduceTree
from meshrt.passes.pipeline import pipeline_between, run_pipeline
from meshrt.runtime.cost_model import CostModel
from meshrt.targets import load_target

PROGRAM = """mesh_kernel.program @reduce target "{target}" mesh {W} x {H} wafers 1 stages 1 micro_batch 1 \
dynamism [] hparams {{dtype_bytes = 4 : i64}} {{
  %x = mesh_kernel.embed @embed on <(0, 0, {w}, {h})> {{layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, \
vocab = 16 : i64}} : !graph.act<{n_in}>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, {w}, {h})> {{layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64}} \
: !graph.act<{n_in}> -> !graph.act<{n}>
  %r = mesh_kernel.allreduce @ar(%g) on <(0, 0, {w}, {h})> {{layer = 0 : i64, stage = 0 : i64, \
wafer = 0 : i64, axis = "{axis}"}} : !graph.act<{n}> -> !graph.act<{n}>
}}
"""


@dataclass(frozen=True)
class Case:
    dims: int  # 1: a row of p cores; 2: a side x side square, reduced along its columns
    p: int  # cores along the reduction
    b: int  # wavelets (fp32 elements) each core contributes
    group: int  # 1: chain, S >= 2: two-phase with groups of S

    @property
    def algorithm(self) -> str:
        return "chain" if self.group < 2 else f"two-phase S={self.group}"


def build(case: Case, target):
    """The coloured segment program of one allreduce case."""
    w, h = (1, case.p) if case.dims == 1 else (case.p, case.p)
    n = case.b * w  # the allreduce's output is split over the columns: b elements per core
    text = PROGRAM.format(target=target.name, W=target.width, H=target.height, w=w, h=h, n=n,
                          n_in=max(16, h), axis="col")
    module = parse_ir(text, "<bench_reduce>")
    run_pipeline(module, f"synthesize-schedules{{reduce-group={case.group}}}", target)
    run_pipeline(module, pipeline_between("events", "segments"), target)
    return next(iter(module.body.block.ops))


def tree_of(case: Case) -> ReduceTree:
    return ReduceTree.centred(case.p, case.group)


def luczynski_cycles(tree: ReduceTree, b: int, t_r: float, allreduce: bool) -> float:
    """Luczynski et al.'s T = max(C, E/N + L) + (2 T_R + 1) D for `tree` and `b` wavelets."""
    sides = [s for s in ("a", "b") if tree.side_length(s)]
    members = sum(hi - lo + 1 for s in sides for lo, hi in tree.groups(s))
    leads = sum(len(tree.leads(s)) for s in sides)
    energy = b * (members + leads * max(tree.group, 1))
    links = tree.n - 1
    dist = max(tree.side_length(s) for s in sides)
    depth = tree.depth()
    into_root = sum((1 if tree.groups(s) and tree.groups(s)[0][0] == 1 else 0) + (1 if tree.leads(s) else 0)
                    for s in sides)
    contention = b * max(into_root, 2 if leads else 1)
    t = max(contention, energy / links + dist) + (2 * t_r + 1) * depth
    if allreduce:  # the result multicast from the root: D = 1
        t += max(b, b + dist) + (2 * t_r + 1)
    return t


def cost_model_cycles(program, target) -> tuple[float, float]:
    """(Reduce, AllReduce) cycles of kernel @ar in the cost model's steady step."""
    run = CostModel(program, target).run(3, 1, record=True)
    start, reduce_end, end = math.inf, 0.0, 0.0
    for c, recs in enumerate(run.records):
        name = run.m.classes[c].name
        ar = [r for r in recs if r[0] == 1 and r[5] == "ar"]
        if not ar:
            continue
        sends = [r for r in ar if r[3] == "send_recv"]
        # the partials leave after the local work: the first send of the kernel
        first = next((r for r in ar if r[3] == "send_recv" and r[2] - r[1] > 0 and "root" not in name), None)
        if first is not None:
            start = min(start, first[1])
        if name.endswith("root"):
            reduce_end = max(reduce_end, sends[-1][1] if sends else ar[-1][2])
        end = max(end, ar[-1][2])
    return reduce_end - start, end - start


def interpreter_cycles(program, target, seed: int = 0) -> tuple[float, float]:
    """(Reduce, AllReduce) cycles of kernel @ar in the interpreter's second step."""
    from meshrt.runtime.mesh_sim import MeshSim

    res = MeshSim(program, target, seed=seed, trace=True).run(3)
    if not res.completed:
        raise RuntimeError(res.summary())
    lo, hi = res.step_cycles[0], res.step_cycles[0] + res.step_cycles[1]
    start, reduce_end, end = math.inf, 0.0, 0.0
    for _, _, name, a, b in res.spans:
        if not lo <= a < hi:
            continue
        if name.startswith("send ar.") and not name.startswith("send ar.up"):
            start = min(start, a)
        if name == "send ar.up":  # the root: its sum leaves (a forward: with the last side's tail)
            reduce_end = max(reduce_end, b)
        if name in ("recv ar.up", "wait ar.up"):
            end = max(end, b)
    return reduce_end - start, end - start


CASES_1D = [Case(1, p, b, g) for p in (16, 64, 256, 512) for b in (1, 64, 1024)
            for g in (1, 0)]


def cases(simulate_up_to: int):
    for c in CASES_1D:
        g = c.group or max(2, round(math.sqrt(c.p / 2)))
        yield Case(1, c.p, c.b, g if c.group == 0 else 1)
    for s in (8, 16, 32):
        for b in (16, 256):
            yield Case(2, s, b, 1)
            yield Case(2, s, b, max(2, round(math.sqrt(s / 2))))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target", default="wse3")
    ap.add_argument("--t-r", type=float, default=None, help="processor <-> router latency (cycles)")
    ap.add_argument("--simulate-up-to", type=int, default=64, help="largest P the interpreter runs")
    args = ap.parse_args()
    target = load_target(args.target)
    t_r = args.t_r if args.t_r is not None else target.costs["recv_wavelet"]
    print(f"Reduce / AllReduce on {target.name}, T_R = {t_r:g}; cycles (cost model | interpreter | "
          "Luczynski et al.), error = cost model / theirs - 1")
    head = (f"{'dim':>3} {'P':>5} {'B':>5} {'algorithm':<15} | {'reduce cm':>9} {'interp':>8} {'paper':>8} "
            f"{'err':>6} | {'allred cm':>9} {'interp':>8} {'paper':>8} {'err':>6}")
    print(head)
    print("-" * len(head))
    for case in cases(args.simulate_up_to):
        prog = build(case, target)
        r_cm, a_cm = cost_model_cycles(prog, target)
        sim = case.p * (case.p if case.dims == 2 else 1) <= args.simulate_up_to ** (2 if case.dims == 2 else 1)
        r_in, a_in = interpreter_cycles(prog, target) if sim and case.p <= args.simulate_up_to else (None, None)
        tree = tree_of(case)
        r_pa = luczynski_cycles(tree, case.b, t_r, False)
        a_pa = luczynski_cycles(tree, case.b, t_r, True)

        def f(v):
            return f"{v:8,.0f}" if v is not None else f"{'-':>8}"

        print(f"{case.dims:>3} {case.p:>5} {case.b:>5} {case.algorithm:<15} | {r_cm:9,.0f} {f(r_in)} {r_pa:8,.0f} "
              f"{r_cm / r_pa - 1:+6.1%} | {a_cm:9,.0f} {f(a_in)} {a_pa:8,.0f} {a_cm / a_pa - 1:+6.1%}")


if __name__ == "__main__":
    main()
