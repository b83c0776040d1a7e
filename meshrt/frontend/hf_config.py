"""Import a Hugging Face `config.json` as a ModelSpec.

Each supported `model_type` reads the fields its transformers modeling code
really uses:

- llama, qwen2, qwen3: dense SwiGLU; `intermediate_size`; `head_dim` if
  present (qwen3 always has it), else hidden_size / num_attention_heads.
- mixtral: `num_local_experts`, `num_experts_per_tok`; every layer is MoE
  and the experts' width is `intermediate_size`.
- qwen3_moe: `num_experts`, `num_experts_per_tok`, `moe_intermediate_size`;
  layer i is MoE iff i is not in `mlp_only_layers` and
  (i + 1) % `decoder_sparse_step` == 0; other layers are dense with
  `intermediate_size`.
- qwen3_5 / qwen3_5_moe (Qwen3.5): the hub's config is multimodal, the
  language model under `text_config` (model_type qwen3_5_text /
  qwen3_5_moe_text, which a config may also be alone); dense
  `intermediate_size`, or every layer MoE with `num_experts`,
  `num_experts_per_tok`, `moe_intermediate_size` and one shared expert of
  `shared_expert_intermediate_size` (equal to the routed width, else an
  error). Defaults are transformers' (its config classes: Qwen3.5-9B and
  Qwen3.5-35B-A3B).
- gpt_oss: `num_local_experts`, `experts_per_token` (or
  `num_experts_per_tok`), experts of width `intermediate_size`, explicit
  `head_dim`.

The math beyond the dimensions (`_read_math`), as transformers' code for
each type computes it, goes into the shape and so into the IR's hparams:

- `rope_theta` and `rope_scaling` (transformers 4) or `rope_parameters`
  (transformers 5): default, linear, llama3 and yarn RoPE (`meshrt.rope`);
  another rope type, a per-layer-type rope, `partial_rotary_factor` below 1
  or `mrope_section` (but for qwen3_5) is an error at its key.
- `rms_norm_eps` (default 1e-6; mixtral and gpt_oss 1e-5); `hidden_act` must
  be silu (the FFNs are SwiGLU), anything else is an error at the key.
- biases: llama `attention_bias` (q, k, v, o) and `mlp_bias` (gate, up,
  down); qwen2 always q, k, v (no o); qwen3 / qwen3_moe `attention_bias`
  (q, k, v, o); gpt_oss `attention_bias` (default true).
- qwen3 / qwen3_moe: q/k RMSNorm over head_dim. qwen3_moe: `norm_topk_prob`
  (default false: the top-k probabilities as they are); mixtral and gpt_oss
  renormalise. qwen3_moe reads `num_experts` or `num_local_experts`.
- sliding windows: qwen2 / qwen3 with `use_sliding_window`: `sliding_window`
  on the layers `layer_types` marks "sliding_attention", else on layers from
  `max_window_layers` on; qwen3_moe with `use_sliding_window`: every layer;
  mixtral: `sliding_window` when not null, every layer; gpt_oss: `layer_types`.
- `tie_word_embeddings`: lm_head is the embedding's transpose (one tensor in a
  checkpoint; on the mesh the lm_head region still holds its own tiles).
- `eos_token_id` null: the model has no EOS token (requests stop at their
  length); a list: a request ends at any of its tokens.
- gpt_oss: attention sinks (a learned logit per head in every softmax),
  router and expert biases, and its clamped SwiGLU (`swiglu_alpha`,
  `swiglu_limit`, `up + 1`).
- qwen3_5 / qwen3_5_moe: `layer_types` ("linear_attention" /
  "full_attention"; default: full attention every `full_attention_interval`-th
  layer, 4) and the Gated DeltaNet's `linear_num_key_heads`,
  `linear_num_value_heads`, `linear_key_head_dim`, `linear_value_head_dim`,
  `linear_conv_kernel_dim`; full attention with q/k norm and its output gate
  (q_proj holds it: transformers always gates, `attn_output_gate` is not read),
  `partial_rotary_factor` (default 0.25; in `rope_parameters` or beside it;
  `mrope_section` / `mrope_interleaved` change nothing for text, whose
  positions are the same on the three axes); the MoE's top-k renormalised
  and its shared expert scaled by sigmoid(x w_sg). `attention_bias` true is an
  error. The multi-token-prediction head (`mtp_*`) and the vision tower do not
  change greedy text tokens and are not read.
- `quantization_config` (`_read_quant`): mxfp4 stores gpt_oss's experts in
  MXFP4 (17/32 bytes per weight), fp8 every attention and FFN projection
  (and the experts) in e4m3 with a scale per `weight_block_size` block; the
  embedding, lm_head and routers stay in `torch_dtype`. The reference and the
  kernels compute with the dequantized weights (`meshrt.quant`).

Dynamism defaults to continuous batching and micro-batch pipelining, plus
MoE routing for MoE models; micro-batch 1; KV capacity per slot is
min(max_position_embeddings, 4096) tokens.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from meshrt.activations import act_format_of
from meshrt.frontend.errors import FrontendError, Loc, locate_text
from meshrt.frontend.model import DEFAULT_MAX_SEQ, ModelShape, ModelSpec
from meshrt.limits import JSONInputError, parse_json

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss", "qwen3_5",
                   "qwen3_5_moe")
# Qwen3.5 as the hub stores it: a multimodal config whose `text_config` is the language
# model (its own model_type with "_text"), or that text config alone (ForCausalLM)
QWEN3_5 = ("qwen3_5", "qwen3_5_moe")
TEXT_TYPES = {f"{t}_text": t for t in QWEN3_5}


def base_type(model_type: str | None) -> str | None:
    """The supported model type a config.json's `model_type` is (qwen3_5_text: qwen3_5)."""
    return TEXT_TYPES.get(model_type, model_type)

DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
               "float8_e4m3fn": 1.0, "float8_e5m2": 1.0}


class _Config:
    """The parsed JSON plus located, typed field access."""

    def __init__(self, data: dict[str, Any], text: str, path: str):
        self.data, self.text, self.path = data, text, path
        self.locs: dict[str, Loc] = {}

    def loc(self, key: str) -> Loc:
        m = re.search(rf'"{re.escape(key)}"\s*:', self.text)
        if not m:
            return Loc(self.path)
        line, col = locate_text(self.text, m.group(0), m.start())
        return Loc(self.path, line, col)

    def get(self, key: str, default: Any = None, *, kind: type = int, field: str | None = None):
        """Field `key` checked to be `kind`; records its location under `field`."""
        if key not in self.data or self.data[key] is None:
            if default is None:
                mt = self.data.get("model_type")
                raise FrontendError(f"config ({mt}) is missing the field '{key}'", self.path)
            return default
        v = self.data[key]
        ok = (isinstance(v, (int, float)) and not isinstance(v, bool)) if kind is float else \
            (isinstance(v, kind) and not (kind is int and isinstance(v, bool)))
        if not ok:
            raise FrontendError(f"field '{key}' must be {_KIND_NAMES[kind]}, got {json.dumps(v)}",
                                self.loc(key))
        if field is not None:
            self.locs[field] = self.loc(key)
        return v


_KIND_NAMES = {int: "an integer", float: "a number", list: "a list", str: "a string",
               dict: "an object"}


def load_hf_config(path: str | Path) -> ModelSpec:
    path = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise FrontendError("config is not UTF-8 text", path)
    except OSError as e:
        raise FrontendError(f"cannot read config: {e.strerror or e}", path)
    try:
        data = parse_json(text)
    except JSONInputError as e:
        raise FrontendError(f"invalid JSON: {e.msg}", e.loc(path)) from None
    if not isinstance(data, dict):
        raise FrontendError("a config.json must hold a JSON object", Loc(path, 1, 1))
    return hf_spec_from_dict(data, path, text)


