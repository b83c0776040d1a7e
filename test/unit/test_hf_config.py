"""The Hugging Face importer's math keys: what each model type's config changes.

Each test reads a config the way transformers' configuration and modeling
code for that type does (defaults included) and checks the shape; the
parity fixtures (test_hf_parity.py) check the numbers these keys produce.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from meshrt.frontend.errors import FrontendError
from meshrt.frontend.hf_config import hf_spec_from_dict
from meshrt.rope import Rope
from meshrt.shape import HParams, ModelShape, hparams_problem

REPO = Path(__file__).resolve().parents[2]

BASE = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4,
        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 128,
        "max_position_embeddings": 64, "eos_token_id": 1, "torch_dtype": "float32"}


def shape(model_type: str, **over) -> ModelShape:
    return hf_spec_from_dict({**BASE, "model_type": model_type, **over}).shape


def test_defaults_per_type():
    for mt, theta, eps in (("llama", 1e4, 1e-6), ("qwen2", 1e4, 1e-6), ("qwen3", 1e4, 1e-6),
                           ("mixtral", 1e6, 1e-5)):
        extra = {"num_local_experts": 4, "num_experts_per_tok": 2} if mt == "mixtral" else {}
        s = shape(mt, **extra)
        assert (s.rope_theta, s.rms_eps, s.rope_type) == (theta, eps, "default"), mt
    q2, q3, ll = shape("qwen2"), shape("qwen3"), shape("llama")
    assert (q2.qkv_bias, q2.o_bias, q2.qk_norm) == (True, False, False)
    assert (q3.qkv_bias, q3.o_bias, q3.qk_norm) == (False, False, True)
    assert (ll.qkv_bias, ll.o_bias, ll.mlp_bias, ll.qk_norm) == (False, False, False, False)
    assert shape("llama", attention_bias=True, mlp_bias=True).mlp_bias
    assert shape("qwen3", attention_bias=True).o_bias


def test_qwen3_moe_routing_keys():
    moe = {"num_experts_per_tok": 2, "moe_intermediate_size": 32, "head_dim": 16}
    s = shape("qwen3_moe", num_experts=4, **moe)
    assert s.experts == 4 and s.norm_topk is False and s.qk_norm  # transformers' default: false
    # transformers 5 writes the expert count as num_local_experts
    s = shape("qwen3_moe", num_local_experts=4, norm_topk_prob=True, **moe)
    assert s.experts == 4 and s.norm_topk is True
    mixtral = shape("mixtral", num_local_experts=4, num_experts_per_tok=2)
    assert mixtral.norm_topk is True


def test_rope_v4_and_v5_spellings_agree():
    scaling = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 16}
    v4 = shape("llama", rope_theta=5e5, rope_scaling={"rope_type": "llama3", **scaling})
    v4_old = shape("llama", rope_theta=5e5, rope_scaling={"type": "llama3", **scaling})
    v5 = shape("llama", rope_parameters={"rope_type": "llama3", "rope_theta": 5e5, **scaling})
    assert v4.rope == v4_old.rope == v5.rope
    assert v5.rope == Rope(5e5, "llama3", 8.0, 1.0, 4.0, 16)
    yarn = shape("qwen3", rope_scaling={"rope_type": "yarn", "factor": 4.0,
                                        "original_max_position_embeddings": 16})
    assert (yarn.rope_type, yarn.rope_original_max, yarn.rope_truncate) == ("yarn", 16, True)
    assert yarn.rope.attention_factor == pytest.approx(0.1 * np.log(4.0) + 1)
    # yarn without a factor: max_position_embeddings over the original
    assert shape("qwen3", rope_scaling={"rope_type": "yarn", "original_max_position_embeddings": 16}
                 ).rope_factor == 4.0


def test_rope_tables():
    d = 16
    plain = Rope(1e4).inv_freq(d)
    assert np.allclose(plain, 1e4 ** (-np.arange(0, d, 2) / d))
    assert np.allclose(Rope(1e4, "linear", 4.0).inv_freq(d), plain / 4)
    ll = Rope(1e4, "llama3", 8.0, 1.0, 4.0, 64).inv_freq(d)
    wavelen = 2 * np.pi / plain
    assert np.allclose(ll[wavelen < 64 / 4], plain[wavelen < 64 / 4])  # high frequencies kept
    assert np.allclose(ll[wavelen > 64], plain[wavelen > 64] / 8)  # low ones divided
    yarn = Rope(1e4, "yarn", 4.0, original_max=16).inv_freq(d)
    assert np.isclose(yarn[0], plain[0]) and np.isclose(yarn[-1], plain[-1] / 4)


@pytest.mark.parametrize("mt, over, width, layers", [
    ("qwen2", {"sliding_window": 8}, 0, ()),  # use_sliding_window is false by default
    ("qwen2", {"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 2}, 8, (2, 3)),
    ("qwen3", {"use_sliding_window": True, "sliding_window": 8,
               "layer_types": ["sliding_attention", "full_attention"] * 2}, 8, (0, 2)),
    ("qwen3", {"use_sliding_window": True}, 4096, ()),  # max_window_layers 28 > 4 layers
    ("qwen3_moe", {"use_sliding_window": True, "sliding_window": 8, "num_experts": 4,
                   "num_experts_per_tok": 2, "moe_intermediate_size": 32}, 8, (0, 1, 2, 3)),
    ("mixtral", {"sliding_window": 8, "num_local_experts": 4, "num_experts_per_tok": 2}, 8,
     (0, 1, 2, 3)),
    ("mixtral", {"sliding_window": None, "num_local_experts": 4, "num_experts_per_tok": 2}, 0, ()),
    ("llama", {"sliding_window": 8}, 0, ()),  # transformers' llama has none
])
def test_sliding_windows(mt, over, width, layers):
    s = shape(mt, **over)
    if not layers:
        width = 0
    assert (s.sliding_window, s.window_layers) == (width, layers)
    assert [s.window(i) for i in range(4)] == [width if i in layers else 0 for i in range(4)]


def test_eos_null_and_explicit_head_dim():
    s = shape("qwen3", eos_token_id=None, hidden_size=60, head_dim=16)
    assert s.eos_token is None and s.attn_width == 64
    hp = s.to_hparams(kv_slots=2, experts_per_region=0)
    assert hp["eos_token"].value.data == -1
    assert ModelShape.from_hparams(hp).eos_token is None


def test_math_survives_the_hparams():
    s = shape("llama", attention_bias=True, mlp_bias=True, rms_norm_eps=1e-5,
              tie_word_embeddings=True, rope_theta=5e5,
              rope_scaling={"rope_type": "yarn", "factor": 4.0, "beta_fast": 16,
                            "original_max_position_embeddings": 16, "truncate": False})
    hp = s.to_hparams(kv_slots=2, experts_per_region=0)
    assert hparams_problem(hp) is None
    back = ModelShape.from_hparams(hp, name=s.name)
    assert back == dataclasses.replace(s, max_seq=back.max_seq)
    assert HParams.of(hp).str("rope_type") == "yarn"
    # a default is not written: the IR of a plain model keeps its old hparams
    plain = shape("llama", rms_norm_eps=1e-5).to_hparams(kv_slots=2, experts_per_region=0)
    assert not {"rms_eps", "rope_theta", "rope_type", "qkv_bias"} & set(plain)


def test_weight_counts_follow_biases_norms_and_tying():
    plain = shape("llama")
    biased = shape("llama", attention_bias=True, mlp_bias=True, tie_word_embeddings=True)
    h, f, v, layers = 64, 96, 128, 4
    qkv = (4 + 2 * 2) * 16
    extra = layers * (qkv + h + 2 * f + h)  # tied: embed and lm_head regions each hold a copy
    assert biased.weight_counts()[0] - plain.weight_counts()[0] == extra
    assert shape("qwen3").weight_counts()[0] - shape("qwen3", attention_bias=False).weight_counts(
        )[0] == 0


@pytest.mark.parametrize("over, needle", [
    ({"rope_scaling": {"rope_type": "longrope", "factor": 2.0}}, "rope type 'longrope'"),
    ({"rope_parameters": {"full_attention": {"rope_type": "default"}}},
     "a rope per layer type ('rope_parameters' holds objects) is not implemented"),
    ({"rope_scaling": {"rope_type": "linear"}}, "'rope_scaling' of rope type 'linear' is missing 'factor'"),
    ({"rope_scaling": {"rope_type": "linear", "factor": "2"}}, "'rope_scaling.factor' must be a number"),
    ({"rope_theta": 0.5}, "rope_theta must be a finite number above 1, got 0.5"),
    ({"hidden_act": "gelu_pytorch_tanh"}, "hidden_act 'gelu_pytorch_tanh' is not implemented"),
    ({"mlp_bias": 1}, "field 'mlp_bias' must be true or false, got 1"),
    ({"rms_norm_eps": -1}, "rms_norm_eps must be a positive number, got -1"),
])
def test_unimplemented_or_bad_math_is_an_error_at_its_key(over, needle):
    with pytest.raises(FrontendError) as e:
        shape("llama", **over)
    assert needle in e.value.message
    # at the key; a bad value inside the rope object at its own key
    key = "factor" if "must be a number" in needle else next(iter(over))
    text = json.dumps({**BASE, "model_type": "llama", **over}, indent=2)
    assert e.value.loc.line == next(i for i, line in enumerate(text.splitlines(), 1)
                                    if f'"{key}"' in line)


def test_gpt_oss_math():
    s = shape("gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=16,
              layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=8)
    assert s.window_layers == (0, 2) and s.qkv_bias and s.o_bias and s.rope_theta == 150000.0
    assert s.attn_sinks and s.router_bias and s.expert_bias and s.norm_topk
    assert (s.swiglu_alpha, s.swiglu_limit, s.swiglu_shift) == (1.702, 7.0, 1.0)
    assert s.expert_quant == ""
    q = shape("gpt_oss", num_local_experts=4, num_experts_per_tok=2, head_dim=16,
              quantization_config={"quant_method": "mxfp4"})
    # the experts in MXFP4, the rest as torch_dtype; computed, not only sized
    assert (q.expert_quant, q.linear_quant) == ("mxfp4", "")
    assert q.expert_dtype_bytes == 17 / 32 and q.linear_bytes == q.dtype_bytes == 4


def test_fp8_quantizes_every_projection_and_the_experts_in_blocks():
    q = shape("qwen3_moe", num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
              head_dim=16, quantization_config={
                  "quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                  "weight_block_size": [128, 64], "modules_to_not_convert": ["lm_head"]})
    assert (q.linear_quant, q.expert_quant) == ("fp8", "fp8")
    assert q.quant_block == (64, 128)  # (input rows, output columns) of meshrt's (in, out)
    assert q.linear_bytes == q.expert_dtype_bytes == 1 + 2 / 4096  # a 4-byte scale per 8,192
    assert q.dtype_bytes == 4  # the embedding and lm_head stay as torch_dtype (float32 here)
    per_tensor = shape("llama", quantization_config={"quant_method": "fp8"})
    assert per_tensor.quant_block is None and per_tensor.linear_bytes == 1.0
    hp = q.to_hparams(kv_slots=2, experts_per_region=0)
    back = ModelShape.from_hparams(hp)
    assert (back.linear_quant, back.expert_quant, back.quant_block) == ("fp8", "fp8", (64, 128))


def test_fp8_deltanet_layers_are_refused():
    with pytest.raises(FrontendError, match="fp8 weights of Gated DeltaNet layers"):
        hf_spec_from_dict({**BASE, "model_type": "qwen3_5_text", "head_dim": 16,
                           "quantization_config": {"quant_method": "fp8"}})


@pytest.mark.parametrize("qcfg, needle, key", [
    ({"quant_method": "gptq"}, "unsupported quant_method 'gptq'", "quant_method"),
    ({"bits": 4}, "quantization_config has no quant_method", "quantization_config"),
    ({"quant_method": "fp8", "fmt": "e5m2"}, "fp8 format 'e5m2' is not supported", "fmt"),
    ({"quant_method": "fp8", "activation_scheme": "static"}, "static activation scales",
     "activation_scheme"),
    ({"quant_method": "fp8", "weight_block_size": [128]}, "weight_block_size must be two",
     "weight_block_size"),
    ({"quant_method": "fp8", "weight_block_size": [0, 128]}, "weight_block_size must be two",
     "weight_block_size"),
    ({"quant_method": "fp8", "modules_to_not_convert": ["model.layers.0.mlp"]},
     "quantizes every attention and FFN projection or none", "modules_to_not_convert"),
    ({"quant_method": "mxfp4"}, "mxfp4 quantizes gpt_oss's experts", "quant_method"),
])
def test_a_quantization_config_meshrt_cannot_compute_is_an_error_at_its_key(qcfg, needle, key):
    over = {"quantization_config": qcfg}
    with pytest.raises(FrontendError) as e:
        shape("llama", **over)
    assert needle in e.value.message
    text = json.dumps({**BASE, "model_type": "llama", **over}, indent=2)
    assert e.value.loc.line == next(i for i, line in enumerate(text.splitlines(), 1)
                                    if f'"{key}"' in line)


def test_an_eos_list_ends_requests_at_any_of_its_tokens():
    from meshrt.runtime import reference as ref

    s = shape("llama", eos_token_id=[3, 5, 3, 7])
    assert (s.eos_token, s.eos_more, s.eos_tokens) == (3, (5, 7), frozenset({3, 5, 7}))
    hp = s.to_hparams(kv_slots=2, experts_per_region=0)
    assert ModelShape.from_hparams(hp).eos_more == (5, 7)
    r = ref.RefShape.of(s)
    model = ref.ReferenceModel(r, ref.Weights.random(r, 0))
    assert model.is_finished([1, 7], 10) and model.is_finished([5], 10)
    assert not model.is_finished([1, 2], 10)
    with pytest.raises(FrontendError, match="EOS token 200 is outside the vocabulary"):
        shape("llama", eos_token_id=[3, 200])


def test_qwen3_5_hub_layout_and_text_config_read_alike(tmp_path):
    """The hub's qwen3_5 config (the language model under text_config) and the text
    config alone (qwen3_5_text, what Qwen3_5ForCausalLM saves) give one shape; without
    layer_types every full_attention_interval-th layer is full attention."""
    from meshrt.frontend.hf_config import load_hf_config

    hub = json.loads((REPO / "examples/configs/qwen3.5-9b.json").read_text())
    text = dict(hub["text_config"])
    (tmp_path / "text.json").write_text(json.dumps(text))
    a, b = (load_hf_config(p).shape for p in (REPO / "examples/configs/qwen3.5-9b.json",
                                               tmp_path / "text.json"))
    assert dataclasses.replace(a, name="x") == dataclasses.replace(b, name="x")
    assert a.linear_layers == tuple(i for i in range(32) if i % 4 != 3)
    assert (a.rope_partial, a.rope_theta, a.attn_gate, a.qk_norm) == (0.25, 1e7, True, True)
    del text["layer_types"]
    text["full_attention_interval"] = 2
    (tmp_path / "every2.json").write_text(json.dumps(text))
    assert load_hf_config(tmp_path / "every2.json").shape.linear_layers == tuple(range(0, 32, 2))
    moe = load_hf_config(REPO / "examples/configs/qwen3.5-35b-a3b.json").shape
    assert (moe.experts, moe.top_k, moe.expert_ffn, moe.shared_experts, moe.norm_topk,
            moe.shared_expert_gate, moe.kv_heads, moe.layers) == (256, 8, 512, 1, True, True, 2, 40)
