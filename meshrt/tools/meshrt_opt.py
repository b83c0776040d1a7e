"""`meshrt-opt`: xdsl-opt with meshrt's dialects, passes and targets, behaving like mlir-opt.

- Every failure is one line on stderr and exit code 1, never a Python
  traceback or argparse's usage dump: a parse or verification failure, inside
  a pass or not, is located (`FILE:LINE:COL: error: ...`); a bad flag, target,
  pass or pass option is `meshrt-opt: error: ...` and names the pass and the
  option (`pass 'place-experts': option 'seed': expected an integer, got 'nan'`).
- `--split-input-file` processes every `// -----` chunk, reports each chunk's
  error at its line in the file, separates the outputs by `// -----` and
  exits 1 if any chunk failed.
- `--verify-diagnostics` checks the file's `// expected-error @+N {{...}}`
  comments (also `@-N`, `@N`, `@above`, `@below`, `@unknown`, `-re`,
  `expected-warning`, `expected-note`, `expected-remark`) against the
  diagnostics, as mlir-opt does: an expectation that was not produced and a
  diagnostic that was not expected are each one located error on stderr, and
  the exit code is 1. A file with no `expected-*` comment keeps meshrt's
  older convention, which its FileCheck tests use: each chunk's diagnostic
  goes to stdout and the exit code is 0.
- `-p 'a, b{opt=v}'` and mlir-opt's `--pass-pipeline='builtin.module(a,b)'`.
- An empty input (no ops) is an empty module, as in mlir-opt.
- Only targets that print meshrt IR are offered: `mlir`, `meshrt-csl` (`csl`).
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
from types import UnionType
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from io import BytesIO
from typing import IO, Any, NoReturn, Union, get_args, get_origin, get_type_hints

from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass, PassPipeline
from xdsl.utils.arg_spec import ArgSpec, parse_pipeline
from xdsl.utils.exceptions import (
    ArgSpecParseError,
    DiagnosticException,
    ParseError,
    ShrinkException,
)
from xdsl.xdsl_opt_main import xDSLOptMain

from meshrt import __version__
from meshrt.diagnostics import MeshrtError, format_parse_error, parse_module, verify_located
from meshrt.kernels import registry
from meshrt.output import output_stream

PROG = "meshrt-opt"


class UsageError(Exception):
    """A bad command line: str() is the complete one-line message."""


class _RunFailed(Exception):
    def __init__(self, code: int):
        self.code = code


class MeshrtOptMain(xDSLOptMain):
    version_format = f"{PROG} {__version__} (xdsl {{xdsl_version}})"

    def __init__(self, args: Sequence[str] | None = None):
        super().__init__(description="meshrt modular optimizer driver", args=args)

    # ---- registration --------------------------------------------------------

    def register_all_dialects(self):
        super().register_all_dialects()
        # Also usable from a source checkout whose entry point is not installed.
        from meshrt.dialects import get_all_dialects

        for name, factory in get_all_dialects().items():
            if name not in self.ctx.registered_dialect_names:
                self.ctx.register_dialect(name, factory)

    def register_all_passes(self):
        super().register_all_passes()
        from meshrt.passes import get_all_passes

        for name, factory in get_all_passes().items():
            self.available_passes.setdefault(name, factory)

    def register_all_targets(self):
        # xDSL's own targets (llvm, wgsl, riscv-asm, ...) print other dialects
        # and fail or print nothing on meshrt IR: only mlir and meshrt's remain.
        from meshrt.backend.targets import get_all_targets

        super().register_all_targets()
        self.foreign_targets = set(self.available_targets) - {"mlir"}
        for name, factory in get_all_targets().items():
            self.available_targets[name] = factory
            self.foreign_targets.discard(name)
        # `-t csl` means meshrt's CSL emitter here, where no clash can occur.
        if "meshrt-csl" in self.available_targets:
            self.available_targets["csl"] = self.available_targets["meshrt-csl"]
            self.foreign_targets.discard("csl")
        for name in self.foreign_targets:
            del self.available_targets[name]

    # ---- command line --------------------------------------------------------

    def register_all_arguments(self, arg_parser: argparse.ArgumentParser):
        arg_parser.prog = PROG
        arg_parser.error = self._usage_error  # one line and exit 1, as mlir-opt
        super().register_all_arguments(arg_parser)
        arg_parser.add_argument(
            "--pass-pipeline", metavar="PIPELINE",
            help="mlir-opt's form of -p: 'builtin.module(PASS,PASS{opt=val})'")
        helps = {
            "input_file": "the input (default, or '-': stdin); an input with no ops is an "
                          "empty module, as in mlir-opt",
            "passes": "passes separated by commas (spaces allowed after them), e.g. "
                      "'lower-to-mesh-kernels, place-experts{policy=eplb profile=\"p.json\"}'; "
                      "'builtin.module(...)' is accepted too. meshrt's passes: "
                      + ", ".join(self._meshrt_passes()),
            "target": "output: mlir (default), meshrt-csl or its alias csl (CSL sources); "
                      "options in braces, e.g. 'csl{arch=wse2}'",
            "verify_diagnostics": "check the input's '// expected-error @+N {{...}}' comments "
                                  "(@-N, @N, @above, @below, @unknown; expected-warning, "
                                  "-note, -remark; -re) against the diagnostics, as mlir-opt: "
                                  "exit 1 on an expectation not produced or a diagnostic not "
                                  "expected. An input without such comments prints each "
                                  "chunk's diagnostic to stdout and exits 0",
            "split_input_file": "process each '// -----'-separated chunk of the input on its "
                                "own: every chunk's error is reported at its line in the file, "
                                "outputs are separated by '// -----', exit 1 if any failed",
            "version": "print meshrt's and xDSL's versions",
        }
        for action in arg_parser._actions:
            if action.dest in helps:
                action.help = helps[action.dest]

    def _usage_error(self, message: str) -> NoReturn:
        m = re.search(r"invalid choice: '([^']*)'", message)
        if m and m.group(1) in getattr(self, "foreign_targets", ()):
            message += f"; xDSL's {m.group(1)} target does not print meshrt IR"
        hint = "" if "choose from" in message else f" (see {PROG} --help)"
        raise UsageError(f"{PROG}: error: {' '.join(message.split())}{hint}")

    @staticmethod
    def _meshrt_passes() -> list[str]:
        from meshrt.passes import get_all_passes

        return list(get_all_passes())

    # ---- pipeline ------------------------------------------------------------

    def setup_pipeline(self):
        def verify_between(
            previous: ModulePass | None, module: ModuleOp, _next: ModulePass | None
        ) -> None:
            if not self.args.disable_verify:
                verify_located(module, self.get_input_name())
            if previous is not None and _next is not None and self.args.print_between_passes:
                print(f"// -----// IR after {previous.name} //----- //")
                print(module)

        if self.args.passes and self.args.pass_pipeline is not None:
            raise UsageError(f"{PROG}: error: give -p or --pass-pipeline, not both")
        if self.args.pass_pipeline is not None:
            spec = pipeline_text(self.args.pass_pipeline, anchored=True)
        else:
            spec = pipeline_text(self.args.passes, anchored=False)
        self.pipeline = PassPipeline(build_passes(self.available_passes, spec), verify_between)

    # ---- input and output ----------------------------------------------------

    def get_input_stream(self) -> tuple[IO[bytes], str]:
        if self.args.input_file == "-":
            return sys.stdin.buffer, "mlir"
        return super().get_input_stream()

    def get_input_name(self):
        return "stdin" if self.args.input_file in (None, "-") else self.args.input_file

    def read_input(self) -> tuple[bytes, str]:
        """The input's bytes, checked to be UTF-8, and its file extension."""
        name = self.get_input_name()
        try:
            f, extension = self.get_input_stream()
            with f:
                data = f.read()
        except OSError as e:
            raise MeshrtError.located(f"{name}: error: cannot read: {e.strerror or e}") from None
        try:
            data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise MeshrtError.located(f"{name}: error: not UTF-8 at byte {e.start}") from None
        if self.args.frontend:
            extension = self.args.frontend
        if extension not in self.available_frontends:
            raise MeshrtError.located(f"{name}: error: unrecognized file extension '{extension}' "
                                      "(give -f mlir to read it as MLIR)")
        return data, extension

    def run(self) -> int:
        """Process every chunk; return the exit code (0 or 1). -o is written
        atomically: replaced only when the run succeeds, else left as it was."""
        try:
            with output_stream(self.args.output_file) as self._output:
                code = self._run_chunks()
                if code and self.args.output_file is not None:
                    raise _RunFailed(code)  # discards the temporary output
        except _RunFailed as e:
            return e.code
        return code

    def prepare_output(self) -> IO[str]:
        return self._output

    def parse_chunk(self, chunk: IO[bytes], file_extension: str, start_offset: int = 0):
        if file_extension != "mlir" and file_extension in self.available_frontends:
            return self.available_frontends[file_extension](chunk)
        return parse_module(self.ctx, chunk.read(), self.get_input_name(), start_offset,
                            empty_ok=True)

    def _run_chunks(self) -> int:
        """Process every chunk into the prepared output; the exit code (0 or 1)."""
        name = self.get_input_name()
        data, extension = self.read_input()
        chunks = split_chunks(data) if self.args.split_input_file else [(data, 0)]
        expectations = None
        if self.args.verify_diagnostics:
            expectations = parse_expectations(data.decode("utf-8"), name, chunks)
        output = self.prepare_output()
        failed = False
        try:
            for i, (chunk, offset) in enumerate(chunks):
                if i > 0:
                    output.write("// -----\n")
                error = self._process(chunk, extension, offset, output)
                if expectations is not None:
                    problems = check_expectations(expectations[i], error, name)
                    for line in problems:
                        print(line, file=sys.stderr)
                    failed |= bool(problems)
                elif error is not None:
                    if self.args.verify_diagnostics or (
                            self.args.parsing_diagnostics and error.during_parse):
                        print(error.line)  # meshrt's convention: FileCheck reads stdout
                        for note in error.notes:
                            print(note)
                    else:
                        print(error.line, file=sys.stderr)
                        failed = True
                output.flush()
        except ShrinkException:
            assert self.args.shrink
            print("Success, can shrink")
            return 0
        if self.args.shrink:
            print("Failure, can't shrink")
            return 1
        return 1 if failed else 0

    def _process(self, chunk: bytes, extension: str, offset: int, output: IO[str]
                 ) -> Diagnostic | None:
        """Parse, transform and print one chunk; its diagnostic if it failed."""
        during_parse = True
        try:
            module = self.parse_chunk(BytesIO(chunk), extension, offset)
            during_parse = False
            if module is not None:
                self.apply_passes(module)
                output.write(self.output_resulting_program(module))
        except ParseError as e:  # from a non-MLIR frontend
            return Diagnostic.of(format_parse_error(e, self.get_input_name(), offset), True)
        except DiagnosticException as e:
            line = str(e) if isinstance(e, MeshrtError) else (
                f"{self.get_input_name()}: error: {' '.join(str(e).split())}")
            return Diagnostic.of(line, during_parse, [str(n) for n in getattr(e, "__notes__", ())])
        return None


