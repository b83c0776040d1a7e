"""Tests for the CSL syntax checker (meshrt/backend/csl_lint.py, csl.lark).

Every snippet under csl_snippets/ was written for these tests. The grammar is
additionally held to real CSL (Cerebras csl-examples, WaferLLM kernels)
outside this repository; see the module docstring of csl_lint.
"""

from __future__ import annotations

import logging
import re
from importlib import resources
from pathlib import Path

import lark
import pytest

from meshrt.backend.csl_lint import (
    CslSyntaxError,
    check_csl,
    lint_file,
    lint_main,
    parse_csl,
)

SNIPPETS = Path(__file__).parent / "csl_snippets"
VALID = sorted((SNIPPETS / "valid").glob("*.csl"))
LOCATED = re.compile(
    r"^(?P<file>.+):(?P<line>\d+):(?P<col>\d+): error: (?P<what>\S.*)$"
)

# file -> (line, column, a phrase the message must contain)
BROKEN = {
    "missing_closing_brace.csl": (4, 18, "'{' is never closed"),
    "extra_closing_brace.csl": (7, 1, "no matching opening bracket"),
    "unbalanced_paren.csl": (5, 38, "expected ')' or ','"),
    "mismatched_bracket.csl": (6, 16, "does not close '(' opened at 6:11"),
    "top_level_garbage.csl": (4, 1, "expected a top-level declaration"),
    "stray_identifier.csl": (2, 1, "found identifier 'oops'"),
    "task_without_body.csl": (5, 16, "expected '{', found ';'"),
    "missing_semicolon.csl": (3, 17, "expected ';'"),
    "missing_semicolon_in_task.csl": (6, 18, "expected ';'"),
    "unterminated_string.csl": (6, 24, "unterminated string literal"),
    "keyword_as_name.csl": (2, 5, "found keyword 'task'"),
    "block_comment.csl": (3, 1, "'/* */' comments are not CSL"),
    "bad_number.csl": (2, 18, "invalid number literal '0xZZ'"),
    "unbraced_nested_if.csl": (4, 14, "found keyword 'if'"),
    "unknown_character.csl": (2, 13, "unexpected character '$'"),
}


def _one_located(messages: list[str], path: Path | str) -> re.Match[str]:
    assert len(messages) == 1, messages
    assert "\n" not in messages[0]
    m = LOCATED.match(messages[0])
    assert m, messages[0]
    assert m["file"] == str(path)
    return m


# ------------------------------------------------------------ valid input


def test_snippet_sets_are_complete():
    assert {p.name for p in VALID} >= {
        "layout.csl",
        "pe_program.csl",
        "syntax_tour.csl",
        "sdk_constructs.csl",
    }
    assert {p.name for p in (SNIPPETS / "broken").glob("*.csl")} == set(BROKEN)


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_valid_snippet_parses(path: Path):
    assert lint_file(path) == []


def test_layout_snippet_tree():
    tree = parse_csl((SNIPPETS / "valid" / "layout.csl").read_text(), "layout.csl")
    assert isinstance(tree, lark.Tree)
    kinds = [c.data for c in tree.children]
    assert kinds.count("param_decl") == 2 and kinds[-1] == "layout_block"
    builtins = {str(t.children[0]) for t in tree.find_data("builtin_call")}
    assert {
        "@set_rectangle",
        "@set_tile_code",
        "@set_color_config",
        "@export_name",
    } <= builtins
    assert len(list(tree.find_data("while_stmt"))) == 2
    assert len(list(tree.find_data("fn_type"))) == 2  # fn()void, fn(i16, f32)void


