"""meshrt-opt behaves like mlir-opt: exit codes, one-line errors, chunks, expected-* comments.

The FileCheck tests in test/filecheck/meshrt-opt/ pin the output; these pin
exit codes (lit's `not` accepts any) and the pieces (pipeline text, chunks,
expectations) in-process, which is fast.
"""

from __future__ import annotations

import pytest

from meshrt import __version__
from meshrt.tools import cli
from meshrt.tools.meshrt_opt import (
    Diagnostic,
    UsageError,
    check_expectations,
    main,
    parse_expectations,
    pipeline_text,
    split_chunks,
)

GOOD = ('graph.model @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] '
        'hparams {} {\n  %x = graph.embed @embed on <(0, 0, 2, 1)> {layer = -1 : i64, '
        'stage = STAGE : i64, wafer = 0 : i64, vocab = 8 : i64} : !graph.act<16>\n}\n')
OK, BAD = GOOD.replace("STAGE", "0"), GOOD.replace("STAGE", "3")  # BAD's error is at line 2


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def write(tmp_path, text: str | bytes, name: str = "in.mlir") -> str:
    path = tmp_path / name
    (path.write_bytes if isinstance(text, bytes) else path.write_text)(text)
    return str(path)


@pytest.mark.parametrize("argv, words", [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["-t", "bogus"], "invalid choice: 'bogus'"),
    (["-t", "llvm"], "xDSL's llvm target does not print meshrt IR"),
    (["-t", "wgsl"], "invalid choice: 'wgsl'"),
    (["-t", "riscv-asm"], "invalid choice: 'riscv-asm'"),
    (["-t", "csl{"], "bad target: expected argument name here at column 5"),
    (["-p", "nosuch"], "unknown pass 'nosuch'"),
    (["-p", "place-experts{seed=nan}"],
     "pass 'place-experts': option 'seed': expected an integer, got 'nan'"),
    (["-p", "place-experts{tokens=x}"],
     "pass 'place-experts': option 'tokens': expected a number, got 'x'"),
    (["-p", "check-segments{handshakes=2}"],
     "pass 'check-segments': option 'handshakes': expected true or false, got 2"),
    (["-p", "materialize-segments{colours=2}"],
     "pass 'materialize-segments': option 'colours': unknown option, expected one of target, "
     "colors,"),
    (["--pass-pipeline", "check-segments"], "--pass-pipeline must be 'builtin.module(PASS,...)'"),
    (["--pass-pipeline", "builtin.module(check-segments)", "-p", "check-segments"],
     "give -p or --pass-pipeline, not both"),
])
def test_bad_command_line_is_one_line_and_exit_1(capsys, tmp_path, argv, words):
    code, out, err = run(capsys, *argv, write(tmp_path, OK))
    assert code == 1 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("meshrt-opt: error: ")
    assert words in err and "usage:" not in err


