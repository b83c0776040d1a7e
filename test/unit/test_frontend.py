"""Frontend: the .mrt language, HF config import, the default mapper, `meshrt compile`."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest
from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser
from xdsl.printer import Printer

from meshrt.dialects import graph as g
from meshrt.dialects.graph import Graph
from meshrt.dialects.mesh import Mesh
from meshrt.frontend.errors import FrontendError
from meshrt.frontend.hf_config import (
    SUPPORTED_TYPES,
    hf_spec_from_dict,
    load_hf_config,
)
from meshrt.frontend.mapper import Sizer, map_model, symbol_name
from meshrt.frontend.model import ModelShape
from meshrt.frontend.spec import parse_spec, parse_spec_file
from meshrt.targets import load_target
from meshrt.tools.cli import main

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.mrt"))
CONFIGS = sorted((REPO / "examples" / "configs").glob("*.json"))


def _spec(path: Path):
    return load_hf_config(path) if path.suffix == ".json" else parse_spec_file(path)


def _model(module: ModuleOp) -> g.ModelOp:
    op = module.body.block.first_op
    assert isinstance(op, g.ModelOp)
    return op


@pytest.fixture(scope="module")
def compiled():
    """(model path name, target) -> verified module, compiled once per test module."""
    cache: dict[tuple[str, str], ModuleOp] = {}

    def get(path: Path, target: str, **kw) -> ModuleOp:
        key = (str(path), target, tuple(sorted(kw.items())))
        if key not in cache:
            m = map_model(_spec(path), load_target(target), **kw)
            m.verify()
            cache[key] = m
        return cache[key]

    return get


# ---------------------------------------------------------------------------
# The .mrt language
# ---------------------------------------------------------------------------

FULL = """
// every kind of field
model "My-Model.v2" {
  layers = 4  hidden = 1_024  heads = 8  kv_heads = 2  head_dim = 128
  vocab = 32_000  ffn = 2048
  experts = 16  top_k = 2  expert_ffn = 512  shared_experts = 1  moe_layers = [1, 3]
  dtype_bytes = 2  expert_dtype_bytes = 0.5  kv_bytes = 2  max_seq = 2048  eos_token = 2
}
runtime {
  dynamism = [continuous_batching, moe_routing, micro_batch_pipeline]
  micro_batch = 4
  wafers = 2
}
mapping {
  stages = 3
  experts_per_region = 2
  placement = contiguous
}
"""


def test_full_spec():
    spec = parse_spec(FULL, "full.mrt")
    s = spec.shape
    assert s.name == "My-Model.v2" and s.hidden == 1024 and s.vocab == 32000
    assert s.moe_layers == (1, 3) and s.is_moe_layer(1) and not s.is_moe_layer(0)
    assert s.expert_dtype_bytes == 0.5 and s.shared_experts == 1
    assert spec.dynamism == ("continuous_batching", "moe_routing", "micro_batch_pipeline")
    assert (spec.micro_batch, spec.wafers) == (4, 2)
    assert spec.mapping.stages == 3 and spec.mapping.experts_per_region == 2
    assert spec.source == "full.mrt"


def test_defaults():
    spec = parse_spec("model m { layers = 1 hidden = 64 heads = 4 vocab = 10 ffn = 8 }")
    s = spec.shape
    assert (s.kv_heads, s.head_dim, s.max_seq, s.eos_token) == (4, 16, 4096, 0)
    assert s.dtype_bytes == 2 and s.kv_bytes == 2 and s.expert_dtype_bytes == 2
    assert spec.dynamism == ("continuous_batching", "micro_batch_pipeline")
    assert spec.micro_batch == 1 and spec.wafers is None and not spec.mapping.explicit


def test_examples_parse():
    dense = parse_spec_file(REPO / "examples" / "tiny_dense.mrt").shape
    moe = parse_spec_file(REPO / "examples" / "tiny_moe.mrt").shape
    assert not dense.is_moe and dense.ffn > 0 and 64 <= dense.hidden <= 128
    assert moe.experts == 8 and moe.top_k == 2 and 64 <= moe.hidden <= 128
    assert moe.layers <= 4 and dense.layers <= 4


@pytest.mark.parametrize(
    "text, where, what",
    [
        ("model m {\n  layers = 2 hidden = 64\n  heads = 0 vocab = 9 ffn = 3 }", "3:11",
         "heads must be at least 1"),
        ("model m { layers = 2 hidden = 64 heads = 4 vocab = 9 ffn = 3\n  widht = 3 }", "2:3",
         "unknown model field 'widht'"),
        ("model m {\n  layers = 2\n  hidden = 64 heads = 4 vocab = 9 ffn = 3 experts = 4 "
         + "top_k = 5 expert_ffn = 2 }", "3:63", "top_k 5 must be between 1 and the expert count 4"),
        ("model m { layers = 2 hidden = 60 heads = 8 vocab = 9 ffn = 3 }", "1:31",
         "hidden size 60 is not divisible by heads 8"),
        ("model m { layers = 2 hidden = 64 heads = 4 vocab = 9 ffn = 3 } extra", "1:64",
         "unexpected 'extra'"),
    ],
)
def test_spec_errors_are_located(text, where, what):
    with pytest.raises(FrontendError) as e:
        parse_spec(text, "x.mrt")
    assert str(e.value).startswith(f"x.mrt:{where}: error: ")
    assert what in str(e.value)
    assert "\n" not in str(e.value)


def test_model_shape_validation_without_locations():
    with pytest.raises(FrontendError, match="^m.mrt: error: heads 4 is not a multiple"):
        ModelShape(1, 64, 4, 3, 16, 10, ffn=8, name="m", source="m.mrt")


# ---------------------------------------------------------------------------
# Hugging Face configs
# ---------------------------------------------------------------------------

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 3,
        "num_attention_heads": 4, "vocab_size": 128, "eos_token_id": [5, 6],
        "max_position_embeddings": 100000, "torch_dtype": "bfloat16"}


def test_llama_and_qwen2_defaults():
    for mt in ("llama", "qwen2"):
        s = hf_spec_from_dict({**BASE, "model_type": mt}).shape
        assert (s.kv_heads, s.head_dim, s.ffn, s.experts) == (4, 16, 96, 0)
        assert s.eos_token == 5 and s.max_seq == 4096 and s.dtype_bytes == 2


def test_qwen3_explicit_head_dim():
    s = hf_spec_from_dict({**BASE, "model_type": "qwen3", "head_dim": 32,
                           "num_key_value_heads": 2}).shape
    assert s.head_dim == 32 and s.kv_heads == 2 and s.attn_width == 128


def test_mixtral():
    spec = hf_spec_from_dict({**BASE, "model_type": "mixtral", "num_local_experts": 8,
                              "num_experts_per_tok": 2})
    s = spec.shape
    assert (s.experts, s.top_k, s.expert_ffn, s.ffn) == (8, 2, 96, 0)
    assert s.moe_layers == (0, 1, 2)
    assert spec.dynamism == ("continuous_batching", "moe_routing", "micro_batch_pipeline")


def test_qwen3_moe_sparse_step_and_mlp_only_layers():
    cfg = {**BASE, "model_type": "qwen3_moe", "head_dim": 16, "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 32, "num_hidden_layers": 6,
           "decoder_sparse_step": 2, "mlp_only_layers": [3]}
    s = hf_spec_from_dict(cfg).shape
    assert s.moe_layers == (1, 5)  # (i+1) % 2 == 0, minus mlp_only layer 3
    assert s.ffn == 96 and s.expert_ffn == 32


def test_gpt_oss_mxfp4():
    spec = load_hf_config(REPO / "examples" / "configs" / "gpt-oss-20b.json")
    s = spec.shape
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim) == (24, 2880, 64, 8, 64)
    assert (s.experts, s.top_k, s.expert_ffn) == (32, 4, 2880)
    assert s.expert_quant == "mxfp4" and s.expert_dtype_bytes == 17 / 32 and s.dtype_bytes == 2
    assert s.name == "gpt-oss-20b"
    assert 12e9 < s.weight_bytes() < 15e9  # the published checkpoint is ~13 GB


def test_bundled_configs_are_the_paper_families():
    names = {p.stem for p in CONFIGS}
    assert {"gpt-oss-20b", "gpt-oss-120b"} <= names
    types = {json.loads(p.read_text())["model_type"] for p in CONFIGS}
    assert {"gpt_oss", "qwen3", "qwen3_moe"} <= types


def test_unknown_type_lists_supported(tmp_path: Path):
    p = tmp_path / "config.json"
    p.write_text(json.dumps({**BASE, "model_type": "bert"}, indent=1))
    with pytest.raises(FrontendError) as e:
        load_hf_config(p)
    line = p.read_text().splitlines().index(' "model_type": "bert"') + 1
    assert str(e.value).startswith(f"{p}:{line}:2: error: unsupported model_type 'bert'")
    assert all(t in str(e.value) for t in SUPPORTED_TYPES)


def test_config_named_after_its_directory(tmp_path: Path):
    d = tmp_path / "Qwen2.5-7B"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({**BASE, "model_type": "qwen2"}))
    assert load_hf_config(d / "config.json").shape.name == "Qwen2.5-7B"
    assert symbol_name("Qwen2.5-7B") == "Qwen2_5_7B" and symbol_name("9b") == "m_9b"


# ---------------------------------------------------------------------------
# The mapper
# ---------------------------------------------------------------------------


# The largest configs take minutes to map: in the suite the examples and two configs,
# every one by hand (`python -m pytest -m slow`).
FAST_MAP = {"qwen3-8b.json", "gpt-oss-20b.json"}


@pytest.mark.parametrize("path", EXAMPLES + [
    pytest.param(p, marks=() if p.name in FAST_MAP else pytest.mark.slow) for p in CONFIGS],
    ids=lambda p: p.name)
def test_compiles_on_wse3(path, compiled):
    m = _model(compiled(path, "wse3"))
    assert m.target.data == "wse3" and m.mesh_size == (755, 1170)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
@pytest.mark.parametrize("target", ["test32", "test16"])
def test_examples_compile_on_test_targets(path, target, compiled):
    compiled(path, target)


def _band_kind(k: g.KernelOp) -> str | None:
    name = k.kernel_name
    for suffix, kind in (("_qkv", "qkv"), ("_o", "o"), ("_up", "up"), ("_down", "down")):
        if name.endswith(suffix):
            return kind
    return {"lm_head": "lm_head", "embed": "embed"}.get(name) or {
        g.AttentionOp: "attn", g.GateTopKOp: "gate", g.MoEExpertsOp: "relay"}.get(type(k))


@pytest.mark.parametrize("path, target", [
    (REPO / "examples" / "tiny_moe.mrt", "test32"),
    (REPO / "examples" / "tiny_moe.mrt", "test16"),
    (REPO / "examples" / "tiny_dense.mrt", "test16"),
    (REPO / "examples" / "configs" / "gpt-oss-20b.json", "wse3"),
    (REPO / "examples" / "configs" / "qwen3-8b.json", "wse3"),
], ids=lambda x: getattr(x, "name", x))
def test_regions_fit_sram(path, target, compiled):
    """Every weight-holding region holds its tile of weights (and KV) in usable SRAM."""
    t, spec = load_target(target), _spec(path)
    m = _model(compiled(path, target))
    sizer = Sizer(spec.shape, m.micro_batch.value.data, m.hparam("kv_slots"), t.usable_sram_bytes)
    checked = 0
    for k in m.kernels():
        kind = _band_kind(k)
        if kind is None:
            continue
        (r,) = k.region.rects.data
        assert sizer.band(kind, r.w.data, r.h.data) <= t.usable_sram_bytes, k.kernel_name
        checked += 1
        if isinstance(k, g.MoEExpertsOp):
            group = m.hparam("experts_per_region")
            for er in k.expert_regions.data:
                (e,) = er.rects.data
                assert sizer.expert(group, e.w.data, e.h.data) <= t.usable_sram_bytes
    assert checked > 0


def _core_sets(m: g.ModelOp):
    """(wafer, layer, coreset) of every region, expert regions included."""
    for k in m.kernels():
        yield k.wafer_index, k.layer_index, k.region
        if isinstance(k, g.MoEExpertsOp):
            for r in k.expert_regions.data:
                yield k.wafer_index, k.layer_index, r


def test_expert_regions_disjoint_and_outside_other_layers(compiled):
    m = _model(compiled(REPO / "examples" / "tiny_moe.mrt", "test32"))
    moe = [k for k in m.kernels() if isinstance(k, g.MoEExpertsOp)]
    assert len(moe) == 2
    for k in moe:
        regions = k.expert_regions.data
        assert len(regions) == 8 and k.expert_placement == tuple(range(8))
        others = [cs for w, layer, cs in _core_sets(m) if layer != k.layer_index]
        for r in regions:
            assert not any(r.overlaps(o) for o in others)


def test_multi_wafer_split(compiled):
    m = _model(compiled(REPO / "examples" / "tiny_moe.mrt", "test16"))
    assert _model(compiled(REPO / "examples" / "tiny_moe.mrt", "test32")).wafers.value.data == 1
    assert m.wafers.value.data == 2
    kernels = m.kernels()
    wafers = [k.wafer_index for k in kernels]
    assert wafers == sorted(wafers)  # contiguous layer ranges per wafer
    stages = [k.stage_index for k in kernels]
    assert stages == sorted(stages)
    by_layer = {}
    for k in kernels:
        by_layer.setdefault(k.layer_index, set()).add(k.wafer_index)
    assert all(len(ws) == 1 for layer, ws in by_layer.items() if layer >= 0)  # no layer split
    handoffs = [k for k in kernels if isinstance(k, g.HandoffOp)]
    assert len(handoffs) == m.stages.value.data - 1
    crossing = [h for h in handoffs if h.crosses_wafer]
    assert len(crossing) == 1 and crossing[0].to_wafer.value.data == 1
    # only the hidden state crosses: every value used on wafer 1 comes from wafer 1
    for k in kernels:
        for operand in k.operands:
            assert operand.owner.wafer_index == k.wafer_index or isinstance(k, g.HandoffOp) \
                or isinstance(operand.owner, g.HandoffOp)


def test_pipelined_kv_slots_follow_stages(compiled):
    m = _model(compiled(REPO / "examples" / "tiny_dense.mrt", "test32"))
    assert m.hparam("kv_slots") == m.micro_batch.value.data * m.stages.value.data
    assert m.stages.value.data == 4  # embed, 2 layers, lm_head: one stage each


def test_micro_batch_override_grows_regions(compiled):
    path = REPO / "examples" / "tiny_dense.mrt"
    small = _model(compiled(path, "test32", micro_batch=1))
    big = _model(compiled(path, "test32", micro_batch=8))
    assert big.micro_batch.value.data == 8
    attn = lambda m: next(k for k in m.kernels() if isinstance(k, g.AttentionOp)).region.count
    assert attn(big) > attn(small)


def test_not_pipelined_has_one_stage_per_wafer():
    spec = parse_spec("model m { layers = 3 hidden = 64 heads = 4 vocab = 64 ffn = 64 "
                      "max_seq = 16 } runtime { dynamism = [continuous_batching] }")
    m = _model(map_model(spec, load_target("test32")))
    assert m.stages.value.data == 1 and m.hparam("kv_slots") == 1
    assert not any(isinstance(k, g.HandoffOp) for k in m.kernels())


def test_ir_size_does_not_grow_with_mesh(compiled):
    path = REPO / "examples" / "tiny_moe.mrt"
    small = _model(compiled(path, "test32"))
    big = _model(compiled(path, "wse3"))
    assert len(big.kernels()) == len(small.kernels())
    for k in big.kernels():
        assert len(k.region.rects.data) == 1


def test_dense_layer_kernel_sequence(compiled):
    m = _model(compiled(REPO / "examples" / "tiny_dense.mrt", "test32"))
    names = [k.kernel_name for k in m.kernels()
             if k.layer_index == 0 and not isinstance(k, g.HandoffOp)]
    assert names == ["l0_norm1", "l0_qkv", "l0_attn", "l0_o", "l0_add1", "l0_norm2", "l0_up",
                     "l0_act", "l0_down", "l0_add2"]
    up = next(k for k in m.kernels() if k.kernel_name == "l0_up")
    assert up.output.type.width.data == 2 * m.hparam("ffn")  # gate and up fused
    ops = m.kernels()
    assert isinstance(ops[0], g.EmbedOp) and isinstance(ops[-1], g.SampleOp)


def test_moe_shared_experts_and_groups():
    spec = parse_spec("model m { layers = 2 hidden = 64 heads = 4 vocab = 64 ffn = 64 "
                      "experts = 8 top_k = 2 expert_ffn = 32 shared_experts = 1 moe_layers = [1] "
                      "max_seq = 16 } mapping { experts_per_region = 2 }")
    m = _model(map_model(spec, load_target("test32")))
    m.verify()
    (moe,) = [k for k in m.kernels() if isinstance(k, g.MoEExpertsOp)]
    assert len(moe.expert_regions.data) == 4 + 1  # 4 groups of 2, then the shared expert
    assert moe.expert_placement == (0, 0, 1, 1, 2, 2, 3, 3)
    assert m.hparam("experts_per_region") == 2
    # the shared expert's region is sized for its one expert: narrower than a group's
    shapes = [cs.rects.data[0].tuple[2:4] for cs in moe.expert_regions.data]
    assert len(set(shapes[:4])) == 1 and shapes[4][0] < shapes[0][0]
    assert shapes[4][1] == shapes[0][1]
    layer0 = [k for k in m.kernels() if k.layer_index == 0 and not isinstance(k, g.HandoffOp)]
    assert layer0[-1].kernel_name == "l0_add2"


def test_explicit_shared_expert_region_of_its_own_shape_lowers():
    """An explicit mapping may give the shared expert a narrower region (one expert) than
    the routed ones (two each), of the same height: one expert_ffn kernel holds both."""
    from meshrt.dialects import mesh_kernel as mk
    from meshrt.passes.pipeline import lower_to

    text = (REPO / "test" / "frontend_errors" / "expert_region_heights.mrt").read_text()
    spec = parse_spec(text.replace("(24, 16, 3, 7)", "(24, 16, 3, 8)"), "e.mrt")
    t = load_target("test32")
    kernels = next(iter(lower_to(map_model(spec, t), "kernels", t).body.block.ops))
    (ffn,) = [k for k in kernels.body.block.ops if isinstance(k, mk.KernelOp)
              and k.kernel_name == "l0_moe.experts"]
    assert ffn.shared == 1 and [tile[2:] for tile in ffn.tiles()] == [(6, 8)] * 4 + [(3, 8)]


def test_explicit_mapping_is_honoured():
    text = (REPO / "examples" / "tiny_moe.mrt").read_text() + """
