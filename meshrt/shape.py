"""The model's shape, in one place: its dimensions, their validation, the
request slots its KV caches hold, and its `hparams` dictionary in the IR.

`ModelShape` is built by the frontend (the `.mrt` parser and the Hugging Face
importer), written into the graph IR by the mapper as `hparams`
(`to_hparams`), and read back by every later consumer (`from_hparams`, or a
single key with `HParams`): the passes, the cost model, the NumPy reference
and the serving loop. Construction validates: an impossible number raises a
`FrontendError` located at the field that holds it (`locs` maps field names
to positions).

Byte sizes may be fractional: `dtype_bytes = 0.5` is a 4-bit weight format,
and MXFP4 (32 four-bit values sharing one 8-bit scale) is 17/32 = 0.53125.

Request slots. With micro-batch pipelining one micro-batch is in flight per
stage, so every attention keeps KV for micro_batch x stages requests
(`kv_slots`); without it one micro-batch is in flight (`in_flight`).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from xdsl.dialects.builtin import (DenseArrayBase, DictionaryAttr, FloatAttr, IntegerAttr,
                                   StringAttr, f64, i64)
from xdsl.ir import Attribute

from meshrt.activations import act_format_of, act_format_problem
from meshrt.diagnostics import FrontendError, Loc
from meshrt.rope import Rope, rotary_dim

DEFAULT_MAX_SEQ = 4096  # KV capacity per request slot when the input gives none
DEFAULT_DTYPE_BYTES = 2.0

# The integer and float hparams of a model, in the order the IR prints them.
SHAPE_INTS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "ffn", "experts",
              "top_k", "expert_ffn", "shared_experts", "max_seq", "eos_token")
MAPPING_INTS = ("kv_slots", "experts_per_region")  # what the mapper chose
SHAPE_FLOATS = ("dtype_bytes", "expert_dtype_bytes", "kv_bytes")
# The math beyond the dimensions, as the config's model type computes it (the
# reference and the kernels' numerics read these): the IR holds a key only
# where it differs from ModelShape's default (LLaMA 2's math). Flags are 0 / 1.
MATH_FLAGS = ("qkv_bias", "o_bias", "mlp_bias", "qk_norm", "norm_topk", "tie_embeddings",
              "rope_truncate", "attn_sinks", "router_bias", "expert_bias", "attn_gate",
              "shared_expert_gate")
# Gated DeltaNet (Qwen3.5's linear attention, on the layers in `linear_layers`)
LINEAR_INTS = ("linear_k_heads", "linear_v_heads", "linear_k_dim", "linear_v_dim", "linear_conv")
MATH_INTS = (MATH_FLAGS + ("sliding_window", "rope_original_max", "quant_block_in", "quant_block_out")
             + LINEAR_INTS)
MATH_FLOATS = ("rms_eps", "rope_theta", "rope_factor", "rope_low_freq_factor",
               "rope_high_freq_factor", "rope_beta_fast", "rope_beta_slow", "rope_attention_factor",
               "rope_partial", "swiglu_alpha", "swiglu_limit", "swiglu_shift")
MATH_STRS = ("rope_type", "linear_quant", "expert_quant", "act_format")

# Sanity bounds, far above any real model and far below what would hang the
# mapper or overflow an i64 product: a larger number is a typo or garbage.
MAX_LAYERS = 1 << 16
MAX_EXPERTS = 1 << 16
MAX_DIM = 1 << 24
MAX_CHUNK = 4096  # the most prompt tokens a slot prefills a step (a 4K context at once)
INT_RANGES: dict[str, tuple[int, int]] = {
    "layers": (1, MAX_LAYERS), "hidden": (1, MAX_DIM), "heads": (1, MAX_DIM),
    "kv_heads": (1, MAX_DIM), "head_dim": (1, MAX_DIM), "vocab": (1, MAX_DIM),
    "ffn": (0, MAX_DIM), "experts": (0, MAX_EXPERTS), "top_k": (0, MAX_EXPERTS),
    "expert_ffn": (0, MAX_DIM), "shared_experts": (0, MAX_EXPERTS), "max_seq": (1, MAX_DIM),
    "eos_token": (-1, MAX_DIM), "kv_slots": (1, MAX_DIM), "experts_per_region": (0, MAX_EXPERTS),
    "sliding_window": (0, MAX_DIM), "rope_original_max": (0, MAX_DIM),
    **{k: (0, MAX_DIM) for k in LINEAR_INTS},
    "quant_block_in": (0, MAX_DIM), "quant_block_out": (0, MAX_DIM),
    "prefill_chunk": (1, MAX_CHUNK),
    **{k: (0, 1) for k in MATH_FLAGS},
}


def int_problem(key: str, v: Any) -> str | None:
    """Why `v` is not a sane value of the integer field `key` (INT_RANGES), or None."""
    lo, hi = INT_RANGES[key]
    if isinstance(v, bool) or not isinstance(v, int):
        return f"{key} must be an integer, got {v!r}"
    if v < lo:
        return f"{key} must be at least {lo}, got {v}" if lo else f"{key} must not be negative, got {v}"
    if v > hi:
        return f"{key} must be at most {hi:,}, got {v:,}"
    return None


BYTES_QUANTUM = 4096  # byte sizes are multiples of 1/4096: 17/32 (mxfp4), fp8 with its scales


def bytes_problem(key: str, v: Any) -> str | None:
    """Why `v` is not a byte size (a positive multiple of 1/4096 up to 8), or None."""
    if (isinstance(v, bool) or not isinstance(v, int | float) or not 0 < v <= 8
            or (v * BYTES_QUANTUM) % 1):
        return f"{key} must be a positive multiple of 1/{BYTES_QUANTUM} up to 8, got {v}"
    return None


def hparams_problem(hparams: Any) -> str | None:
    """What is wrong with an IR `hparams` dictionary, or None: every numeric
    key present is checked (INT_RANGES, byte sizes), and hparams that hold the
    six dimensions are checked as a whole ModelShape (top_k <= experts, ...)."""
    hp = HParams.of(hparams)
    for key, attr in hp.attrs.items():
        if key in MATH_FLOATS:
            if not isinstance(attr, IntegerAttr | FloatAttr) or not math.isfinite(attr.value.data):
                return f"{key} must be a finite number, got {attr}"
        if key in MATH_STRS and not isinstance(attr, StringAttr):
            return f"{key} must be a string, got {attr}"
        if key == "act_format" and act_format_problem(attr.data):
            return act_format_problem(attr.data)
        if key in INT_RANGES or key in SHAPE_FLOATS:
            if not isinstance(attr, IntegerAttr | FloatAttr):
                return f"{key} must be a number, got {attr}"
            v = attr.value.data
            if key in SHAPE_FLOATS:
                problem = bytes_problem(key, v)
            else:
                problem = int_problem(key, v if isinstance(attr, IntegerAttr) or v % 1 else int(v))
            if problem:
                return problem
    if all(k in hp for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab")):
        try:
            ModelShape.from_hparams(hp)
        except FrontendError as e:
            return e.message
    return None


def kv_bytes_default(dtype_bytes: float) -> float:
    """KV-cache bytes per element when not given: the weights', at least 16 bits."""
    return max(dtype_bytes, 2.0)