# ---- pass pipelines ------------------------------------------------------------

def pipeline_text(text: str, anchored: bool) -> str:
    """xDSL's pass list for `-p` (plain or anchored) or `--pass-pipeline` (anchored).

    Whitespace outside braces, brackets and strings is dropped, so
    `'a, b'` and `'builtin.module( a, b )'` read as `a,b`.
    """
    text = _outside_blanks_removed(text)
    m = re.fullmatch(r"builtin\.module\((.*)\)", text, re.S)
    if m:
        return m.group(1)
    if anchored:
        raise UsageError(f"{PROG}: error: --pass-pipeline must be 'builtin.module(PASS,...)', "
                         f"got '{text}' (or give the passes to -p)")
    if re.match(r"[\w.$-]+\(", text):
        raise UsageError(f"{PROG}: error: only 'builtin.module(...)' pipelines apply to meshrt "
                         f"IR, got '{text}'")
    return text


def _outside_blanks_removed(text: str) -> str:
    out: list[str] = []
    depth, quote, escaped = 0, False, False
    for ch in text:
        if quote:
            out.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                quote = False
            continue
        if ch == '"':
            quote = True
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth = max(depth - 1, 0)
        elif ch.isspace() and depth == 0:
            continue
        out.append(ch)
    return "".join(out)