def hf_spec_from_dict(data: dict[str, Any], path: str = "<config.json>",
                      text: str | None = None) -> ModelSpec:
    cfg = _Config(data, text if text is not None else json.dumps(data, indent=2), path)
    mt = base_type(cfg.get("model_type", kind=str)) if "model_type" in data else None
    if mt in QWEN3_5 and "text_config" in data:  # the language model of the multimodal config
        inner = cfg.get("text_config", kind=dict)
        cfg.data = data = {**{k: v for k, v in data.items() if k in ("tie_word_embeddings",
                                                                      "_name_or_path")},
                           **inner, "model_type": mt}
    if mt not in SUPPORTED_TYPES:
        what = f"unsupported model_type '{mt}'" if mt else "config has no 'model_type'"
        raise FrontendError(f"{what}; supported: {', '.join(SUPPORTED_TYPES)}",
                            cfg.loc("model_type") if mt else Loc(path))

    hidden = cfg.get("hidden_size", field="hidden")
    heads = cfg.get("num_attention_heads", field="heads")
    fields: dict[str, Any] = {
        "layers": cfg.get("num_hidden_layers", field="layers"),
        "hidden": hidden,
        "heads": heads,
        "kv_heads": cfg.get("num_key_value_heads", heads, field="kv_heads"),
        "vocab": cfg.get("vocab_size", field="vocab"),
    }
    if heads < 1:
        raise FrontendError(f"heads must be at least 1, got {heads}", cfg.locs["heads"])
    if "head_dim" in data and data["head_dim"] is not None:
        fields["head_dim"] = cfg.get("head_dim", field="head_dim")
    elif hidden % heads:
        raise FrontendError(f"hidden size {hidden} is not divisible by heads {heads}",
                            cfg.locs["hidden"])
    else:
        fields["head_dim"] = hidden // heads

    _read_ffn(cfg, mt, fields)
    _read_dtypes(cfg, mt, fields)
    _read_math(cfg, mt, fields)

    max_pos = cfg.get("max_position_embeddings", DEFAULT_MAX_SEQ, field="max_seq")
    fields["max_seq"] = min(max_pos, DEFAULT_MAX_SEQ)
    eos = data.get("eos_token_id", 0)
    if isinstance(eos, list) and eos:  # a request ends at any of them
        more = eos[1:]
        eos = eos[0]
        if any(isinstance(t, bool) or not isinstance(t, int) for t in more):
            raise FrontendError(f"field 'eos_token_id' must be an integer or a list of integers, "
                                f"got {json.dumps(data.get('eos_token_id'))}", cfg.loc("eos_token_id"))
        fields["eos_more"] = tuple(dict.fromkeys(t for t in more if t != eos))
    if eos is None:
        pass  # no EOS token: requests stop at their length
    elif isinstance(eos, bool) or not isinstance(eos, int):
        raise FrontendError(f"field 'eos_token_id' must be an integer or a list of integers, got "
                            f"{json.dumps(data.get('eos_token_id'))}", cfg.loc("eos_token_id"))
    fields["eos_token"] = eos
    cfg.locs.setdefault("eos_token", cfg.loc("eos_token_id"))

    shape = ModelShape(name=_model_name(data, path), **fields, source=path, locs=cfg.locs)
    dyn = ["continuous_batching", "micro_batch_pipeline"]
    if shape.is_moe:
        dyn.insert(1, "moe_routing")
    return ModelSpec(shape=shape, dynamism=tuple(dyn), micro_batch=1, wafers=None, source=path,
                     max_positions=max_pos)