mapping {
  stages = 3
  embed region (0, 0, 4, 4)
  layer 0 region (4, 0, 12, 4)
  layer 0 experts (0, 8, 4, 4), (4, 8, 4, 4), (8, 8, 4, 4), (12, 8, 4, 4),
                  (0, 12, 4, 4), (4, 12, 4, 4), (8, 12, 4, 4), (12, 12, 4, 4)
  layer 1 region (16, 0, 16, 16)
  lm_head region (0, 16, 4, 4)
}
"""
    m = _model(map_model(parse_spec(text, "e.mrt"), load_target("test32")))
    m.verify()
    k = {k.kernel_name: k for k in m.kernels()}
    assert str(k["embed"].region) == "(0, 0, 4, 4)"
    assert k["l0_moe"].expert_regions.data[5] == k["l0_moe"].expert_regions.data[5]
    assert str(k["l0_moe"].expert_regions.data[5]) == "(4, 12, 4, 4)"
    assert k["l1_qkv"].region.extent[1] == 0 and k["l1_qkv"].region.extent[0] >= 16
    assert m.stages.value.data == 3 and m.hparam("kv_slots") == 2 * 3
    # layer 0's kernels lie inside its block
    for name in ("l0_qkv", "l0_attn", "l0_o", "l0_gate", "l0_moe"):
        x0, y0, x1, y1 = k[name].region.extent
        assert 4 <= x0 and x1 <= 16 and 0 <= y0 and y1 <= 4


def test_model_too_big_for_wafer_budget():
    spec = load_hf_config(REPO / "examples" / "configs" / "gpt-oss-120b.json")
    with pytest.raises(FrontendError) as e:
        map_model(spec, load_target("wse3"), wafers=1)
    msg = str(e.value)
    assert "SRAM bytes for weights+KV" in msg and "short by" in msg
    assert "needs at least" in msg and "wafers" in msg


def test_layer_too_big_for_any_wafer():
    spec = load_hf_config(REPO / "examples" / "configs" / "qwen3-8b.json")
    with pytest.raises(FrontendError, match="embed needs 1.24 GB of SRAM.*short by"):
        map_model(spec, load_target("test16"))


@pytest.mark.slow  # about 45 s; how long it takes is measured by hand, not asserted here
def test_largest_config_maps_and_verifies():
    path = max(CONFIGS, key=lambda p: load_hf_config(p).shape.weight_bytes())
    m = map_model(load_hf_config(path), load_target("wse3"))
    m.verify()


def test_printed_ir_parses_back(compiled):
    module = compiled(REPO / "examples" / "tiny_moe.mrt", "test16")
    text = io.StringIO()
    Printer(stream=text).print_op(module)
    ctx = Context()
    for d in (Builtin, Mesh, Graph):
        ctx.load_dialect(d)
    again = Parser(ctx, text.getvalue()).parse_module()
    again.verify()
    text2 = io.StringIO()
    Printer(stream=text2).print_op(again)
    assert text2.getvalue() == text.getvalue()


# ---------------------------------------------------------------------------
# meshrt compile
# ---------------------------------------------------------------------------


def _run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(list(argv))
    return rc, out.getvalue(), err.getvalue()


def test_cli_compile_stdout():
    rc, out, err = _run("compile", str(REPO / "examples" / "tiny_moe.mrt"), "--target", "test32")
    assert rc == 0 and err == ""
    assert out.startswith("builtin.module {") and "graph.model @tiny_moe" in out


def test_cli_compile_output_file(tmp_path: Path):
    dest = tmp_path / "out.mlir"
    rc, out, _ = _run("compile", str(EXAMPLES[0]), "--target", "wse3", "-o", str(dest),
                      "--micro-batch", "2", "--wafers", "2")
    assert rc == 0 and out == ""
    assert "wafers 2 " in dest.read_text() and "micro_batch 2" in dest.read_text()


def test_cli_user_target_file(tmp_path: Path):
    p = tmp_path / "t.toml"
    p.write_text(load_target("test32").source and Path(load_target("test32").source).read_text())
    rc, out, _ = _run("compile", str(REPO / "examples" / "tiny_dense.mrt"), "--target", str(p))
    assert rc == 0 and 'target "test32"' in out


@pytest.mark.parametrize("argv, needle", [
    (["compile", "examples/tiny_dense.mrt", "--target", "nope"], "unknown target 'nope'"),
    (["compile", "examples/missing.mrt", "--target", "wse3"], "no such model file"),
    (["compile", "examples/tiny_dense.mrt"], "--target"),
    (["compile", "examples/tiny_dense.mrt", "--target", "wse3", "--emit", "asm"], "invalid choice"),
    (["compile", "examples/tiny_dense.mrt", "--target", "wse3", "--micro-batch", "0"],
     "--micro-batch must be at least 1"),
    (["frobnicate"], "invalid choice"),
])
def test_cli_errors_are_one_line(argv, needle, monkeypatch):
    monkeypatch.chdir(REPO)
    rc, out, err = _run(*argv)
    assert rc == 1 and out == ""
    assert err.count("\n") == 1 and needle in err and "error" in err