def spec_error(e: ArgSpecParseError) -> str:
    """xDSL's multi-line pipeline-syntax error as `MESSAGE at column N`."""
    lines = str(e).strip().splitlines()
    col = next((m[1] for line in lines if (m := re.search(r":\d+:(\d+)\b", line))), None)
    what = lines[-1].strip() if lines else "syntax error"
    what = what[:1].lower() + what[1:]
    return f"{what} at column {col}" if col else what


def build_passes(available: dict[str, Callable[[], type[ModulePass]]],
                 spec: str) -> tuple[ModulePass, ...]:
    """The passes of `spec`; a bad pass or option is a UsageError naming both."""
    try:
        specs = list(parse_pipeline(spec))
    except ArgSpecParseError as e:
        raise UsageError(f"{PROG}: error: bad pass pipeline '{spec}': {spec_error(e)}") from None
    return tuple(_build_pass(available, s) for s in specs)


def _build_pass(available: dict[str, Callable[[], type[ModulePass]]],
                spec: ArgSpec) -> ModulePass:
    if spec.name not in available:
        near = difflib.get_close_matches(spec.name, available, n=1)
        hint = f"; did you mean '{near[0]}'?" if near else f" (see {PROG} --help)"
        raise UsageError(f"{PROG}: error: unknown pass '{spec.name}'{hint}")
    cls = available[spec.name]()
    try:
        return cls.from_pass_spec(spec)
    except (ValueError, TypeError) as e:
        raise UsageError(f"{PROG}: error: {_option_error(cls, spec, e)}") from None


