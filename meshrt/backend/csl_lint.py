"""Syntax checker for CSL (Cerebras Software Language, SDK 1.x syntax).

`parse_csl` parses CSL text with the LALR(1) grammar in `csl.lark` and
returns the lark parse tree; `lint_file` / `lint_main` turn every failure
into one located line, `FILE:LINE:COL: error: <what>`, MLIR style.

The grammar is held to real CSL: it accepts all 192 `.csl` files of
Cerebras's csl-examples (SDK 1.4.0, commit 162e0f3: 164) and WaferLLM (2cd13b5: 28),
among them `if` statements with unbraced bodies (`if (c) @unblock(q) else
@unblock(c2);`), `if` expressions without a last `else` (comptime-known
arch selections), `param x = {};`, `param cb: task () void;`,
`enum(u16) { a = 0, b }` and `align(16)` on a declaration. What it
deliberately does not accept:

* `while` / `for` bodies that are not braced blocks, and an unbraced `if`
  body that is itself an `if` or returns / assigns an `if` expression
  (`if (a) if (b) f();`: brace it or use `else if`; in Zig the `else` would
  bind to the nearest `if`, which an LALR(1) grammar without conflicts
  cannot say);
* an expression statement that starts with an `if` or `switch` expression
  (`switch (x) { ... }` as a statement is fine, with or without `;`);
* Zig features CSL does not have (error unions, `try`/`catch`, `defer`,
  optionals, slices, labelled blocks, `/* */` comments, multi-line `\\\\`
  strings) and `struct { ... }` declarations.

Column numbers are 1-based and count characters (a tab is one column).
"""

from __future__ import annotations

import bisect
import re
import sys
from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import ClassVar

import lark
from lark.exceptions import (
    UnexpectedCharacters,
    UnexpectedEOF,
    UnexpectedInput,
    UnexpectedToken,
)

__all__ = ["CslSyntaxError", "check_csl", "lint_file", "lint_main", "parse_csl"]


class CslSyntaxError(Exception):
    """A CSL syntax error; str() is the one-line located message."""

    def __init__(self, filename: str, line: int, column: int, message: str):
        self.filename = filename
        self.line = line
        self.column = column
        self.message = " ".join(message.split())
        super().__init__(f"{filename}:{line}:{column}: error: {self.message}")


# ----------------------------------------------------------------- parser

_PARSERS: dict[bool, lark.Lark] = {}  # with / without tree positions


def _grammar_text() -> str:
    try:
        return (
            resources.files(__package__)
            .joinpath("csl.lark")
            .read_text(encoding="utf-8")
        )
    except (ModuleNotFoundError, FileNotFoundError, TypeError):  # pragma: no cover
        return (Path(__file__).with_name("csl.lark")).read_text(encoding="utf-8")


class _KeywordsEverywhere:
    """Post-lexer that makes every parser state's lexer know the keywords.

    lark's contextual lexer only tries the terminals the current parser
    state accepts, so where a keyword is not expected but a name is
    (`var if = 1;`, `b and or c`), the keyword would be lexed as a plain
    name and accepted. Listing the keyword terminals in `always_accept`
    makes them reserved everywhere, as they are in CSL.
    """

    def __init__(self, keywords: tuple[str, ...]):
        self.always_accept = keywords

    def process(self, stream):
        return stream


def _keyword_terminals(grammar: str) -> tuple[str, ...]:
    """Names of the keyword terminals declared in csl.lark (`IF: "if"`)."""
    return tuple(
        re.findall(r'^([A-Z_]+):\s*"[a-z_][a-z0-9_]*"\s*$', grammar, re.MULTILINE)
    )


def _parser(positions: bool = True) -> lark.Lark:
    """The CSL parser; without `positions` the tree carries no line/column (about
    1.8x faster; the linter's errors are located from the tokens anyway)."""
    if positions not in _PARSERS:
        grammar = _grammar_text()
        _PARSERS[positions] = lark.Lark(
            grammar,
            parser="lalr",
            lexer="contextual",
            postlex=_KeywordsEverywhere(_keyword_terminals(grammar)),
            propagate_positions=positions,
            maybe_placeholders=False,
        )
    return _PARSERS[positions]


