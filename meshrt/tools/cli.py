"""The `meshrt` command: compile, csl-lint, run, bench, viz.

Every error caused by the input (a bad spec or config, an unknown target, a
model that does not fit, a level not built yet, a bad command line) is one
line on stderr and exit code 1, never a traceback. Set MESHRT_TRACEBACK=1 to
see the traceback of an internal error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from meshrt.frontend.errors import FrontendError
from meshrt.tools.common import add_build_options, fail as _fail
from meshrt.output import atomic_directory, atomic_file


class _UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line and exit 1, not argparse's usage dump
        raise _UsageError(f"{self.prog}: error: {message}")


def _parser() -> argparse.ArgumentParser:
    from meshrt.frontend.model import SUPPORTED_DYNAMISM
    from meshrt.passes.pipeline import LEVELS
    from meshrt.targets import available_targets

    p = _Parser(prog="meshrt", description="Compile and run LLMs on wafer-scale meshes.")
    p.add_argument("--version", action="version", version=f"meshrt {__import__('meshrt').__version__}",
                   help="print meshrt's version")
    sub = p.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    c = sub.add_parser("compile", help="compile a .mrt spec or a config.json to IR",
                       description="Compile MODEL (a .mrt spec or a Hugging Face config.json, or "
                       "printed IR of any level, .mlir) for target T and print the IR at LEVEL.")
    c.add_argument("model", metavar="MODEL", help="a .mrt spec, a Hugging Face config.json, or "
                   "printed IR (.mlir), which restarts where it stands")
    c.add_argument("--target", required=True, metavar="T",
                   help=f"a bundled target ({', '.join(available_targets())}) or a target .toml "
                        "file")
    c.add_argument("--micro-batch", type=int, metavar="N",
                   help="requests per micro-batch, at least 1 (default: the spec's, or 1)")
    c.add_argument("--wafers", type=int, metavar="N",
                   help="wafer budget, at least 1 (default: as few as fit)")
    add_build_options(c)
    c.add_argument("--dynamism", type=parse_dynamism, metavar="LIST",
                   help="override the spec's dynamism kinds: a comma-separated list of "
                        f"{', '.join(SUPPORTED_DYNAMISM)}, or 'none' for the static build")
    c.add_argument("--emit", choices=LEVELS, default="graph", metavar="LEVEL",
                   help=f"stop after this level: {', '.join(LEVELS)} (default graph)")
    c.add_argument("-o", dest="output", metavar="PATH",
                   help="write here instead of stdout (--emit csl: a directory of files)")
    c.add_argument("--arch", choices=("wse2", "wse3"),
                   help="--emit csl: CSL architecture (default: the target's, wse3 for test targets)")
    c.add_argument("--report", action="store_true",
                   help="--emit csl: print the per-class allocation table (only the table "
                        "when there is no -o)")
    c.add_argument("--weights", action="store_true",
                   help="--emit csl -o DIR: also write each core class's resident tiles for the "
                        "host (DIR/weights/<class>.w.npy, which run.py loads): MODEL's checkpoint, "
                        "or random weights drawn with --weights-seed as `meshrt run` draws them")
    c.add_argument("--weights-seed", type=int, default=0, metavar="S",
                   help="--weights of a model without a checkpoint: the seed (default 0)")
    lint = sub.add_parser("csl-lint", help="syntax-check CSL files")
    lint.add_argument("files", nargs="+", metavar="FILE", help="CSL files (.csl) to check")
    from meshrt.tools import bench, run, viz

    run.add_arguments(sub.add_parser(
        "run", help="serve a workload on the simulated mesh, checked against NumPy",
        description=run.__doc__.splitlines()[0]))

    bench.add_arguments(sub.add_parser(
        "bench", help="governance overhead, policy ablation, throughput and padding (cost model)",
        description=bench.__doc__.splitlines()[0]))

    viz.add_arguments(sub.add_parser(
        "viz", help="mesh pictures: mapping, core classes, coloured routes, per-core load (PNG/SVG)",
        description=viz.__doc__.splitlines()[0]))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = _parser().parse_args(argv)
    except _UsageError as e:
        return _fail(str(e))
    if args.cmd == "compile":
        return _compile(args)
    if args.cmd == "csl-lint":
        try:
            from meshrt.backend.csl_lint import lint_main
        except ImportError:
            return _fail("meshrt csl-lint: error: the CSL linter is not available in this build")
        return lint_main(args.files)
    if args.cmd == "run":
        from meshrt.tools.run import main as run_main

        return run_main(args)
    if args.cmd == "bench":
        from meshrt.tools.bench import main as bench_main

        return bench_main(args)
    if args.cmd == "viz":
        from meshrt.tools.viz import main as viz_main

        return viz_main(args)
    raise AssertionError(f"unhandled command {args.cmd}")  # argparse only accepts the ones above


def _compile(args: argparse.Namespace) -> int:
    from xdsl.utils.exceptions import DiagnosticException, VerifyException

    from meshrt import driver
    from meshrt.diagnostics import MeshrtError

    if args.emit != "csl" and (args.arch or args.report or args.weights):
        flag = "--arch" if args.arch else ("--report" if args.report else "--weights")
        return _fail(f"meshrt compile: error: {flag} only applies to --emit csl")
    if args.weights and not args.output:
        return _fail("meshrt compile: error: --weights writes files: it needs -o DIR")
    if not 0 <= args.weights_seed < 2**63:
        return _fail(f"meshrt compile: error: --weights-seed must be in 0..2^63-1, got {args.weights_seed}")
    for flag, v in (("--micro-batch", args.micro_batch), ("--wafers", args.wafers)):
        if v is not None and v < 1:
            return _fail(f"meshrt compile: error: {flag} must be at least 1, got {v}")
    try:
        if driver.is_ir(args.model):  # printed IR of any level: restart where it stands
            if (args.micro_batch, args.wafers, args.dynamism, args.prefill_chunk, args.context,
                    args.kv_spill) != (None,) * 6:
                return _fail(f"{args.model}: error: --micro-batch, --wafers, --dynamism, --context, "
                             "--prefill-chunk and --kv-spill are chosen when a model is compiled, not on IR")
            module = driver.read_ir(args.model)
        else:
            module = driver.load_model(args.model, args.target, micro_batch=args.micro_batch,
                                       wafers=args.wafers, dynamism=args.dynamism,
                                       chunk=args.prefill_chunk or 1, context=args.context,
                                       spill=args.kv_spill or 0)
        target = driver.load_target(args.target)
    except (FrontendError, MeshrtError) as e:
        return _fail(str(e))
    try:
        module.verify()
    except (VerifyException, DiagnosticException) as e:
        return _fail(f"{args.model}: error: internal error: the generated graph IR does not "
                     f"verify: {str(e).strip().splitlines()[0] if str(e).strip() else e!r}")
    if args.emit != "graph":
        try:
            module = driver.lower(module, args.emit, target)
        except driver.LevelNotReady as e:
            return _fail(f"{args.model}: error: {e}")
        except MeshrtError as e:
            # Compiled IR has no source line of its own: name the model file,
            # and the message names the kernel, class, flow or resource.
            return _fail(f"{args.model}: error: {e.message}")
        except Exception as e:  # a pass failing on valid input is a bug: say so on one line
            if os.environ.get("MESHRT_TRACEBACK"):
                raise
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            return _fail(f"{args.model}: error: lowering to {args.emit} failed: {first}")
    if args.emit == "csl":
        return _emit_csl(args, module, target)
    try:
        if args.output:
            with atomic_file(args.output) as f:
                _print_module(module, f)
        else:
            _print_module(module, sys.stdout)
    except BrokenPipeError:  # e.g. `| head`: the reader has what it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        return _fail(f"{args.output or '<stdout>'}: error: cannot write output: {e.strerror or e}")
    return 0


def _emit_csl(args: argparse.Namespace, module, target) -> int:
    """--emit csl: the files into directory -o, or behind FILE lines on stdout."""
    from meshrt.backend.csl import emit_csl
    from meshrt.diagnostics import MeshrtError

    import numpy as np

    try:
        out = emit_csl(module, args.arch, target, _host_weights(args, module) if args.weights else None)
    except FrontendError as e:
        return _fail(str(e))
    except MeshrtError as e:
        return _fail(f"{args.model}: error: CSL backend: {e.message}")
    except Exception as e:  # a backend bug on valid input: still one line
        if os.environ.get("MESHRT_TRACEBACK"):
            raise
        return _fail(f"{args.model}: error: CSL backend: internal error: {type(e).__name__}: {e} "
                     "(set MESHRT_TRACEBACK=1 for details)")
    try:
        if args.output:
            root = Path(args.output)
            if root.exists() and not root.is_dir():
                return _fail(f"{args.output}: error: --emit csl writes a directory, and this is a file")
            with atomic_directory(root) as built:
                for name, text in out.files.items():
                    path = built / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    path.write_text(text, encoding="utf-8")
                    if name.endswith(".sh"):
                        path.chmod(0o755)
                for name, array in out.arrays.items():
                    path = built / name
                    path.parent.mkdir(parents=True, exist_ok=True)
                    np.save(path, array)
        elif not args.report:
            sys.stdout.write(out.as_text())
        if args.report:
            sys.stdout.write("\n".join(out.table) + "\n")
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as e:
        return _fail(f"{args.output or '<stdout>'}: error: cannot write output: {e.strerror or e}")
    return 0


def _host_weights(args: argparse.Namespace, module):
    """The weights --emit csl --weights writes: MODEL's checkpoint, or random ones."""
    from meshrt.backend.csl.model import segment_programs
    from meshrt.runtime import reference as ref
    from meshrt.runtime.checkpoint import is_checkpoint, load_checkpoint
    from meshrt.runtime.serving import reference_shape

    from meshrt.limits import check_memory
    from meshrt.runtime.serving import run_bytes
    from meshrt.shape import ModelShape

    program = segment_programs(module)[0]
    check_memory(run_bytes(ModelShape.from_hparams(program, program.program_name), 0),
                 f"the weights and host tiles of {program.program_name}",
                 "emit the CSL without --weights", args.model)
    shape = reference_shape(program)
    if is_checkpoint(args.model):
        return load_checkpoint(args.model, shape)
    return ref.Weights.random(shape, args.weights_seed)


def parse_dynamism(text: str) -> tuple[str, ...]:
    """`--dynamism`: 'none' (static) or a comma-separated list of distinct kinds."""
    from meshrt.frontend.model import SUPPORTED_DYNAMISM

    text = text.strip()
    if text == "none":
        return ()
    kinds = tuple(k.strip() for k in text.split(","))
    for k in kinds:
        if k not in SUPPORTED_DYNAMISM:
            what = f"unknown dynamism kind '{k}'" if k else f"empty item in '{text}'"
            raise argparse.ArgumentTypeError(
                f"{what}, expected 'none' or a comma-separated list of "
                f"{', '.join(SUPPORTED_DYNAMISM)}")
    if len(set(kinds)) < len(kinds):
        raise argparse.ArgumentTypeError(f"a dynamism kind is listed twice in '{text}'")
    return kinds


def _print_module(module, stream) -> None:
    from xdsl.printer import Printer

    Printer(stream=stream).print_op(module)
    stream.write("\n")


if __name__ == "__main__":
    sys.exit(main())
