"""Located, one-line diagnostics for everything meshrt reports.

MLIR's convention: `FILE:LINE:COL: error: 'dialect.op' op MESSAGE`. Ops keep
the position they were parsed from in `op.location`; ops a pass creates
copy the location of the op they replace, and an op without one is reported
at its nearest located ancestor.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from xdsl.dialects.builtin import FileLineColLoc, IntAttr, ModuleOp, StringAttr
from xdsl.ir import Operation
from xdsl.parser import Parser
from xdsl.utils.mlir_lexer import MLIRLexer, MLIRTokenKind
from xdsl.utils.exceptions import DiagnosticException, ParseError

# xDSL 0.74 lexes a string literal with `+` nested in `*`: a '"' left open backtracks
# exponentially over the rest of its line (one corrupted byte hung the parser). The
# same language with possessive quantifiers fails at once.
MLIRLexer._unescaped_characters_regex = re.compile(r'"(?:[^"\\\n\v\f]++|\\(?:["nt\\]|[0-9A-Fa-f]{2}))*+"')


@dataclass(frozen=True)
class Loc:
    """A position in a source file (1-based line and column; 0 = unknown)."""

    file: str
    line: int = 0
    col: int = 0

    def __str__(self) -> str:
        if self.line > 0:
            return f"{self.file}:{self.line}:{max(self.col, 1)}"
        return self.file


class MeshrtError(DiagnosticException):
    """The one error type for everything a user can get wrong: one located line.

    str() is the complete message, `WHERE: error: MESSAGE`. WHERE is `loc` (a
    position in a spec, config or target file) when given, else the position
    of `op` (or of its nearest located ancestor), else `filename`, else
    `unlocated` (no `WHERE: ` at all when that is None).
    """

    unlocated: str | None = "<input>"

    def __init__(self, message: str, op: Operation | None = None, filename: str | None = None,
                 *, loc: Loc | str | None = None):
        self.message = message
        self.op = op
        self.filename = filename
        self.loc = Loc(loc) if isinstance(loc, str) else loc
        if self.loc is not None:
            line = f"{self.loc}: error: {' '.join(message.split())}"
        elif op is None and filename is None and self.unlocated is None:
            line = f"error: {' '.join(message.split())}"
        else:
            line = format_diagnostic(message, op, filename or self.unlocated)
        super().__init__(line)

    def __str__(self) -> str:
        return self.args[0]

    @classmethod
    def located(cls, line: str) -> MeshrtError:
        """An error whose location is already part of `line`."""
        err = cls.__new__(cls)
        err.message, err.op, err.filename, err.loc = line, None, None, None
        DiagnosticException.__init__(err, line)
        return err


class FrontendError(MeshrtError):
    """A user error located in a source file (spec, config.json, target, profile).

    `FrontendError(message, loc)`; without a position it prints `error: MESSAGE`.
    The message is kept on one line.
    """

    unlocated = None

    def __init__(self, message: str, loc: Loc | str | None = None):
        super().__init__(" ".join(message.split()), loc=loc)


def op_location(op: Operation | None) -> str | None:
    """`FILE:LINE:COL` of `op` or of its nearest located ancestor."""
    while op is not None:
        loc = op.location
        if isinstance(loc, FileLineColLoc):
            return f"{loc.filename.data}:{loc.line.data}:{loc.column.data}"
        op = op.parent_op()
    return None


def format_diagnostic(message: str, op: Operation | None = None, filename: str | None = None) -> str:
    where = op_location(op) or filename or "<input>"
    what = f"'{op.name}' op " if op is not None and not isinstance(op, ModuleOp) else ""
    # One line: a verifier message with newlines would break the contract.
    message = " ".join(message.split())
    return f"{where}: error: {what}{message}"


def format_parse_error(e: ParseError, filename: str, line_offset: int = 0) -> str:
    loc = e.span.get_location()
    return f"{filename}:{loc.line + line_offset}:{loc.col}: error: {' '.join(e.msg.split())}"


class LocatingParser(Parser):
    """A Parser that records each op's source position in `op.location`."""

    def __init__(self, ctx, text: str | bytes, name: str = "<input>", line_offset: int = 0):
        super().__init__(ctx, text, name)
        self._file = name
        self._line_offset = line_offset

    def parse_operation(self) -> Operation:
        loc = self._current_token.span.get_location()
        op = super().parse_operation()
        if not isinstance(op.location, FileLineColLoc):
            op.location = FileLineColLoc(
                StringAttr(self._file), IntAttr(loc.line + self._line_offset), IntAttr(loc.col)
            )
        return op


def verify_located(root: Operation, filename: str | None = None) -> None:
    """Verify `root` and everything nested, raising a located MeshrtError.

    Children are verified before parents so the innermost culprit is named.
    """
    for op in root.walk(region_first=True):
        try:
            op.verify(verify_nested_ops=False)
        except MeshrtError:
            raise
        except DiagnosticException as e:
            raise MeshrtError(_strip_xdsl_noise(str(e)), op, filename) from e


def _strip_xdsl_noise(text: str) -> str:
    # xDSL sometimes appends the printed op after the message; keep line one.
    return text.strip().splitlines()[0] if text.strip() else "verification failed"


def parse_module(ctx, text: str | bytes, filename: str, line_offset: int = 0,
                 empty_ok: bool = False) -> ModuleOp:
    """Parse and verify MLIR text; all failures become one-line MeshrtErrors.

    `empty_ok`: text with no ops (only blanks and comments) is an empty module,
    as mlir-opt reads it, instead of an error.
    """
    parser = LocatingParser(ctx, text, filename, line_offset)
    if empty_ok and parser._current_token.kind is MLIRTokenKind.EOF:
        return ModuleOp([])
    try:
        module = parser.parse_module()
    except ParseError as e:
        raise MeshrtError.located(format_parse_error(e, filename, line_offset)) from e
    except RecursionError:
        # xDSL's parser recurses once per nested attribute, type or region:
        # about a hundred levels fill Python's stack (meshrt's IR needs ~10).
        loc = parser._current_token.span.get_location()
        raise MeshrtError.located(
            f"{filename}:{loc.line + line_offset}:{loc.col}: error: attributes, types or regions "
            f"nested too deeply for the parser (meshrt IR nests about 10 levels)") from None
    except DiagnosticException as e:
        # Attribute verifiers run while parsing: report where the parser stood.
        loc = parser._current_token.span.get_location()
        where = f"{filename}:{loc.line + line_offset}:{loc.col}"
        raise MeshrtError.located(f"{where}: error: {_strip_xdsl_noise(str(e))}") from e
    verify_located(module, filename)
    return module
