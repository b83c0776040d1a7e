"""`meshrt bench MODEL --target T --context 4k,16k,32k,64k,128k`: decode as the context grows
(the paper's Figure 10b).

For each context C the model is compiled with a KV capacity of C positions per request
slot (the mapper sizes every attention's region for it, adding wafers where the caches
need them; a sliding-window layer holds its window, `ModelShape.kv_capacity`) for one
request in flight, as the paper's batch size 1: micro-batch 1 with the spec's dynamism
less micro-batch pipelining, so every attention holds one slot; and the class-level cost model
(`meshrt.runtime.cost_model`) times a decode step with every slot at C: TPOT, per-user
tokens/s, and the cycles the step's critical path spends in the attention kernels of
the full-attention layers (sliding-window and DeltaNet layers attend a bounded context,
so they do not grow with C). Each build is mapped onto the fewest wafers it needs, or
onto `--deploy-wafers N` (the paper's placement: GPT-OSS-20B on 4). The builds run in
`--jobs` workers like the other questions. With `--kv-spill N` every MoE layer's
attention region holds N positions and a context past N spills the rest to tiles of the
layer's expert cores (docs/kernels.md, "KV spill"), which attend them in parallel; the
spill tiles column counts a layer's.

What it does not model yet (issue 18): attention is charged for a slot's capacity, which
is its context here.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from meshrt.tools.common import BenchError, context_value, increasing_list, write_question

PLOT = "context.png"


def context_list(text: str) -> tuple[int, ...]:
    """'4k,16k,32768' -> (4096, 16384, 32768): positive, increasing; k = 1024."""
    return increasing_list(text, context_value, "contexts")


def max_position(model: str) -> int | None:
    """A Hugging Face config's max_position_embeddings (its text_config's), or None."""
    p = Path(model)
    p = p / "config.json" if p.is_dir() else p
    if p.suffix != ".json":
        return None
    try:
        cfg = json.loads(p.read_text())
    except (OSError, ValueError):
        return None  # the compile of the first build reports it, located
    cfg = cfg.get("text_config", cfg) if isinstance(cfg, dict) else {}
    n = cfg.get("max_position_embeddings") if isinstance(cfg, dict) else None
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def _build(job: tuple) -> dict:
    """One context's build: job = (model, target, context); its row of the table."""
    from meshrt import driver
    from meshrt.diagnostics import MeshrtError
    from meshrt.frontend.errors import FrontendError
    from meshrt.frontend.mapper import map_model
    from meshrt.kernels.attention.op import kv_rows
    from meshrt.runtime.cost_model import CostModelError, estimate, kernels_where

    model, target_arg, context, wafers, spill = job
    t0 = time.perf_counter()
    try:
        target = driver.load_target(target_arg)
        spec = driver.load_spec(model)
        spec = dataclasses.replace(spec, shape=dataclasses.replace(spec.shape, max_seq=context))
        one = tuple(k for k in spec.dynamism if k != "micro_batch_pipeline")  # one request
        # a context up to `spill` spills nothing (`mapper.spills`)
        program = driver.segment_program(map_model(spec, target, 1, wafers, one, spill=spill or 0), target)
        est = estimate(program, target)
    except (FrontendError, MeshrtError, CostModelError) as e:
        return {"context": context, "error": str(e).splitlines()[0]}
    shape = spec.shape
    attention = kernels_where(program, lambda op: op.ATTENDS_KV)
    full, rows, tiles = [], 0, 0
    for k in program.kernels():
        if k.kernel_name in attention and not shape.window(k.param("layer", -1)):
            full.append(k.kernel_name)
            _, _, w, h = k.region.rects.data[0].tuple[:4]
            tiles = max(tiles, len(k.region.rects.data) - 1)
            held = k.param("spill_from") or context  # the region's share where it spills
            rows = max(rows, kv_rows(shape.heads, shape.kv_heads, shape.head_dim, held,
                                     k.param("slots"), shape.kv_bytes, 1, w, h))
    path = est.latency.kernel_path
    attn = sum(path.get(k, 0.0) for k in attention)
    return {"context": context, "wafers": est.wafers, "stages": est.stages,
            "tpot_cycles": est.tpot_cycles, "tpot_us": est.tpot_cycles / target.clock_hz * 1e6,
            "user_tokens_per_s": est.user_tokens_per_s(),
            "full_attention_cycles": sum(path.get(k, 0.0) for k in full),
            "attention_cycles": attn, "full_attention_layers": len(full),
            "kv_rows_per_core": rows, "spill_tiles": tiles, "compile_model_s": time.perf_counter() - t0}