def test_pe_program_snippet_tree():
    tree = parse_csl(
        (SNIPPETS / "valid" / "pe_program.csl").read_text(), "pe_program.csl"
    )
    kinds = [c.data for c in tree.children]
    assert kinds.count("task_decl") == 3 and kinds.count("fn_decl") == 3
    assert kinds[-1] == "comptime_block"
    assert len(list(tree.find_data("tensor_access"))) == 2
    assert len(list(tree.find_data("switch_stmt"))) == 1
    assert len(list(tree.find_data("switch_expr"))) == 2  # the statement wraps one
    assert list(tree.find_data("for_stmt")) and list(tree.find_data("if_stmt"))
    async_opts = [
        f for f in tree.find_data("field_init") if str(f.children[0]) == "async"
    ]
    assert len(async_opts) == 2
    ptr_types = list(tree.find_data("ptr_type")) + list(tree.find_data("many_ptr_type"))
    assert len(ptr_types) >= 4  # [*]f32 (x3 incl. param), *const f32


def test_positions_are_recorded():
    tree = parse_csl("param n: i16;\n\ntask t() void {\n}\n")
    task = tree.children[1]
    assert (task.meta.line, task.meta.column) == (3, 1)


@pytest.mark.parametrize(
    "text",
    [
        "",
        "// only a comment\n",
        "const x = a * -b.c[1] << 2 | 3;",
        "const s = if (a) b else c;",
        "const t = .{ .x = .{ .y = .{ WEST } } };",
        "fn f() [8]u16 { return @constants([8]u16, 0); }",
        "const v = (p.*)[3];",
        "const d = @get_dsd(mem4d_dsd, .{ .tensor_access = |i, j, k|{2, 3, 4} -> b[i, j, k] });",
        "param p: color = @get_color(4);",
        "param untyped;",
        "\ufeffconst bom = 1;",
        "const crlf = 1;\r\nconst y = 2;\r\n",
        "fn f() void { switch (x) { .a => {}, else => y = 1 } }",
        'comptime { if (@is_arch("wse3")) { @initialize_queue(q, .{ .color = c }); } }',
    ],
)
def test_valid_fragments(text: str):
    assert check_csl(text, "frag.csl") == []


# ----------------------------------------------------------- broken input


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_broken_snippet_is_located(name: str):
    path = SNIPPETS / "broken" / name
    line, col, phrase = BROKEN[name]
    m = _one_located(lint_file(path), path)
    assert (int(m["line"]), int(m["col"])) == (line, col), m.string
    assert phrase in m["what"], m.string


@pytest.mark.parametrize(
    "text, line, phrase",
    [
        ("const a = b and or c;", 1, "found keyword 'or'"),
        ("var if = 1;", 1, "found keyword 'if'"),
        ("task t() void {\n  x = 1 +;\n}\n", 2, "expected an expression, found ';'"),
        ("const x = foo(,);", 1, "expected an expression or ')'"),
        ("const c = 'ab';", 1, "character literal"),
        ("fn f() void {\n  x = (a + b;\n}\n", 2, "expected ')'"),
        ("const x = @zeros([4]f32)", 1, "unexpected end of file"),
        ("const a = 1;\nconst b = \x00;", 2, "U+0000"),
    ],
)
def test_broken_fragments(text: str, line: int, phrase: str):
    m = _one_located(check_csl(text, "frag.csl"), "frag.csl")
    assert int(m["line"]) == line and phrase in m["what"], m.string


def test_parse_csl_raises_located_error():
    with pytest.raises(CslSyntaxError) as info:
        parse_csl("param n: i16;\ntask t() void;\n", "t.csl")
    err = info.value
    assert (err.filename, err.line, err.column) == ("t.csl", 2, 14)
    assert str(err).startswith("t.csl:2:14: error: ")


def _bracket_offsets(text: str) -> list[int]:
    """Offsets of brackets outside comments, strings and char literals."""
    code = re.sub(
        r"//[^\n]*|\"(?:\\.|[^\"\\\n])*\"|'(?:\\.|[^'\\\n])*'",
        lambda m: " " * len(m[0]),
        text,
    )
    return [i for i, ch in enumerate(code) if ch in "()[]{}"]


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_deleting_any_bracket_is_reported_once(path: Path):
    """Property (exhaustive, no hypothesis): every single-bracket deletion fails."""
    text = path.read_text()
    offsets = _bracket_offsets(text)
    assert offsets
    for off in offsets:
        broken = text[:off] + text[off + 1 :]
        m = _one_located(check_csl(broken, path.name), path.name)
        assert 1 <= int(m["line"]) <= broken.count("\n") + 1