def field_loc(locs: Mapping[str, Loc], key: str, source: str) -> Loc:
    return locs.get(key) or Loc(source)


# -- request slots ------------------------------------------------------------
def in_flight(stages: int, dynamism: Sequence[str]) -> int:
    """Micro-batches circulating in steady state: one per stage when pipelined, else one."""
    return stages if "micro_batch_pipeline" in dynamism else 1


def kv_slots(micro_batch: int, stages: int, dynamism: Sequence[str]) -> int:
    """Request slots every attention keeps KV for: micro-batch x micro-batches in flight."""
    return micro_batch * in_flight(stages, dynamism)


DESCRIPTOR_BYTES = 16
"""A request descriptor: request id, status, context length, spare (four u32)."""
SLOT_LENGTH_BYTES = 4
"""A request slot's context length (a u32)."""


def request_state(micro_batch: int, slots: int = 0) -> int:
    """Control state per core for request bookkeeping: the descriptors of the micro-batch in
    hand (its slots' ids and status arrive with it, on the continuous-batching payload, and
    leave with it) and, for `slots` request slots whose KV the core keeps, each slot's context
    length (which persists between the visits of its micro-batch). The request table is split
    so: only what a core reads stays on it, so the slots a stage holds (micro-batch x stages)
    cost 4 bytes each where KV lives, not a whole descriptor on every core."""
    return micro_batch * DESCRIPTOR_BYTES + slots * SLOT_LENGTH_BYTES


@dataclass(frozen=True)
class ModelShape:
    """Decoder-only transformer dimensions (dense, MoE, or mixed)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    ffn: int = 0  # dense FFN width (SwiGLU), for every layer not in moe_layers
    experts: int = 0  # routed experts per MoE layer
    top_k: int = 0
    expert_ffn: int = 0
    shared_experts: int = 0  # always-on experts of width expert_ffn
    moe_layers: tuple[int, ...] = ()  # which layers are MoE (all of them by default)
    dtype_bytes: float = DEFAULT_DTYPE_BYTES  # bytes per weight element (attention, norms, embeddings)
    expert_dtype_bytes: float = 0.0  # bytes per expert weight; 0 = dtype_bytes
    kv_bytes: float = 0.0  # bytes per KV-cache element; 0 = max(dtype_bytes, 2)
    max_seq: int = DEFAULT_MAX_SEQ  # KV capacity per request slot, in tokens
    eos_token: int | None = 0  # None: no EOS token (the IR's -1); requests stop at their length
    eos_more: tuple[int, ...] = ()  # further EOS tokens (a config's eos_token_id list)
    # -- the math (MATH_INTS / MATH_FLOATS / MATH_STRS) --
    rms_eps: float = 1e-5  # every RMSNorm's epsilon
    qkv_bias: bool = False  # q, k and v projections have biases
    o_bias: bool = False  # the attention output projection has a bias
    mlp_bias: bool = False  # the dense FFN's gate, up and down have biases
    qk_norm: bool = False  # RMSNorm over head_dim of every q and k head, before RoPE
    norm_topk: bool = True  # MoE: the top-k router weights renormalised to sum to 1
    tie_embeddings: bool = False  # lm_head is the embedding's transpose (one tensor in a checkpoint)
    sliding_window: int = 0  # keys within this many positions, in window_layers (0: none)
    window_layers: tuple[int, ...] = ()  # which layers attend over the sliding window
    rope_theta: float = 10000.0  # see meshrt.rope.Rope for the rest
    rope_type: str = "default"
    rope_factor: float = 1.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max: int = 0
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_attention_factor: float = 0.0
    rope_truncate: bool = True
    rope_partial: float = 1.0  # partial_rotary_factor: the share of head_dim RoPE rotates
    attn_sinks: bool = False  # gpt_oss: a learned logit per head joins every softmax
    router_bias: bool = False  # the MoE router has a bias
    expert_bias: bool = False  # the routed experts' gate, up and down have biases
    # the FFN activation: min(g, limit) * sigmoid(alpha * min(g, limit)) * (clip(u, ±limit) + shift);
    # the defaults (no clamp) are SwiGLU, silu(g) * u; gpt_oss: 1.702, 7, 1
    swiglu_alpha: float = 1.0
    swiglu_limit: float = 0.0
    swiglu_shift: float = 0.0
    # Qwen3.5: full attention's output gated by sigmoid(x W_g) per element (q_proj holds W_g)
    attn_gate: bool = False
    shared_expert_gate: bool = False  # the shared experts' sum scaled by sigmoid(x w_sg)
    # Gated DeltaNet token mixers on `linear_layers` (the others: full attention)
    linear_layers: tuple[int, ...] = ()
    linear_k_heads: int = 0
    linear_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv: int = 0  # the short causal conv's kernel size
    # quantized weights (`meshrt.quant`): the format of the attention and dense FFN
    # projections and of the experts ("" = dtype_bytes floats; "fp8", "mxfp4"), and
    # fp8's scale block (input rows x output columns of the (in, out) matrix; 0 x 0:
    # one scale per tensor)
    linear_quant: str = ""
    expert_quant: str = ""
    quant_block_in: int = 0
    quant_block_out: int = 0
    # the format activations travel in (`meshrt.activations`): "" = as the weights
    # (bf16 for 16-bit weights, f32 for 32-bit); "f16" for float16 checkpoints
    act_format: str = ""
    name: str = "model"
    source: str = field(default="<model>", compare=False)
    locs: Mapping[str, Loc] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        for key in SHAPE_INTS:  # before anything is built per layer (eos_token: below)
            problem = None if key == "eos_token" else int_problem(key, getattr(self, key))
            if problem:
                raise FrontendError(problem, field_loc(self.locs, key, self.source))
        if self.experts and not self.moe_layers:
            object.__setattr__(self, "moe_layers", tuple(range(self.layers)))
        if not self.expert_dtype_bytes:
            object.__setattr__(self, "expert_dtype_bytes",
                               self.quant_bytes(self.expert_quant) or self.dtype_bytes)
        if not self.kv_bytes:
            object.__setattr__(self, "kv_bytes", kv_bytes_default(self.dtype_bytes))
        if not self.act_format:
            object.__setattr__(self, "act_format", act_format_of(self.dtype_bytes))
        self._validate()

    # -- derived ---------------------------------------------------------
    @property
    def quant_block(self) -> tuple[int, int] | None:
        """fp8's scale block (input rows, output columns), None for one per tensor."""
        return (self.quant_block_in, self.quant_block_out) if self.quant_block_in else None

    def quant_bytes(self, fmt: str) -> float:
        """Stored bytes per weight of `fmt` with its scales; 0.0 for "" (unquantized)."""
        from meshrt.quant import bytes_per_weight

        return bytes_per_weight(fmt, self.quant_block) if fmt else 0.0

    @property
    def linear_bytes(self) -> float:
        """Bytes per weight of the attention and dense FFN projections."""
        return self.quant_bytes(self.linear_quant) or self.dtype_bytes

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def is_moe_layer(self, layer: int) -> bool:
        return layer in self._moe_set

    @functools.cached_property
    def _moe_set(self) -> frozenset[int]:
        return frozenset(self.moe_layers)

    @property
    def eos_tokens(self) -> frozenset[int]:
        """Every token that ends a request (none without an EOS token)."""
        return frozenset(() if self.eos_token is None else (self.eos_token, *self.eos_more))

    def window(self, layer: int) -> int:
        """The sliding window layer `layer` attends over (0: every earlier key)."""
        return self.sliding_window if layer in self._window_set else 0

    def kv_capacity(self, layer: int, chunk: int = 1) -> int:
        """Positions a request slot's KV cache holds in attention layer `layer`: max_seq,
        or on a sliding-window layer a ring of the last ones: its window, and the chunk's
        other rows (a prefill chunk of `chunk` rows writes its keys before the first row
        has read the oldest of its window)."""
        w = self.window(layer)
        return min(w + chunk - 1, self.max_seq) if w else self.max_seq

    @functools.cached_property
    def _window_set(self) -> frozenset[int]:
        return frozenset(self.window_layers)

    @functools.cached_property
    def rope(self) -> Rope:
        return Rope(self.rope_theta, self.rope_type, self.rope_factor, self.rope_low_freq_factor,
                    self.rope_high_freq_factor, self.rope_original_max, self.rope_beta_fast,
                    self.rope_beta_slow, self.rope_attention_factor, self.rope_truncate,
                    self.rope_partial)

    def is_linear_layer(self, layer: int) -> bool:
        """Whether layer `layer` mixes tokens with Gated DeltaNet (else full attention)."""
        return layer in self._linear_set

    @functools.cached_property
    def _linear_set(self) -> frozenset[int]:
        return frozenset(self.linear_layers)

    @property
    def qkv_width(self) -> int:
        """Full attention's input projection: q, k, v (and the output gate where attn_gate)."""
        return (self.heads * (1 + self.attn_gate) + 2 * self.kv_heads) * self.head_dim

    @property
    def linear_key_width(self) -> int:
        return self.linear_k_heads * self.linear_k_dim

    @property
    def linear_value_width(self) -> int:
        return self.linear_v_heads * self.linear_v_dim

    @property
    def linear_conv_width(self) -> int:
        """DeltaNet's convolved channels: q, k and v."""
        return 2 * self.linear_key_width + self.linear_value_width

    @property
    def linear_in_width(self) -> int:
        """DeltaNet's input projection: q, k, v, the output gate z, and b, a per value head."""
        return self.linear_conv_width + self.linear_value_width + 2 * self.linear_v_heads

    def linear_state_elements(self) -> tuple[int, int]:
        """(recurrent state, conv state) elements of one DeltaNet layer for one request:
        a (k_dim, v_dim) matrix per value head, and the last linear_conv - 1 inputs."""
        return (self.linear_v_heads * self.linear_k_dim * self.linear_v_dim,
                self.linear_conv_width * max(self.linear_conv - 1, 0))

    @property
    def attn_width(self) -> int:
        return self.heads * self.head_dim

    def kv_bytes_per_token(self) -> float:
        """K and V of one token in one layer."""
        return 2 * self.kv_heads * self.head_dim * self.kv_bytes

    def request_state_bytes(self, positions: int) -> float:
        """One request's KV of `positions` positions in every attention layer (at most its
        `kv_capacity`) and its state in every DeltaNet layer, at kv_bytes: what the host
        writes to push a cache."""
        rec, conv = self.linear_state_elements()
        attention = sum(min(positions, self.kv_capacity(i)) for i in range(self.layers)
                        if not self.is_linear_layer(i))
        return (attention * self.kv_bytes_per_token()
                + len(self.linear_layers) * (rec + conv) * self.kv_bytes)

    def weight_counts(self) -> tuple[int, int]:
        """(weights stored at dtype_bytes, expert weights at expert_dtype_bytes),
        counted in elements (embedding and lm_head separately, even tied: their
        regions each hold their own tiles; biases, q/k norm gains and sinks where
        the model has them)."""
        h = self.hidden
        attn = h * self.qkv_width + self.attn_width * h + 2 * h  # + two norm gains
        attn += self.qkv_width * self.qkv_bias + h * self.o_bias + 2 * self.head_dim * self.qk_norm
        attn += self.heads * self.attn_sinks
        # DeltaNet: in projection, conv taps, dt_bias and A_log, the gated norm, out, two norms
        linear = (h * self.linear_in_width + self.linear_conv_width * self.linear_conv
                  + 2 * self.linear_v_heads + self.linear_v_dim + self.linear_value_width * h + 2 * h)
        n_lin = len(self.linear_layers)
        moe = len(self.moe_layers) if self.is_moe else 0
        plain = 2 * self.vocab * h + h  # embed, lm_head (each region its copy, tied or not), final norm
        plain += (self.layers - n_lin) * attn + n_lin * linear
        plain += moe * (h + self.router_bias) * self.experts  # routers
        plain += moe * h * self.shared_experts * self.shared_expert_gate
        plain += (self.layers - moe) * (3 * h * self.ffn + (2 * self.ffn + h) * self.mlp_bias)
        experts = moe * (self.experts + self.shared_experts) * 3 * h * self.expert_ffn
        experts += moe * self.experts * (2 * self.expert_ffn + h) * self.expert_bias
        return plain, experts

    def projection_count(self) -> int:
        """Elements of the attention and dense FFN projections (stored at `linear_bytes`)."""
        h, moe = self.hidden, len(self.moe_layers) if self.is_moe else 0
        return (self.layers * (h * self.qkv_width + self.attn_width * h)
                + (self.layers - moe) * 3 * h * self.ffn)

    def weight_bytes(self) -> float:
        """All weights (see `weight_counts`), the projections at `linear_bytes`."""
        plain, experts = self.weight_counts()
        proj = self.projection_count()
        return ((plain - proj) * self.dtype_bytes + proj * self.linear_bytes
                + experts * self.expert_dtype_bytes)

    # -- the IR's hparams ------------------------------------------------
    def to_hparams(self, kv_slots: int, experts_per_region: int) -> dict[str, Attribute]:
        """The `hparams` dictionary of the graph IR (the mapper's slots and expert group)."""
        ints = {k: getattr(self, k) for k in SHAPE_INTS}
        ints["eos_token"] = -1 if self.eos_token is None else self.eos_token
        ints["kv_slots"] = kv_slots
        ints["experts_per_region"] = experts_per_region
        hparams: dict[str, Attribute] = {k: IntegerAttr(v, i64) for k, v in ints.items()}
        for k in SHAPE_FLOATS:
            hparams[k] = FloatAttr(float(getattr(self, k)), f64)
        if self.is_moe:
            hparams["moe_layers"] = DenseArrayBase.from_list(i64, list(self.moe_layers))
        for k in MATH_INTS + MATH_FLOATS + MATH_STRS:
            v = getattr(self, k)
            if v != (_DERIVED[k](self) if k in _DERIVED else _DEFAULTS[k]):
                hparams[k] = (StringAttr(v) if k in MATH_STRS else FloatAttr(float(v), f64)
                              if k in MATH_FLOATS else IntegerAttr(int(v), i64))
        if self.window_layers:
            hparams["window_layers"] = DenseArrayBase.from_list(i64, list(self.window_layers))
        if self.linear_layers:
            hparams["linear_layers"] = DenseArrayBase.from_list(i64, list(self.linear_layers))
        if self.eos_more:
            hparams["eos_more"] = DenseArrayBase.from_list(i64, list(self.eos_more))
        return hparams

    @classmethod
    def from_hparams(cls, hparams: Any, name: str = "model", source: str = "<model>") -> ModelShape:
        """The shape an IR's `hparams` (a DictionaryAttr, a mapping or a program) records;
        absent keys take the defaults of the fields, a missing dimension is an error."""
        hp = HParams.of(hparams)
        missing = [k for k in ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab")
                   if k not in hp]
        if missing:
            raise FrontendError(f"hparams lack {', '.join(missing)}", source)
        kw: dict[str, Any] = {k: hp.int(k) for k in SHAPE_INTS if k in hp}
        if kw.get("eos_token") == -1:
            kw["eos_token"] = None
        kw.update({k: hp.float(k) for k in SHAPE_FLOATS if k in hp})
        if "moe_layers" in hp:
            kw["moe_layers"] = hp.ints("moe_layers")
        kw.update({k: hp.int(k) for k in MATH_INTS if k in hp})
        kw.update({k: bool(kw[k]) for k in MATH_FLAGS if k in kw})
        kw.update({k: hp.float(k) for k in MATH_FLOATS if k in hp})
        kw.update({k: hp.str(k) for k in MATH_STRS if k in hp})
        if "window_layers" in hp:
            kw["window_layers"] = hp.ints("window_layers")
        if "linear_layers" in hp:
            kw["linear_layers"] = hp.ints("linear_layers")
        if "eos_more" in hp:
            kw["eos_more"] = hp.ints("eos_more")
        return cls(name=name, **kw, source=source)

    # -- checks ----------------------------------------------------------
    def _validate(self) -> None:
        def err(key: str, msg: str) -> FrontendError:
            return FrontendError(msg, field_loc(self.locs, key, self.source))

        if self.heads % self.kv_heads:
            raise err("kv_heads",
                      f"heads {self.heads} is not a multiple of kv_heads {self.kv_heads}")
        if self.head_dim % 2:
            raise err("head_dim", f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        for key in SHAPE_FLOATS:
            problem = bytes_problem(key, getattr(self, key))
            if problem:
                raise err(key, problem)
        for key in MATH_INTS:
            problem = int_problem(key, int(getattr(self, key)))
            if problem:
                raise err(key, problem)
        if not (math.isfinite(self.swiglu_alpha) and self.swiglu_alpha > 0
                and math.isfinite(self.swiglu_limit) and self.swiglu_limit >= 0
                and math.isfinite(self.swiglu_shift)):
            raise err("swiglu", "swiglu_alpha must be positive and swiglu_limit not negative, got "
                                f"{self.swiglu_alpha} and {self.swiglu_limit}")
        from meshrt.quant import FORMATS

        problem = act_format_problem(self.act_format)
        if problem:
            raise err("act_format", problem)
        for key in ("linear_quant", "expert_quant"):
            if getattr(self, key) not in ("", *FORMATS):
                raise err(key, f"{key} must be one of {', '.join(FORMATS)}, got "
                               f"'{getattr(self, key)}'")
        if bool(self.quant_block_in) != bool(self.quant_block_out):
            raise err("quant_block_in", "an fp8 scale block needs both its rows and its columns")
        if not (math.isfinite(self.rms_eps) and self.rms_eps > 0):
            raise err("rms_eps", f"rms_norm_eps must be a positive number, got {self.rms_eps}")
        problem = self.rope.problem()
        if problem:
            raise err("rope", problem)
        rot = rotary_dim(self.rope, self.head_dim)
        if rot < 2 or rot % 2:
            raise err("rope", f"partial_rotary_factor {self.rope_partial} rotates {rot} of "
                      f"head_dim {self.head_dim}: it must rotate an even number, at least 2")
        self._validate_linear(err)
        bad = [i for i in self.window_layers if not 0 <= i < self.layers]
        if bad:
            raise err("sliding_window",
                      f"window_layers lists layer {bad[0]}, outside 0..{self.layers - 1}")
        if bool(self.window_layers) != bool(self.sliding_window):
            raise err("sliding_window", "a sliding window needs both its width and its layers")
        if self.eos_token is not None and not 0 <= self.eos_token < self.vocab:
            raise err("eos_token",
                      f"eos_token {self.eos_token} is outside the vocabulary 0..{self.vocab - 1}")
        bad = [t for t in self.eos_more if not 0 <= t < self.vocab]
        if bad or (self.eos_more and self.eos_token is None):
            raise err("eos_token", f"EOS token {bad[0]} is outside the vocabulary 0..{self.vocab - 1}"
                      if bad else "further EOS tokens need a first one")
        if self.experts:
            if not 1 <= self.top_k <= self.experts:
                raise err("top_k",
                          f"top_k {self.top_k} must be between 1 and the expert count {self.experts}")
            if self.expert_ffn < 1:
                raise err("expert_ffn", "an MoE model needs expert_ffn of at least 1")
            bad = [i for i in self.moe_layers if not 0 <= i < self.layers]
            if bad:
                raise err("moe_layers",
                          f"moe_layers lists layer {bad[0]}, outside 0..{self.layers - 1}")
            if len(set(self.moe_layers)) != len(self.moe_layers):
                raise err("moe_layers", "moe_layers lists a layer twice")
            if len(self.moe_layers) < self.layers and self.ffn < 1:
                raise err("ffn", "layers outside moe_layers are dense and need ffn of at least 1")
        else:
            for key in ("top_k", "expert_ffn", "shared_experts"):
                if getattr(self, key):
                    raise err(key, f"{key} is set but the model has no experts (experts = 0)")
            if self.moe_layers:
                raise err("moe_layers", "moe_layers is set but the model has no experts")
            if self.ffn < 1:
                raise err("ffn", "a dense model needs ffn of at least 1 (or experts for MoE)")


    def _validate_linear(self, err) -> None:
        bad = [i for i in self.linear_layers if not 0 <= i < self.layers]
        if bad:
            raise err("linear_layers",
                      f"linear_layers lists layer {bad[0]}, outside 0..{self.layers - 1}")
        if len(set(self.linear_layers)) != len(self.linear_layers):
            raise err("linear_layers", "linear_layers lists a layer twice")
        if not self.linear_layers:
            return
        for key in LINEAR_INTS:
            if getattr(self, key) < 1:
                raise err(key, f"Gated DeltaNet layers need {key} of at least 1")
        if self.linear_v_heads % self.linear_k_heads:
            raise err("linear_v_heads", f"linear_v_heads {self.linear_v_heads} is not a multiple "
                      f"of linear_k_heads {self.linear_k_heads}")
        if self.linear_conv < 2:
            raise err("linear_conv", f"the DeltaNet conv needs a kernel of at least 2, got "
                      f"{self.linear_conv}")


class HParams:
    """Typed reads of an IR `hparams` dictionary, at any level.

    An absent key takes `ModelShape`'s default (`expert_dtype_bytes` and
    `kv_bytes` derive theirs from `dtype_bytes` as a ModelShape does); keys
    without one (`kv_slots`, `inflight_slots`, ...) need a default at the call.
    """

    __slots__ = ("attrs",)

    def __init__(self, attrs: Mapping[str, Attribute]):
        self.attrs = attrs

    @classmethod
    def of(cls, obj: Any) -> HParams:
        """From a program op (anything with `.hparams`), a DictionaryAttr or a mapping."""
        if isinstance(obj, HParams):
            return obj
        obj = getattr(obj, "hparams", obj)
        return cls(obj.data if isinstance(obj, DictionaryAttr) else obj)

    def __contains__(self, key: str) -> bool:
        return isinstance(self.attrs.get(key), IntegerAttr | FloatAttr | DenseArrayBase | StringAttr)

    def _value(self, key: str, default: float | None) -> float:
        attr = self.attrs.get(key)
        if isinstance(attr, IntegerAttr | FloatAttr):
            return attr.value.data
        if default is not None:
            return default
        if key in _DERIVED:
            return _DERIVED[key](self)
        if key in _DEFAULTS:
            return _DEFAULTS[key]
        raise KeyError(f"no numeric hparam '{key}'")

    def int(self, key: str, default: int | None = None) -> int:
        return int(self._value(key, default))

    def float(self, key: str, default: float | None = None) -> float:
        return float(self._value(key, default))

    def str(self, key: str) -> str:
        attr = self.attrs.get(key)
        if isinstance(attr, StringAttr):
            return attr.data
        return _DERIVED[key](self) if key in _DERIVED else str(_DEFAULTS[key])

    def ints(self, key: str) -> tuple[int, ...]:
        attr = self.attrs.get(key)
        return tuple(attr.get_values()) if isinstance(attr, DenseArrayBase) else ()

    @property
    def dtype_bytes(self) -> float:
        return self.float("dtype_bytes")

    @property
    def expert_dtype_bytes(self) -> float:
        return self.float("expert_dtype_bytes")

    @property
    def kv_bytes(self) -> float:
        return self.float("kv_bytes")

    @property
    def act_format(self) -> str:
        """The format activations travel in (absent: as `ModelShape` derives it)."""
        return self.str("act_format")

    def kv_slots(self, program: Any) -> int:
        """The KV slots the mapper sized `program`'s attentions for, else the formula."""
        return self.int("kv_slots", kv_slots(program.micro_batch_size, program.num_stages,
                                             program.dynamism_kinds))


# Absent keys: the field defaults of ModelShape, and what it derives from dtype_bytes.
_DERIVED = {
    "expert_dtype_bytes": lambda hp: hp.dtype_bytes,
    "kv_bytes": lambda hp: kv_bytes_default(hp.dtype_bytes),
    "act_format": lambda hp: act_format_of(hp.dtype_bytes),
}
_DEFAULTS: dict[str, float | str] = {
    f.name: f.default for f in fields(ModelShape)
    if f.name in SHAPE_INTS + SHAPE_FLOATS + MATH_INTS + MATH_FLOATS + MATH_STRS
    and f.name not in _DERIVED
}