def _option_error(cls: type[ModulePass], spec: ArgSpec, e: Exception) -> str:
    """Which option of `spec` is wrong, and how."""
    where = f"pass '{spec.name}'"
    fields = [f.name for f in dataclasses.fields(cls) if f.init and f.name != "name"]
    try:
        hints = get_type_hints(cls)
    except Exception:  # an unresolvable annotation: fall back to xDSL's message
        hints = {}
    for given, value in spec.parameters.items():
        option = given.replace("-", "_")
        if option not in fields:
            return (f"{where}: option '{given}': unknown option, expected one of "
                    f"{', '.join(fields) or '(none)'}")
        try:
            cls.from_pass_spec(ArgSpec(spec.name, {given: value}))
        except (ValueError, TypeError) as trial:
            if "requires argument" in str(trial):  # another option is missing
                continue
            expected = _describe_type(hints[option]) if option in hints else "another value"
            return f"{where}: option '{given}': expected {expected}, got {_show(value)}"
    required = getattr(cls, "required_fields", lambda: set())()
    missing = [f for f in fields if f in required and f not in
               {k.replace("-", "_") for k in spec.parameters}]
    if missing:
        return f"{where}: option '{missing[0]}': required"
    return f"{where}: {' '.join(str(e).split())}"


def _describe_type(t: Any) -> str:
    if get_origin(t) in (Union, UnionType):
        args = [a for a in get_args(t) if a is not type(None)]
        if float in args and int in args:
            args.remove(int)
        return " or ".join(_describe_type(a) for a in args)
    if get_origin(t) is tuple:
        return "a comma-separated list"
    return {bool: "true or false", int: "an integer", float: "a number",
            str: "a string"}.get(t, getattr(t, "__name__", str(t)))


def _show(value: Any) -> str:
    if isinstance(value, tuple | list):
        if not value:
            return "no value"
        if len(value) > 1:
            return ", ".join(_show(v) for v in value)
        value = value[0]
    if isinstance(value, str):
        return f"'{value}'"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# ---- chunks and expected diagnostics ---------------------------------------------

_SPLIT_MARKER = re.compile(rb"^[ \t]*// -----[ \t]*\r?$")


def split_chunks(data: bytes) -> list[tuple[bytes, int]]:
    """The `// -----`-separated chunks, each with the number of lines before it."""
    lines = data.split(b"\n")
    chunks: list[tuple[bytes, int]] = []
    start = 0
    for i, line in enumerate(lines):
        if _SPLIT_MARKER.match(line):
            chunks.append((b"\n".join(lines[start:i]) + b"\n", start))
            start = i + 1
    chunks.append((b"\n".join(lines[start:]), start))
    return chunks


@dataclass
class Diagnostic:
    """One diagnostic line, split into its parts (line is None when unlocated)."""

    line: str  # the complete one-line message
    severity: str
    message: str
    file: str | None = None
    lineno: int | None = None
    col: int | None = None
    during_parse: bool = False
    notes: Sequence[str] = ()

    _LOCATED = re.compile(r"(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): "
                          r"(?P<sev>error|warning|note|remark): (?P<msg>.*)", re.S)
    _FILE = re.compile(r"(?P<file>.+?): (?P<sev>error|warning|note|remark): (?P<msg>.*)", re.S)

    @classmethod
    def of(cls, line: str, during_parse: bool = False, notes: Sequence[str] = ()) -> Diagnostic:
        if m := cls._LOCATED.fullmatch(line):
            return cls(line, m["sev"], m["msg"], m["file"], int(m["line"]), int(m["col"]),
                       during_parse, notes)
        if m := cls._FILE.fullmatch(line):
            return cls(line, m["sev"], m["msg"], m["file"], None, None, during_parse, notes)
        return cls(line, "error", line, None, None, None, during_parse, notes)

    def where(self) -> str:
        if self.lineno is not None:
            return f"{self.file}:{self.lineno}:{self.col}"
        return self.file or PROG


