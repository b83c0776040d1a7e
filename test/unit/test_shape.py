"""meshrt.shape: the one model shape, its hparams, its KV slots."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import DictionaryAttr, FloatAttr, IntegerAttr, f64, i64

from meshrt.diagnostics import FrontendError, Loc, MeshrtError
from meshrt.kernels.attention.op import AttentionOp
from meshrt.passes.pipeline import lower_to
from meshrt.passes.synthesize_schedules import kernel_context
from meshrt.runtime.cost_model import default_in_flight
from meshrt.runtime.reference import RefShape
from meshrt.runtime.serving import reference_shape
from meshrt.shape import HParams, ModelShape, in_flight, kv_slots
from meshrt.driver import load_model

REPO = Path(__file__).resolve().parents[2]
DENSE = ModelShape(name="d", layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, vocab=64, ffn=48)

BYTES = st.integers(1, 256).map(lambda n: n / 32)  # positive multiples of 1/32 up to 8


@st.composite
def shapes(draw) -> ModelShape:
    kv_heads = draw(st.integers(1, 4))
    heads = kv_heads * draw(st.integers(1, 4))
    layers = draw(st.integers(1, 6))
    vocab = draw(st.integers(1, 1000))
    kw = dict(name="m", layers=layers, hidden=heads * draw(st.integers(1, 16)), heads=heads,
              kv_heads=kv_heads, head_dim=2 * draw(st.integers(1, 64)), vocab=vocab,
              max_seq=draw(st.integers(1, 1 << 16)), eos_token=draw(st.integers(0, vocab - 1)),
              dtype_bytes=draw(BYTES))
    if draw(st.booleans()):
        experts = draw(st.integers(1, 16))
        moe = draw(st.lists(st.integers(0, layers - 1), min_size=1, unique=True))
        kw.update(experts=experts, top_k=draw(st.integers(1, experts)),
                  expert_ffn=draw(st.integers(1, 512)), shared_experts=draw(st.integers(0, 2)),
                  moe_layers=tuple(moe), ffn=draw(st.integers(1, 512)) if len(moe) < layers else 0)
    else:
        kw["ffn"] = draw(st.integers(1, 4096))
    if draw(st.booleans()):
        kw["expert_dtype_bytes"] = draw(BYTES)
    if draw(st.booleans()):
        kw["kv_bytes"] = draw(BYTES)
    return ModelShape(**kw)


@settings(max_examples=200, deadline=None)
@given(shapes(), st.integers(1, 64), st.integers(0, 16))
def test_hparams_round_trip(shape, slots, group):
    hp = shape.to_hparams(slots, group)
    assert ModelShape.from_hparams(hp, "m") == shape
    assert ModelShape.from_hparams(DictionaryAttr(hp), "m") == shape
    view = HParams.of(DictionaryAttr(hp))
    assert view.int("kv_slots") == slots and view.int("experts_per_region") == group
    assert (view.dtype_bytes, view.expert_dtype_bytes, view.kv_bytes) == (
        shape.dtype_bytes, shape.expert_dtype_bytes, shape.kv_bytes)


def test_hparams_order_and_types():
    hp = DENSE.to_hparams(4, 0)
    assert list(hp) == ["layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "ffn",
                        "experts", "top_k", "expert_ffn", "shared_experts", "max_seq",
                        "eos_token", "kv_slots", "experts_per_region", "dtype_bytes",
                        "expert_dtype_bytes", "kv_bytes"]
    assert hp["kv_slots"] == IntegerAttr(4, i64) and hp["kv_bytes"] == FloatAttr(2.0, f64)
    moe = dataclasses.replace(DENSE, ffn=0, experts=4, top_k=2, expert_ffn=16)
    assert list(moe.to_hparams(1, 2))[-1] == "moe_layers"


def test_hparams_defaults_for_partial_ir():
    """Hand-written IR gives a few keys: the rest take ModelShape's defaults."""
    empty = HParams.of(DictionaryAttr({}))
    assert (empty.dtype_bytes, empty.expert_dtype_bytes, empty.kv_bytes) == (2.0, 2.0, 2.0)
    assert empty.int("top_k") == 0 and empty.int("max_seq") == 4096
    assert "top_k" not in empty
    four = HParams.of({"dtype_bytes": IntegerAttr(4, i64)})
    assert (four.dtype_bytes, four.expert_dtype_bytes, four.kv_bytes) == (4.0, 4.0, 4.0)
    half = HParams.of({"dtype_bytes": FloatAttr(0.5, f64)})
    assert (half.expert_dtype_bytes, half.kv_bytes) == (0.5, 2.0)
    with pytest.raises(KeyError):
        empty.int("kv_slots")
    assert empty.int("kv_slots", 3) == 3
    with pytest.raises(FrontendError, match="hparams lack layers"):
        ModelShape.from_hparams({}, source="x.mlir")


