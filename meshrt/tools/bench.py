"""`meshrt bench`: the paper's evaluation (§6) for one model on one target, side by side.

    meshrt bench MODEL --target T [--micro-batch 1,2,4,8] [--wafers 1,2,4] [--deploy-wafers N]
                 [--workload NAME] [--jobs N]
                 [--out DIR] [--placement [--placement-seeds 0,1] [--spreads 0,0.03,0.07]
                  [--placement-steps 3]]

Compiles the model in the configurations each question needs, times every
build with the class-level cost model (`meshrt.runtime.cost_model`), prints
rich tables, and writes `bench.json` (every number, with where it comes
from and how each configuration is modelled) and PNG plots into DIR:

- governance overhead: time per output token of the compiled model vs the
  same mapping compiled without dynamism handling (`--dynamism none`), at
  micro-batch 1. Pipelining is left out of both so the mapper gives them the
  same single-stage mapping: the difference is only the governance.
- policy ablation in the paper's order (Table 4, decode): static bs=1,
  + expert parallelism, + pipelining, + continuous batching; each factor and
  their product (`ABLATION_NOTES` says how each step is modelled).
- single-user vs system throughput over micro-batch sizes, static vs meshrt
  (the paper's Figure 9; no padding correction, as there).
- padding of static batching vs batch size on the synthetic chat-like and
  reasoning-like workloads (the paper's Figure 2).
- TPOT against wafer count: the full build at the first micro-batch mapped
  onto each wafer count of `--wafers` (default: the fewest the model needs
  and twice that), the mapper spreading the layers over every wafer and
  widening their regions where they have room ("wafers" in bench.json; a
  count too small for the model is a row saying so, not an error).
- with `--placement` (MoE models on targets small enough to simulate, e.g.
  test32 / test16): the expert-placement benchmark of
  `meshrt.tools.placement_bench` -- per-layer MoE time gap and TPOT of the
  contiguous, eplb and vibe policies at per-region speed spreads
  (`--spreads`) on simulated chips (`--placement-seeds`), measured on the
  interpreter and predicted by fitted region models, and a routing-drift
  scenario with and without recalibration ("placement" in bench.json,
  placement.png).

By default each build is mapped onto the fewest wafers it needs, so the two
systems and the micro-batches may run on different hardware. `--deploy-wafers
N` maps every build of the governance, ablation and throughput questions onto
N wafers, as the paper's placements do (Qwen3.5-9B on 2 CS-3s, GPT-OSS-20B on
4, Qwen3.5-35B-A3B on 6, GPT-OSS-120B on 8): both systems then compare on
the same hardware. A build that does not fit N wafers is a row saying so.

The builds (compile + cost model, and the interpreter where it runs) are
independent: after the first, which checks the input, they run in `--jobs`
worker processes (default: one per CPU, at most 4; `--jobs 1` runs them in
this process), or as tasks on a Ray cluster with `--ray ADDRESS`
(`meshrt.tools.workers`); so do `--placement`'s simulated chips (one job per
chip and spread, each worker compiling the model once). The numbers do not
depend on it; bench.json's timing gives the wall time beside each build's
own compile and model seconds.

Beside each TPOT the tables and bench.json give the build's lower bound
(`meshrt.runtime.lower_bound`: each layer's compute at the SIMD rate over the
cores the layer uses, plus one hop per core along each dependent reduction)
and TPOT / bound, so a reader sees how far the build is from the limit.

Numbers come from three places, and the JSON says which is which: the cost
model (every cycle count and throughput on any target), the interpreter
(`mesh_sim`, run beside the cost model only on targets small enough to
simulate core by core: cycles per decode step with one micro-batch in
flight), and the workload generators (padding fractions).

Errors in the input (model, target, option values, workload) are one line
on stderr and exit 1, like `meshrt compile`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from meshrt.tools.common import INTERPRETER_MAX_CORES, BenchError, spill_value
from meshrt.tools.context_bench import context_list
from meshrt.tools.prefill_bench import DEFAULT_CHUNKS, chunk_list
from meshrt.tools.workers import default_workers, parse_ray_address
from meshrt.output import save_figure, write_text

DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
ABLATION_MICRO_BATCH = 4  # the paper's Table 4 decode column (the largest swept if 4 is not)
PADDING_BATCHES = (1, 2, 4, 8, 16, 32, 64)
PADDING_WORKLOADS = ("chat", "reasoning")
PADDING_SEEDS = (0, 1, 2, 3, 4)
PADDING_REQUESTS = 1000
INTERPRETER_SEEDS = (0, 1)
PIPELINE = "micro_batch_pipeline"
CB = "continuous_batching"
ROUTING = "moe_routing"

SOURCES = {
    "cost_model": "meshrt.runtime.cost_model: class-level timing of the compiled segment IR "
                  "with the target's costs, calibrated against the interpreter "
                  "(test/unit/test_cost_model.py, within 10 %)",
    "interpreter": "meshrt.runtime.mesh_sim: core-by-core GALS simulation of the same IR, "
                   "one micro-batch in flight (only on targets of at most "
                   f"{INTERPRETER_MAX_CORES} cores)",
    "workload": "meshrt.runtime.workloads: synthetic chat-like / reasoning-like length "
                "distributions (not the ShareGPT / OpenThoughts datasets) or a JSONL file",
    "modelled": "assumptions on top of cost-model numbers, stated in 'modelling'",
    "lower_bound": "meshrt.runtime.lower_bound: each layer's compute (the build's compute events "
                   "at the target's SIMD rate) spread over the cores the layer uses, plus the "
                   "longest dependent chain of reductions at one hop per core along each, plus "
                   "a wafer-link latency per wafer crossed on it; TPOT >= bound",
}

ABLATION_NOTES = {
    "static_bs1": "WaferLLM-style baseline: the --dynamism none build at micro-batch 1 (one "
                  "request in flight; the mapper's stages are only wafers). It has no expert "
                  "parallelism: all experts of a layer share one block, so a token's top-k "
                  "experts run one after another; modelled by running the cost model with the "
                  "expert kernels' local costs (compute, send/recv, task switches) multiplied "
                  "by top_k (dense models: no change).",
    "expert_parallelism": "the moe_routing build at micro-batch 1 (one stage): each expert on "
                          "its own region, the gate's routing metainfo resolved by relays and "
                          "experts, experts of a token in parallel. Factor 1 for dense models.",
    "pipelining": "the build with micro_batch_pipeline (and moe_routing) but without "
                  "continuous_batching, at micro-batch B: S stages with S micro-batches in "
                  "flight, throughput B / (cost-model initiation interval). Requests of a "
                  "micro-batch are batched statically, so only 1 - padding(B) of the decode "
                  "slots emit tokens (padding from the --workload).",
    "continuous_batching": "the full build at micro-batch B: finished requests' slots are "
                           "refilled every step, so every slot emits a token. Factor = "
                           "1 / (1 - padding(B)) x (initiation interval without CB / with "
                           "CB), the second term being the CF metainfo's cost.",
    "total": "product of the factors = full build's system throughput over the static bs=1 "
             "baseline's.",
}


# ---------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------


def _list_arg(text: str, conv, ok, what: str, ordered: bool):
    """Comma-separated values of `conv` that pass `ok`, distinct: sorted if `ordered`,
    else in the order given; anything else is an argparse error naming `what`."""
    bad = argparse.ArgumentTypeError(f"expected comma-separated {what}, got '{text}'")
    try:
        vals = [conv(x) for x in text.split(",")]  # an empty item is an error, not skipped
    except ValueError:
        raise bad from None
    if not vals or not all(ok(v) for v in vals):  # `ok` also rejects nan
        raise bad
    return tuple(sorted(set(vals))) if ordered else tuple(dict.fromkeys(vals))


def micro_batch_list(text: str) -> tuple[int, ...]:
    """`--micro-batch 1,2,4,8`: distinct positive integers, in increasing order."""
    return _list_arg(text, int, lambda v: v >= 1, "positive integers", ordered=True)


def wafer_list(text: str) -> tuple[int, ...]:
    """`--wafers 1,2,4`: distinct positive integers, in increasing order."""
    return _list_arg(text, int, lambda v: v >= 1, "positive integers", ordered=True)


def positive_int(text: str) -> int:
    """`--deploy-wafers N`, `--jobs N`: a positive integer."""
    return _int_at_least(text, 1, "a positive integer")


def seed_list(text: str) -> tuple[int, ...]:
    """`--placement-seeds 0,1`: distinct non-negative integers, in the order given."""
    return _list_arg(text, int, lambda v: v >= 0, "non-negative integers", ordered=False)


def spread_list(text: str) -> tuple[float, ...]:
    """`--spreads 0,0.03,0.07`: distinct fractions in [0, 1], in increasing order."""
    return _list_arg(text, float, lambda v: 0.0 <= v <= 1.0,
                     "fractions between 0 and 1 (0.03 = 3 %)", ordered=True)


def step_count(text: str) -> int:
    """`--placement-steps N`: simulated decode steps per run, at least 2 (one is warm-up)."""
    return _int_at_least(text, 2, "an integer of at least 2")


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        v = int(text)
    except ValueError:
        v = low - 1
    if v < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got '{text}'")
    return v


PLACEMENT_FLAGS = ("placement_seeds", "spreads", "placement_steps")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("model", metavar="MODEL", help="a .mrt spec or a Hugging Face config.json")
    p.add_argument("--target", required=True, metavar="T",
                   help="a bundled target (wse3, wse2, test32, test16) or a target .toml file")
    p.add_argument("--micro-batch", type=micro_batch_list, default=DEFAULT_MICRO_BATCHES,
                   metavar="LIST", help="micro-batch sizes to sweep (default 1,2,4,8)")
    p.add_argument("--wafers", type=wafer_list, metavar="LIST",
                   help="wafer counts for the TPOT-vs-wafers table (default: the fewest the "
                        "model needs and twice that)")
    p.add_argument("--deploy-wafers", type=positive_int, metavar="N",
                   help="map every build of the governance, ablation and throughput questions "
                        "onto N wafers, both systems alike (the paper's placements: "
                        "GPT-OSS-20B on 4); default: each build on the fewest it needs")
    p.add_argument("--jobs", type=positive_int, metavar="N",
                   help="worker processes for the builds and --placement's chips (default: "
                        "one per CPU, at most 4; 1: in this process)")
    p.add_argument("--ray", type=parse_ray_address, metavar="ADDRESS",
                   help="run the builds and --placement's chips as tasks on the Ray cluster at "
                        "ADDRESS ('local': start one here); needs the ray extra")
    p.add_argument("--workload", default="chat", metavar="NAME",
                   help="workload whose padding prices continuous batching: chat, reasoning "
                        "(synthetic) or a .jsonl file (default chat)")
    p.add_argument("--out", metavar="DIR",
                   help="where bench.json and the plots go (default bench-MODEL-TARGET)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode",
                   help="decode (default): the questions above; prefill: prefill throughput at "
                        "the model's context over --micro-batch and --prefill-chunk (single-user "
                        "and system, static vs meshrt, Table 4's prefill ablation), with "
                        "prefill.png")
    p.add_argument("--prefill-chunk", type=chunk_list, metavar="LIST",
                   help=f"--phase prefill: prompt tokens a slot prefills a step, each micro-batch "
                        f"at its best (default {','.join(map(str, DEFAULT_CHUNKS))})")
    p.add_argument("--context", type=context_list, metavar="LIST",
                   help="instead of the other questions: decode TPOT, per-user throughput and "
                        "the time in full-attention layers as the context grows, e.g. "
                        "4k,16k,32k,64k,128k (k = 1024 positions), with context.png")
    p.add_argument("--kv-spill", type=spill_value, metavar="N",
                   help="--context: MoE layers' attention regions hold N positions, a context "
                        "past N spills the rest to their expert cores (docs/kernels.md)")
    p.add_argument("--placement", action="store_true",
                   help="also run the expert-placement benchmark (MoE models on targets the "
                        "interpreter simulates, e.g. test32): contiguous / eplb / vibe on "
                        "simulated chips, and a routing-drift scenario with recalibration")
    p.add_argument("--placement-seeds", type=seed_list, metavar="LIST",
                   help="--placement: simulated chips (interpreter seeds; the first also runs "
                        "the drift scenario); default 0,1")
    p.add_argument("--spreads", type=spread_list, metavar="LIST",
                   help="--placement: per-region speed spreads as fractions (the drift scenario "
                        "uses the largest); default 0,0.03,0.07")
    p.add_argument("--placement-steps", type=step_count, metavar="N",
                   help="--placement: simulated decode steps per interpreter run, the first a "
                        "warm-up; default 3")


def main(args: argparse.Namespace) -> int:
    """Run `meshrt bench` from parsed arguments; 0, or 1 after a one-line error."""
    from meshrt.tools.common import fail as _fail

    out = Path(args.out or f"bench-{Path(args.model).stem}-{Path(args.target).stem}")
    try:
        if out.exists() and not out.is_dir():
            raise BenchError(f"{out}: error: --out must be a directory, and this is a file")
        if getattr(args, "phase", "decode") == "prefill":
            return _prefill_main(args, out)
        if getattr(args, "prefill_chunk", None):
            raise BenchError("meshrt bench: error: --prefill-chunk only applies with --phase prefill")
        if getattr(args, "context", None):
            return _context_main(args, out)
        if getattr(args, "kv_spill", None):
            raise BenchError("meshrt bench: error: --kv-spill only applies with --context")
        check_workload(args.workload)
        placement = placement_options(args)
        results = run_bench(args.model, args.target, args.micro_batch, args.workload,
                            progress=_progress, placement=placement,
                            wafers=getattr(args, "wafers", None),
                            deploy_wafers=getattr(args, "deploy_wafers", None),
                            jobs=getattr(args, "jobs", None) or default_workers(),
                            ray_address=getattr(args, "ray", None))
        results["meta"]["command"] = _command_line(args)
        print_tables(results)
        write_outputs(results, out)
    except BenchError as e:
        return _fail(str(e))
    print(f"wrote {out / 'bench.json'} and {len(plots_of(results))} plots in "
          f"{results['timing']['total_s']:.1f} s")
    return 0


def _context_main(args: argparse.Namespace, out: Path) -> int:
    """`--context LIST`: the long-context sweep alone (`meshrt.tools.context_bench`)."""
    from meshrt.tools import context_bench

    if args.placement:
        raise BenchError("meshrt bench: error: --context and --placement are separate runs")
    if getattr(args, "wafers", None):
        raise BenchError("meshrt bench: error: --wafers sweeps the wafer count of the other "
                         "questions; --context maps each build onto the fewest wafers or "
                         "--deploy-wafers N")
    t0 = time.perf_counter()
    ctx = context_bench.run_context(args.model, args.target, args.context,
                                    jobs=getattr(args, "jobs", None) or default_workers(),
                                    ray_address=getattr(args, "ray", None), progress=_progress,
                                    wafers=getattr(args, "deploy_wafers", None),
                                    spill=getattr(args, "kv_spill", None))
    spill = f" --kv-spill {args.kv_spill}" if getattr(args, "kv_spill", None) else ""
    return _one_question(args, out, context_bench, "context", ctx, t0,
                         f"--context {','.join(str(c) for c in args.context)}{spill}")


def _one_question(args: argparse.Namespace, out: Path, module, key: str, value: dict, t0: float,
                  flags: str) -> int:
    """Print and write a question run alone (`module`: its table, bench.json and plot
    under `key`), its command `flags` and --deploy-wafers."""
    deploy = f" --deploy-wafers {args.deploy_wafers}" if getattr(args, "deploy_wafers", None) else ""
    results = {"meta": {"model": args.model, "target": args.target,
                        "command": f"meshrt bench {args.model} --target {args.target} {flags}{deploy}",
                        "sources": {"cost_model": SOURCES["cost_model"]}},
               key: value, "timing": {"total_s": time.perf_counter() - t0}}
    module.print_table(value)
    try:
        module.write_results(results, out)
    except OSError as e:
        raise BenchError(f"{out}: error: cannot write results: {e.strerror or e}") from None
    print(f"wrote {out / 'bench.json'} and {out / module.PLOT} in "
          f"{results['timing']['total_s']:.1f} s")
    return 0


def _prefill_main(args: argparse.Namespace, out: Path) -> int:
    """`--phase prefill`: the prefill sweep alone (`meshrt.tools.prefill_bench`)."""
    from meshrt.tools import prefill_bench

    for flag, on in (("--placement", args.placement), ("--context", getattr(args, "context", None)),
                     ("--wafers", getattr(args, "wafers", None)), ("--kv-spill", getattr(args, "kv_spill", None))):
        if on:
            raise BenchError(f"meshrt bench: error: {flag} does not apply with --phase prefill")
    t0 = time.perf_counter()
    chunks = getattr(args, "prefill_chunk", None) or DEFAULT_CHUNKS
    pf = prefill_bench.run_prefill(args.model, args.target, args.micro_batch, chunks,
                                   jobs=getattr(args, "jobs", None) or default_workers(),
                                   ray_address=getattr(args, "ray", None), progress=_progress,
                                   wafers=getattr(args, "deploy_wafers", None))
    return _one_question(args, out, prefill_bench, "prefill", pf, t0,
                         f"--phase prefill --micro-batch {','.join(map(str, args.micro_batch))} "
                         f"--prefill-chunk {','.join(map(str, chunks))}")


@dataclass(frozen=True)
class PlacementOptions:
    """What `--placement` runs (see meshrt.tools.placement_bench)."""

    seeds: tuple[int, ...]
    spreads: tuple[float, ...]
    steps: int


def placement_options(args: argparse.Namespace) -> PlacementOptions | None:
    """The --placement options, or None; the other placement flags need --placement."""
    from meshrt.tools.placement_bench import DEFAULT_SEEDS, DEFAULT_SPREADS, DEFAULT_STEPS

    if not getattr(args, "placement", False):
        for name in PLACEMENT_FLAGS:
            if getattr(args, name, None) is not None:
                flag = "--" + name.replace("_", "-")
                raise BenchError(f"meshrt bench: error: {flag} only applies with --placement")
        return None
    return PlacementOptions(args.placement_seeds or DEFAULT_SEEDS,
                            args.spreads or DEFAULT_SPREADS,
                            args.placement_steps or DEFAULT_STEPS)


def _command_line(args: argparse.Namespace) -> str:
    mb = ",".join(str(b) for b in args.micro_batch)
    out = f" --out {args.out}" if args.out else ""
    if getattr(args, "wafers", None):
        out = f" --wafers {','.join(map(str, args.wafers))}" + out
    if getattr(args, "deploy_wafers", None):
        out = f" --deploy-wafers {args.deploy_wafers}" + out
    if getattr(args, "jobs", None):
        out = f" --jobs {args.jobs}" + out
    if getattr(args, "ray", None):
        out = f" --ray {args.ray}" + out
    place = ""
    opts = placement_options(args)
    if opts:
        place = (f" --placement --placement-seeds {','.join(map(str, opts.seeds))} --spreads "
                 f"{','.join(f'{s:g}' for s in opts.spreads)} --placement-steps {opts.steps}")
    return f"meshrt bench {args.model} --target {args.target} --micro-batch {mb} " \
           f"--workload {args.workload}{out}{place}"


def _progress(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# Builds
# ---------------------------------------------------------------------------


@dataclass
class Build:
    """One compiled configuration and its timing."""

    label: str
    micro_batch: int
    dynamism: tuple[str, ...]
    stages: int = 0
    in_flight: int = 1  # micro-batches circulating in steady state
    wafers: int = 0
    cores: int = 0
    latency_cycles: float = 0.0  # decode step, one micro-batch in flight (the cost model)
    interval_cycles: float = 0.0  # initiation interval with `in_flight` micro-batches
    tpot_cycles: float = 0.0
    stage_cycles: list[float] = field(default_factory=list)
    stage_kernels: list[tuple[str, str]] = field(default_factory=list)
    critical_path: dict[str, float] = field(default_factory=dict)
    bound_cycles: float = 0.0  # lower bound on the decode step (meshrt.runtime.lower_bound)
    bound_compute_cycles: float = 0.0
    bound_hop_cycles: float = 0.0
    bound_wafer_cycles: float = 0.0
    no_ep_cycles: float | None = None  # static MoE builds: step with the top-k experts in series
    interpreter_cycles: float | None = None  # mesh_sim, where the target is small
    interpreter_error: str | None = None
    compile_s: float = 0.0
    model_s: float = 0.0
    interpreter_s: float = 0.0
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


class Builder:
    """Compiles and times builds of one model on one target, each once."""

    def __init__(self, model: str, target: str, progress: Callable[[str], None] | None = None,
                 deploy_wafers: int | None = None):
        from meshrt import driver
        from meshrt.frontend.errors import FrontendError

        self.model = model
        self.target_arg = target  # what workers load the target from
        try:
            self.target = driver.load_target(target)
        except FrontendError as e:
            raise BenchError(str(e)) from None
        self.progress = progress or (lambda _msg: None)
        self.cache: dict[tuple[int, tuple[str, ...] | None, int | None], Build] = {}
        self.hparams: dict[str, float] = {}
        self.spec_dynamism: tuple[str, ...] = ()
        self.simulate = self.target.cores <= INTERPRETER_MAX_CORES
        self.deploy_wafers = deploy_wafers  # wafers of every build not given its own

    def build(self, label: str, micro_batch: int, dynamism: Sequence[str] | None,
              required: bool = False, wafers: int | None = None) -> Build:
        """Compile (dynamism None: the spec's own kinds; wafers None: `deploy_wafers`, else
        the fewest) and time; errors kept unless required."""
        key = self._key(micro_batch, dynamism, wafers)
        if key in self.cache:
            b = self.cache[key]
            if required and not b.ok:  # built in a worker (`prefetch`), which keeps errors
                raise BenchError(b.error)
            return b
        b = Build(label, micro_batch, tuple(dynamism or ()))
        t0 = time.perf_counter()
        try:
            program = self._compile(micro_batch, dynamism, key[2])
            b.compile_s = time.perf_counter() - t0
            self._time(b, program)
        except BenchError as e:
            if required:
                raise
            b.error = str(e)
        self._report(b)
        self.cache[key] = b
        return b

    def _key(self, micro_batch: int, dynamism: Sequence[str] | None,
              wafers: int | None) -> tuple[int, tuple[str, ...] | None, int | None]:
        """A build's cache key: (micro-batch, dynamism, wafers), wafers None meaning
        `deploy_wafers`."""
        return (micro_batch, None if dynamism is None else tuple(dynamism),
                self.deploy_wafers if wafers is None else wafers)

    def prefetch(self, wanted: Sequence[tuple[str, int, Sequence[str] | None, int | None]],
                 jobs: int, ray_address: str | None = None) -> None:
        """Build (label, micro-batch, dynamism, wafers) of `wanted` not built yet in `jobs`
        worker processes (or as Ray tasks at `ray_address`), each a Builder of its own;
        the first label of a key names it, as a call of `build` in that order would."""
        todo: dict[tuple, tuple] = {}
        for label, mb, dyn, wafers in wanted:
            key = self._key(mb, dyn, wafers)
            if key not in self.cache and key not in todo:
                todo[key] = (label, *key)
        if (jobs <= 1 and not ray_address) or not todo:
            return  # `build` makes them one by one where they are asked for
        from meshrt.tools.workers import WorkerError, run_jobs

        keys = list(todo)
        work = [(self.model, self.target_arg, self.simulate, *todo[k]) for k in keys]
        try:
            for i, (b, hparams, spec_dynamism) in run_jobs(_build_in_worker, work, jobs,
                                                            ray_address):
                key = keys[i]
                self.cache[key] = b
                self.hparams = self.hparams or hparams
                if key[1] is None and spec_dynamism is not None:
                    self.spec_dynamism = spec_dynamism
                self._report(b)
        except WorkerError as e:
            raise BenchError(f"meshrt bench: error: {e}") from None

    def _report(self, b: Build) -> None:
        if b.ok:
            self.progress(f"{b.label} at micro-batch {b.micro_batch}: {b.stages} stage(s), "
                          f"{b.latency_cycles:,.0f} cycles/step (compile {b.compile_s:.1f} s, "
                          f"model {b.model_s:.1f} s)")
        else:
            self.progress(f"{b.label} at micro-batch {b.micro_batch}: skipped ({b.error})")

    def _compile(self, micro_batch: int, dynamism: Sequence[str] | None, wafers: int | None = None):
        from meshrt import driver
        from meshrt.diagnostics import MeshrtError
        from meshrt.frontend.errors import FrontendError

        try:
            module = driver.load_model(self.model, self.target, micro_batch=micro_batch,
                                       wafers=wafers,
                                       dynamism=None if dynamism is None else tuple(dynamism))
        except FrontendError as e:
            raise BenchError(str(e)) from None
        try:
            program = driver.segment_program(module, self.target)
        except MeshrtError as e:
            raise BenchError(f"{self.model}: error: {e.message}") from None
        if not self.hparams:
            self.hparams = {k: v.value.data for k, v in program.hparams.data.items()
                            if hasattr(v, "value")}
        if dynamism is None:
            self.spec_dynamism = program.dynamism_kinds
        return program

    def _time(self, b: Build, program) -> None:
        from meshrt.runtime.cost_model import (
            CostModel,
            CostModelError,
            estimate,
            kernels_where,
            measured_cycles_per_step,
        )
        from meshrt.runtime.lower_bound import lower_bound

        t0 = time.perf_counter()
        try:
            est = estimate(program, self.target)
        except CostModelError as e:
            raise BenchError(f"{self.model}: error: cost model: {e}") from None
        b.model_s = time.perf_counter() - t0
        b.dynamism = program.dynamism_kinds
        b.stages, b.wafers, b.in_flight = est.stages, est.wafers, est.in_flight
        b.cores = sum(c.cores.count for c in program.core_classes())
        b.latency_cycles = est.latency.cycles_per_step
        b.interval_cycles = est.pipelined.cycles_per_step
        b.tpot_cycles = est.tpot_cycles
        b.stage_cycles = [s.cycles for s in est.latency.stages]
        b.stage_kernels = [(s.first_kernel, s.last_kernel) for s in est.latency.stages]
        b.critical_path = est.latency.critical_path
        lb = lower_bound(program, self.target)
        b.bound_cycles, b.bound_compute_cycles = lb.cycles, lb.compute_cycles
        b.bound_hop_cycles, b.bound_wafer_cycles = lb.hop_cycles, lb.wafer_cycles
        experts = kernels_where(program, lambda op: op.PLACES_EXPERTS)
        if experts and not b.dynamism:
            b.no_ep_cycles = CostModel(program, self.target, kernel_scale=dict.fromkeys(
                experts, float(max(self.top_k, 1)))).estimate(1).cycles_per_step
        if self.simulate:
            t1 = time.perf_counter()
            try:
                b.interpreter_cycles = measured_cycles_per_step(program, self.target,
                                                                seeds=INTERPRETER_SEEDS)
            except Exception as e:  # the interpreter's own failure is a result, not a crash
                b.interpreter_error = f"{type(e).__name__}: {e}"
            b.interpreter_s = time.perf_counter() - t1

    @property
    def is_moe(self) -> bool:
        return self.hparams.get("experts", 0) > 0

    @property
    def top_k(self) -> int:
        return int(self.hparams.get("top_k", 0) or 0)


def _build_in_worker(job: tuple):
    """One build in a worker: job = (model, target, simulate, label, micro-batch, dynamism,
    wafers); returns (Build, the model's hparams, its spec's dynamism or None when the
    build was not of the spec's own kinds)."""
    model, target, simulate, label, micro_batch, dynamism, wafers = job
    builder = Builder(model, target)
    builder.simulate = simulate
    b = builder.build(label, micro_batch, dynamism, wafers=wafers)
    return b, builder.hparams, builder.spec_dynamism if dynamism is None else None


def wanted_builds(builder: Builder, micro_batches: Sequence[int], kinds: Sequence[str],
                  base: Build, wafers: Sequence[int] | None) -> list[tuple]:
    """The builds the questions below ask for, in the order they ask (the ablation's
    micro-batch as `ablation_micro_batch` picks it when every build succeeds)."""
    out: list[tuple] = [("static", b, (), None) for b in micro_batches]
    out += [("meshrt", b, None, None) for b in micro_batches]
    out += [("governed", 1, governed_kinds(kinds), None), ("static", 1, (), None)]
    if builder.is_moe:
        out.append(("expert-parallel", 1, (ROUTING,), None))
    mb = _ablation_micro_batch(micro_batches)
    out += [("pipelined", mb, pipelined_kinds(kinds), None), ("meshrt", mb, None, None)]
    if base.ok:
        out += [(f"wafers {n}", base.micro_batch, None, n)
                for n in wafer_counts(base.wafers, wafers) if n != base.wafers]
    return out


# ---------------------------------------------------------------------------
# The four questions
# ---------------------------------------------------------------------------


def run_bench(model: str, target: str, micro_batches: Sequence[int], workload: str,
              progress: Callable[[str], None] | None = None,
              placement: PlacementOptions | None = None,
              wafers: Sequence[int] | None = None, deploy_wafers: int | None = None,
              jobs: int = 1, ray_address: str | None = None) -> dict:
    """Every number of the benchmark as one JSON-ready dict; the builds after the first in
    `jobs` worker processes."""
    t0 = time.perf_counter()
    if ray_address:  # before any compilation, like every other input check
        from meshrt.tools.workers import WorkerError, check_cluster

        try:
            check_cluster(ray_address)
        except WorkerError as e:
            raise BenchError(f"meshrt bench: error: {e}") from None
    builder = Builder(model, target, progress, deploy_wafers)
    placed = None
    if placement:
        from meshrt.tools.placement_bench import check_model, check_target

        check_target(builder.target, target)  # before any compilation
        check_model(model)
    first = builder.build("meshrt", micro_batches[0], None, required=True)  # bad input fails here
    if placement:
        placed = _compile_placement(model, target, progress)
    kinds = builder.spec_dynamism
    builder.prefetch(wanted_builds(builder, micro_batches, kinds, first, wafers), jobs, ray_address)
    padding = padding_curves(sorted(set(PADDING_BATCHES) | set(micro_batches)))
    cb_padding = workload_padding(workload, micro_batches, builder.hparams.get("vocab", 32000))
    clock = builder.target.clock_hz

    static = {b: builder.build("static", b, ()) for b in micro_batches}
    meshrt = {b: builder.build("meshrt", b, None) for b in micro_batches}
    results = {
        "meta": {
            "model": model, "target": builder.target.name, "clock_hz": clock,
            "micro_batches": list(micro_batches), "workload": workload,
            "moe": builder.is_moe, "top_k": builder.top_k, "dynamism": list(kinds),
            "interpreter": builder.simulate, "deploy_wafers": deploy_wafers,
            "jobs": None if ray_address else jobs, "ray": ray_address,
        },
        "sources": SOURCES,
        "governance": governance(builder, kinds, clock),
        "ablation": ablation(builder, kinds, ablation_micro_batch(meshrt), cb_padding, clock),
        "pareto": pareto(builder, static, meshrt, clock),
        "wafers": wafer_scaling(builder, meshrt[micro_batches[0]], wafers, clock),
        "padding": {"batches": sorted(set(PADDING_BATCHES) | set(micro_batches)),
                    "seeds": list(PADDING_SEEDS), "requests": PADDING_REQUESTS,
                    "source": "workload", **padding},
        "builds": [_build_json(b) for b in builder.cache.values()],
    }
    results["meta"]["placement"] = placement is not None
    t_place = 0.0
    if placement:
        from meshrt.tools.placement_bench import run_placement

        t1 = time.perf_counter()
        c, compile_s = placed
        results["placement"] = run_placement(
            c, model=model, seeds=placement.seeds, spreads=placement.spreads,
            steps=placement.steps, drift_spread=max(placement.spreads),
            drift_seed=placement.seeds[0], compile_s=compile_s, progress=progress,
            workers=jobs, ray_address=ray_address, target=target)
        results["sources"] = {**SOURCES, "placement": "measured (interpreter) and predicted "
                              "(fitted region models): see placement.sources"}
        t_place = time.perf_counter() - t1 + compile_s
    results["timing"] = {
        "total_s": time.perf_counter() - t0,
        "compile_s": sum(b.compile_s for b in builder.cache.values()),
        "cost_model_s": sum(b.model_s for b in builder.cache.values()),
        "interpreter_s": sum(b.interpreter_s for b in builder.cache.values()),
        "builds": len(builder.cache),
        "placement_s": t_place,
    }
    return results


def _compile_placement(model: str, target: str,
                       progress: Callable[[str], None] | None):
    """The MoE model compiled for region timing (its MoE layers' expert regions)."""
    from meshrt.tools.placement_bench import compile_placement

    t0 = time.perf_counter()
    c = compile_placement(model, target)
    dt = time.perf_counter() - t0
    if progress:
        progress(f"placement: compiled {len(c.layers)} MoE layer(s) for region timing "
                 f"({dt:.1f} s)")
    return c, dt


def _build_json(b: Build) -> dict:
    d = asdict(b)
    d["dynamism"] = list(b.dynamism)
    d["stage_kernels"] = [list(k) for k in b.stage_kernels]
    d["source"] = {"cycles": "cost_model", "interpreter_cycles": "interpreter",
                   "bound_cycles": "lower_bound"}
    return d


def _bound_json(b: Build, tpot_cycles: float, clock: float) -> dict:
    """The build's lower bound beside one of its TPOTs."""
    return {"bound_cycles": b.bound_cycles, "bound_us": 1e6 * b.bound_cycles / clock,
            "tpot_over_bound": tpot_cycles / b.bound_cycles if b.bound_cycles else None}


def no_ep_cycles(b: Build) -> float:
    """Decode step of a static build without expert parallelism (dense: the step itself)."""
    return b.no_ep_cycles if b.no_ep_cycles is not None else b.latency_cycles


def governance(builder: Builder, kinds: Sequence[str], clock: float) -> dict:
    """TPOT of the dynamic build vs the static build of the same (single-stage) mapping."""
    dyn = builder.build("governed", 1, governed_kinds(kinds), required=True)
    st = builder.build("static", 1, (), required=True)
    out = {
        "micro_batch": 1,
        "dynamic": {"dynamism": list(dyn.dynamism), "tpot_cycles": dyn.latency_cycles,
                    "tpot_us": 1e6 * dyn.latency_cycles / clock, "stages": dyn.stages,
                    **_bound_json(dyn, dyn.latency_cycles, clock)},
        "static": {"dynamism": [], "tpot_cycles": st.latency_cycles,
                   "tpot_us": 1e6 * st.latency_cycles / clock, "stages": st.stages,
                   **_bound_json(st, st.latency_cycles, clock)},
        "overhead_cycles": dyn.latency_cycles - st.latency_cycles,
        "overhead_us": 1e6 * (dyn.latency_cycles - st.latency_cycles) / clock,
        "overhead_percent": 100.0 * (dyn.latency_cycles - st.latency_cycles) / st.latency_cycles,
        "critical_path_delta": {k: dyn.critical_path.get(k, 0.0) - st.critical_path.get(k, 0.0)
                                for k in dyn.critical_path},
        "source": "cost_model",
        "paper": "7.6-9.5 % (25-40 us per token) for Qwen3.5-9B and GPT-OSS-20B on CS-3",
        "modelling": "both builds leave out micro_batch_pipeline so that the mapper gives them "
                     "the same mapping (one stage, or one per wafer on several); TPOT is the "
                     "decode step with one request in flight",
    }
    if dyn.interpreter_cycles is not None and st.interpreter_cycles is not None:
        out["interpreter"] = {
            "dynamic_tpot_cycles": dyn.interpreter_cycles,
            "static_tpot_cycles": st.interpreter_cycles,
            "overhead_percent": 100.0 * (dyn.interpreter_cycles - st.interpreter_cycles)
            / st.interpreter_cycles,
            "source": "interpreter",
        }
    return out


def ablation_micro_batch(meshrt: dict[int, Build]) -> int:
    """The paper's micro-batch 4 when it builds, else the largest micro-batch that does."""
    return _ablation_micro_batch([b for b, m in meshrt.items() if m.ok] or list(meshrt))


def _ablation_micro_batch(built: Sequence[int]) -> int:
    return ABLATION_MICRO_BATCH if ABLATION_MICRO_BATCH in built else max(built)


def governed_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """The governance question's dynamic build: the spec's kinds but pipelining (so that
    the mapper gives it the static build's mapping)."""
    return tuple(k for k in kinds if k != PIPELINE)


def pipelined_kinds(kinds: Sequence[str]) -> tuple[str, ...]:
    """The ablation's pipelining step: the spec's kinds but continuous batching."""
    return tuple(k for k in kinds if k != CB)


def ablation(builder: Builder, kinds: Sequence[str], mb: int, padding: dict[int, float],
             clock: float) -> dict:
    """Table 4 (decode): static bs=1, + expert parallelism, + pipelining, + continuous batching."""
    k = builder.top_k if builder.is_moe else 1
    st = builder.build("static", 1, (), required=True)
    ep = builder.build("expert-parallel", 1, (ROUTING,), required=True) if builder.is_moe else st
    pipe = builder.build("pipelined", mb, pipelined_kinds(kinds))
    full = builder.build("meshrt", mb, None)
    pad = padding[mb]
    steps = [("static_bs1", 1, no_ep_cycles(st), 1.0, st),
             ("expert_parallelism", 1, ep.latency_cycles, 1.0, ep)]
    if pipe.ok and full.ok:
        steps += [("pipelining", mb, pipe.interval_cycles, 1.0 - pad, pipe),
                  ("continuous_batching", mb, full.interval_cycles, 1.0, full)]
    rows, prev = [], None
    for name, b, cycles, useful, build in steps:
        tput = useful * b * clock / cycles  # tokens/s that reach users
        rows.append({"step": name, "micro_batch": b, "stages": build.stages,
                     "in_flight": build.in_flight, "cycles_per_step": cycles,
                     "useful_fraction": useful, "tokens_per_s": tput,
                     "factor": tput / prev if prev else 1.0,
                     "dynamism": list(build.dynamism), "modelling": ABLATION_NOTES[name]})
        prev = tput
    out = {"micro_batch": mb, "top_k": k, "padding": pad, "steps": rows,
           "total": rows[-1]["tokens_per_s"] / rows[0]["tokens_per_s"],
           "complete": len(rows) == 4, "total_modelling": ABLATION_NOTES["total"],
           "source": "cost_model (cycles), workload (padding), modelled (no-EP baseline)",
           "paper": "decode, micro-bs 4: expert 1.2-1.4x, pipelining 5.5-30.1x, continuous "
                    "batching 1.6-1.7x, total 10.7-71.3x"}
    if out["complete"]:
        # what the pipelining factor is made of: the stage mapping's own step latency,
        # overlapping micro-batches, their size, and the padding they carry
        out["pipelining_parts"] = {
            "step_latency": ep.latency_cycles / pipe.latency_cycles,
            "overlap": pipe.latency_cycles / pipe.interval_cycles,
            "micro_batch": mb, "useful_fraction": 1.0 - pad}
    return out


def pareto(builder: Builder, static: dict[int, Build], meshrt: dict[int, Build],
           clock: float) -> dict:
    """Single-user vs system throughput per micro-batch (Figure 9), static vs meshrt."""
    points = []
    for b, s in static.items():
        if s.ok:
            cyc = no_ep_cycles(s)
            points.append({"system": "static", "micro_batch": b, "stages": s.stages, "in_flight": b,
                           "tpot_cycles": cyc, "step_cycles": cyc,
                           "user_tokens_per_s": clock / cyc, "system_tokens_per_s": b * clock / cyc,
                           **_bound_json(s, cyc, clock)})
    for b, m in meshrt.items():
        if m.ok:
            points.append({"system": "meshrt", "micro_batch": b, "stages": m.stages,
                           "in_flight": b * m.in_flight, "tpot_cycles": m.tpot_cycles,
                           "step_cycles": m.interval_cycles,
                           "user_tokens_per_s": clock / m.tpot_cycles,
                           "system_tokens_per_s": b * clock / m.interval_cycles,
                           "bottleneck_stage_cycles": max(m.stage_cycles, default=0.0),
                           **_bound_json(m, m.tpot_cycles, clock)})
    best = {sys_: max((p["system_tokens_per_s"] for p in points if p["system"] == sys_), default=0.0)
            for sys_ in ("static", "meshrt")}
    return {"points": points, "peak_system_ratio": best["meshrt"] / best["static"] if best["static"] else None,
            "source": "cost_model (static points: modelled without expert parallelism)",
            "modelling": "static: --dynamism none build at batch B, one stage, one batch in "
                         "flight, top-k experts run one after another; meshrt: the full build "
                         "at micro-batch B with S stages and S micro-batches in flight "
                         "(TPOT = max(step latency, S x initiation interval), system = B / "
                         "initiation interval); no padding correction, as in the paper's "
                         "Figure 9",
            "paper": "decode peak system throughput 6.3-55.8x over WaferLLM"}


def wafer_counts(fewest: int, asked: Sequence[int] | None) -> tuple[int, ...]:
    """The wafer counts of the TPOT-vs-wafers table: those asked, else the fewest and twice it."""
    return tuple(asked) if asked else (fewest, 2 * fewest)


def wafer_scaling(builder: Builder, base: Build, asked: Sequence[int] | None,
                  clock: float) -> dict:
    """TPOT of the full build at `base`'s micro-batch mapped onto each wafer count."""
    b = base.micro_batch
    counts = wafer_counts(base.wafers, asked) if base.ok else tuple(asked or ())
    points = []
    for n in counts:
        m = base if n == base.wafers and base.ok else builder.build(f"wafers {n}", b, None, wafers=n)
        row = {"wafers": n, "micro_batch": b, "ok": m.ok, "error": m.error}
        if m.ok:
            row.update({"wafers_used": m.wafers, "stages": m.stages, "cores": m.cores,
                        "step_cycles": m.latency_cycles, "tpot_cycles": m.tpot_cycles,
                        "tpot_us": 1e6 * m.tpot_cycles / clock,
                        "user_tokens_per_s": clock / m.tpot_cycles,
                        "system_tokens_per_s": b * clock / m.interval_cycles,
                        **_bound_json(m, m.tpot_cycles, clock)})
        points.append(row)
    fewest = base.wafers if base.ok and builder.deploy_wafers is None else None
    return {"micro_batch": b, "fewest": fewest, "points": points,
            "source": "cost_model",
            "modelling": "the full build (the spec's dynamism) with --wafers N: the mapper puts "
                         "contiguous runs of units on each of the N wafers (a stage each at "
                         "least) and widens the dense layers and the LM head where the wafers "
                         "have room, choosing among packings by the cost model's step time"}


def padding_curves(batches: Sequence[int]) -> dict:
    """Static-batching padding vs batch size on the two synthetic workloads (mean over seeds)."""
    from meshrt.runtime.workloads import get_workload, padding_fraction

    out = {}
    for name in PADDING_WORKLOADS:
        reqs = [get_workload(name, PADDING_REQUESTS, seed=s) for s in PADDING_SEEDS]
        out[name] = {str(b): sum(padding_fraction(r, b) for r in reqs) / len(reqs) for b in batches}
    return out


def check_workload(workload: str) -> None:
    """Fail fast on a workload name that is neither bundled nor a .jsonl path."""
    from meshrt.runtime.workloads import WORKLOADS

    if workload.endswith(".jsonl"):
        if not Path(workload).is_file():
            raise BenchError(f"{workload}: error: --workload: no such file")
    elif workload not in WORKLOADS:
        raise BenchError(f"meshrt bench: error: --workload: unknown workload '{workload}', "
                         f"expected one of {', '.join(WORKLOADS)} or a .jsonl file")


def workload_padding(workload: str, batches: Sequence[int], vocab: int) -> dict[int, float]:
    """Padding of the --workload at each micro-batch (what continuous batching recovers)."""
    from meshrt.runtime.workloads import WorkloadError, get_workload, padding_fraction

    try:
        if workload.endswith(".jsonl"):
            reqs = [get_workload(workload, vocab=int(vocab))]
        else:
            reqs = [get_workload(workload, PADDING_REQUESTS, seed=s) for s in PADDING_SEEDS]
    except WorkloadError as e:
        raise BenchError(str(e) if e.path else f"meshrt bench: --workload: {e}") from None
    return {b: sum(padding_fraction(r, b) for r in reqs) / len(reqs) for b in batches}


# ---------------------------------------------------------------------------
# Output
# ---------------------------------------------------------------------------


def _fmt(v: float, digits: int = 0) -> str:
    return f"{v:,.{digits}f}"


def _bound_cells(row: dict) -> tuple[str, str]:
    """The lower bound (us) and how far the TPOT is above it."""
    r = row.get("tpot_over_bound")
    return _fmt(row["bound_us"], 1), f"{r:,.1f}x" if r is not None else "-"


def print_tables(results: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console(file=file or sys.stdout, width=120)
    meta = results["meta"]
    con.print(f"[bold]meshrt bench[/bold] {meta['model']} on {meta['target']} "
              f"(clock {meta['clock_hz'] / 1e6:.0f} MHz); cycles from the cost model"
              + ("; interpreter beside it" if meta["interpreter"] else ""))

    g = results["governance"]
    t = Table(title=f"Governance overhead (micro-batch 1, the same {g['static']['stages']}-stage "
                    "mapping for both)")
    for col in ("build", "dynamism", "TPOT cycles", "TPOT us", "bound us", "TPOT / bound",
                "interpreter cycles"):
        t.add_column(col, justify="left" if col in ("build", "dynamism") else "right")
    gi = g.get("interpreter", {})
    t.add_row("static", "none", _fmt(g["static"]["tpot_cycles"]), _fmt(g["static"]["tpot_us"], 1),
              *_bound_cells(g["static"]), _fmt(gi["static_tpot_cycles"]) if gi else "-")
    t.add_row("meshrt", ", ".join(g["dynamic"]["dynamism"]) or "none",
              _fmt(g["dynamic"]["tpot_cycles"]), _fmt(g["dynamic"]["tpot_us"], 1),
              *_bound_cells(g["dynamic"]), _fmt(gi["dynamic_tpot_cycles"]) if gi else "-")
    t.caption = (f"overhead {_fmt(g['overhead_cycles'])} cycles = {g['overhead_percent']:.2f} %"
                 + (f" (interpreter {gi['overhead_percent']:.2f} %)" if gi else "")
                 + f"; paper: {g['paper']}")
    con.print(t)

    a = results["ablation"]
    t = Table(title=f"Policy ablation (decode, micro-batch {a['micro_batch']}, "
                    f"padding {100 * a['padding']:.1f} %)")
    for col in ("step", "micro-batch", "in flight", "cycles/step", "useful", "tokens/s", "factor"):
        t.add_column(col, justify="left" if col == "step" else "right")
    for r in a["steps"]:
        t.add_row(r["step"].replace("_", " "), str(r["micro_batch"]), str(r["in_flight"]),
                  _fmt(r["cycles_per_step"]), f"{r['useful_fraction']:.3f}",
                  _fmt(r["tokens_per_s"], 1), f"{r['factor']:.2f}x")
    t.caption = f"total {a['total']:.2f}x; paper: {a['paper']}"
    con.print(t)

    p = results["pareto"]
    t = Table(title="Single-user vs system throughput (decode)")
    for col in ("system", "micro-batch", "stages", "in flight", "TPOT cycles", "bound us",
                "TPOT / bound", "user tok/s", "system tok/s"):
        t.add_column(col, justify="left" if col == "system" else "right")
    for pt in p["points"]:
        t.add_row(pt["system"], str(pt["micro_batch"]), str(pt["stages"]), str(pt["in_flight"]),
                  _fmt(pt["tpot_cycles"]), *_bound_cells(pt), _fmt(pt["user_tokens_per_s"], 1),
                  _fmt(pt["system_tokens_per_s"], 1))
    if p["peak_system_ratio"] is not None:
        t.caption = f"peak system throughput meshrt / static: {p['peak_system_ratio']:.2f}x"
    con.print(t)

    wf = results.get("wafers")
    if wf and wf["points"]:
        t = Table(title=f"TPOT against wafer count (micro-batch {wf['micro_batch']})")
        for col in ("wafers", "stages", "cores", "step cycles", "TPOT us", "bound us",
                    "TPOT / bound", "user tok/s", "system tok/s"):
            t.add_column(col, justify="right")
        for r in wf["points"]:
            if not r["ok"]:
                t.add_row(str(r["wafers"]), "-", "-", "not built", r["error"] or "", "", "", "", "")
                continue
            t.add_row(str(r["wafers_used"]), str(r["stages"]), _fmt(r["cores"]),
                      _fmt(r["step_cycles"]), _fmt(r["tpot_us"], 1), *_bound_cells(r),
                      _fmt(r["user_tokens_per_s"], 1), _fmt(r["system_tokens_per_s"], 1))
        t.caption = ("step: one micro-batch's decode step; TPOT = max(step, stages x initiation "
                     "interval) with a micro-batch per stage in flight"
                     + (f"; the model needs at least {wf['fewest']} wafer(s) at this micro-batch"
                        if wf["fewest"] else ""))
        con.print(t)

    pad = results["padding"]
    t = Table(title="Padding of static batching\n(synthetic workloads; paper, ShareGPT: "
                    "45-52 % at batch 8)")
    t.add_column("batch", justify="right")
    for name in PADDING_WORKLOADS:
        t.add_column(f"{name} %", justify="right")
    for b in pad["batches"]:
        t.add_row(str(b), *(f"{100 * pad[n][str(b)]:.1f}" for n in PADDING_WORKLOADS))
    con.print(t)

    t = Table(title="Builds")
    for col in ("build", "micro-batch", "stages", "wafers", "step cycles", "interval cycles",
                "bound cycles", "interpreter", "compile s", "model s"):
        t.add_column(col, justify="left" if col == "build" else "right")
    for b in results["builds"]:
        if b["error"] and not b["latency_cycles"]:
            t.add_row(b["label"], str(b["micro_batch"]), "-", "-", "not built", "", "", "", "", "")
            continue
        t.add_row(b["label"], str(b["micro_batch"]), str(b["stages"]), str(b["wafers"]),
                  _fmt(b["latency_cycles"]), _fmt(b["interval_cycles"]), _fmt(b["bound_cycles"]),
                  _fmt(b["interpreter_cycles"]) if b["interpreter_cycles"] else "-",
                  f"{b['compile_s']:.1f}", f"{b['model_s']:.1f}")
    con.print(t)

    if "placement" in results:
        from meshrt.tools.placement_bench import print_rich

        print_rich(con, results["placement"])


PLOTS = ("pareto.png", "padding.png", "ablation.png", "governance.png")


def plots_of(results: dict) -> tuple[str, ...]:
    """The PNG files `write_plots` writes for these results."""
    from meshrt.tools.placement_bench import PLOT

    return PLOTS + ((PLOT,) if "placement" in results else ())


def write_outputs(results: dict, out: Path) -> None:
    """bench.json and the plots into `out` (created)."""
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_text(out / "bench.json", json.dumps(results, indent=1, default=float) + "\n")
        write_plots(results, out)
    except OSError as e:
        raise BenchError(f"{out}: error: cannot write results: {e.strerror or e}") from None


def write_plots(results: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    title = f"{Path(results['meta']['model']).stem} on {results['meta']['target']}"
    _pareto_plot(plt, results["pareto"], title, out / "pareto.png")
    _padding_plot(plt, results["padding"], out / "padding.png")
    _ablation_plot(plt, results["ablation"], title, out / "ablation.png")
    _governance_plot(plt, results["governance"], title, out / "governance.png")
    if "placement" in results:
        from meshrt.tools.placement_bench import PLOT, write_plot

        write_plot(plt, results["placement"], out / PLOT)


def _pareto_plot(plt, p: dict, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for name, marker in (("static", "s"), ("meshrt", "o")):
        pts = sorted((q for q in p["points"] if q["system"] == name), key=lambda q: q["micro_batch"])
        if not pts:
            continue
        xs = [q["user_tokens_per_s"] for q in pts]
        ys = [q["system_tokens_per_s"] for q in pts]
        ax.plot(xs, ys, marker=marker, label=name)
        for q, x, y in zip(pts, xs, ys):
            ax.annotate(f"{q['micro_batch']}", (x, y), textcoords="offset points", xytext=(4, 4),
                        fontsize=8)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("single-user throughput (tokens/s)")
    ax.set_ylabel("system throughput (tokens/s)")
    ax.set_title(f"Decode: {title} (labels: micro-batch)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _padding_plot(plt, pad: dict, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    bs = pad["batches"]
    for name in PADDING_WORKLOADS:
        ax.plot(bs, [100 * pad[name][str(b)] for b in bs], marker="o", label=f"{name}-like (synthetic)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(bs)
    ax.set_xticklabels([str(b) for b in bs])
    ax.set_xlabel("static batch size")
    ax.set_ylabel("padded decode slots (%)")
    ax.set_ylim(0, 100)
    ax.set_title("Padding of static batching")
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _ablation_plot(plt, a: dict, title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    rows = a["steps"]
    base = rows[0]["tokens_per_s"]
    names = [r["step"].replace("_", "\n") for r in rows]
    vals = [r["tokens_per_s"] / base for r in rows]
    bars = ax.bar(names, vals, color="tab:blue")
    for bar, r in zip(bars, rows):
        ax.annotate(f"{r['factor']:.2f}x", (bar.get_x() + bar.get_width() / 2, bar.get_height()),
                    ha="center", va="bottom", fontsize=8)
    ax.set_yscale("log")
    ax.set_ylabel("system throughput vs static bs=1")
    ax.set_title(f"Policy ablation, micro-batch {a['micro_batch']}: {title}")
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


def _governance_plot(plt, g: dict, title: str, path: Path) -> None:
    from meshrt.runtime.cost_model import CATEGORIES

    fig, ax = plt.subplots(figsize=(6, 4))
    static, dyn = g["static"]["tpot_us"], g["dynamic"]["tpot_us"]
    ax.bar(["static", "meshrt"], [static, dyn], color=["tab:gray", "tab:blue"])
    ax.annotate(f"{g['overhead_percent']:+.2f} %", (1, dyn), ha="center", va="bottom")
    ax.set_ylim(0, 1.15 * max(static, dyn))
    ax.set_ylabel("TPOT (us), cost model")
    delta = ", ".join(f"{k} {v:+,.0f}" for k, v in g["critical_path_delta"].items()
                      if k in CATEGORIES and abs(v) >= 1)
    ax.set_title(f"Governance overhead: {title}", fontsize=10)
    ax.set_xlabel(f"critical path change (cycles): {delta or 'none'}", fontsize=7, wrap=True)
    fig.tight_layout()
    save_figure(fig, path, dpi=120)
    plt.close(fig)


if __name__ == "__main__":  # pragma: no cover - `meshrt bench` is the entry point
    ap = argparse.ArgumentParser(prog="meshrt bench")
    add_arguments(ap)
    sys.exit(main(ap.parse_args()))
