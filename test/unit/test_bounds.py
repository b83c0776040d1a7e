"""Bounds on every input (issue 19, item 1): nesting depth, sizes and counts,
memory estimated before it is allocated, finite numbers, flags checked
before any work. Each bad input is exit 1 with one located line on stderr."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from meshrt.diagnostics import FrontendError
from meshrt.limits import MAX_JSON_DEPTH, JSONInputError, parse_json
from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
TINY_MOE = REPO / "examples" / "tiny_moe.mrt"
TINY_DENSE = REPO / "examples" / "tiny_dense.mrt"
LOCATED = re.compile(r"^(meshrt( [\w-]+)?|\S+?(:\d+:\d+)?): error: \S")  # a flag: the command


def _cli(*args: str, env: dict[str, str] | None = None) -> tuple[int, list[str]]:
    """`meshrt ARGS` in this process: (exit code, stderr lines)."""
    out, err = io.StringIO(), io.StringIO()
    old = {k: os.environ.get(k) for k in env or {}}
    os.environ.update(env or {})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = main([str(a) for a in args])
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return rc, err.getvalue().splitlines()


def _one_line(rc: int, lines: list[str], needle: str) -> str:
    assert rc == 1, lines
    assert len(lines) == 1, lines
    assert LOCATED.match(lines[0]), lines[0]
    assert needle in lines[0], lines[0]
    assert "internal error" not in lines[0] and "Traceback" not in lines[0]
    return lines[0]


def _process(*args: str, timeout: int = 300, env: dict[str, str] | None = None):
    proc = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout, check=False, env={**os.environ, **(env or {})})
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    return proc.returncode, proc.stderr.splitlines()


def _spec(tmp_path: Path, old: str, new: str, base: Path = TINY_MOE, name: str = "m.mrt") -> Path:
    text = base.read_text()
    assert old in text
    p = tmp_path / name
    p.write_text(text.replace(old, new, 1))
    return p


def _config(tmp_path: Path, **over) -> Path:
    cfg = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
           "num_attention_heads": 4, "vocab_size": 256, "intermediate_size": 128,
           "max_position_embeddings": 32, "eos_token_id": 1, "torch_dtype": "float32"}
    cfg.update(over)
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    return p


# -- nesting depth ----------------------------------------------------------------

def test_parse_json_bounds_depth_before_parsing():
    deep = "[" * 20_000 + "]" * 20_000
    with pytest.raises(JSONInputError) as e:
        parse_json('{"a":\n ' + deep + "}")
    assert (e.value.line, e.value.col) == (2, 2 + MAX_JSON_DEPTH - 1)
    assert parse_json("[" * (MAX_JSON_DEPTH - 1) + "]" * (MAX_JSON_DEPTH - 1))  # the bound itself is fine
    assert parse_json('{"s": "[[[[' + "[" * 100 + '"}') == {"s": "[[[[" + "[" * 100}  # strings don't nest


@pytest.mark.parametrize("text, needle", [
    ('{"a": NaN}', "NaN is not a finite number"),
    ('{"a": -Infinity}', "-Infinity is not a finite number"),
    ('{"a": 1e400}', "number 1e400 is out of range"),
    ('{"a": ' + "7" * 400 + "}", "(400 digits) is out of range"),
])
def test_parse_json_numbers_are_finite(text, needle):
    with pytest.raises(JSONInputError, match=re.escape(needle)) as e:
        parse_json(text)
    assert (e.value.line, e.value.col) == (1, 7)


def test_deep_config_json(tmp_path):
    p = tmp_path / "config.json"
    p.write_text('{"model_type": "llama",\n "x": ' + "[" * 20_000 + "]" * 20_000 + "}")
    line = _one_line(*_cli("compile", p, "--target", "test32"), "nested deeper than 64")
    assert line.startswith(f"{p}:2:")


def test_config_number_out_of_range(tmp_path):
    p = tmp_path / "config.json"
    p.write_text(_config(tmp_path).read_text().replace('"num_hidden_layers": 2',
                                                       '"num_hidden_layers": 1e400'))
    _one_line(*_cli("compile", p, "--target", "test32"), "1e400 is out of range")


def test_deep_expert_profile_and_region_models(tmp_path):
    from meshrt.runtime.expert_profile import ExpertProfile, RegionModels

    deep = '{"layers": {"0": ' + "[" * 20_000 + "]" * 20_000 + "}}"
    for cls, what in ((ExpertProfile, "expert profile"), (RegionModels, "region models")):
        p = tmp_path / f"{cls.__name__}.json"
        p.write_text(deep)
        with pytest.raises(FrontendError) as e:
            cls.load(p)
        assert str(e.value).startswith(f"{p}:1:")
        assert f"{what} is not valid JSON: nested deeper than 64" in str(e.value)


def test_deep_workload_line(tmp_path):
    from meshrt.runtime.workloads import WorkloadError, load_jsonl

    p = tmp_path / "w.jsonl"
    p.write_text('{"arrival": 0, "prompt": [1], "max_new_tokens": 2}\n{"x": '
                 + "[" * 20_000 + "]" * 20_000 + "}\n")
    with pytest.raises(WorkloadError, match=r"w.jsonl:2: error: invalid JSON: nested deeper"):
        load_jsonl(p, vocab=10)


@pytest.fixture(scope="module")
def graph_ir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("ir")
    assert _cli("compile", TINY_MOE, "--target", "test32", "-o", d / "g.mlir")[0] == 0
    return (d / "g.mlir").read_text()


@pytest.fixture(scope="module")
def segment_ir(tmp_path_factory) -> str:
    d = tmp_path_factory.mktemp("ir")
    assert _cli("compile", TINY_MOE, "--target", "test32", "--emit", "segments",
                "-o", d / "s.mlir")[0] == 0
    return (d / "s.mlir").read_text()


def test_deeply_nested_ir_attribute(tmp_path, graph_ir):
    """20,000 nested arrays in an attribute: a located line, not 'internal error'."""
    p = tmp_path / "deep.mlir"
    p.write_text(graph_ir.replace("hparams {", "hparams {deep = " + "[" * 20_000 + "]" * 20_000
                                  + ", ", 1))
    rc, lines = _process("meshrt.tools.meshrt_opt", str(p))
    _one_line(rc, lines, "nested too deeply for the parser")
    assert lines[0].startswith(f"{p}:2:")
    _one_line(*_cli("run", p), "nested too deeply for the parser")


# -- sizes and counts ------------------------------------------------------------

@pytest.mark.parametrize("layers, needle", [
    ("1000000000", "layers must be at most 65,536, got 1,000,000,000"),
    (str(2 ** 63), "layers must be at most 65,536"),
    ("65536", "more than the 18.79 GB of 2048 test32 wafers"),
])
def test_huge_layer_count_fails_fast(tmp_path, layers, needle):
    p = _spec(tmp_path, "layers      = 2", f"layers = {layers}")
    rc, lines = _process("meshrt.tools.cli", "compile", str(p), "--target", "test32", timeout=120)
    _one_line(rc, lines, needle)


def test_huge_layer_count_in_a_wafer_budget_blames_the_budget(tmp_path):
    p = _spec(tmp_path, "layers      = 2", "layers = 60000")
    _one_line(*_cli("compile", p, "--target", "test32", "--wafers", "4"),
              "model does not fit")


def test_config_layer_count_out_of_range(tmp_path):
    p = _config(tmp_path, num_hidden_layers=10 ** 30)
    line = _one_line(*_cli("compile", p, "--target", "test32"), "layers must be at most 65,536")
    assert line.startswith(f"{p}:1:")


@pytest.mark.parametrize("old, new, needle", [
    ("experts = 8 : i64", "experts = -3 : i64", "hparams: experts must not be negative, got -3"),
    ("top_k = 2 : i64", "top_k = -3 : i64", "hparams: top_k must not be negative, got -3"),
    ("top_k = 2 : i64", "top_k = 9 : i64", "hparams: top_k 9 must be between 1 and the expert count 8"),
    ("head_dim = 16 : i64", "head_dim = 1000000000 : i64", "head_dim must be at most 16,777,216"),
    ("kv_slots = 8 : i64", "kv_slots = 0 : i64", "hparams: kv_slots must be at least 1, got 0"),
    ("dtype_bytes = 4.000000e+00", "dtype_bytes = 0x7FF8000000000000",
     "hparams: dtype_bytes must be a positive multiple of 1/4096 up to 8, got nan"),
])
def test_bad_hparams_are_rejected_by_the_program_verifier(tmp_path, segment_ir, old, new, needle):
    """Segment IR mutated: meshrt-opt and meshrt run refuse it at the program op."""
    assert old in segment_ir
    p = tmp_path / "bad.mlir"
    p.write_text(segment_ir.replace(old, new, 1))
    for argv in (["meshrt-opt"], ["run"]):
        if argv == ["meshrt-opt"]:
            from meshrt.tools.meshrt_opt import main as opt_main

            err = io.StringIO()
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                rc = opt_main([str(p)])
            lines = err.getvalue().splitlines()
        else:
            rc, lines = _cli("run", p)
        line = _one_line(rc, lines, needle)
        assert line.startswith(f"{p}:2:3: error: 'segment.program' op @tiny_moe: hparams:")


def test_graph_hparams_are_checked_too(tmp_path, graph_ir):
    p = tmp_path / "bad.mlir"
    p.write_text(graph_ir.replace("experts = 8 : i64", "experts = -3 : i64", 1))
    _one_line(*_cli("run", p), "'graph.model' op @tiny_moe: hparams: experts must not be negative")


def test_expert_region_outside_the_mesh(tmp_path):
    out = tmp_path / "k.mlir"
    assert _cli("compile", TINY_MOE, "--target", "test32", "--emit", "kernels", "-o", out)[0] == 0
    text = out.read_text()
    dispatch = next(ln for ln in text.splitlines() if "mesh_kernel.dispatch" in ln)
    first = re.search(r"expert_regions = \[#mesh.cores<\((\d+), (\d+), (\d+), (\d+)\)>", dispatch)
    wide = dispatch.replace(first.group(0), first.group(0).replace(
        f"{first.group(3)}, {first.group(4)})", f"100000000000, {first.group(4)})"), 1)
    out.write_text(text.replace(dispatch, wide))
    rc, lines = _cli("run", out)
    _one_line(rc, lines, "expert_regions[0]")
    assert "outside the 32 x 32 mesh" in lines[0]


# -- memory ------------------------------------------------------------------------

def test_run_bytes_counts_weights_tiles_and_kv():
    from meshrt.runtime.serving import run_bytes
    from meshrt.shape import ModelShape

    s = ModelShape(2, 64, 4, 2, 16, 256, ffn=128)
    plain, experts = s.weight_counts()
    assert experts == 0 and plain * s.dtype_bytes == s.weight_bytes()
    kv = 4 * 2 * 2 * 16 * s.max_seq * 2 * (3 + 1)
    assert run_bytes(s, 3) == 12 * plain + 8 * 256 * 64 + kv
    assert run_bytes(s, 7) > run_bytes(s, 3)


def test_run_refuses_a_model_this_machine_cannot_hold():
    rc, lines = _cli("run", TINY_DENSE, env={"MESHRT_MEMORY_BYTES": "1000000"})
    line = _one_line(rc, lines, "for the NumPy reference and interpreter of tiny_dense; this machine "
                                "has 1.00 MB available: use `meshrt bench`")
    assert line.startswith(f"{TINY_DENSE}: error: needs ")


def test_run_qwen3_8b_on_wse3_is_refused_before_lowering():
    """The reference would need tens of GB: refused with the estimate, no MemoryError."""
    rc, lines = _process("meshrt.tools.cli", "run", "examples/configs/qwen3-8b.json", "--target",
                         "wse3", env={"MESHRT_MEMORY_BYTES": str(16 * 10 ** 9)})
    line = _one_line(rc, lines, "for the NumPy reference and interpreter of qwen3-8b")
    assert re.search(r"needs \d+\.\d\d GB", line) and "has 16.00 GB available" in line


def test_run_refuses_segment_ir_too_large_for_memory(tmp_path, segment_ir):
    p = tmp_path / "big.mlir"
    p.write_text(segment_ir.replace("head_dim = 16 : i64", "head_dim = 1048576 : i64", 1))
    rc, lines = _cli("run", p, env={"MESHRT_MEMORY_BYTES": str(10 ** 9)})
    line = _one_line(rc, lines, "for the NumPy reference and interpreter of tiny_moe")
    assert line.startswith(f"{p}:2:3: error: needs ")


def test_a_quantized_config_is_computed_not_only_sized(tmp_path):
    p = _config(tmp_path, model_type="gpt_oss", num_local_experts=4, num_experts_per_tok=2,
                head_dim=16, quantization_config={"quant_method": "mxfp4"})
    assert _cli("compile", p, "--target", "test32")[0] == 0
    rc, lines = _cli("run", p, "--requests", "1")
    assert rc == 0, lines


# -- spec values ---------------------------------------------------------------

def test_explicit_zero_byte_sizes_and_empty_name(tmp_path):
    p = _spec(tmp_path, "dtype_bytes = 4", "dtype_bytes = 4\n  kv_bytes = 0")
    assert _one_line(*_cli("compile", p, "--target", "test32"),
                     "kv_bytes must be positive, got 0").startswith(f"{p}:20:")
    p = _spec(tmp_path, "dtype_bytes = 4", "dtype_bytes = 4  expert_dtype_bytes = 0")
    _one_line(*_cli("compile", p, "--target", "test32"), "expert_dtype_bytes must be positive")
    p = _spec(tmp_path, "model tiny_moe", 'model ""')
    assert _one_line(*_cli("compile", p, "--target", "test32"),
                     "the model's name is empty").startswith(f"{p}:9:7:")


# -- flags, before any work --------------------------------------------------------

def test_dynamism_flag_is_blamed_on_the_flag():
    line = _one_line(*_cli("compile", TINY_MOE, "--target", "test32", "--dynamism", "bogus"),
                     "argument --dynamism: unknown dynamism kind 'bogus'")
    assert line.startswith("meshrt compile: error:") and "continuous_batching" in line
    _one_line(*_cli("compile", TINY_MOE, "--target", "test32", "--dynamism", "moe_routing,,"),
              "empty item")


def test_micro_batch_list_rejects_empty_items():
    _one_line(*_cli("bench", TINY_MOE, "--target", "test32", "--micro-batch", "1,,2"),
              "argument --micro-batch: expected comma-separated positive integers, got '1,,2'")


@pytest.mark.parametrize("flags, needle", [
    (["--workload", "bogus"], "meshrt run: error: --workload: unknown workload 'bogus'"),
    (["--workload", "nosuch.jsonl"], "nosuch.jsonl: error: no such workload file"),
    (["--target", "nosuch"], "meshrt run: error: --target: unknown target 'nosuch'"),
    (["--rate", "nan"], "--rate must be a finite number, got nan"),
    (["--seed", "-1"], "--seed must be at least 0, got -1"),
    (["--weights-seed", str(2 ** 64)], "--weights-seed must be at most"),
    (["--trace-by-class"], "--trace-by-class needs --trace FILE"),
    (["--requests", "100000000"], "arrive over about 5,000,000,000,000 cycles, past --max-cycles"),
    (["--requests", "100000000", "--rate", "0"], "needs 6.61 TB for the 100,000,000 requests"),
])
def test_run_flags_are_checked_before_the_model_is_read(flags, needle):
    """The model does not exist: each flag error comes first, so nothing was compiled."""
    _one_line(*_cli("run", "no-such-model.mrt", *flags), needle)


def test_viz_steps_are_bounded_by_memory(tmp_path):
    out = tmp_path / "never-written.png"
    line = _one_line(*_cli("viz", TINY_DENSE, "--target", "test32", "--what", "load", "--steps",
                           "100000000", "-o", str(out)),
                     "for the per-core trace of 100,000,000 decode steps")
    assert line.startswith(f"{TINY_DENSE}: error: needs ") and "lower --steps" in line
    assert not out.exists()


def _actions(parser):
    import argparse

    for a in parser._actions:
        if isinstance(a, argparse._SubParsersAction):
            for name, sub in a.choices.items():
                yield from ((f"{name} {n}", x) for n, x in _actions(sub))
        else:
            yield "/".join(a.option_strings) or a.dest, a


def test_every_flag_has_help():
    from meshrt.tools.cli import _parser

    missing = [n for n, a in _actions(_parser()) if not a.help]
    assert missing == []


def test_help_lists_valid_values():
    from meshrt.frontend.model import SUPPORTED_DYNAMISM
    from meshrt.passes.pipeline import LEVELS
    from meshrt.tools.cli import _parser

    helps = {n: a.help for n, a in _actions(_parser())}
    assert all(k in helps["compile --dynamism"] for k in SUPPORTED_DYNAMISM)
    assert all(lv in helps["compile --emit"] for lv in LEVELS)
    for flag in ("compile --target", "run --target", "bench --target", "viz --target"):
        assert all(t in helps[flag] for t in ("wse3", "wse2", "test32", "test16")), flag
    for flag in ("run --workload", "bench --workload"):
        assert "chat" in helps[flag] and "reasoning" in helps[flag] and ".jsonl" in helps[flag]
