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
- gpt_oss: `num_local_experts`, `experts_per_token` (or
  `num_experts_per_tok`), experts of width `intermediate_size`, explicit
  `head_dim`; `quantization_config.quant_method == "mxfp4"` stores the
  expert weights in MXFP4 (17/32 bytes per weight) and the rest in
  `torch_dtype`.

Dynamism defaults to continuous batching and micro-batch pipelining, plus
MoE routing for MoE models; micro-batch 1; KV capacity per slot is
min(max_position_embeddings, 4096) tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from meshrt.frontend.errors import FrontendError, Loc, locate_text
from meshrt.frontend.model import DEFAULT_MAX_SEQ, ModelShape, ModelSpec
from meshrt.limits import JSONInputError, parse_json

SUPPORTED_TYPES = ("llama", "qwen2", "qwen3", "qwen3_moe", "mixtral", "gpt_oss")

DTYPE_BYTES = {"float32": 4.0, "float": 4.0, "float16": 2.0, "half": 2.0, "bfloat16": 2.0,
               "float8_e4m3fn": 1.0, "float8_e5m2": 1.0}
MXFP4_BYTES = 17 / 32  # 32 four-bit values + one shared 8-bit scale


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
    mt = cfg.get("model_type", kind=str) if "model_type" in data else None
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

    max_pos = cfg.get("max_position_embeddings", DEFAULT_MAX_SEQ, field="max_seq")
    fields["max_seq"] = min(max_pos, DEFAULT_MAX_SEQ)
    eos = data.get("eos_token_id", 0)
    if isinstance(eos, list) and eos:
        eos = eos[0]
    if isinstance(eos, bool) or not isinstance(eos, int):
        raise FrontendError(f"field 'eos_token_id' must be an integer or a list of integers, got "
                            f"{json.dumps(data.get('eos_token_id'))}", cfg.loc("eos_token_id"))
    fields["eos_token"] = eos
    cfg.locs.setdefault("eos_token", cfg.loc("eos_token_id"))

    shape = ModelShape(name=_model_name(data, path), **fields, source=path, locs=cfg.locs)
    dyn = ["continuous_batching", "micro_batch_pipeline"]
    if shape.is_moe:
        dyn.insert(1, "moe_routing")
    return ModelSpec(shape=shape, dynamism=tuple(dyn), micro_batch=1, wafers=None, source=path)


def _read_ffn(cfg: _Config, mt: str, f: dict[str, Any]) -> None:
    if mt in ("llama", "qwen2", "qwen3"):
        f["ffn"] = cfg.get("intermediate_size", field="ffn")
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
        f["experts"] = cfg.get("num_experts", field="experts")
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
    q = cfg.get("quantization_config", {}, kind=dict)
    method = q.get("quant_method")
    if method == "mxfp4":
        # gpt-oss keeps attention, router, embeddings and lm_head unquantized.
        f["expert_dtype_bytes"] = MXFP4_BYTES
        cfg.locs["expert_dtype_bytes"] = cfg.loc("quantization_config")
    elif method == "fp8":
        f["dtype_bytes"] = 1.0
        cfg.locs["dtype_bytes"] = cfg.loc("quantization_config")
    elif method is not None:
        raise FrontendError(f"unsupported quant_method '{method}', expected mxfp4 or fp8",
                            cfg.loc("quant_method"))


def _model_name(data: dict[str, Any], path: str) -> str:
    name = data.get("_name_or_path")
    if isinstance(name, str) and name.strip():
        return name.strip().rstrip("/").split("/")[-1]
    p = Path(path)
    return p.parent.name if p.stem == "config" and p.parent.name else p.stem