@dataclass
class Expectation:
    severity: str
    text: str
    regex: re.Pattern[str] | None
    line: int | None  # the line the diagnostic must be at; None: @unknown
    where: str  # FILE:LINE:COL of the comment
    matched: bool = False

    def matches(self, d: Diagnostic, input_name: str) -> bool:
        if self.matched or d.severity != self.severity:
            return False
        at = d.lineno if d.file == input_name else None
        if at != self.line:
            return False
        if self.regex is not None:
            return self.regex.search(d.message) is not None
        return self.text in d.message


_EXPECTED = re.compile(r"expected-(error|warning|note|remark)(-re)? *"
                       r"(?:@(\S+))? *\{\{(.*)\}\}\s*$")


def parse_expectations(text: str, name: str, chunks: list[tuple[bytes, int]]
                       ) -> list[list[Expectation]] | None:
    """Each chunk's `expected-*` comments, or None when the input has none."""
    starts = [offset + 1 for _, offset in chunks]  # first line of each chunk, 1-based
    per_chunk: list[list[Expectation]] = [[] for _ in chunks]
    found = False
    bad: list[str] = []
    for n, line in enumerate(text.splitlines(), start=1):
        m = _EXPECTED.search(line)
        if not m:
            continue
        found = True
        where = f"{name}:{n}:{m.start() + 1}"
        severity, is_re, at, body = m.groups()
        target: int | None
        if at is None:
            target = n
        elif at == "above":
            target = n - 1
        elif at == "below":
            target = n + 1
        elif at == "unknown":
            target = None
        elif re.fullmatch(r"[+-]\d+", at):
            target = n + int(at)
        elif at.isdigit():
            target = int(at)
        else:
            bad.append(f"{where}: error: expected '@+N', '@-N', '@N', '@above', '@below' or "
                       f"'@unknown' after expected-{severity}, got '@{at}'")
            continue
        regex = None
        if is_re:
            try:
                regex = re.compile("".join(
                    part if i % 2 else re.escape(part)
                    for i, part in enumerate(re.split(r"\{\{(.*?)\}\}", body))))
            except re.error as e:
                bad.append(f"{where}: error: bad regex in expected-{severity}-re: {e}")
                continue
        chunk = max(i for i, s in enumerate(starts) if s <= n)
        per_chunk[chunk].append(Expectation(severity, body, regex, target, where))
    if bad:
        raise MeshrtError.located(bad[0])
    return per_chunk if found else None


def check_expectations(expected: list[Expectation], error: Diagnostic | None,
                       input_name: str) -> list[str]:
    """mlir-opt's complaints about one chunk: diagnostics not expected, expectations not met."""
    problems: list[str] = []
    for d in [error] if error is not None else []:
        e = next((e for e in expected if e.matches(d, input_name)), None)
        if e is not None:
            e.matched = True
        else:
            problems.append(f"{d.where()}: error: unexpected {d.severity}: {d.message}")
    for e in expected:
        if not e.matched:
            problems.append(f'{e.where}: error: expected {e.severity} "{e.text}" was not produced')
    return problems


# ---- entry point -------------------------------------------------------------------

def main(argv: Sequence[str] | None = None) -> int:
    try:
        # Kind folders load before any input is parsed: a bad folder is its own error,
        # not one the parser reports at the first mesh_kernel op.
        registry.kernels()
        tool = MeshrtOptMain(args=argv)
        return tool.run()
    except (UsageError, MeshrtError) as e:
        print(str(e), file=sys.stderr)
        return 1
    except ParseError as e:
        print(format_parse_error(e, e.span.input.name), file=sys.stderr)
        return 1
    except ArgSpecParseError as e:  # only -t is left: the pipeline's are UsageErrors
        print(f"{PROG}: error: bad target: {spec_error(e)}", file=sys.stderr)
        return 1
    except DiagnosticException as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)
        return 1
    except (OSError, ValueError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # a bug in meshrt: still one line, unless asked for more
        if os.environ.get("MESHRT_TRACEBACK"):
            raise
        print(f"{PROG}: internal error: {type(e).__name__}: {e} "
              "(set MESHRT_TRACEBACK=1 for details)", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