# ------------------------------------------------------ token descriptions

# Regex terminals, by what a reader calls them.
_REGEX_NAMES = {
    "NAME": "an identifier",
    "BUILTIN": "a builtin (@name)",
    "NUMBER": "a number",
    "STRING": "a string literal",
    "CHAR": "a character literal",
}

# Which expected tokens to list first.
_PRIORITY = [";", "}", ")", "]", "{", "(", ",", "=", ":", "|", "=>", "->"]

_TOP_LEVEL = {
    "param",
    "const",
    "var",
    "fn",
    "task",
    "comptime",
    "layout",
    "export",
    "extern",
    "inline",
}


def _terminal_text(name: str) -> str | None:
    """The literal text of a string terminal (`';'`, `'fn'`), else None."""
    try:
        term = _parser().get_terminal(name)
    except KeyError:
        return None
    if term.pattern.type == "str":
        return term.pattern.value
    return None


def _describe_expected(name: str) -> str:
    if name == "$END":
        return "end of file"
    text = _terminal_text(name)
    if text is not None:
        return f"'{text}'"
    return _REGEX_NAMES.get(name, name.lower())


def _describe_found(tok: lark.Token) -> str:
    if tok.type == "$END":
        return "end of file"
    value = str(tok)
    if tok.type == "NAME":
        return f"identifier '{value}'"
    if tok.type == "BUILTIN":
        return f"builtin '{value}'"
    if tok.type == "NUMBER":
        return f"number '{value}'"
    if tok.type == "STRING":
        return "string literal " + (value if len(value) <= 40 else value[:37] + '..."')
    if tok.type == "CHAR":
        return f"character literal {value}"
    if re.fullmatch(r"[a-z_]+", value):
        return f"keyword '{value}'"
    return f"'{value}'"


def _expected_phrase(names: Iterable[str]) -> str:
    names = set(names)
    if {"NAME", "NUMBER", "STRING"} <= names:
        # Every operand can start here: say so instead of listing 20 tokens.
        # Keep the closers and separators that could also end the construct.
        rest = {n for n in names if _terminal_text(n) in (";", ")", "]", "}", ",")}
        return (
            "an expression"
            if not rest
            else "an expression or " + _expected_phrase(rest)
        )
    texts = sorted({_describe_expected(n) for n in names})

    def key(t: str) -> tuple[int, str]:
        bare = t[1:-1] if t.startswith("'") else t
        return (_PRIORITY.index(bare) if bare in _PRIORITY else len(_PRIORITY), t)

    texts.sort(key=key)
    if not texts:
        return "nothing"
    if len(texts) > 7:
        texts = texts[:6] + ["..."]
    if len(texts) == 1:
        return texts[0]
    if len(texts) == 2:
        return f"{texts[0]} or {texts[1]}"
    return "one of " + ", ".join(texts)


# ---------------------------------------------------------- source helpers