def test_only_targets_that_print_meshrt_ir_are_offered(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    help_text = capsys.readouterr().out
    assert "meshrt-csl" in help_text and "wgsl" not in help_text and "llvm" not in help_text
    assert "empty module" in help_text  # what an empty input means is documented


@pytest.mark.parametrize("spec", ["lower-to-mesh-kernels, synthesize-schedules",
                                  "builtin.module(lower-to-mesh-kernels,synthesize-schedules)",
                                  " builtin.module( lower-to-mesh-kernels , synthesize-schedules ) "])
def test_pipeline_text_takes_spaces_and_the_anchor(spec):
    assert pipeline_text(spec, anchored="builtin" in spec) == \
        "lower-to-mesh-kernels,synthesize-schedules"


def test_pipeline_text_keeps_spaces_inside_options_and_strings():
    spec = 'materialize-segments{colors=3 iq=2}, place-experts{profile="a b.json"}'
    assert pipeline_text(spec, anchored=False) == \
        'materialize-segments{colors=3 iq=2},place-experts{profile="a b.json"}'
    with pytest.raises(UsageError, match="only 'builtin.module"):
        pipeline_text("func.func(cse)", anchored=False)


def test_pass_pipeline_runs_like_p(capsys, tmp_path):
    f = write(tmp_path, OK)
    code_p, out_p, _ = run(capsys, f, "-p", "lower-to-mesh-kernels, check-segments{handshakes=false}")
    code_pp, out_pp, _ = run(capsys, f, "--pass-pipeline",
                             "builtin.module(lower-to-mesh-kernels, check-segments{handshakes=false})")
    assert code_p == code_pp == 1 and out_p == out_pp == ""  # check-segments: wrong level
    code_p, out_p, _ = run(capsys, f, "-p", " lower-to-mesh-kernels ")
    code_pp, out_pp, _ = run(capsys, f, "--pass-pipeline", "builtin.module(lower-to-mesh-kernels)")
    assert code_p == code_pp == 0 and out_p == out_pp and "mesh_kernel.program @m" in out_p


@pytest.mark.parametrize("text", ["", "\n\n", "// only a comment\n"])
def test_empty_input_is_an_empty_module(capsys, tmp_path, text):
    code, out, err = run(capsys, write(tmp_path, text))
    assert (code, out, err) == (0, "builtin.module {\n}\n\n", "")


def test_bad_utf8_is_located_in_the_file(capsys, tmp_path):
    f = write(tmp_path, OK.encode() + b"// caf\xe9\n")
    code, out, err = run(capsys, f)
    assert code == 1 and out == ""
    assert err == f"{f}: error: not UTF-8 at byte {len(OK.encode()) + 6}\n"


def test_missing_input_is_one_line(capsys, tmp_path):
    code, _, err = run(capsys, str(tmp_path / "nope.mlir"))
    assert code == 1 and err == f"{tmp_path / 'nope.mlir'}: error: cannot read: No such file or directory\n"


def test_split_input_file_reports_every_chunk(capsys, tmp_path):
    f = write(tmp_path, BAD + "// -----\n" + OK + "// -----\n" + BAD)
    code, out, err = run(capsys, f, "--split-input-file")
    assert code == 1
    # BAD is 3 lines, the marker 1: the third chunk starts at line 9.
    assert err.splitlines() == [
        f"{f}:2:3: error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0",
        f"{f}:10:3: error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0"]
    assert out.count("// -----\n") == 2 and out.count("graph.model @m") == 1
    assert out.index("// -----") < out.index("graph.model") < out.rindex("// -----")


def test_split_input_file_all_good_exits_0(capsys, tmp_path):
    code, out, err = run(capsys, write(tmp_path, OK + "// -----\n" + OK), "--split-input-file")
    assert code == 0 and err == "" and out.count("graph.model @m") == 2


def test_split_chunks_offsets():
    assert split_chunks(b"a\n// -----\nb\nc\n  // -----  \nd") == \
        [(b"a\n", 0), (b"b\nc\n", 2), (b"d", 5)]
    assert split_chunks(b"a // ----- b\n") == [(b"a // ----- b\n", 0)]  # only a line of its own


def test_verify_diagnostics_without_expectations_keeps_the_old_convention(capsys, tmp_path):
    """No expected-* comment: each diagnostic to stdout, exit 0 (the FileCheck tests use this)."""
    f = write(tmp_path, BAD + "// -----\n" + BAD)
    code, out, err = run(capsys, f, "--split-input-file", "--verify-diagnostics")
    assert code == 0 and err == ""
    assert out.splitlines() == [f"{f}:2:3: error: 'graph.embed' op kernel @embed: stage 3 is not "
                                "in 0..0", "// -----",
                                f"{f}:6:3: error: 'graph.embed' op kernel @embed: stage 3 is not "
                                "in 0..0"]


@pytest.mark.parametrize("comment_line, comment", [
    (0, "// expected-error @+2 {{stage 3 is not in 0..0}}"),
    (2, "  // expected-error @-1 {{stage 3}}"),
    (2, "  // expected-error @above {{stage 3}}"),
    (0, "// expected-error @3 {{stage 3}}"),
    (0, "// expected-error-re @+2 {{stage {{[0-9]}} is not in 0..{{[0-9]+}}}}"),
])
def test_verify_diagnostics_matches_expectations(capsys, tmp_path, comment_line, comment):
    lines = BAD.splitlines()
    lines.insert(comment_line, comment)
    f = write(tmp_path, "\n".join(lines) + "\n")
    code, out, err = run(capsys, f, "--verify-diagnostics")
    assert (code, out, err) == (0, "", "")


def test_same_line_expectation(capsys, tmp_path):
    lines = BAD.splitlines()
    lines[1] += "  // expected-error {{stage 3}}"
    code, _, err = run(capsys, write(tmp_path, "\n".join(lines) + "\n"), "--verify-diagnostics")
    assert (code, err) == (0, "")


def test_verify_diagnostics_fails_on_unmatched_and_unexpected(capsys, tmp_path):
    f = write(tmp_path, "// expected-error @+2 {{stage 4}}\n" + BAD
              + "// -----\n// expected-warning @+1 {{careful}}\n" + OK)
    code, out, err = run(capsys, f, "--split-input-file", "--verify-diagnostics")
    assert code == 1
    assert err.splitlines() == [
        f"{f}:3:3: error: unexpected error: 'graph.embed' op kernel @embed: stage 3 is not in 0..0",
        f'{f}:1:4: error: expected error "stage 4" was not produced',
        f'{f}:6:4: error: expected warning "careful" was not produced']
    assert out.count("graph.model") == 1  # the chunk without an error is printed


def test_expectation_designators():
    text = ("x // expected-error {{a}}\n// expected-note @+2 {{b}}\n"
            "// expected-remark @unknown {{c}}\n// expected-error @7 {{d}}\n")
    (chunk,) = parse_expectations(text, "f.mlir", [(b"", 0)])
    assert [(e.severity, e.line, e.text, e.where) for e in chunk] == [
        ("error", 1, "a", "f.mlir:1:6"), ("note", 4, "b", "f.mlir:2:4"),
        ("remark", None, "c", "f.mlir:3:4"), ("error", 7, "d", "f.mlir:4:4")]
    assert parse_expectations("no comments\n", "f.mlir", [(b"", 0)]) is None


def test_unknown_expectation_matches_an_unlocated_diagnostic():
    (chunk,) = parse_expectations("// expected-error @unknown {{needs}}\n", "f.mlir", [(b"", 0)])
    assert check_expectations(chunk, Diagnostic.of("f.mlir: error: x needs y"), "f.mlir") == []


def test_bad_designator_is_located(capsys, tmp_path):
    f = write(tmp_path, "// expected-error @nowhere {{x}}\n" + OK)
    code, _, err = run(capsys, f, "--verify-diagnostics")
    assert code == 1 and err.startswith(f"{f}:1:4: error: expected '@+N'")


def test_versions(capsys):
    for entry, prog in ((main, "meshrt-opt"), (cli.main, "meshrt")):
        with pytest.raises(SystemExit) as e:
            entry(["--version"])
        assert e.value.code == 0
        assert capsys.readouterr().out.startswith(f"{prog} {__version__}")