def _read_ffn(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    if mt in ("llama", "qwen2", "qwen3", "qwen3_5"):
        f["ffn"] = cfg.get("intermediate_size", 12288 if mt == "qwen3_5" else None, field="ffn")
    elif mt == "qwen3_5_moe":  # every layer MoE, with one gated shared expert
        f["experts"] = cfg.get("num_experts", 256, field="experts")
        f["top_k"] = cfg.get("num_experts_per_tok", 8, field="top_k")
        f["expert_ffn"] = cfg.get("moe_intermediate_size", 512, field="expert_ffn")
        shared = cfg.get("shared_expert_intermediate_size", 512, field="shared_experts")
        if shared != f["expert_ffn"]:
            raise FrontendError(f"shared_expert_intermediate_size {shared} differs from "
                                f"moe_intermediate_size {f['expert_ffn']}: shared experts as wide as "
                                "the routed ones only", cfg.loc("shared_expert_intermediate_size"))
        f["shared_experts"] = 1
    elif mt == "mixtral":
        f["experts"] = cfg.get("num_local_experts", field="experts")
        f["top_k"] = cfg.get("num_experts_per_tok", field="top_k")
        f["expert_ffn"] = cfg.get("intermediate_size", field="expert_ffn")
    elif mt == "gpt_oss":
        f["experts"] = cfg.get("num_local_experts", field="experts")
        key = "experts_per_token" if "experts_per_token" in cfg.data else "num_experts_per_tok"
        f["top_k"] = cfg.get(key, field="top_k")
        f["expert_ffn"] = cfg.get("intermediate_size", field="expert_ffn")
    elif mt == "qwen3_moe":
        # transformers 5 writes the expert count as num_local_experts
        key = "num_experts" if "num_experts" in cfg.data else "num_local_experts"
        f["experts"] = cfg.get(key, field="experts")
        f["top_k"] = cfg.get("num_experts_per_tok", field="top_k")
        f["expert_ffn"] = cfg.get("moe_intermediate_size", field="expert_ffn")
        step = cfg.get("decoder_sparse_step", 1, field="moe_layers")
        if step < 1:
            raise FrontendError(f"decoder_sparse_step must be at least 1, got {step}",
                                cfg.loc("decoder_sparse_step"))
        only_mlp = cfg.get("mlp_only_layers", [], kind=list)
        if any(isinstance(i, bool) or not isinstance(i, int) for i in only_mlp):
            raise FrontendError("field 'mlp_only_layers' must be a list of integers",
                                cfg.loc("mlp_only_layers"))
        moe = tuple(i for i in range(f["layers"]) if i not in only_mlp and (i + 1) % step == 0)
        if f["experts"] > 0 and not moe:
            raise FrontendError("no layer is MoE under decoder_sparse_step and mlp_only_layers",
                                cfg.loc("decoder_sparse_step"))
        f["moe_layers"] = moe
        if len(moe) < f["layers"]:
            f["ffn"] = cfg.get("intermediate_size", field="ffn")


def _read_dtypes(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    key = "torch_dtype" if "torch_dtype" in cfg.data else "dtype"
    name = cfg.get(key, "bfloat16", kind=str, field="dtype_bytes")
    if name not in DTYPE_BYTES:
        raise FrontendError(f"unknown {key} '{name}', expected one of {', '.join(DTYPE_BYTES)}",
                            cfg.loc(key))
    f["dtype_bytes"] = DTYPE_BYTES[name]
    f["kv_bytes"] = max(DTYPE_BYTES[name], 2.0)
    f["act_format"] = act_format_of(DTYPE_BYTES[name], name)
    q = cfg.get("quantization_config", {}, kind=dict)
    if q:
        _read_quant(cfg, mt, q, f)


# modules_to_not_convert entries that leave what meshrt quantizes as it is: the embedding and
# lm_head are never quantized here, nor are routers (not linear layers in transformers)
_UNCONVERTED_OK = re.compile(r"^(model\.)?(embed_tokens|lm_head|layers\.\*\.mlp\.(router|gate))$"
                             r"|^lm_head$")


def _read_quant(cfg: _Config, mt: str, q: dict[str, Any], f: dict[str, Any]) -> None:
    """transformers' quantization_config: which weights are stored how (`meshrt.quant`).

    mxfp4 (transformers' Mxfp4 quantizer) replaces gpt_oss's experts only; fp8
    (FineGrainedFP8Config) every linear layer but lm_head: the attention and FFN
    projections and the experts, e4m3 with a float32 scale per weight_block_size
    block (or per tensor). Both compute with the dequantized weights, as
    transformers does where it dequantizes (its CPU path); fp8's GPU kernels also
    quantize activations per token group, which meshrt does not (16-bit activations)."""
    where = cfg.loc("quantization_config")
    method = q.get("quant_method")
    if method == "mxfp4":
        if mt != "gpt_oss":
            raise FrontendError(f"mxfp4 quantizes gpt_oss's experts; a {mt} model has none it "
                                "applies to", cfg.loc("quant_method"))
        f["expert_quant"] = "mxfp4"
        cfg.locs["expert_quant"] = where
        return
    if "quant_method" not in q:
        raise FrontendError("quantization_config has no quant_method (mxfp4 or fp8)", where)
    if method != "fp8":
        raise FrontendError(f"unsupported quant_method '{method}', expected mxfp4 or fp8",
                            cfg.loc("quant_method"))
    if mt.startswith("qwen3_5"):  # Qwen3.5's DeltaNet projections would be quantized too
        raise FrontendError("fp8 weights of Gated DeltaNet layers are not computed yet (only "
                            "attention's, the FFNs' and the experts')", cfg.loc("quant_method"))
    fmt = q.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise FrontendError(f"fp8 format '{fmt}' is not supported, only e4m3", cfg.loc("fmt"))
    scheme = q.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise FrontendError(f"activation_scheme '{scheme}' (static activation scales) is not "
                            "supported, only dynamic", cfg.loc("activation_scheme"))
    block = q.get("weight_block_size")
    if block is not None:
        if (not isinstance(block, list) or len(block) != 2
                or any(isinstance(b, bool) or not isinstance(b, int) or not 0 < b <= 1 << 16
                       for b in block)):
            raise FrontendError(f"weight_block_size must be two positive integers [rows, columns], "
                                f"got {json.dumps(block)}", cfg.loc("weight_block_size"))
        # transformers' block is (output rows, input columns) of the (out, in) weight
        f["quant_block_out"], f["quant_block_in"] = block
    for name in q.get("modules_to_not_convert") or ():
        if not isinstance(name, str) or not _UNCONVERTED_OK.match(name):
            raise FrontendError(f"modules_to_not_convert lists {json.dumps(name)}: meshrt quantizes "
                                "every attention and FFN projection or none", cfg.loc("modules_to_not_convert"))
    f["linear_quant"] = "fp8"
    cfg.locs["linear_quant"] = where
    if f.get("experts"):
        f["expert_quant"] = "fp8"
        cfg.locs["expert_quant"] = where


# transformers' defaults per model type (its configuration classes)
_THETA = {"mixtral": 1e6, "gpt_oss": 150000.0}
_EPS = {"mixtral": 1e-5, "gpt_oss": 1e-5}
_ROPE_KEYS = {  # what each implemented rope type reads; other keys change nothing
    "default": (), "linear": ("factor",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "yarn": ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "attention_factor", "mscale", "mscale_all_dim", "truncate"),
}


def _read_math(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    """The math-changing keys of model type `mt` (see the module doc) into `f`."""
    data = cfg.data
    f["rms_eps"] = cfg.get("rms_norm_eps", _EPS.get(mt, 1e-6), kind=float, field="rms_eps")
    act = cfg.get("hidden_act", "silu", kind=str)
    if act not in ("silu", "swish"):
        raise FrontendError(f"hidden_act '{act}' is not implemented: meshrt's FFNs are SwiGLU "
                            "(silu)", cfg.loc("hidden_act"))
    flag = lambda key, default: _flag(cfg, key, default)  # noqa: E731
    if mt == "qwen2":
        f["qkv_bias"], f["o_bias"] = True, False
    elif mt != "mixtral":
        f["qkv_bias"] = f["o_bias"] = flag("attention_bias", mt == "gpt_oss")
    if mt == "llama":
        f["mlp_bias"] = flag("mlp_bias", False)
    f["qk_norm"] = mt in ("qwen3", "qwen3_moe", *QWEN3_5)
    if mt == "qwen3_moe":
        f["norm_topk"] = flag("norm_topk_prob", False)
    if mt in QWEN3_5:
        if f["qkv_bias"]:
            raise FrontendError("attention_bias with Qwen3.5's gated q_proj is not implemented",
                                cfg.loc("attention_bias"))
        _read_linear(cfg, f)
        f["attn_gate"] = True
        f["shared_expert_gate"] = mt == "qwen3_5_moe"
    f["tie_embeddings"] = flag("tie_word_embeddings", False)
    if f["tie_embeddings"]:
        cfg.locs["tie_embeddings"] = cfg.loc("tie_word_embeddings")
    _read_window(cfg, mt, f)
    _read_rope(cfg, mt, f)
    if mt == "gpt_oss":  # sinks, biased router and experts, the clamped SwiGLU
        f["attn_sinks"] = f["router_bias"] = f["expert_bias"] = True
        f["swiglu_alpha"] = cfg.get("swiglu_alpha", 1.702, kind=float, field="swiglu")
        f["swiglu_limit"] = cfg.get("swiglu_limit", 7.0, kind=float, field="swiglu")
        f["swiglu_shift"] = 1.0
    key = "partial_rotary_factor"
    if mt not in QWEN3_5 and key in data and data[key] not in (None, 1, 1.0):
        raise FrontendError(f"{key} {json.dumps(data[key])} is not implemented (RoPE over all "
                            "of head_dim only)", cfg.loc(key))


def _read_linear(cfg: _Config, f: dict[str, Any]) -> None:
    """Qwen3.5's Gated DeltaNet layers: `layer_types` (default: full attention every
    `full_attention_interval`-th layer, 4) and the linear attention's heads and conv."""
    layers = f["layers"]
    types = cfg.data.get("layer_types")
    if types is None:
        every = cfg.get("full_attention_interval", 4, field="linear_layers")
        if every < 1:
            raise FrontendError(f"full_attention_interval must be at least 1, got {every}",
                                cfg.loc("full_attention_interval"))
        types = ["linear_attention" if (i + 1) % every else "full_attention" for i in range(layers)]
    elif not isinstance(types, list) or len(types) != layers or any(
            t not in ("linear_attention", "full_attention") for t in types):
        raise FrontendError(f"field 'layer_types' must list {layers} of \"linear_attention\" and "
                            "\"full_attention\"", cfg.loc("layer_types"))
    else:
        cfg.locs["linear_layers"] = cfg.loc("layer_types")
    f["linear_layers"] = tuple(i for i, t in enumerate(types) if t == "linear_attention")
    for key, theirs, default in (("linear_k_heads", "linear_num_key_heads", 16),
                                 ("linear_v_heads", "linear_num_value_heads", 32),
                                 ("linear_k_dim", "linear_key_head_dim", 128),
                                 ("linear_v_dim", "linear_value_head_dim", 128),
                                 ("linear_conv", "linear_conv_kernel_dim", 4)):
        f[key] = cfg.get(theirs, default, field=key)


def _flag(cfg: _Config, key: str, default: bool) -> bool:
    v = cfg.data.get(key)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise FrontendError(f"field '{key}' must be true or false, got {json.dumps(v)}", cfg.loc(key))
    return v


def _read_window(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    data, layers = cfg.data, f["layers"]
    if mt in ("llama", *QWEN3_5):
        return  # transformers' llama and qwen3_5 have no sliding window
    if mt in ("qwen2", "qwen3", "qwen3_moe") and not _flag(cfg, "use_sliding_window", False):
        return
    key = "sliding_window"
    width = cfg.get(key, 4096 if mt != "mixtral" else 0, field="sliding_window")
    if not width:
        return
    if width < 1:
        raise FrontendError(f"sliding_window must be at least 1, got {width}", cfg.loc(key))
    types = data.get("layer_types")
    if mt in ("qwen2", "qwen3", "gpt_oss") and types is not None:
        if not isinstance(types, list) or len(types) != layers or any(
                t not in ("sliding_attention", "full_attention") for t in types):
            raise FrontendError(f"field 'layer_types' must list {layers} of \"sliding_attention\" "
                                "and \"full_attention\"", cfg.loc("layer_types"))
        slide = tuple(i for i, t in enumerate(types) if t == "sliding_attention")
    elif mt in ("qwen2", "qwen3"):
        first = cfg.get("max_window_layers", 28)
        slide = tuple(range(first, layers))
    else:
        slide = tuple(range(layers))  # qwen3_moe, mixtral: every layer
    if slide:
        f["sliding_window"], f["window_layers"] = width, slide


def _read_rope(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    data = cfg.data
    key = "rope_parameters" if data.get("rope_parameters") is not None else "rope_scaling"
    p = cfg.get(key, {}, kind=dict)
    where = cfg.loc(key)
    if any(isinstance(v, dict) for v in p.values()):
        raise FrontendError(f"a rope per layer type ('{key}' holds objects) is not implemented",
                            where)
    cfg.locs["rope"] = where if p else cfg.loc("rope_theta")

    def num(name: str, default: float | None) -> float:
        v = p.get(name)
        if v is None:
            if default is None:
                raise FrontendError(f"'{key}' of rope type '{rtype}' is missing '{name}'", where)
            return default
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise FrontendError(f"'{key}.{name}' must be a number, got {json.dumps(v)}",
                                cfg.loc(name) if name in cfg.text else where)
        return v

    rtype = p.get("rope_type", p.get("type", "default"))
    if rtype not in _ROPE_KEYS:
        raise FrontendError(f"rope type '{rtype}' ('{key}') is not implemented; implemented: "
                            f"{', '.join(_ROPE_KEYS)}", where)
    if "rope_theta" in p:
        f["rope_theta"] = num("rope_theta", None)
    else:
        f["rope_theta"] = cfg.get("rope_theta", _THETA.get(mt, 10000.0), kind=float, field="rope")
    if mt in QWEN3_5:  # transformers' default 0.25; text positions are the same on the three
        # mrope axes, so mrope_section / mrope_interleaved change nothing
        f["rope_partial"] = num("partial_rotary_factor", data.get("partial_rotary_factor") or 0.25)
        if not 0 < f["rope_partial"] <= 1:
            raise FrontendError(f"partial_rotary_factor must be in (0, 1], got {f['rope_partial']}",
                                cfg.loc("partial_rotary_factor"))
    elif p.get("partial_rotary_factor") not in (None, 1, 1.0):
        raise FrontendError(f"'{key}.partial_rotary_factor' is not implemented (RoPE over all "
                            "of head_dim only)", where)
    elif p.get("mrope_section") is not None:
        raise FrontendError(f"'{key}.mrope_section' (multimodal RoPE) is not implemented for {mt}",
                            where)
    f["rope_type"] = rtype
    if rtype == "default":
        return
    max_pos = cfg.get("max_position_embeddings", DEFAULT_MAX_SEQ)
    original = int(num("original_max_position_embeddings", max_pos))
    f["rope_factor"] = num("factor", None if rtype != "yarn" else max_pos / original)
    if rtype == "llama3":
        f["rope_low_freq_factor"] = num("low_freq_factor", None)
        f["rope_high_freq_factor"] = num("high_freq_factor", None)
        f["rope_original_max"] = original
    elif rtype == "yarn":
        f["rope_original_max"] = original
        f["rope_beta_fast"] = num("beta_fast", 32.0) or 32.0
        f["rope_beta_slow"] = num("beta_slow", 1.0) or 1.0
        truncate = p.get("truncate", True)
        if not isinstance(truncate, bool):
            raise FrontendError(f"'{key}.truncate' must be true or false", where)
        f["rope_truncate"] = truncate
        factor, mscale, mscale_all = f["rope_factor"], num("mscale", 0.0), num("mscale_all_dim", 0.0)
        attn = num("attention_factor", 0.0)
        if not attn and mscale and mscale_all:
            def get_mscale(m: float) -> float:
                return 1.0 if factor <= 1 else 0.1 * m * math.log(factor) + 1.0

            attn = get_mscale(mscale) / get_mscale(mscale_all)
        f["rope_attention_factor"] = attn


def _model_name(data: dict[str, Any], path: str) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        return name.strip().rstrip("/").split("/")[-1]
    p = Path(path)
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem
