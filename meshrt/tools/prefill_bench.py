"""`meshrt bench MODEL --target T --phase prefill [--micro-batch 1,2,4,8] [--prefill-chunk 2,4,8,16]`:
prefill on chip at the model's context (the paper's Figure 9 top, Table 2's prefill and
Table 4's prefill ablation).

Each build is the model compiled with a prefill chunk C (`--prefill-chunk`: a micro-batch
carries micro-batch x C token rows, the GEMVs become GEMMs over them with the weights
resident) and timed by the class-level cost model (`meshrt.runtime.cost_model`): the
latency of one micro-batch through every stage, and the interval between micro-batches
when one per stage circulates. A prompt of P positions (the model's KV capacity, 4K for
the bundled configs) is ceil(P / C) chunks. In a pipelined build the chunks of one
request go in consecutive micro-batches (the host lends a micro-batch's spare rows to the
oldest prompt, `meshrt.runtime.serving`), so its prefill takes (chunks - 1) intervals plus
one latency; a static build (`--dynamism none`, the WaferLLM-style baseline: one batch in
flight) takes a latency per chunk. Single-user throughput is P over that time (the time to
first token of a lone P-token prompt); system throughput is every row of a micro-batch
per interval (static: per latency). For each system and micro-batch the chunk of the
highest single-user throughput is chosen; every build is a row of bench.json. The Table 4
ablation: static at batch 1 -> pipelined at micro-batch 1 (single-user throughput) ->
micro-batch 4 (system throughput), each at its best chunk.

What it does not model yet (issue 18): the cost model has no positions, so every
attention core is charged the capacity's rows (on the critical path, the fullest core's:
exact once a chunk passes the entries one row of the region holds, docs/kernels.md); a chunk's rows are
all buffered on each core (no streaming of sub-chunks), so large chunks widen the regions.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from meshrt.tools.common import BenchError, chunk_value, increasing_list, write_question

PLOT = "prefill.png"
DEFAULT_CHUNKS = (2, 4, 8, 16)
ABLATION_BATCH = 4  # Table 4's second step: micro-batch 1 -> 4
PAPER_PIPELINE_FACTOR = "4.0-6.9x"  # Table 4, prefill, the three MoE models, static bs 1 -> micro-bs 1
PAPER_BATCH_FACTOR = "1.1-1.6x"  # Table 4, prefill, micro-bs 1 -> 4


def chunk_list(text: str) -> tuple[int, ...]:
    """`--prefill-chunk 2,4,8`: distinct integers of 1..MAX_CHUNK, increasing."""
    return increasing_list(text, chunk_value, "chunks")


def prefill_cycles(prompt: int, chunk: int, latency: float, interval: float, in_flight: int) -> float:
    """Cycles to prefill one `prompt`-token request alone: its chunks one micro-batch apart
    where the build pipelines and lends rows (chunk > 1, several micro-batches in flight),
    else one chunk per trip round the token loop."""
    chunks = math.ceil(prompt / chunk)
    if chunk > 1 and in_flight > 1:
        return (chunks - 1) * interval + latency
    return chunks * max(latency, in_flight * interval)


def _build(job: tuple) -> dict:
    """One build: job = (model, target, micro_batch, chunk, static, wafers); its row."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.frontend.mapper import map_model
    from meshrt.runtime.cost_model import CostModelError, estimate

    model, target_arg, mb, chunk, static, wafers = job
    row = {"system": "static" if static else "meshrt", "micro_batch": mb, "chunk": chunk}
    t0 = time.perf_counter()
    try:
        target = driver.load_target(target_arg)
        spec = driver.load_spec(model)
        dyn = () if static else spec.dynamism
        program = driver.segment_program(map_model(spec, target, mb, wafers, dyn, chunk), target)
        est = estimate(program, target)
    except (FrontendError, MeshrtError, CostModelError) as e:
        return row | {"error": str(e).splitlines()[0]}
    prompt = spec.shape.max_seq
    lat, ii = est.latency.cycles_per_step, est.pipelined.cycles_per_step
    cycles = prefill_cycles(prompt, chunk, lat, ii, est.in_flight)
    clock = target.clock_hz
    return row | {"prompt": prompt, "wafers": est.wafers, "stages": est.stages,
                  "in_flight": est.in_flight, "latency_cycles": lat, "interval_cycles": ii,
                  "prefill_cycles": cycles, "ttft_ms": cycles / clock * 1e3,
                  "user_tokens_per_s": prompt * clock / cycles,
                  "system_tokens_per_s": mb * chunk * clock / (ii if est.in_flight > 1 else lat),
                  "compile_model_s": time.perf_counter() - t0}


def best(rows: Sequence[dict], system: str, mb: int) -> dict | None:
    """The build of `system` at micro-batch `mb` with the highest single-user throughput."""
    ok = [r for r in rows if r["system"] == system and r["micro_batch"] == mb and "error" not in r]
    return max(ok, key=lambda r: r["user_tokens_per_s"], default=None)