@pytest.mark.parametrize("path", VALID, ids=lambda p: p.name)
def test_deleting_any_semicolon_is_reported_once(path: Path):
    text = path.read_text()
    code = re.sub(r"//[^\n]*|\"(?:\\.|[^\"\\\n])*\"", lambda m: " " * len(m[0]), text)
    for off in [i for i, ch in enumerate(code) if ch == ";"]:
        broken = text[:off] + text[off + 1 :]
        m = _one_located(check_csl(broken, path.name), path.name)
        # The ';' belongs on the line where it was deleted from, or the
        # parser trips on the very next token.
        deleted_line = text.count("\n", 0, off) + 1
        assert deleted_line <= int(m["line"]) <= deleted_line + 2, (off, m.string)


# ------------------------------------------------------ files and lint_main


def test_missing_file(tmp_path: Path):
    path = tmp_path / "nope.csl"
    m = _one_located(lint_file(path), path)
    assert (m["line"], m["col"]) == ("1", "1") and "cannot read file" in m["what"]


def test_directory_is_unreadable(tmp_path: Path):
    m = _one_located(lint_file(tmp_path), tmp_path)
    assert "cannot read file" in m["what"]


def test_non_utf8_file_is_located(tmp_path: Path):
    path = tmp_path / "latin1.csl"
    path.write_bytes(b"const a = 1;\n// caf\xe9\n")
    m = _one_located(lint_file(path), path)
    assert (m["line"], m["col"]) == ("2", "7")
    assert "not valid UTF-8" in m["what"] and "0xe9" in m["what"]


def test_lint_main_ok(capsys):
    assert lint_main([str(p) for p in VALID]) == 0
    assert capsys.readouterr().err == ""


def test_lint_main_reports_each_bad_file(tmp_path: Path, capsys):
    broken = [
        SNIPPETS / "broken" / n
        for n in ("task_without_body.csl", "missing_semicolon.csl")
    ]
    missing = tmp_path / "missing.csl"
    paths = [str(VALID[0]), *map(str, broken), str(missing)]
    assert lint_main(paths) == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3
    assert [LOCATED.match(l)["file"] for l in lines] == [
        *map(str, broken),
        str(missing),
    ]


def test_lint_main_empty_list():
    assert lint_main([]) == 0


# ------------------------------------------------------------------ grammar


def test_grammar_ships_as_package_data():
    assert resources.files("meshrt.backend").joinpath("csl.lark").is_file()


def test_grammar_is_conflict_free_lalr():
    """lark resolves shift/reduce conflicts silently (logged); we have none."""
    records: list[str] = []

    class Grab(logging.Handler):
        def emit(self, record):
            records.append(record.getMessage())

    handler, old_level = Grab(), lark.logger.level
    lark.logger.addHandler(handler)
    lark.logger.setLevel(logging.DEBUG)
    try:
        text = resources.files("meshrt.backend").joinpath("csl.lark").read_text()
        lark.Lark(text, parser="lalr")
    finally:
        lark.logger.removeHandler(handler)
        lark.logger.setLevel(old_level)
    assert not [r for r in records if "conflict" in r.lower()]


def test_every_keyword_is_declared_reserved():
    """A quoted keyword used in a rule but missing from the grammar's keyword
    list would silently be accepted as an identifier where no keyword fits."""
    from meshrt.backend.csl_lint import _keyword_terminals

    text = resources.files("meshrt.backend").joinpath("csl.lark").read_text()
    full = lark.Lark(text, parser="lalr", lexer="basic")
    words = {
        t.name
        for t in full.terminals
        if t.pattern.type == "str"
        and re.fullmatch(r"[a-z_][a-z0-9_]*", t.pattern.value)
    }
    assert words == set(_keyword_terminals(text))
