"""Plain NumPy reference of a decoder-only transformer (dense or MoE).

The mesh interpreter carries NumPy tiles in its messages; this module is what
those tiles are checked against. It is written for clarity and
reproducibility, not speed.

Semantics (what a tiled on-mesh implementation must reproduce)
--------------------------------------------------------------
* Embedding lookup, then ``layers`` pre-norm blocks, then a final RMSNorm and
  ``lm_head``. Each block::

      h   = x + Wo · attention(rope(Wq·n1), rope(Wk·n1), Wv·n1)   n1 = rmsnorm(x, g_attn)
      out = h + ffn(n2)                                           n2 = rmsnorm(h, g_ffn)

* RMSNorm: ``x / sqrt(mean(x**2) + rms_eps) * gain`` (no bias, no mean removal;
  ``rms_eps`` 1e-5 unless the shape says otherwise).
* Projections ``x·W + b``: q, k, v have biases where ``qkv_bias``, the output
  projection where ``o_bias``, the dense FFN's three where ``mlp_bias``.
* q/k norm (``qk_norm``, Qwen3): an RMSNorm over ``head_dim`` of every q and k
  head with its own (head_dim,) gain, before RoPE.
* RoPE, "rotate-half" pairing: element ``i`` of a head is rotated with element
  ``i + head_dim/2`` by angle ``pos * inv_freq[i]``, where ``pos`` is the token's
  0-based index within its request and ``inv_freq`` is ``meshrt.rope``'s table
  (``theta**(-2i/head_dim)``, or its linear / llama3 / yarn scaling). Applied to
  q and k (k is cached *after* rotation). ``head_dim`` must be even.
* Attention: grouped-query; query head ``h`` reads KV head
  ``h // (heads // kv_heads)`` (contiguous groups). Scores are scaled by
  ``1/sqrt(head_dim)``, causal (a query at position p sees keys 0..p of its
  own request only, and in a layer with a sliding window of W only keys
  p-W+1..p), softmax in float32 with the row max subtracted. With
  ``attn_sinks`` (gpt_oss) each head's learned sink logit joins the softmax
  as one more column, dropped after it (the weights sum to less than 1).
* Dense FFN: SwiGLU, ``W_down · (silu(W_gate·x) * (W_up·x))``; the activation
  is :func:`glu` (gpt_oss's clamped form where the shape says so).
* MoE FFN (the layers in ``moe_layers``; the others are dense): router logits
  ``x·W_router``, float32 softmax over all experts, top-k by probability (ties
  to the lower expert index), the k weights renormalised to sum to 1 where
  ``norm_topk`` (else the probabilities as they are), output = sum_k w_k ·
  expert_k(x) + sum of all shared experts (always on, weight 1). Every expert
  is a SwiGLU of width ``expert_ffn``; the router has a bias where
  ``router_bias``, the routed experts' three maps where ``expert_bias``.
* Qwen3.5 (``linear_layers``, ``attn_gate``, ``rope_partial``, ``shared_expert_gate``):
  the layers in ``linear_layers`` mix tokens with Gated DeltaNet instead of
  attention (:func:`deltanet`): the in projection's q, k, v go through a
  depthwise causal conv of ``linear_conv`` taps (over the request's previous
  inputs, zeros before its first) and silu; q and k are l2-normed, q scaled
  by 1/sqrt(k_dim); per value head (value head j reads key head
  j // (v_heads / k_heads)) the (k_dim, v_dim) state S is decayed by
  exp(g), g = -exp(A_log) softplus(a + dt_bias), then written
  S += k (beta (v - S^T k))^T with beta = sigmoid(b), and read out S^T q;
  the output is RMSNorm'd per head (its own gain) times silu(z), then
  out_proj. The other layers' attention output is multiplied by
  sigmoid(x W_g) before o_proj (``attn_gate``); RoPE rotates the first
  int(head_dim * rope_partial) elements of each head only; the shared
  expert is scaled by sigmoid(x w_sg) (``shared_expert_gate``). The
  checkpoint's zero-centred RMSNorm weights w load as gains 1 + w.
* ``lm_head`` is the embedding's transpose where ``tie_embeddings``.
* Greedy sampling: argmax of the logits, ties to the lowest token id.
* A request finishes when it emits ``eos_token`` or one of ``eos_more`` (the EOS token is part of its
  output) or when it has produced ``max_new_tokens`` tokens (the first of
  which comes out of prefill).

Numerics
--------
Weights and activations are float32 at every op boundary. Matrix products
accumulate in float64 and are rounded once to float32, so a row's result does
not depend on how many other rows share the product (batching, BLAS blocking).
That is what makes ``decode_batch`` produce bit-for-bit the tokens of one-by-one
decoding. An on-mesh float32 implementation accumulates in a different order,
so compare its tensors with a tolerance (``rtol≈1e-4``), and its tokens exactly
only where the reference's top-2 logit gap is not tiny.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from meshrt import rope as _rope
from meshrt.diagnostics import FrontendError
from meshrt import quant
from meshrt.activations import round_activations
from meshrt.shape import MATH_FLOATS, MATH_INTS, MATH_STRS, ModelShape

__all__ = [
    "RMS_EPS",
    "SILU",
    "Act",
    "ROPE_THETA",
    "DeltaNetWeights",
    "DenseFFNWeights",
    "KVState",
    "LayerWeights",
    "MoEFFNWeights",
    "RefShape",
    "ReferenceModel",
    "Trace",
    "Weights",
    "apply_rope",
    "attention",
    "attention_decode",
    "causal_conv",
    "delta_rule",
    "deltanet",
    "deltanet_gates",
    "deltanet_mix",
    "deltanet_qk",
    "dense_ffn",
    "expert_load",
    "expert_routing",
    "gated_rmsnorm",
    "glu",
    "greedy",
    "key_heads",
    "l2norm",
    "moe_ffn",
    "qk_norm",
    "rmsnorm",
    "route",
    "sigmoid",
    "softmax",
    "swiglu",
]

RMS_EPS = 1e-5
ROPE_THETA = 10000.0

_F32 = np.float32
_F64 = np.float64


# --------------------------------------------------------------------------
# Shape
# --------------------------------------------------------------------------


# The fields a reference shape takes from a config (the byte sizes and
# max_seq keep their defaults: they change no number).
_REF_FIELDS = ("layers", "hidden", "heads", "kv_heads", "head_dim", "vocab", "ffn", "experts",
               "top_k", "expert_ffn", "shared_experts", "eos_token", "moe_layers",
               "window_layers", "eos_more", "linear_layers", *MATH_INTS, *MATH_FLOATS, *MATH_STRS)
_NOT_INT = ("eos_token", "moe_layers", "window_layers", "linear_layers", *MATH_FLOATS, *MATH_STRS)


@dataclass(frozen=True)
class RefShape(ModelShape):
    """The model shape the reference runs (a `ModelShape`, checked as one): dense
    models have ``experts == 0`` and ``ffn > 0``; MoE models have ``experts > 0``,
    and ``ffn > 0`` only if some layers are dense (not in ``moe_layers``).
    ``eos_token`` None: requests stop only at their length. The first six fields are positional, as in ``RefShape(layers,
    hidden, heads, kv_heads, head_dim, vocab, ffn=...)``."""

    eos_token: int | None = None
    act_format: str = "f32"  # built directly: fp32 activations (a ModelShape's is taken by `of`)
    name: str = "reference"

    def __post_init__(self) -> None:
        if self.experts and self.ffn and (not self.moe_layers or len(self.moe_layers) == self.layers):
            raise ValueError("an MoE shape must have ffn == 0 (experts use expert_ffn) unless "
                             "some layers are dense")
        try:
            super().__post_init__()
        except FrontendError as e:
            raise ValueError(e.message) from None

    @classmethod
    def of(cls, obj: Any) -> RefShape:
        """Coerce any object with the shape attributes (e.g. a model config)."""
        if isinstance(obj, RefShape):
            return obj
        defaults = {f.name: f.default for f in dataclasses.fields(cls)}
        kw = {k: getattr(obj, k, defaults[k]) for k in _REF_FIELDS}
        missing = [k for k, v in kw.items() if v is dataclasses.MISSING]
        if missing:
            raise ValueError(f"shape object lacks attributes: {', '.join(missing)}")
        for k, v in kw.items():
            if k == "eos_token":
                kw[k] = None if v is None else int(v)
            elif k in ("moe_layers", "window_layers", "eos_more", "linear_layers"):
                kw[k] = tuple(int(i) for i in (v or ()))
            elif k in _NOT_INT:
                pass
            else:
                # Configs often spell "no experts" / "no dense FFN" as None.
                kw[k] = 0 if v is None else int(v)
        return cls(**kw)

    def without_eos(self) -> RefShape:
        return dataclasses.replace(self, eos_token=None, eos_more=())


# --------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------


@dataclass
class DenseFFNWeights:
    w_gate: np.ndarray  # (hidden, ffn)
    w_up: np.ndarray  # (hidden, ffn)
    w_down: np.ndarray  # (ffn, hidden)
    b_gate: np.ndarray | None = None  # (ffn,) where mlp_bias
    b_up: np.ndarray | None = None  # (ffn,)
    b_down: np.ndarray | None = None  # (hidden,)


@dataclass
class MoEFFNWeights:
    router: np.ndarray  # (hidden, experts)
    w_gate: np.ndarray  # (experts, hidden, expert_ffn)
    w_up: np.ndarray  # (experts, hidden, expert_ffn)
    w_down: np.ndarray  # (experts, expert_ffn, hidden)
    shared_gate: np.ndarray  # (shared, hidden, expert_ffn)
    shared_up: np.ndarray  # (shared, hidden, expert_ffn)
    shared_down: np.ndarray  # (shared, expert_ffn, hidden)
    router_bias: np.ndarray | None = None  # (experts,) where router_bias
    b_gate: np.ndarray | None = None  # (experts, expert_ffn) where expert_bias
    b_up: np.ndarray | None = None  # (experts, expert_ffn)
    b_down: np.ndarray | None = None  # (experts, hidden)
    shared_scale: np.ndarray | None = None  # (hidden, shared) where shared_expert_gate


@dataclass
class DeltaNetWeights:
    """A Gated DeltaNet token mixer (Qwen3.5's linear attention)."""

    w_qkv: np.ndarray  # (hidden, 2 * k_heads * k_dim + v_heads * v_dim): q, k, v
    w_z: np.ndarray  # (hidden, v_heads * v_dim): the output gate
    w_b: np.ndarray  # (hidden, v_heads): beta = sigmoid(x w_b)
    w_a: np.ndarray  # (hidden, v_heads): the decay's input
    conv: np.ndarray  # (conv channels, linear_conv): depthwise causal conv taps
    dt_bias: np.ndarray  # (v_heads,)
    a_log: np.ndarray  # (v_heads,): decay rate log(A)
    norm: np.ndarray  # (v_dim,): the gated RMSNorm's gain
    w_out: np.ndarray  # (v_heads * v_dim, hidden)


@dataclass
class LayerWeights:
    attn_norm: np.ndarray  # (hidden,)
    wq: np.ndarray | None  # (hidden, heads*head_dim); None on a DeltaNet layer (as wk, wv, wo)
    wk: np.ndarray | None  # (hidden, kv_heads*head_dim)
    wv: np.ndarray | None  # (hidden, kv_heads*head_dim)
    wo: np.ndarray | None  # (heads*head_dim, hidden)
    ffn_norm: np.ndarray  # (hidden,)
    dense: DenseFFNWeights | None = None
    moe: MoEFFNWeights | None = None
    bq: np.ndarray | None = None  # (heads*head_dim,) where qkv_bias
    bk: np.ndarray | None = None  # (kv_heads*head_dim,)
    bv: np.ndarray | None = None  # (kv_heads*head_dim,)
    bo: np.ndarray | None = None  # (hidden,) where o_bias
    q_norm: np.ndarray | None = None  # (head_dim,) where qk_norm
    k_norm: np.ndarray | None = None  # (head_dim,)
    sinks: np.ndarray | None = None  # (heads,) where attn_sinks
    wg: np.ndarray | None = None  # (hidden, heads*head_dim) where attn_gate: the output gate
    linear: DeltaNetWeights | None = None  # the token mixer of a layer in linear_layers


def _map_arrays(obj: Any, fn) -> Any:
    """Apply fn to every array of a weights dataclass tree."""
    if isinstance(obj, np.ndarray):
        return fn(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return type(obj)(**{f.name: _map_arrays(getattr(obj, f.name), fn) for f in dataclasses.fields(obj)})
    if isinstance(obj, list):
        return [_map_arrays(x, fn) for x in obj]
    return obj


_PROJECTIONS = re.compile(r"layers\.\d+\.(wq|wk|wv|wo|dense\.w_(gate|up|down))$")
_EXPERT_MATRICES = re.compile(r"layers\.\d+\.moe\.(w_gate|w_up|w_down|shared_gate|shared_up|shared_down)$")


def weight_format(shape: ModelShape, name: str) -> str:
    """The format (`meshrt.quant`) the weight array `name` (a `Weights.named_arrays` name)
    is stored in: the shape's `linear_quant` for the attention and dense FFN
    projections, `expert_quant` for the experts, "" (plain floats) for the rest."""
    if _PROJECTIONS.match(name):
        return shape.linear_quant
    if _EXPERT_MATRICES.match(name):
        return shape.expert_quant
    return ""


@dataclass
class Weights:
    """All model parameters, float32. ``x @ W`` convention (W is in x out).

    Quantized arrays (`weight_format`) hold the values their stored codes stand
    for, and `packed` holds the codes and scales themselves by `named_arrays`
    name: the reference computes with the former, the interpreter's tiles hold
    the latter and decode them where the kernel computes."""

    shape: RefShape
    embed: np.ndarray  # (vocab, hidden)
    layers: list[LayerWeights]
    final_norm: np.ndarray  # (hidden,)
    lm_head: np.ndarray  # (hidden, vocab)
    packed: dict[str, quant.Packed] = dataclasses.field(default_factory=dict)

    @classmethod
    def random(cls, shape: Any, seed: int) -> Weights:
        """Seeded random weights. Linear maps are N(0, 1/fan_in) so every
        projection keeps O(1) activations; the embedding is N(0, 1) so the
        residual stream starts at unit RMS; norm gains are 1 + N(0, 0.1²) so a
        forgotten gain shows up in comparisons; biases are N(0, 0.1²) and q/k
        norm gains 1 + N(0, 0.1²), drawn after a layer's other weights (a shape
        without them draws what it did before). The draw order is fixed, and
        ``eos_token`` does not influence it. ``tie_embeddings``: lm_head is the
        embedding's transpose. A 16-bit model's weights are rounded to its format (bf16,
        f16), as its checkpoint would hold them, so the CSL host's 16-bit copies of them
        are the values the interpreter and this reference computed with."""
        s = RefShape.of(shape)
        rng = np.random.default_rng(seed)

        def lin(*dims: int) -> np.ndarray:
            fan_in = dims[-2]
            return (rng.standard_normal(dims) / math.sqrt(fan_in)).astype(_F32)

        def gain(n: int = s.hidden) -> np.ndarray:
            return (1.0 + 0.1 * rng.standard_normal(n)).astype(_F32)

        def bias(n: int, on: bool) -> np.ndarray | None:
            return (0.1 * rng.standard_normal(n)).astype(_F32) if on else None

        embed = rng.standard_normal((s.vocab, s.hidden)).astype(_F32)
        q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
        layers = []
        for _ in range(s.layers):
            li = len(layers)
            attn_norm = gain()
            linear = None
            if s.is_linear_layer(li):
                vh = s.linear_v_heads
                linear = DeltaNetWeights(
                    w_qkv=lin(s.hidden, s.linear_conv_width), w_z=lin(s.hidden, s.linear_value_width),
                    w_b=lin(s.hidden, vh), w_a=lin(s.hidden, vh),
                    conv=(rng.standard_normal((s.linear_conv_width, s.linear_conv))
                          / math.sqrt(s.linear_conv)).astype(_F32),
                    dt_bias=gain(vh), a_log=(0.5 * rng.standard_normal(vh)).astype(_F32),
                    norm=gain(s.linear_v_dim), w_out=lin(s.linear_value_width, s.hidden))
                wq = wk = wv = wo = None
            else:
                wq, wk, wv = lin(s.hidden, q_dim), lin(s.hidden, kv_dim), lin(s.hidden, kv_dim)
                wo = lin(q_dim, s.hidden)
            ffn_norm = gain()
            dense = moe = None
            if s.is_moe_layer(li):
                e, f, sh = s.experts, s.expert_ffn, s.shared_experts
                moe = MoEFFNWeights(
                    router=lin(s.hidden, e),
                    w_gate=lin(e, s.hidden, f),
                    w_up=lin(e, s.hidden, f),
                    w_down=lin(e, f, s.hidden),
                    shared_gate=lin(sh, s.hidden, f),
                    shared_up=lin(sh, s.hidden, f),
                    shared_down=lin(sh, f, s.hidden),
                )
                if s.router_bias:
                    moe.router_bias = bias(e, True)
                if s.expert_bias:
                    moe.b_gate = (0.1 * rng.standard_normal((e, f))).astype(_F32)
                    moe.b_up = (0.1 * rng.standard_normal((e, f))).astype(_F32)
                    moe.b_down = (0.1 * rng.standard_normal((e, s.hidden))).astype(_F32)
                if s.shared_expert_gate:
                    moe.shared_scale = lin(s.hidden, sh)
            else:
                dense = DenseFFNWeights(lin(s.hidden, s.ffn), lin(s.hidden, s.ffn), lin(s.ffn, s.hidden))
                if s.mlp_bias:
                    dense.b_gate, dense.b_up = bias(s.ffn, True), bias(s.ffn, True)
                    dense.b_down = bias(s.hidden, True)
            lw = LayerWeights(attn_norm, wq, wk, wv, wo, ffn_norm, dense, moe, linear=linear)
            if linear is None:
                lw.bq, lw.bk, lw.bv = (bias(n, s.qkv_bias) for n in (q_dim, kv_dim, kv_dim))
                lw.bo = bias(s.hidden, s.o_bias)
                if s.qk_norm:
                    lw.q_norm, lw.k_norm = gain(s.head_dim), gain(s.head_dim)
                lw.sinks = bias(s.heads, s.attn_sinks)
                if s.attn_gate:
                    lw.wg = lin(s.hidden, q_dim)
            layers.append(lw)
        final_norm = gain()
        lm_head = embed.T.copy() if s.tie_embeddings else lin(s.hidden, s.vocab)
        w = cls(s, embed, layers, final_norm, lm_head)
        if s.act_format != "f32":  # a 16-bit model's weights are numbers of its format, as a
            w = _map_arrays(w, lambda a: round_activations(a, s.act_format))  # checkpoint's
        # a quantized model's weights are drawn, then rounded to what their format holds
        for name, a in w.named_arrays().items():
            fmt = weight_format(s, name)
            if fmt:
                w.set_packed(name, quant.pack(a, fmt, s.quant_block))
        return w

    def set_packed(self, name: str, packed: quant.Packed) -> None:
        """Array `name` stored as `packed`: the array becomes the values it decodes to."""
        *path, last = name.split(".")
        obj: Any = self
        for part in path:
            obj = obj[int(part)] if part.isdigit() else getattr(obj, part)
        setattr(obj, last, packed.decode())
        self.packed[name] = packed

    def astype(self, dtype) -> Weights:
        return _map_arrays(self, lambda a: a.astype(dtype))

    def named_arrays(self) -> dict[str, np.ndarray]:
        """Flat ``{"layers.3.moe.w_up": array, ...}`` view, e.g. for loading
        tiles onto the mesh."""
        out: dict[str, np.ndarray] = {}

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, np.ndarray):
                out[prefix] = obj
            elif isinstance(obj, list):
                for i, x in enumerate(obj):
                    walk(f"{prefix}.{i}", x)
            elif dataclasses.is_dataclass(obj):
                for f in dataclasses.fields(obj):
                    walk(f"{prefix}.{f.name}" if prefix else f.name, getattr(obj, f.name))

        walk("", self)
        return out

    @staticmethod
    def expected(s: RefShape) -> dict[str, tuple[int, ...]]:
        """The shape of every array a `Weights` of shape `s` holds, by `named_arrays` name."""
        q_dim, kv_dim = s.heads * s.head_dim, s.kv_heads * s.head_dim
        expect = {
            "embed": (s.vocab, s.hidden),
            "final_norm": (s.hidden,),
            "lm_head": (s.hidden, s.vocab),
        }
        for i in range(s.layers):
            p = f"layers.{i}"
            expect |= {f"{p}.attn_norm": (s.hidden,), f"{p}.ffn_norm": (s.hidden,)}
            if s.is_linear_layer(i):
                vh, c = s.linear_v_heads, s.linear_conv_width
                expect |= {
                    f"{p}.linear.w_qkv": (s.hidden, c),
                    f"{p}.linear.w_z": (s.hidden, s.linear_value_width),
                    f"{p}.linear.w_b": (s.hidden, vh), f"{p}.linear.w_a": (s.hidden, vh),
                    f"{p}.linear.conv": (c, s.linear_conv),
                    f"{p}.linear.dt_bias": (vh,), f"{p}.linear.a_log": (vh,),
                    f"{p}.linear.norm": (s.linear_v_dim,),
                    f"{p}.linear.w_out": (s.linear_value_width, s.hidden),
                }
            else:
                expect |= {
                    f"{p}.wq": (s.hidden, q_dim),
                    f"{p}.wk": (s.hidden, kv_dim),
                    f"{p}.wv": (s.hidden, kv_dim),
                    f"{p}.wo": (q_dim, s.hidden),
                }
            if s.attn_gate and not s.is_linear_layer(i):
                expect[f"{p}.wg"] = (s.hidden, q_dim)
            if s.is_moe_layer(i) and s.shared_expert_gate:
                expect[f"{p}.moe.shared_scale"] = (s.hidden, s.shared_experts)
            if s.is_linear_layer(i):
                pass
            elif s.qkv_bias:
                expect |= {f"{p}.bq": (q_dim,), f"{p}.bk": (kv_dim,), f"{p}.bv": (kv_dim,)}
            if s.o_bias and not s.is_linear_layer(i):
                expect[f"{p}.bo"] = (s.hidden,)
            if s.qk_norm and not s.is_linear_layer(i):
                expect |= {f"{p}.q_norm": (s.head_dim,), f"{p}.k_norm": (s.head_dim,)}
            if s.attn_sinks and not s.is_linear_layer(i):
                expect[f"{p}.sinks"] = (s.heads,)
            if s.is_moe_layer(i) and s.router_bias:
                expect[f"{p}.moe.router_bias"] = (s.experts,)
            if s.is_moe_layer(i) and s.expert_bias:
                expect |= {f"{p}.moe.b_gate": (s.experts, s.expert_ffn),
                           f"{p}.moe.b_up": (s.experts, s.expert_ffn),
                           f"{p}.moe.b_down": (s.experts, s.hidden)}
            if s.is_moe_layer(i):
                e, f, sh = s.experts, s.expert_ffn, s.shared_experts
                expect |= {
                    f"{p}.moe.router": (s.hidden, e),
                    f"{p}.moe.w_gate": (e, s.hidden, f),
                    f"{p}.moe.w_up": (e, s.hidden, f),
                    f"{p}.moe.w_down": (e, f, s.hidden),
                    f"{p}.moe.shared_gate": (sh, s.hidden, f),
                    f"{p}.moe.shared_up": (sh, s.hidden, f),
                    f"{p}.moe.shared_down": (sh, f, s.hidden),
                }
            else:
                expect |= {
                    f"{p}.dense.w_gate": (s.hidden, s.ffn),
                    f"{p}.dense.w_up": (s.hidden, s.ffn),
                    f"{p}.dense.w_down": (s.ffn, s.hidden),
                }
                if s.mlp_bias:
                    expect |= {f"{p}.dense.b_gate": (s.ffn,), f"{p}.dense.b_up": (s.ffn,),
                               f"{p}.dense.b_down": (s.hidden,)}
        return expect

    def validate(self) -> None:
        expect = self.expected(self.shape)
        got = self.named_arrays()
        if set(got) != set(expect):
            raise ValueError(f"weights do not match shape: unexpected {sorted(set(got) ^ set(expect))}")
        for name, shp in expect.items():
            if got[name].shape != shp:
                raise ValueError(f"weight {name} has shape {got[name].shape}, expected {shp}")
            fmt = weight_format(self.shape, name) if got[name].size else ""
            p = self.packed.get(name)
            if fmt and (p is None or p.fmt != fmt or p.codes.shape != shp):
                raise ValueError(f"weight {name} must be stored as {fmt} "
                                 f"({'absent' if p is None else p.fmt + ' ' + str(p.codes.shape)})")


# --------------------------------------------------------------------------
# Building blocks (public so the interpreter can compare intermediates)
# --------------------------------------------------------------------------


def _mm(x: np.ndarray, w: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """float32 result of x @ w (+ b), accumulated in float64 (see module doc)."""
    y = np.matmul(np.asarray(x, _F64), np.asarray(w, _F64))
    return (y if b is None else y + np.asarray(b, _F64)).astype(_F32)


def rmsnorm(x: np.ndarray, gain: np.ndarray, eps: float = RMS_EPS) -> np.ndarray:
    """RMSNorm over the last axis."""
    x64 = np.asarray(x, _F64)
    inv = 1.0 / np.sqrt(np.mean(x64 * x64, axis=-1, keepdims=True) + eps)
    return (x64 * inv * np.asarray(gain, _F64)).astype(_F32)


def softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """float32 softmax with the max subtracted (rows of all -inf are an error
    upstream: every causal row sees at least its own key)."""
    x = np.asarray(x, _F32)
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def apply_rope(x: np.ndarray, positions: np.ndarray, rope: _rope.Rope | float = ROPE_THETA) -> np.ndarray:
    """Rotate-half RoPE. x: (N, n_heads, head_dim); positions: (N,) ints; `rope`
    a `meshrt.rope.Rope` (or a bare theta)."""
    rope = rope if isinstance(rope, _rope.Rope) else _rope.Rope(theta=float(rope))
    return _rope.rotate(np.asarray(x, _F32), positions, rope).astype(_F32)


def qk_norm(x: np.ndarray, gain: np.ndarray | None, eps: float) -> np.ndarray:
    """Qwen3's per-head RMSNorm of q or k (N, n_heads, head_dim); None: x as it is."""
    return x if gain is None else rmsnorm(x, gain, eps)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_start: int, window: int = 0,
              sinks: np.ndarray | None = None) -> np.ndarray:
    """Causal GQA attention for one request.

    q: (Tq, heads, D) at absolute positions q_start..q_start+Tq-1;
    k, v: (Tk, kv_heads, D), keys at positions 0..Tk-1 (already roped);
    `window` > 0: a query at p sees keys p-window+1..p only; `sinks` (heads,):
    each head's sink logit is one more softmax column, dropped after it.
    Returns (Tq, heads, D) float32.
    """
    tq, heads, d = q.shape
    tk, kv_heads, _ = k.shape
    if heads % kv_heads:
        raise ValueError("heads must be a multiple of kv_heads")
    if q_start + tq > tk:
        raise ValueError(f"queries reach position {q_start + tq - 1} but only {tk} keys are cached")
    g = heads // kv_heads
    # (kv, g*tq, d): query head h = kv*g + j lives in group kv, contiguous.
    qg = np.asarray(q, _F64).reshape(tq, kv_heads, g, d).transpose(1, 2, 0, 3).reshape(kv_heads, g * tq, d)
    kt = np.asarray(k, _F64).transpose(1, 2, 0)  # (kv, d, tk)
    scores = (np.matmul(qg, kt) / math.sqrt(d)).astype(_F32)  # (kv, g*tq, tk)
    qpos = np.tile(np.arange(q_start, q_start + tq), g)  # row r -> position of query r % tq
    kpos = np.arange(tk)[None, None, :]
    seen = kpos <= qpos[None, :, None]
    if window > 0:
        seen &= kpos > qpos[None, :, None] - window
    scores = np.where(seen, scores, _F32(-np.inf))
    if sinks is not None:  # row r of group kv is head kv * g + r // tq
        col = np.repeat(np.asarray(sinks, _F32).reshape(kv_heads, g), tq, axis=1)[..., None]
        p = softmax(np.concatenate([scores, col], axis=-1), axis=-1)[..., :-1]
    else:
        p = softmax(scores, axis=-1)
    out = np.matmul(p.astype(_F64), np.asarray(v, _F64).transpose(1, 0, 2))  # (kv, g*tq, d)
    return out.reshape(kv_heads, g, tq, d).transpose(2, 0, 1, 3).reshape(tq, heads, d).astype(_F32)


def attention_decode(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray) -> np.ndarray:
    """One decode query. q: (heads, D); caches (T, kv_heads, D) already hold
    the current token's k/v at index T-1. Returns (heads, D)."""
    return attention(np.asarray(q)[None], k_cache, v_cache, k_cache.shape[0] - 1)[0]


def _silu(x: np.ndarray) -> np.ndarray:
    return x / (_F32(1.0) + np.exp(-x))


@dataclass(frozen=True)
class Act:
    """The FFN activation of `glu`: alpha, limit (0: no clamp) and the shift of up."""

    alpha: float = 1.0
    limit: float = 0.0
    shift: float = 0.0

    @classmethod
    def of(cls, shape: Any) -> Act:
        return cls(shape.swiglu_alpha, shape.swiglu_limit, shape.swiglu_shift)


SILU = Act()


def glu(gate: np.ndarray, up: np.ndarray, act: Act = SILU) -> np.ndarray:
    """The gated activation, float32: silu(gate) * up, or gpt_oss's clamped form
    min(gate, limit) * sigmoid(alpha * min(gate, limit)) * (clip(up, ±limit) + shift)."""
    if act == SILU:
        return _silu(gate) * up
    g, u = np.asarray(gate, _F32), np.asarray(up, _F32)
    if act.limit:
        g, u = np.minimum(g, _F32(act.limit)), np.clip(u, _F32(-act.limit), _F32(act.limit))
    return (g / (_F32(1.0) + np.exp(_F32(-act.alpha) * g)) * (u + _F32(act.shift))).astype(_F32)


def _same(x: np.ndarray) -> np.ndarray:
    return x


def swiglu(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
           b_gate: np.ndarray | None = None, b_up: np.ndarray | None = None,
           b_down: np.ndarray | None = None, act: Act = SILU, rnd=_same) -> np.ndarray:
    """W_down · glu(W_gate·x + b_gate, W_up·x + b_up) + b_down for rows x: (N, hidden);
    `rnd` rounds each of the three products and the activation (a dense FFN's values
    at its kernels' boundaries; an expert's stay fp32 inside its kernel)."""
    h = rnd(glu(rnd(_mm(x, w_gate, b_gate)), rnd(_mm(x, w_up, b_up)), act))
    return rnd(_mm(h, w_down, b_down))


def dense_ffn(x: np.ndarray, w_gate: np.ndarray, w_up: np.ndarray, w_down: np.ndarray,
              b_gate: np.ndarray | None = None, b_up: np.ndarray | None = None,
              b_down: np.ndarray | None = None, act: Act = SILU, rnd=_same) -> np.ndarray:
    """Dense SwiGLU FFN (same as :func:`swiglu`; named for the layer it is)."""
    return swiglu(x, w_gate, w_up, w_down, b_gate, b_up, b_down, act, rnd)


def sigmoid(x: np.ndarray) -> np.ndarray:
    """float32 logistic function (Qwen3.5's output gates)."""
    x = np.asarray(x, _F32)
    return (_F32(1.0) / (_F32(1.0) + np.exp(-x))).astype(_F32)


# -- Gated DeltaNet (Qwen3.5's linear attention) -------------------------------------


def l2norm(x: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """x / sqrt(sum(x**2) + eps) over the last axis (DeltaNet's q and k, as FLA computes it)."""
    x64 = np.asarray(x, _F64)
    return (x64 / np.sqrt(np.sum(x64 * x64, axis=-1, keepdims=True) + eps)).astype(_F32)


def causal_conv(x: np.ndarray, state: np.ndarray, taps: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeltaNet's short depthwise causal conv, then silu, over tokens x (N, C) of one
    request; `state` (C, K-1) holds the request's K-1 previous inputs (zeros before its
    first token), `taps` (C, K) the kernel (tap K-1 on the newest input). Returns
    (silu(conv) (N, C), the new state)."""
    k = taps.shape[1]
    seq = np.concatenate([np.asarray(state, _F32).T, np.asarray(x, _F32)], axis=0)  # (K-1+N, C)
    n = seq.shape[0] - (k - 1)
    win = np.lib.stride_tricks.sliding_window_view(seq.astype(_F64), k, axis=0)[:n]  # (N, C, K)
    y = np.einsum("nck,ck->nc", win, np.asarray(taps, _F64)).astype(_F32)
    return _silu(y), np.ascontiguousarray(seq[n:].T)


def delta_rule(q: np.ndarray, k: np.ndarray, v: np.ndarray, g: np.ndarray, beta: np.ndarray,
               state: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The gated delta rule over the tokens of one request, token by token: per value head
    S = S * exp(g); S += k (beta (v - S^T k))^T; out = S^T q. q, k (N, heads, k_dim) (already
    l2-normed, q scaled), v (N, heads, v_dim), g, beta (N, heads), state S (heads, k_dim,
    v_dim) float32. Returns (out (N, heads, v_dim), the new state)."""
    st = np.asarray(state, _F64)
    out = np.empty(v.shape, _F32)
    for t in range(q.shape[0]):
        st = st * np.exp(np.asarray(g[t], _F64))[:, None, None]
        kt, qt = np.asarray(k[t], _F64), np.asarray(q[t], _F64)
        mem = np.einsum("hkv,hk->hv", st, kt)
        delta = (np.asarray(v[t], _F64) - mem) * np.asarray(beta[t], _F64)[:, None]
        st = (st + kt[:, :, None] * delta[:, None, :]).astype(_F32).astype(_F64)
        out[t] = np.einsum("hkv,hk->hv", st, qt).astype(_F32)
    return out, st.astype(_F32)


def gated_rmsnorm(x: np.ndarray, z: np.ndarray, gain: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis (head v_dim) with its gain, times silu(z)."""
    return (rmsnorm(x, gain, eps) * _silu(np.asarray(z, _F32))).astype(_F32)


def deltanet_qk(q: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """DeltaNet's convolved q and k (N, heads, k_dim): l2-normed, q scaled by 1/sqrt(k_dim)."""
    q, k = l2norm(q), l2norm(k)
    return (q / _F32(math.sqrt(q.shape[-1]))).astype(_F32), k


def deltanet_gates(b: np.ndarray, a: np.ndarray, dt_bias: np.ndarray, a_log: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray]:
    """(g, beta) per value head from the projections b, a (N, heads): the log decay
    g = -exp(A_log) softplus(a + dt_bias) and the write strength beta = sigmoid(b)."""
    soft = np.logaddexp(0.0, np.asarray(a, _F64) + np.asarray(dt_bias, _F64))
    return (-np.exp(np.asarray(a_log, _F64)) * soft).astype(_F32), sigmoid(b)


def key_heads(v_heads: range, k_heads: int, v_total: int) -> np.ndarray:
    """The key head each value head of `v_heads` reads (value head j: j // (v_total / k_heads))."""
    return np.asarray(v_heads, np.int64) // (v_total // k_heads)


def deltanet_mix(mixed: np.ndarray, z: np.ndarray, b: np.ndarray, a: np.ndarray, taps: np.ndarray,
                 dt_bias: np.ndarray, a_log: np.ndarray, gain: np.ndarray, k_dim: int, v_dim: int,
                 eps: float, conv_state: np.ndarray, rec_state: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Gated DeltaNet for the tokens (N,) of one request from its projections: `mixed`
    (N, 2 kh k_dim + vh v_dim) is [q | k | v] before the conv (taps (C, K)), z (N, vh v_dim),
    b, a (N, vh); conv_state (C, K-1) and rec_state (vh, k_dim, v_dim) the request's.
    Returns (the gated, normed output (N, vh v_dim) before out_proj, conv_state, rec_state)."""
    n = mixed.shape[0]
    vh = b.shape[1]
    conv, conv_state = causal_conv(mixed, conv_state, taps)
    kw = (conv.shape[1] - vh * v_dim) // 2
    kh = kw // k_dim
    q, k = deltanet_qk(conv[:, :kw].reshape(n, kh, k_dim), conv[:, kw:2 * kw].reshape(n, kh, k_dim))
    v = conv[:, 2 * kw:].reshape(n, vh, v_dim)
    g, beta = deltanet_gates(b, a, dt_bias, a_log)
    of = key_heads(range(vh), kh, vh)
    out, rec_state = delta_rule(q[:, of], k[:, of], v, g, beta, rec_state)
    y = gated_rmsnorm(out, np.asarray(z, _F32).reshape(n, vh, v_dim), gain, eps)
    return y.reshape(n, vh * v_dim), conv_state, rec_state


def deltanet(x: np.ndarray, lw: DeltaNetWeights, k_dim: int, v_dim: int, eps: float,
             conv_state: np.ndarray, rec_state: np.ndarray, rnd=_same
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A DeltaNet token mixer on the normed rows x (N, hidden) of one request:
    (out_proj of :func:`deltanet_mix`, conv_state, rec_state); `rnd` rounds the values
    at its kernels' boundaries (the four projections, the mixer's output, out_proj's)."""
    y, conv_state, rec_state = deltanet_mix(
        rnd(_mm(x, lw.w_qkv)), rnd(_mm(x, lw.w_z)), rnd(_mm(x, lw.w_b)), rnd(_mm(x, lw.w_a)),
        lw.conv, lw.dt_bias, lw.a_log, lw.norm, k_dim, v_dim, eps, conv_state, rec_state)
    return rnd(_mm(rnd(y), lw.w_out)), conv_state, rec_state


def route(logits: np.ndarray, top_k: int, normalize: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """The MoE gate's choice from router logits (N, experts): (expert_ids (N, k)
    int64, weights (N, k) float32), experts in descending softmax probability,
    ties to the lower index; the k probabilities renormalised to sum to 1 per
    row where `normalize` (norm_topk), else as they are."""
    probs = softmax(logits, axis=-1)
    # Stable sort of -p keeps equal probabilities in ascending expert order.
    ids = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k].astype(np.int64)
    w = np.take_along_axis(probs, ids, axis=-1)
    return ids, (w / np.sum(w, axis=-1, keepdims=True) if normalize else w).astype(_F32)


def expert_routing(hidden_rows: np.ndarray, router: np.ndarray, top_k: int,
                   normalize: bool = True, bias: np.ndarray | None = None
                   ) -> tuple[np.ndarray, np.ndarray]:
    """MoE gate for rows (N, hidden) (already ffn-normed): :func:`route` of
    their router logits (+ the router's bias)."""
    return route(_mm(hidden_rows, router, bias), top_k, normalize)


def moe_ffn(
    x: np.ndarray,
    moe: MoEFFNWeights,
    top_k: int,
    counts: np.ndarray | None = None,
    routing: tuple[np.ndarray, np.ndarray] | None = None,
    normalize: bool = True,
    act: Act = SILU,
) -> np.ndarray:
    """MoE FFN for rows (N, hidden). ``counts`` (experts,) if given is
    incremented by the number of rows routed to each expert. ``routing`` lets
    a caller reuse a precomputed :func:`expert_routing` result."""
    ids, w = routing if routing is not None else expert_routing(x, moe.router, top_k, normalize,
                                                                moe.router_bias)
    b = (moe.b_gate, moe.b_up, moe.b_down) if moe.b_gate is not None else None
    # Per row, experts are summed in ascending id order then shared experts,
    # in float64: independent of which other rows are in the batch.
    out = np.zeros(x.shape, _F64)
    for e in np.unique(ids):
        rows, slots = np.nonzero(ids == e)
        y = swiglu(x[rows], moe.w_gate[e], moe.w_up[e], moe.w_down[e],
                   *((None,) * 3 if b is None else (b[0][e], b[1][e], b[2][e])), act=act)
        out[rows] += w[rows, slots][:, None].astype(_F64) * y
    for s in range(moe.shared_gate.shape[0]):
        y = swiglu(x, moe.shared_gate[s], moe.shared_up[s], moe.shared_down[s], act=act)
        if moe.shared_scale is not None:  # Qwen3.5: sigmoid(x w_sg) scales the shared expert
            y = (sigmoid(_mm(x, moe.shared_scale[:, s:s + 1])) * y).astype(_F32)
        out += y
    if counts is not None:
        np.add.at(counts, ids.ravel(), 1)
    return out.astype(_F32)


def greedy(logits: np.ndarray) -> np.ndarray | int:
    """argmax over the last axis; np.argmax returns the first (lowest id) max."""
    r = np.argmax(logits, axis=-1)
    return int(r) if np.ndim(r) == 0 else r


# --------------------------------------------------------------------------
# KV cache and tracing
# --------------------------------------------------------------------------


class KVState:
    """Per-request KV cache: for each layer, roped keys and values of every
    token fed so far, shape (length, kv_heads, head_dim); for each DeltaNet layer
    its conv state (channels, linear_conv - 1) and recurrent state (v_heads, k_dim,
    v_dim) instead (`conv`, `rec`)."""

    def __init__(self, shape: RefShape, capacity: int = 16):
        self.shape = shape
        self.length = 0
        cap = max(1, capacity)
        dims = (cap, shape.kv_heads, shape.head_dim)
        self._k = [np.zeros(dims, _F32) for _ in range(shape.layers)]
        self._v = [np.zeros(dims, _F32) for _ in range(shape.layers)]
        # DeltaNet layers: the conv's last inputs and the recurrent state, zeros at admission
        s = shape
        self.conv = {i: np.zeros((s.linear_conv_width, s.linear_conv - 1), _F32)
                     for i in s.linear_layers}
        self.rec = {i: np.zeros((s.linear_v_heads, s.linear_k_dim, s.linear_v_dim), _F32)
                    for i in s.linear_layers}

    def keys(self, layer: int) -> np.ndarray:
        return self._k[layer][: self.length]

    def values(self, layer: int) -> np.ndarray:
        return self._v[layer][: self.length]

    def _reserve(self, n: int) -> None:
        cap = self._k[0].shape[0]
        if n <= cap:
            return
        new = max(n, 2 * cap)  # doubling keeps appends amortised O(1)
        for buf in (self._k, self._v):
            for i, a in enumerate(buf):
                b = np.zeros((new,) + a.shape[1:], _F32)
                b[: self.length] = a[: self.length]
                buf[i] = b

    def _write(self, layer: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        self._k[layer][start : start + len(k)] = k
        self._v[layer][start : start + len(v)] = v

    def copy(self) -> KVState:
        c = KVState.__new__(KVState)
        c.shape, c.length = self.shape, self.length
        c._k = [a.copy() for a in self._k]
        c._v = [a.copy() for a in self._v]
        c.conv = {i: a.copy() for i, a in self.conv.items()}
        c.rec = {i: a.copy() for i, a in self.rec.items()}
        return c


@dataclass
class Trace:
    """Optional recorder passed to the forward functions.

    ``tensors[(layer, name)]`` holds the latest value of each intermediate
    (rows in the order of the call's tokens); names are ``attn_in, qkv`` (the
    three projections side by side, before RoPE) ``, q, k, v, attn_out`` (gated where
    the model gates it) ``,
    attn_proj, resid_mid, ffn_in, ffn_out, resid_out`` plus ``router_ids,
    router_weights`` for MoE; ``(-1, "embed")`` for the embedded tokens,
    ``(-1, "final_in")`` and ``(-1, "logits")`` for the final norm and logits
    (rows: the last token of each segment). ``expert_counts[layer, e]`` accumulates routed tokens.
    """

    capture_tensors: bool = True
    tensors: dict[tuple[int, str], np.ndarray] = field(default_factory=dict)
    expert_counts: np.ndarray | None = None

    def _put(self, layer: int, name: str, value: np.ndarray) -> None:
        if self.capture_tensors:
            self.tensors[(layer, name)] = np.array(value, copy=True)


# --------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------


class ReferenceModel:
    """Greedy decoder over :class:`Weights`. Thread-unsafe, state lives in
    the :class:`KVState` objects the caller holds."""

    def __init__(self, shape: Any, weights: Weights):
        self.shape = RefShape.of(shape)
        if weights.shape.without_eos() != self.shape.without_eos():
            raise ValueError(f"weights were built for {weights.shape}, not {self.shape}")
        weights.validate()
        self.weights = weights
        # float64 copies so _mm does not re-cast weights on every call.
        self._w = weights.astype(_F64)

    def _round(self, x: np.ndarray) -> np.ndarray:
        """A kernel's value as it travels: rounded to the activation format (`meshrt.activations`)."""
        return round_activations(x, self.shape.act_format)

    # ---- core forward --------------------------------------------------

    def _check_tokens(self, tokens: Iterable[int]) -> list[int]:
        out = [int(t) for t in tokens]
        for t in out:
            if not 0 <= t < self.shape.vocab:
                raise ValueError(f"token {t} outside vocab {self.shape.vocab}")
        return out

    def forward(
        self,
        segments: Sequence[tuple[KVState, Sequence[int]]],
        trace: Trace | None = None,
    ) -> np.ndarray:
        """Feed ``tokens`` to each ``state`` (appending to its cache) and
        return the logits at the last token of every segment, (n_seg, vocab).
        Rows of all segments share the projection / FFN products."""
        s, w = self.shape, self._w
        if len({id(st) for st, _ in segments}) != len(segments):
            raise ValueError("a KVState appears twice in one forward call")
        toks, pos, spans = [], [], []
        for st, seg in segments:
            seg = self._check_tokens(seg)
            if not seg:
                raise ValueError("empty token segment")
            spans.append((st, len(toks), len(seg)))
            pos.extend(range(st.length, st.length + len(seg)))
            toks.extend(seg)
            st._reserve(st.length + len(seg))
        positions = np.asarray(pos, np.int64)
        n = len(toks)
        r = self._round
        x = r(self.weights.embed[np.asarray(toks, np.int64)])
        if trace is not None:
            trace._put(-1, "embed", x)
        eps, rope = s.rms_eps, s.rope
        for li, lw in enumerate(w.layers):
            n1 = r(rmsnorm(x, lw.attn_norm, eps))
            if lw.linear is not None:
                proj = np.empty((n, s.hidden), _F32)
                for st, r0, cnt in spans:
                    proj[r0:r0 + cnt], st.conv[li], st.rec[li] = deltanet(
                        n1[r0:r0 + cnt], self.weights.layers[li].linear, s.linear_k_dim,
                        s.linear_v_dim, eps, st.conv[li], st.rec[li], r)
                x = self._ffn(li, lw, x, r(x + proj), trace, n1=n1, proj=proj)
                continue
            lin = r(_mm(n1, lw.wq, lw.bq)), r(_mm(n1, lw.wk, lw.bk)), r(_mm(n1, lw.wv, lw.bv))
            q = apply_rope(qk_norm(lin[0].reshape(n, s.heads, s.head_dim), lw.q_norm, eps),
                           positions, rope)
            k = apply_rope(qk_norm(lin[1].reshape(n, s.kv_heads, s.head_dim), lw.k_norm, eps),
                           positions, rope)
            v = lin[2].reshape(n, s.kv_heads, s.head_dim)
            att = np.empty((n, s.heads, s.head_dim), _F32)
            for st, r0, cnt in spans:
                st._write(li, st.length, k[r0 : r0 + cnt], v[r0 : r0 + cnt])
                end = st.length + cnt
                att[r0 : r0 + cnt] = attention(
                    q[r0 : r0 + cnt], st._k[li][:end], st._v[li][:end], st.length, s.window(li),
                    lw.sinks)
            flat = att.reshape(n, s.heads * s.head_dim)
            if lw.wg is not None:  # Qwen3.5's gated attention
                flat = (flat * sigmoid(r(_mm(n1, lw.wg)))).astype(_F32)
            flat = r(flat)
            proj = r(_mm(flat, lw.wo, lw.bo))
            x = self._ffn(li, lw, x, r(x + proj), trace, n1=n1, qkv=np.concatenate(lin, axis=1),
                          q=q, k=k, v=v, attn_out=flat.reshape(att.shape), proj=proj)
        for st, _, cnt in spans:
            st.length += cnt
        last = np.asarray([r0 + cnt - 1 for _, r0, cnt in spans], np.int64)
        final = r(rmsnorm(x[last], w.final_norm, eps))
        logits = r(_mm(final, w.lm_head))
        if trace is not None:
            trace._put(-1, "final_in", final)
            trace._put(-1, "logits", logits)
        return logits

    def _ffn(self, li: int, lw: LayerWeights, x: np.ndarray, h: np.ndarray, trace: Trace | None,
             **mixer: np.ndarray) -> np.ndarray:
        """Layer `li`'s FFN half on the residual h = x + token mixer; traces the layer."""
        s, eps, act = self.shape, self.shape.rms_eps, Act.of(self.shape)
        r = self._round
        n2 = r(rmsnorm(h, lw.ffn_norm, eps))
        moe = s.is_moe_layer(li)
        if moe:
            routing = expert_routing(n2, lw.moe.router, s.top_k, s.norm_topk, lw.moe.router_bias)
            counts = None
            if trace is not None:
                if trace.expert_counts is None:
                    trace.expert_counts = np.zeros((s.layers, s.experts), np.int64)
                counts = trace.expert_counts[li]
            f = r(moe_ffn(n2, lw.moe, s.top_k, counts=counts, routing=routing, act=act))
        else:
            d = lw.dense
            f = dense_ffn(n2, d.w_gate, d.w_up, d.w_down, d.b_gate, d.b_up, d.b_down, act, r)
        out = r(h + f)
        if trace is not None:
            names = {"n1": "attn_in", "qkv": "qkv", "q": "q", "k": "k", "v": "v",
                     "attn_out": "attn_out", "proj": "attn_proj"}
            for key, val in mixer.items():
                trace._put(li, names[key], val)
            for name, val in (("resid_mid", h), ("ffn_in", n2), ("ffn_out", f), ("resid_out", out)):
                trace._put(li, name, val)
            if moe:
                trace._put(li, "router_ids", routing[0])
                trace._put(li, "router_weights", routing[1])
        return out

    # ---- request-level API ---------------------------------------------

    def new_state(self) -> KVState:
        return KVState(self.shape)

    def prefill(self, prompt_tokens: Sequence[int], trace: Trace | None = None,
                kv: KVState | None = None) -> tuple[KVState, int]:
        """Run the whole prompt; returns (kv_state, first generated token). `kv`: the cache
        of the prompt's first `kv.length` positions, computed elsewhere (left as it is):
        only the prompt's rest is fed."""
        if len(prompt_tokens) == 0:
            raise ValueError("prompt must contain at least one token")
        if kv is None:
            st = KVState(self.shape, capacity=2 * len(prompt_tokens))
        elif kv.length >= len(prompt_tokens):
            raise ValueError(f"a cache of {kv.length} positions leaves none of the "
                             f"{len(prompt_tokens)}-token prompt to feed")
        else:
            st = kv.copy()
            st._reserve(2 * len(prompt_tokens))
        logits = self.forward([(st, prompt_tokens[st.length:])], trace)
        return st, greedy(logits[0])

    def decode_step(self, kv_state: KVState, token: int, trace: Trace | None = None) -> int:
        """Feed one token, return the next (greedy)."""
        return self.decode_batch([kv_state], [token], trace)[0]

    def decode_batch(self, states: Sequence[KVState], tokens: Sequence[int], trace: Trace | None = None) -> list[int]:
        """One decode step for several independent requests at once."""
        if len(states) != len(tokens):
            raise ValueError("states and tokens differ in length")
        if not states:
            return []
        logits = self.forward([(st, [t]) for st, t in zip(states, tokens)], trace)
        return [int(t) for t in greedy(logits)]

    def is_finished(self, output: Sequence[int], max_new_tokens: int) -> bool:
        return len(output) >= max_new_tokens or (bool(output) and output[-1] in self.shape.eos_tokens)

    def generate(self, prompt: Sequence[int], max_new_tokens: int, trace: Trace | None = None,
                 kv: KVState | None = None) -> list[int]:
        """Greedy generation; the output ends with EOS if one was emitted. `kv`: the cache of
        the prompt's first positions the request arrived with (`prefill`)."""
        return self.generate_batch([prompt], max_new_tokens, trace, [kv])[0]

    def generate_batch(
        self,
        prompts: Sequence[Sequence[int]],
        max_new_tokens: int | Sequence[int],
        trace: Trace | None = None,
        kvs: Sequence[KVState | None] | None = None,
    ) -> list[list[int]]:
        """Generate for several requests, decoding the unfinished ones as a
        batch each step (continuous batching without arrivals). Same tokens as
        calling :meth:`generate` on each prompt (with its cache of `kvs`)."""
        caps = [int(max_new_tokens)] * len(prompts) if np.isscalar(max_new_tokens) else [int(m) for m in max_new_tokens]
        if len(caps) != len(prompts):
            raise ValueError("max_new_tokens per prompt has the wrong length")
        kvs = [None] * len(prompts) if kvs is None else list(kvs)
        outs: list[list[int]] = [[] for _ in prompts]
        live: list[tuple[int, KVState]] = []
        for i, p in enumerate(prompts):
            if caps[i] <= 0:
                continue
            st, tok = self.prefill(p, trace, kvs[i])
            outs[i].append(tok)
            if not self.is_finished(outs[i], caps[i]):
                live.append((i, st))
        while live:
            nxt = self.decode_batch([st for _, st in live], [outs[i][-1] for i, _ in live], trace)
            still = []
            for (i, st), tok in zip(live, nxt):
                outs[i].append(tok)
                if not self.is_finished(outs[i], caps[i]):
                    still.append((i, st))
            live = still
        return outs


def expert_load(
    model: ReferenceModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int | Sequence[int],
    include_prefill: bool = True,
) -> np.ndarray:
    """Tokens routed to each expert of each layer over a generate run.

    Returns int64 (layers, experts); each token contributes top_k counts per
    layer (shared experts are always on and are not counted). With
    ``include_prefill=False`` only decode-phase tokens are counted."""
    if not model.shape.is_moe:
        raise ValueError("expert_load needs an MoE model")
    caps = [int(max_new_tokens)] * len(prompts) if np.isscalar(max_new_tokens) else list(max_new_tokens)
    total = np.zeros((model.shape.layers, model.shape.experts), np.int64)
    prefill_only = np.zeros_like(total)
    trace = Trace(capture_tensors=False, expert_counts=total)
    model.generate_batch(prompts, caps, trace)
    if not include_prefill:
        ptrace = Trace(capture_tensors=False, expert_counts=prefill_only)
        for p, cap in zip(prompts, caps):
            if cap > 0:
                model.prefill(p, ptrace)
        total = total - prefill_only
    return total
