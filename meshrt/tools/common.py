"""What the console tools share: the one-line failure, the bench's error, the
largest target the interpreter simulates beside a model, and the progress bar
of long simulations."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

INTERPRETER_MAX_CORES = 64 * 64  # targets the interpreter simulates beside the model


class BenchError(Exception):
    """Bad input or a configuration that cannot be built: one line for stderr."""


def write_question(results: dict, out: Path, key: str, write_plot, plot: str) -> None:
    """A question run's bench.json (`results`: its `key` with "meta" and "timing") and
    its plot `plot` (`write_plot(plt, results[key], title, path)`) into `out` (created)."""
    import json

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from meshrt.output import write_text

    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "bench.json", json.dumps(results, indent=1, default=float) + "\n")
    write_plot(plt, results[key], Path(results["meta"]["model"]).stem, out / plot)


def chunk_value(text: str) -> int:
    """A prefill chunk on the command line: prompt tokens a step, 1..MAX_CHUNK."""
    import argparse

    from meshrt.shape import MAX_CHUNK

    try:
        v = int(text)
    except ValueError:
        v = 0
    if not 1 <= v <= MAX_CHUNK:
        raise argparse.ArgumentTypeError(f"expected prompt tokens a step of 1..{MAX_CHUNK}, got '{text.strip()}'")
    return v


def context_value(text: str, what: str = "a context") -> int:
    """A context on the command line: positions like 4k or 4096 (k = 1024), 1..MAX_DIM."""
    import argparse
    import re

    from meshrt.shape import MAX_DIM

    m = re.fullmatch(r"\s*(\d{1,9})\s*([kK]?)\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected positions like 4k or 4096, got {text.strip()!r}")
    n = int(m.group(1)) * (1024 if m.group(2) else 1)
    if not 1 <= n <= MAX_DIM:
        raise argparse.ArgumentTypeError(f"{what} must be 1..{MAX_DIM:,} positions, got {n:,}")
    return n


def spill_value(text: str) -> int:
    """`--kv-spill N` of compile and run: the KV positions a slot keeps on an MoE layer's
    attention region, like 16k."""
    return context_value(text, "a spill point")


def increasing_list(text: str, value, plural: str) -> tuple:
    """A comma-separated list of `value(part)`s that must increase ("{plural} must increase")."""
    import argparse

    out = []
    for part in text.split(","):
        v = value(part)
        if out and v <= out[-1]:
            raise argparse.ArgumentTypeError(f"{plural} must increase")
        out.append(v)
    return tuple(out)


def parse_context(text: str) -> int | str:
    """`--context N|auto` of compile and run: the KV positions a request slot holds."""
    return text if text == "auto" else context_value(text)


def parse_chunk(text: str) -> int | str:
    """`--prefill-chunk N|auto` of compile and run."""
    import argparse

    if text == "auto":
        return text
    try:
        return chunk_value(text)
    except argparse.ArgumentTypeError as e:
        raise argparse.ArgumentTypeError(f"expected 'auto' or {str(e).removeprefix('expected ')}") from None


def add_build_options(p) -> None:
    """The options `meshrt compile` and `meshrt run` compile a model with (not IR, which
    was compiled with them): the context a slot holds, the prefill chunk, the KV spill."""
    p.add_argument("--context", type=parse_context, metavar="N|auto",
                   help="KV positions a request slot holds, like 32k (default: the spec's; a "
                        "config's max_position_embeddings up to 4K); auto: the most the SRAM of "
                        "the wafers the model needs holds (or of --wafers)")
    p.add_argument("--prefill-chunk", type=parse_chunk, metavar="N|auto",
                   help="prompt tokens a prefilling slot feeds a step, at least 1 (default 1; "
                        "auto: the largest whose rows fit beside the weights and whose "
                        "program compiles for the target): a micro-batch "
                        "carries micro-batch x N token rows, and the time to first token comes "
                        "from chunks of N (docs/prefill.md)")
    p.add_argument("--kv-spill", type=spill_value, metavar="N",
                   help="KV positions a slot keeps on each MoE layer's attention region, like 16k; "
                        "later ones go to tiles of the layer's expert cores, attended there in "
                        "parallel (default: none spill; docs/kernels.md, \"KV spill\")")


def fail(line: str) -> int:
    """Print `line` as one line on stderr (an error with no file gets `meshrt:`); exit code 1."""
    if line.startswith("error:"):  # a FrontendError with no file to blame
        line = f"meshrt: {line}"
    print(" ".join(line.split()), file=sys.stderr)
    return 1


@contextlib.contextmanager
def progress_bar(what: str, total: int) -> Iterator[Callable[[int, str], None] | None]:
    """A rich progress bar on stderr, when stderr is a terminal (else None):
    yields `update(completed, text)`, `completed` out of `total`."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    if not console.is_terminal:
        yield None
        return
    bar = Progress(TextColumn(what), BarColumn(), TextColumn("{task.fields[text]}"),
                   TimeElapsedColumn(), console=console, transient=True)
    task = bar.add_task(what, total=total, text="")
    with bar:
        yield lambda completed, text: bar.update(task, completed=min(completed, total), text=text)