def run_context(model: str, target: str, contexts: Sequence[int], jobs: int = 1,
                ray_address: str | None = None,
                progress: Callable[[str], None] | None = None, wafers: int | None = None,
                spill: int | None = None) -> dict:
    """Every row of the context sweep, in context order (a context that does not compile
    or fit is a row with its error); `wafers`: every build on that many (else the fewest);
    `spill`: MoE layers' attention regions hold that many positions, the rest spill."""
    from meshrt.tools.workers import WorkerError, run_jobs

    progress = progress or (lambda _m: None)
    limit = max_position(model)
    if limit is not None and contexts[-1] > limit:
        raise BenchError(f"meshrt bench: error: --context {contexts[-1]:,} exceeds the model's "
                         f"max_position_embeddings ({limit:,})")
    first = _build((model, target, contexts[0], wafers, spill))  # checks the input before any worker
    if "error" in first:
        raise BenchError(first["error"])
    rows = {contexts[0]: first}
    progress(_line(first))
    try:
        for i, row in run_jobs(_build, [(model, target, c, wafers, spill) for c in contexts[1:]], jobs,
                               ray_address):
            rows[contexts[1 + i]] = row
            progress(_line(row))
    except WorkerError as e:
        raise BenchError(f"meshrt bench: error: {e}") from None
    out = [rows[c] for c in contexts]
    for r in out:  # the first built (or this sweep stopped above)
        if "error" not in r:
            r["tpot_vs_first"] = r["tpot_cycles"] / first["tpot_cycles"]
    return {"micro_batch": 1, "wafers": wafers, "kv_spill": spill, "rows": out,
            "notes": __doc__.split("\n\n", 2)[1].replace("\n", " ")}


def _line(r: dict) -> str:
    if "error" in r:
        return f"context {r['context']:,}: skipped ({r['error']})"
    return (f"context {r['context']:,}: {r['wafers']} wafer(s), TPOT {r['tpot_cycles']:,.0f} cycles "
            f"({r['compile_model_s']:.1f} s)")


def print_table(ctx: dict, file=None) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="decode vs context (one request in flight, cost model)")
    for col in ("context", "wafers", "stages", "TPOT cycles", "TPOT µs", "tok/s/user",
                "full-attn cycles", "KV rows/core", "spill tiles", "vs first"):
        t.add_column(col, justify="right")
    for r in ctx["rows"]:
        if "error" in r:
            t.add_row(f"{r['context']:,}", r["error"], *[""] * 8)
            continue
        t.add_row(f"{r['context']:,}", str(r["wafers"]), str(r["stages"]), f"{r['tpot_cycles']:,.0f}",
                  f"{r['tpot_us']:,.1f}", f"{r['user_tokens_per_s']:,.0f}",
                  f"{r['full_attention_cycles']:,.0f}", f"{r['kv_rows_per_core']:,}",
                  str(r.get("spill_tiles", 0)), f"{r['tpot_vs_first']:.2f}x")
    Console(file=file, width=max(Console(file=file).width, 110)).print(t)


def write_results(results: dict, out: Path) -> None:
    """A sweep's bench.json (`results`: its "context" with "meta" and "timing") and
    context.png into `out` (created)."""
    write_question(results, out, "context", write_plot, PLOT)


def write_plot(plt, ctx: dict, title: str, path: Path) -> None:
    """TPOT and its full-attention part against context (Figure 10b)."""
    from meshrt.output import save_figure

    rows = [r for r in ctx["rows"] if "error" not in r]
    fig, ax = plt.subplots(figsize=(6, 4))
    xs = [r["context"] for r in rows]
    ax.plot(xs, [r["tpot_us"] for r in rows], "o-", label="TPOT (end to end)")
    ax.plot(xs, [r["full_attention_cycles"] / r["tpot_cycles"] * r["tpot_us"] for r in rows], "s--",
            label="in full-attention layers' attention")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [f"{x // 1024}K" if x % 1024 == 0 else str(x) for x in xs])
    ax.set_xlabel("context (positions)")
    ax.set_ylabel("µs per output token")
    ax.set_ylim(bottom=0)
    on = f", {ctx['wafers']} wafers" if ctx.get("wafers") else ""
    if ctx.get("kv_spill"):
        on += f"\nKV past {ctx['kv_spill']:,} positions on the FFN cores"
    ax.set_title(f"{title}: decode vs context, one request{on}", fontsize=10)
    ax.legend()
    save_figure(fig, path)
    plt.close(fig)