class _Source:
    """Offsets to (line, column), plus a light scan for brackets."""

    _SCAN = re.compile(
        r"""
        (?P<comment>//[^\n]*)
      | (?P<string>"(?:\\[^\n]|[^"\\\n])*")
      | (?P<char>'(?:\\[^\n]|[^'\\\n])*')
      | (?P<open>[(\[{])
      | (?P<close>[)\]}])
      | (?P<ws>\s+)
      | (?P<other>[^\s()\[\]{}"'/]+|/|["'])
        """,
        re.VERBOSE,
    )
    _PAIRS: ClassVar[dict[str, str]] = {"(": ")", "[": "]", "{": "}"}

    def __init__(self, text: str):
        self.text = text
        self.line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]
        self._tokens: list[tuple[int, int, str, str]] | None = None

    def loc(self, offset: int) -> tuple[int, int]:
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.line_starts, offset)
        return line, offset - self.line_starts[line - 1] + 1

    def eof(self) -> tuple[int, int]:
        return self.loc(len(self.text))

    def tokens(self) -> list[tuple[int, int, str, str]]:
        """Significant tokens (comments and whitespace dropped)."""
        if self._tokens is None:
            toks = []
            for m in self._SCAN.finditer(self.text):
                kind = m.lastgroup
                if kind in ("comment", "ws"):
                    continue
                toks.append((m.start(), m.end(), kind, m.group()))
            self._tokens = toks
        return self._tokens

    def previous_token_end(self, offset: int) -> int | None:
        """End offset of the last significant token that ends before `offset`."""
        ends = [t[1] for t in self.tokens()]
        i = bisect.bisect_right(ends, offset) - 1
        return ends[i] if i >= 0 else None

    def bracket_problem(self) -> tuple[str, int, str, int | None] | None:
        """The first bracket imbalance: (kind, offset, char, opener offset).

        kind is "unclosed" (offset is the opener), "unmatched" (a closer with
        no opener) or "mismatch" (a closer of the wrong kind; the opener's
        offset comes fourth).
        """
        stack: list[tuple[int, str]] = []
        for start, _end, kind, value in self.tokens():
            if kind == "open":
                stack.append((start, value))
            elif kind == "close":
                if not stack:
                    return ("unmatched", start, value, None)
                open_at, opener = stack.pop()
                if self._PAIRS[opener] != value:
                    return ("mismatch", start, value, open_at)
        if stack:
            open_at, opener = stack[-1]
            return ("unclosed", open_at, opener, None)
        return None


# ------------------------------------------------------------ diagnostics


def _error_from_lark(e: UnexpectedInput, src: _Source, filename: str) -> CslSyntaxError:
    text = src.text

    if isinstance(e, UnexpectedCharacters):
        pos = e.pos_in_stream
        line, col = src.loc(pos)
        ch = text[pos] if pos < len(text) else ""
        if ch == '"':
            msg = (
                "unterminated string literal (a string must close on the line it opens)"
            )
        elif ch == "'":
            msg = "invalid or unterminated character literal"
        elif ch.isdigit():
            bad = re.match(r"[0-9A-Za-z_.]*", text[pos:]).group()  # type: ignore[union-attr]
            msg = f"invalid number literal '{bad}'"
        elif ch and ch.isprintable() and not ch.isspace():
            msg = f"unexpected character '{ch}'"
        else:
            msg = (
                f"unexpected character U+{ord(ch):04X}"
                if ch
                else "unexpected end of file"
            )
        return CslSyntaxError(filename, line, col, msg)

    if isinstance(e, UnexpectedToken):
        tok = e.token
        expected = set(getattr(e, "accepts", None) or e.expected or ())
        at_eof = tok.type == "$END"
        pos = len(text) if at_eof else tok.start_pos
    elif isinstance(e, UnexpectedEOF):
        tok = lark.Token("$END", "")
        expected = set(e.expected or ())
        at_eof = True
        pos = len(text)
    else:  # pragma: no cover - lark has no other UnexpectedInput today
        line, col = src.loc(getattr(e, "pos_in_stream", 0) or 0)
        return CslSyntaxError(filename, line, col, str(e).splitlines()[0])

    problem = src.bracket_problem()
    if at_eof:
        if problem and problem[0] == "unclosed":
            _, open_at, opener, _ = problem
            line, col = src.loc(open_at)
            closer = _Source._PAIRS[opener]
            return CslSyntaxError(
                filename,
                line,
                col,
                f"'{opener}' is never closed: expected '{closer}' before end of file",
            )
        line, col = src.eof()
        return CslSyntaxError(
            filename,
            line,
            col,
            f"unexpected end of file; expected {_expected_phrase(expected)}",
        )

    found = _describe_found(tok)
    if text.startswith("/*", pos):
        line, col = src.loc(pos)
        return CslSyntaxError(
            filename, line, col, "'/* */' comments are not CSL; use '//'"
        )
    if problem and problem[1] == pos and problem[0] in ("unmatched", "mismatch"):
        line, col = src.loc(pos)
        if problem[0] == "unmatched":
            return CslSyntaxError(
                filename, line, col, f"'{problem[2]}' has no matching opening bracket"
            )
        oline, ocol = src.loc(problem[3])
        opener = text[problem[3]]
        return CslSyntaxError(
            filename,
            line,
            col,
            f"'{problem[2]}' does not close '{opener}' opened at {oline}:{ocol}; "
            f"expected '{_Source._PAIRS[opener]}'",
        )

    semi = _terminal_text("SEMICOLON") == ";" and "SEMICOLON" in expected
    if semi:
        prev_end = src.previous_token_end(pos)
        if prev_end is not None and src.loc(prev_end)[0] < src.loc(pos)[0]:
            # The statement ended on an earlier line: point at where the ';'
            # belongs, like a compiler would.
            line, col = src.loc(prev_end)
            prev_text = text[:prev_end].split()[-1] if text[:prev_end].split() else ""
            prev_text = prev_text[-20:]
            return CslSyntaxError(
                filename,
                line,
                col,
                f"expected ';' after '{prev_text}', found {found} on line {src.loc(pos)[0]}",
            )

    line, col = src.loc(pos)
    decl_starts = expected - {"$END"}
    texts = {_terminal_text(n) for n in decl_starts}
    if decl_starts and None not in texts and texts <= _TOP_LEVEL:
        return CslSyntaxError(
            filename,
            line,
            col,
            f"expected a top-level declaration (param, const, var, fn, task, comptime, layout), found {found}",
        )
    return CslSyntaxError(
        filename, line, col, f"expected {_expected_phrase(expected)}, found {found}"
    )