@pytest.mark.parametrize("kw, where, message", [
    ({"layers": 0}, "layers", "layers must be at least 1, got 0"),
    ({"rms_eps": 0.0}, "rms_eps", "rms_norm_eps must be a positive number, got 0.0"),
    ({"rope_theta": 0.5}, "rope", "rope_theta must be a finite number above 1, got 0.5"),
    ({"rope_type": "llama3", "rope_factor": 8.0}, "rope",
     "rope type llama3 needs original_max_position_embeddings of at least 1"),
    ({"sliding_window": 8}, "sliding_window", "a sliding window needs both its width and its layers"),
    ({"qk_norm": 2}, "qk_norm", "qk_norm must be at most 1, got 2"),
    ({"kv_heads": 3}, "kv_heads", "heads 4 is not a multiple of kv_heads 3"),
    ({"head_dim": 7}, "head_dim", "head_dim must be even for rotary embeddings, got 7"),
    ({"dtype_bytes": 0.3}, "dtype_bytes",
     "dtype_bytes must be a positive multiple of 1/4096 up to 8, got 0.3"),
    ({"eos_token": 64}, "eos_token", "eos_token 64 is outside the vocabulary 0..63"),
    ({"top_k": 1}, "top_k", "top_k is set but the model has no experts (experts = 0)"),
    ({"ffn": 0}, "ffn", "a dense model needs ffn of at least 1 (or experts for MoE)"),
    ({"experts": 4, "top_k": 5, "expert_ffn": 8}, "top_k",
     "top_k 5 must be between 1 and the expert count 4"),
    ({"experts": 4, "top_k": 1, "expert_ffn": 8, "moe_layers": (0, 0)}, "moe_layers",
     "moe_layers lists a layer twice"),
])
def test_validation_is_located(kw, where, message):
    locs = {where: Loc("m.mrt", 7, 3)}
    with pytest.raises(FrontendError) as e:
        dataclasses.replace(DENSE, **kw, locs=locs)
    assert str(e.value) == f"m.mrt:7:3: error: {message}"
    with pytest.raises(FrontendError) as e:
        dataclasses.replace(DENSE, **kw, source="m.mrt")
    assert str(e.value) == f"m.mrt: error: {message}"


def test_explicit_head_dim_need_not_divide_hidden():
    # Qwen3-style: head_dim given, hidden_size not heads x head_dim
    s = dataclasses.replace(DENSE, hidden=30, heads=4, kv_heads=2, head_dim=16)
    assert s.attn_width == 64 and s.qkv_width == 128


def test_reference_shares_the_validation():
    with pytest.raises(ValueError, match="heads 4 is not a multiple of kv_heads 3"):
        RefShape(1, 32, 4, 3, 8, 64, ffn=16)
    with pytest.raises(ValueError, match="an MoE shape must have ffn == 0"):
        RefShape(1, 32, 4, 2, 8, 64, ffn=16, experts=2, top_k=1, expert_ffn=8)
    ref = RefShape(1, 32, 4, 2, 8, 64, ffn=16)
    assert isinstance(ref, ModelShape) and ref.eos_token is None and ref.kv_bytes == 2.0


def test_one_error_type():
    assert issubclass(FrontendError, MeshrtError)
    assert str(FrontendError("two\nlines")) == "error: two lines"
    assert str(FrontendError("bad", "t.toml")) == "t.toml: error: bad"
    assert str(MeshrtError("bad")) == "<input>: error: bad"
    assert str(MeshrtError("bad", filename="x.mlir")) == "x.mlir: error: bad"
    assert str(MeshrtError("bad", loc=Loc("x.mlir", 2, 5))) == "x.mlir:2:5: error: bad"


def test_slot_formula():
    pipe = ("continuous_batching", "micro_batch_pipeline")
    assert in_flight(3, pipe) == 3 and kv_slots(2, 3, pipe) == 6
    assert in_flight(3, ("continuous_batching",)) == 1 and kv_slots(2, 3, ()) == 2


@pytest.mark.parametrize("model, target, dynamism", [
    ("tiny_moe.mrt", "test32", None),
    ("tiny_dense.mrt", "test16", None),
    ("tiny_dense.mrt", "test16", ()),
])
def test_kv_slots_agree_with_the_mapper(model, target, dynamism):
    """The slots the mapper sized for are the ones every later reader derives."""
    module = load_model(str(REPO / "examples" / model), target, dynamism=dynamism)
    graph_model = next(iter(module.body.block.ops))
    mb, stages, dyn = (graph_model.micro_batch_size, graph_model.num_stages,
                       graph_model.dynamism_kinds)
    want = kv_slots(mb, stages, dyn)
    assert graph_model.hparam("kv_slots") == want
    shape = ModelShape.from_hparams(graph_model, graph_model.program_name)
    assert shape.to_hparams(want, graph_model.hparam("experts_per_region")) == \
        dict(graph_model.hparams.data)
    lower_to(module, "kernels")
    program = next(iter(module.body.block.ops))
    attns = [k for k in program.body.block.ops if isinstance(k, AttentionOp)]
    assert attns and {k.slots.value.data for k in attns} == {want}
    assert kernel_context(program).slots == want
    lower_to(module, "segments")
    program = next(iter(module.body.block.ops))
    assert program.hparam("inflight_slots") == want
    assert default_in_flight(program) * mb == want
    assert reference_shape(program) == RefShape.of(shape)