def run_prefill(model: str, target: str, micro_batches: Sequence[int], chunks: Sequence[int],
                jobs: int = 1, ray_address: str | None = None,
                progress: Callable[[str], None] | None = None, wafers: int | None = None) -> dict:
    """Every build (static and meshrt, every micro-batch and chunk; a build that does not
    compile or fit is a row with its error), the chosen chunk of each, and the ablation."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.tools.workers import WorkerError, run_jobs

    progress = progress or (lambda _m: None)
    try:  # the input, before any worker
        driver.load_target(target)
        driver.load_spec(model)
    except (FrontendError, MeshrtError) as e:
        raise BenchError(str(e).splitlines()[0]) from None
    builds = [(model, target, mb, c, static, wafers) for static in (True, False)
              for mb in micro_batches for c in chunks]
    rows: dict[int, dict] = {}
    try:
        for i, row in run_jobs(_build, builds, jobs, ray_address):
            rows[i] = row
            progress(_line(row))
    except WorkerError as e:
        raise BenchError(f"meshrt bench: error: {e}") from None
    out = [rows[i] for i in range(len(builds))]
    chosen = {s: {mb: best(out, s, mb) for mb in micro_batches} for s in ("static", "meshrt")}
    if not any(chosen["meshrt"].values()):
        raise BenchError(f"meshrt bench: error: no prefill build of {model} fits: "
                         + next(r["error"] for r in out if r["system"] == "meshrt"))
    return {"micro_batches": list(micro_batches), "chunks": list(chunks), "wafers": wafers,
            "rows": out, "ablation": ablation(chosen, micro_batches),
            "notes": __doc__.split("\n\n", 2)[1].replace("\n", " ")}


def ablation(chosen: dict, micro_batches: Sequence[int]) -> dict:
    """Table 4's prefill factors where the builds exist: pipelining (static bs 1 ->
    meshrt micro-batch 1, single-user throughput) and batching (micro-batch 1 -> 4,
    system throughput)."""
    out: dict = {"paper_pipeline_factor": PAPER_PIPELINE_FACTOR, "paper_batch_factor": PAPER_BATCH_FACTOR}
    s1, m1 = chosen["static"].get(1), chosen["meshrt"].get(1)
    if s1 and m1:
        out["pipeline_factor"] = m1["user_tokens_per_s"] / s1["user_tokens_per_s"]
    m4 = chosen["meshrt"].get(ABLATION_BATCH)
    if m1 and m4:
        out["batch_factor"] = m4["system_tokens_per_s"] / m1["system_tokens_per_s"]
    if "pipeline_factor" in out and "batch_factor" in out:
        out["total_factor"] = out["pipeline_factor"] * out["batch_factor"]
    return out


def _line(r: dict) -> str:
    what = f"{r['system']} micro-batch {r['micro_batch']} chunk {r['chunk']}"
    if "error" in r:
        return f"{what}: skipped ({r['error']})"
    return (f"{what}: {r['wafers']} wafer(s), {r['user_tokens_per_s']:,.0f} tok/s single-user "
            f"({r['compile_model_s']:.1f} s)")


def print_table(pf: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="prefill (cost model; each system and micro-batch at its best chunk)")
    for col in ("system", "micro-batch", "chunk", "wafers", "stages", "TTFT ms", "tok/s/user",
                "tok/s system"):
        t.add_column(col, justify="right")
    for system in ("static", "meshrt"):
        for mb in pf["micro_batches"]:
            r = best(pf["rows"], system, mb)
            if r is None:
                t.add_row(system, str(mb), "no build fits", *[""] * 5)
                continue
            t.add_row(system, str(mb), str(r["chunk"]), str(r["wafers"]), str(r["stages"]),
                      f"{r['ttft_ms']:,.2f}", f"{r['user_tokens_per_s']:,.0f}",
                      f"{r['system_tokens_per_s']:,.0f}")
    con = Console(file=file, width=max(Console(file=file).width, 110))
    con.print(t)
    a = pf["ablation"]
    parts = []
    if "pipeline_factor" in a:
        parts.append(f"pipelining at micro-batch 1: {a['pipeline_factor']:.1f}x (paper {a['paper_pipeline_factor']})")
    if "batch_factor" in a:
        parts.append(f"micro-batch 1 -> {ABLATION_BATCH}: {a['batch_factor']:.2f}x (paper {a['paper_batch_factor']})")
    if parts:
        con.print("prefill ablation: " + "; ".join(parts))


def write_results(results: dict, out: Path) -> None:
    """A sweep's bench.json (`results`: its "prefill" with "meta" and "timing") and
    prefill.png into `out` (created)."""
    write_question(results, out, "prefill", write_plot, PLOT)


def write_plot(plt, pf: dict, title: str, path: Path) -> None:
    """System against single-user prefill throughput, one point a micro-batch (Figure 9
    top): static and meshrt, each at its best chunk."""
    from meshrt.output import save_figure

    fig, ax = plt.subplots(figsize=(6, 4))
    for system, style in (("static", "s--"), ("meshrt", "o-")):
        pts = [r for mb in pf["micro_batches"] if (r := best(pf["rows"], system, mb))]
        if not pts:
            continue
        xs = [r["user_tokens_per_s"] for r in pts]
        ys = [r["system_tokens_per_s"] for r in pts]
        ax.plot(xs, ys, style, label=system)
        for r, x, y in zip(pts, xs, ys):
            ax.annotate(f"mb{r['micro_batch']}/c{r['chunk']}", (x, y), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel("single-user prefill throughput (tokens/s)")
    ax.set_ylabel("system prefill throughput (tokens/s)")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.set_title(f"{title}: prefill at its context, micro-batch/chunk labelled")
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