# ------------------------------------------------------------------ API


def parse_csl(text: str, filename: str = "<input>", positions: bool = True) -> lark.Tree:
    """Parse CSL source text; raise CslSyntaxError (located) on bad syntax.
    `positions`: record each tree node's line and column."""
    text = text.removeprefix("\ufeff")
    try:
        return _parser(positions).parse(text)
    except UnexpectedInput as e:
        raise _error_from_lark(e, _Source(text), filename) from None


def check_csl(text: str, filename: str = "<input>") -> list[str]:
    """[] when `text` is valid CSL, else the one-line located message."""
    try:
        parse_csl(text, filename, positions=False)
    except CslSyntaxError as e:
        return [str(e)]
    return []


def _read_source(path: str) -> tuple[str | None, str | None]:
    """(text, None) or (None, located error message)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        reason = e.strerror or e.__class__.__name__
        return None, f"{path}:1:1: error: cannot read file: {reason}"
    try:
        return data.decode("utf-8"), None
    except UnicodeDecodeError as e:
        before = data[: e.start]
        line = before.count(b"\n") + 1
        line_start = before.rfind(b"\n") + 1
        col = len(before[line_start:].decode("utf-8", errors="replace")) + 1
        return (
            None,
            f"{path}:{line}:{col}: error: file is not valid UTF-8 (byte 0x{data[e.start]:02x})",
        )


def lint_file(path: str | Path) -> list[str]:
    """Syntax-check one CSL file: [] when it parses, else one located message."""
    path = str(path)
    text, err = _read_source(path)
    if err is not None:
        return [err]
    assert text is not None
    return check_csl(text, path)


def lint_main(paths: list[str]) -> int:
    """Lint each path, print problems to stderr; 0 if all parse, else 1."""
    status = 0
    for path in paths:
        for msg in lint_file(path):
            print(msg, file=sys.stderr)
            status = 1
    return status


if __name__ == "__main__":  # pragma: no cover
    sys.exit(lint_main(sys.argv[1:]))
