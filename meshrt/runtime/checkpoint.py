"""Hugging Face checkpoints as `reference.Weights`.

A checkpoint is a directory as the hub stores a model: `config.json` beside
`*.safetensors` files, sharded with a `model.safetensors.index.json` (its
`weight_map` says which file holds which tensor) or not. `load_checkpoint`
reads it with the `safetensors` package's NumPy API (bfloat16, which NumPy
lacks, is widened from its bytes) into the same `Weights` object
`Weights.random` makes, so the NumPy reference, the interpreter's tiles and
everything downstream take either.

`tensor_names` is the one place that says which tensor of which model type
is which weight: Hugging Face stores a linear map as (out, in), meshrt as
(in, out), so those are transposed; experts are stacked along a first axis.
Quantized weights (`reference.weight_format`) are read as stored and kept
packed (`meshrt.quant.Packed`): fp8 as an F8_E4M3 `weight` beside its float32
`weight_scale_inv` grid (the block follows from the grid, as transformers
derives it), gpt_oss's mxfp4 experts as `*_blocks` and `*_scales` bytes.
A tensor that is missing, of another shape, of a dtype that is not a float,
or left over (a bias or a norm the config does not announce) is a
`FrontendError` naming the tensor, located at its file.
"""

from __future__ import annotations

import dataclasses
import json
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshrt import quant
from meshrt.activations import bf16_to_float32
from meshrt.diagnostics import FrontendError
from meshrt.frontend.hf_config import base_type
from meshrt.runtime import reference as ref

__all__ = ["Checkpoint", "is_checkpoint", "load_checkpoint", "tensor_names"]

INDEX = "model.safetensors.index.json"
FLOAT_DTYPES = ("F32", "F16", "BF16", "F64")
# what each quantized format's stored tensors must be
STORED_DTYPES = {"codes:fp8": "F8_E4M3", "scales:fp8": "F32", "codes:mxfp4": "U8",
                 "scales:mxfp4": "U8"}
# buffers some exports write beside the weights; they change no number we compute
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)
# Qwen3.5 hub checkpoints hold the vision tower and the multi-token-prediction head beside
# the language model: neither changes the greedy tokens of text
IGNORED_PREFIXES = ("model.visual.", "mtp.")


def is_checkpoint(path: str | Path) -> bool:
    """Whether `path` is a model directory (one that holds a config.json)."""
    p = Path(path)
    return p.is_dir() and (p / "config.json").is_file()


@dataclass(frozen=True)
class Source:
    """Where one meshrt array comes from: Hugging Face tensor names (several:
    stacked along a new first axis, one per expert) and whether each is an
    (out, in) linear map to transpose."""

    names: tuple[str, ...]
    transpose: bool
    stacked: bool = False
    interleaved: int | None = None  # 0 / 1: the even / odd last-axis entries of a fused tensor
    # (head_dim, 0 / 1): the first / second half of each head's 2 x head_dim rows (Qwen3.5's
    # q_proj holds the query and the output gate of every head side by side)
    head_half: tuple[int, int] | None = None
    offset: float = 0.0  # added to the tensor (Qwen3.5's RMSNorms scale by 1 + weight)
    squeeze: bool = False  # a depthwise conv's (channels, 1, taps) as (channels, taps)

    @staticmethod
    def stored(name: str, fmt: str) -> tuple[str, str]:
        """(codes tensor, scales tensor) a weight `name` is stored as in `fmt`."""
        if fmt == "mxfp4":
            return f"{name}_blocks", f"{name}_scales"
        return name, name.removesuffix(".weight") + ".weight_scale_inv"

    def theirs(self, expect: tuple[int, ...]) -> tuple[int, ...]:
        """The checkpoint's shape of a tensor meshrt holds as `expect`."""
        if self.interleaved is not None:
            return (*expect[:-1], 2 * expect[-1])
        if self.squeeze:
            return (expect[0], 1, *expect[1:])
        mine = (*expect[:-1], 2 * expect[-1]) if self.head_half else expect
        return tuple(reversed(mine)) if self.transpose else mine

    def convert(self, a: np.ndarray) -> np.ndarray:
        """A checkpoint tensor (its shape `theirs`) in meshrt's orientation."""
        if self.interleaved is not None:
            a = a[..., self.interleaved::2]
        if self.head_half is not None:
            d, part = self.head_half
            a = a.reshape(-1, 2, d, a.shape[-1])[:, part].reshape(-1, a.shape[-1])
        if self.squeeze:
            a = a[:, 0]
        a = np.ascontiguousarray(a.T if self.transpose else a)
        return (a + np.float32(self.offset)).astype(np.float32) if self.offset else a


def tensor_names(model_type: str, shape: ref.RefShape, prefix: str = "model.") -> dict[str, Source]:
    """Every `Weights.named_arrays` name of `shape` -> its checkpoint tensors, for
    `model_type` (the types `meshrt.frontend.hf_config` imports; gpt_oss's
    unquantized layout: fused experts, gate and up interleaved)."""
    s = shape
    out: dict[str, Source] = {
        "embed": Source(("model.embed_tokens.weight",), False),
        "final_norm": Source(("model.norm.weight",), False),
        # tied: lm_head is the embedding (checkpoints usually omit lm_head.weight)
        "lm_head": Source(("model.embed_tokens.weight" if s.tie_embeddings else "lm_head.weight",),
                          True),
    }
    model_type = base_type(model_type)
    moe_block, expert = {
        "mixtral": ("block_sparse_moe", {"w_gate": "w1", "w_up": "w3", "w_down": "w2"}),
    }.get(model_type, ("mlp", {"w_gate": "gate_proj", "w_up": "up_proj", "w_down": "down_proj"}))
    for i in range(s.layers):
        hf, me = f"{prefix}layers.{i}", f"layers.{i}"
        one = lambda name, t=True: Source((f"{hf}.{name}",), t)  # noqa: E731
        out |= {
            f"{me}.attn_norm": one("input_layernorm.weight", False),
            f"{me}.ffn_norm": one("post_attention_layernorm.weight", False),
            f"{me}.wq": one("self_attn.q_proj.weight"), f"{me}.wk": one("self_attn.k_proj.weight"),
            f"{me}.wv": one("self_attn.v_proj.weight"), f"{me}.wo": one("self_attn.o_proj.weight"),
            f"{me}.bq": one("self_attn.q_proj.bias", False),
            f"{me}.bk": one("self_attn.k_proj.bias", False),
            f"{me}.bv": one("self_attn.v_proj.bias", False),
            f"{me}.bo": one("self_attn.o_proj.bias", False),
            f"{me}.q_norm": one("self_attn.q_norm.weight", False),
            f"{me}.k_norm": one("self_attn.k_norm.weight", False),
            f"{me}.sinks": one("self_attn.sinks", False),
        }
        if s.is_moe_layer(i) and model_type == "gpt_oss":
            ex = f"{hf}.mlp.experts"
            out |= {
                f"{me}.moe.router": one("mlp.router.weight"),
                f"{me}.moe.router_bias": one("mlp.router.bias", False),
                f"{me}.moe.w_gate": Source((f"{ex}.gate_up_proj",), False, interleaved=0),
                f"{me}.moe.w_up": Source((f"{ex}.gate_up_proj",), False, interleaved=1),
                f"{me}.moe.w_down": Source((f"{ex}.down_proj",), False),
                f"{me}.moe.b_gate": Source((f"{ex}.gate_up_proj_bias",), False, interleaved=0),
                f"{me}.moe.b_up": Source((f"{ex}.gate_up_proj_bias",), False, interleaved=1),
                f"{me}.moe.b_down": Source((f"{ex}.down_proj_bias",), False),
            }
        elif s.is_moe_layer(i):
            out[f"{me}.moe.router"] = one(f"{moe_block}.gate.weight")
            for mine, theirs in expert.items():
                out[f"{me}.moe.{mine}"] = Source(tuple(
                    f"{hf}.{moe_block}.experts.{e}.{theirs}.weight" for e in range(s.experts)),
                    True, stacked=True)
        else:
            for part in ("gate", "up", "down"):
                out[f"{me}.dense.w_{part}"] = one(f"mlp.{part}_proj.weight")
                out[f"{me}.dense.b_{part}"] = one(f"mlp.{part}_proj.bias", False)
    if model_type in ("qwen3_5", "qwen3_5_moe"):
        out |= _qwen3_5_names(s, prefix)
    expected = ref.Weights.expected(s)
    return {k: v for k, v in out.items() if k in expected}


def _qwen3_5_names(s: ref.RefShape, prefix: str) -> dict[str, Source]:
    """Qwen3.5's own tensors (they replace the common names): its zero-centred
    RMSNorms, the gated q_proj, the DeltaNet layers' and the gated shared expert's."""
    norm = lambda name: Source((f"{prefix}{name}",), False, offset=1.0)  # noqa: E731
    out = {"embed": Source((f"{prefix}embed_tokens.weight",), False),
           "final_norm": norm("norm.weight")}
    if s.tie_embeddings:
        out["lm_head"] = Source((f"{prefix}embed_tokens.weight",), True)
    for i in range(s.layers):
        hf, me = f"{prefix}layers.{i}", f"layers.{i}"
        one = lambda name, t=True, **kw: Source((f"{hf}.{name}",), t, **kw)  # noqa: E731
        out |= {f"{me}.attn_norm": norm(f"layers.{i}.input_layernorm.weight"),
                f"{me}.ffn_norm": norm(f"layers.{i}.post_attention_layernorm.weight"),
                f"{me}.q_norm": norm(f"layers.{i}.self_attn.q_norm.weight"),
                f"{me}.k_norm": norm(f"layers.{i}.self_attn.k_norm.weight"),
                f"{me}.wq": one("self_attn.q_proj.weight", head_half=(s.head_dim, 0)),
                f"{me}.wg": one("self_attn.q_proj.weight", head_half=(s.head_dim, 1))}
        la = f"{me}.linear"
        out |= {f"{la}.w_qkv": one("linear_attn.in_proj_qkv.weight"),
                f"{la}.w_z": one("linear_attn.in_proj_z.weight"),
                f"{la}.w_b": one("linear_attn.in_proj_b.weight"),
                f"{la}.w_a": one("linear_attn.in_proj_a.weight"),
                f"{la}.conv": one("linear_attn.conv1d.weight", False, squeeze=True),
                f"{la}.dt_bias": one("linear_attn.dt_bias", False),
                f"{la}.a_log": one("linear_attn.A_log", False),
                f"{la}.norm": one("linear_attn.norm.weight", False),
                f"{la}.w_out": one("linear_attn.out_proj.weight")}
        for part in ("gate", "up", "down"):
            out[f"{me}.moe.shared_{part}"] = Source(
                (f"{hf}.mlp.shared_expert.{part}_proj.weight",), True, stacked=True)
        out[f"{me}.moe.shared_scale"] = one("mlp.shared_expert_gate.weight")
    return out


def _prefix(model_type: str, ckpt: Checkpoint) -> str:
    """Where the language model's tensors are: Qwen3.5's multimodal checkpoints hold
    them under model.language_model."""
    if model_type in ("qwen3_5", "qwen3_5_moe") and \
            "model.language_model.embed_tokens.weight" in ckpt.where:
        return "model.language_model."
    return "model."


class Checkpoint:
    """The tensors of a checkpoint directory: which file holds each, read on demand."""

    def __init__(self, directory: str | Path):
        self.dir = Path(directory)
        self._headers: dict[Path, dict[str, dict]] = {}
        index = self.dir / INDEX
        self.where: dict[str, Path] = {}
        if index.is_file():
            try:
                wmap = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
                if not isinstance(wmap, dict):
                    raise TypeError
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
                raise FrontendError(f"{INDEX} must be a JSON object with a 'weight_map' object",
                                    str(index)) from None
            for name, file in wmap.items():
                path = self.dir / str(file)
                if not path.is_file():
                    raise FrontendError(f"tensor '{name}' is in '{file}', which does not exist",
                                        str(index))
                self.where[name] = path
        else:
            files = sorted(self.dir.glob("*.safetensors"))
            if not files:
                raise FrontendError("no *.safetensors file (and no model.safetensors.index.json)",
                                    str(self.dir))
            for path in files:
                for name in self._header(path):
                    self.where.setdefault(name, path)

    def _header(self, path: Path) -> dict[str, dict]:
        """A safetensors file's header: name -> {dtype, shape, data_offsets} (read once)."""
        if path not in self._headers:
            self._headers[path] = self._read_header(path)
        return self._headers[path]

    @staticmethod
    def _read_header(path: Path) -> dict[str, dict]:
        try:
            with open(path, "rb") as f:
                (n,) = struct.unpack("<Q", f.read(8))
                if n > 100_000_000:
                    raise ValueError
                header = json.loads(f.read(n))
        except (OSError, ValueError, struct.error, UnicodeDecodeError):
            raise FrontendError("not a safetensors file (bad header)", str(path)) from None
        header.pop("__metadata__", None)
        return header

    def tensor(self, name: str, expect: tuple[int, ...], src: Source) -> np.ndarray:
        """Tensor `name` of `src` as float32, in meshrt's orientation, checked against `expect`."""
        path, info = self._info(name)
        theirs = src.theirs(expect)
        if tuple(info.get("shape", ())) != theirs:
            raise FrontendError(f"tensor '{name}' has shape {tuple(info.get('shape', ()))}, the "
                                f"config makes it {theirs}", str(path))
        dtype = info.get("dtype")
        if dtype not in FLOAT_DTYPES:
            raise FrontendError(f"tensor '{name}' is {dtype}; meshrt loads {', '.join(FLOAT_DTYPES)} "
                                "(quantized weights need the config's quantization_config)", str(path))
        if dtype == "BF16":
            a = self._bf16(path, info)
        else:
            from safetensors import SafetensorError, safe_open

            try:
                with safe_open(str(path), framework="np") as f:
                    a = f.get_tensor(name)
            except (SafetensorError, OSError, ValueError) as e:
                raise FrontendError(f"cannot read tensor '{name}': {e}", str(path)) from None
        return src.convert(np.asarray(a, np.float32).reshape(theirs))

    def _info(self, name: str) -> tuple[Path, dict]:
        path = self.where.get(name)
        if path is None:
            raise FrontendError(f"checkpoint has no tensor '{name}'", str(self.dir))
        info = self._header(path).get(name)
        if info is None:
            raise FrontendError(f"checkpoint has no tensor '{name}' (the index names this file)",
                                str(path))
        return path, info

    def _stored(self, name: str, what: str, fmt: str) -> np.ndarray:
        """Tensor `name` as stored (codes or scales of `fmt`), checked to be of its dtype."""
        path, info = self._info(name)
        want = STORED_DTYPES[f"{what}:{fmt}"]
        if info.get("dtype") != want:
            raise FrontendError(f"tensor '{name}' is {info.get('dtype')}; {fmt} {what} are {want}",
                                str(path))
        raw = self._raw(path, info)
        shape = tuple(info.get("shape", ()))
        dtype = np.dtype("<f4") if want == "F32" else np.dtype(np.uint8)
        if len(raw) != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise FrontendError(f"tensor '{name}' holds {len(raw)} bytes, not the {shape} its "
                                "header gives", str(path))
        return np.frombuffer(raw, dtype).reshape(shape)

    def packed(self, name: str, expect: tuple[int, ...], src: Source, fmt: str) -> quant.Packed:
        """Quantized weight `name` of `src` in meshrt's orientation, still packed."""
        codes_name, scales_name = Source.stored(name, fmt)
        codes, scales = self._stored(codes_name, "codes", fmt), self._stored(scales_name, "scales", fmt)
        path = self.where[codes_name]
        theirs = src.theirs(expect)
        if fmt == "mxfp4":  # (..., out, in / 32, 16) bytes and (..., out, in / 32) exponents
            # gpt_oss's fused experts: meshrt's (in, out) orientation, the blocks along in
            lead, n_in, n_out = theirs[:-2], theirs[-2], theirs[-1]
            want_c = (*lead, n_out, -(-n_in // quant.MXFP4_BLOCK), quant.MXFP4_BLOCK // 2)
            if codes.shape != want_c or scales.shape != want_c[:-1]:
                raise FrontendError(f"tensors '{codes_name}' / '{scales_name}' have shapes "
                                    f"{codes.shape} / {scales.shape}, the config makes them "
                                    f"{want_c} / {want_c[:-1]}", str(path))
            nib = quant.unpack_nibbles(codes).reshape(*lead, n_out, -1)[..., :n_in]
            p = quant.Packed("mxfp4", np.swapaxes(nib, -1, -2).copy(),
                             np.swapaxes(scales, -1, -2).copy(), quant.MXFP4_BLOCK)
        else:  # (out, in) e4m3 codes and a (ceil(out / bo), ceil(in / bi)) float32 grid
            if codes.shape != theirs:
                raise FrontendError(f"tensor '{codes_name}' has shape {codes.shape}, the config "
                                    f"makes it {theirs}", str(path))
            grid = scales.reshape(1, 1) if scales.size == 1 else scales
            if grid.ndim != 2:
                raise FrontendError(f"tensor '{scales_name}' must be a 2-D grid of block scales, "
                                    f"got shape {scales.shape}", str(self.where[scales_name]))
            n_out, n_in = codes.shape
            (g_out, g_in) = grid.shape
            if n_out % g_out or n_in % g_in:  # as transformers: the grid divides the matrix
                raise FrontendError(f"tensor '{scales_name}': a {g_out} x {g_in} scale grid does "
                                    f"not divide the {n_out} x {n_in} weight", str(self.where[scales_name]))
            per_col = np.repeat(grid, n_out // g_out, axis=0)  # (out, g_in)
            p = quant.Packed("fp8", codes.T.copy(), per_col.T.astype(np.float32).copy(), n_in // g_in)
        if src.interleaved is not None:
            p = p.columns(np.arange(src.interleaved, p.codes.shape[-1], 2))
        return p

    def _raw(self, path: Path, info: dict) -> bytes:
        """A tensor's bytes as the file stores them."""
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            lo, hi = info["data_offsets"]
            f.seek(8 + n + lo)
            data = f.read(hi - lo)
        if len(data) != hi - lo:
            raise FrontendError("tensor data is cut short", str(path))
        return data

    def _bf16(self, path: Path, info: dict) -> np.ndarray:
        """bfloat16 widened to float32 from the file's bytes (NumPy has no bfloat16)."""
        data = self._raw(path, info)
        if len(data) % 2:
            raise FrontendError("bfloat16 tensor data is cut short", str(path))
        return bf16_to_float32(np.frombuffer(data, "<u2"))


def load_checkpoint(directory: str | Path, shape) -> ref.Weights:
    """The weights of checkpoint `directory` for `shape` (the shape its config.json
    gives, as the program's hparams record it); FrontendError on a missing,
    mis-shaped, non-float or unexpected tensor."""
    s = ref.RefShape.of(shape)
    d = Path(directory)
    try:
        model_type = json.loads((d / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        raise FrontendError("cannot read config.json", str(d / "config.json")) from None
    ckpt = Checkpoint(d)
    names = tensor_names(model_type, s, _prefix(base_type(model_type), ckpt))
    expected = ref.Weights.expected(s)
    arrays: dict[str, np.ndarray] = {}
    packed: dict[str, quant.Packed] = {}
    used: set[str] = set()
    for mine, src in names.items():
        want = expected[mine]
        fmt = ref.weight_format(s, mine)
        if fmt:
            parts = [ckpt.packed(n, want[1:] if src.stacked else want, src, fmt) for n in src.names]
            packed[mine] = quant.Packed.stack(parts) if src.stacked else parts[0]
            arrays[mine] = packed[mine].decode()
            used.update(t for n in src.names for t in Source.stored(n, fmt))
        elif src.stacked:
            arrays[mine] = np.stack([ckpt.tensor(n, want[1:], src) for n in src.names])
        else:
            arrays[mine] = ckpt.tensor(src.names[0], want, src)
        if not fmt:
            used.update(src.names)
    if s.tie_embeddings:  # transformers ties it to the embedding whatever the file holds
        used.add("lm_head.weight")
    extra = sorted(n for n in ckpt.where if n not in used and not n.endswith(IGNORED_SUFFIXES)
                   and not n.startswith(IGNORED_PREFIXES))
    if extra:
        raise FrontendError(f"tensor '{extra[0]}' is not a weight of this {model_type} config"
                            + (f" (nor are {len(extra) - 1} more)" if len(extra) > 1 else "")
                            + ": a bias, norm or layer the config does not announce",
                            str(ckpt.where[extra[0]]))
    w = _weights(s, arrays)
    w.packed.update(packed)
    w.validate()
    return w


def _weights(s: ref.RefShape, a: dict[str, np.ndarray]) -> ref.Weights:
    """`Weights` from its `named_arrays` (no shared experts where the type has none)."""
    layers = []
    for i in range(s.layers):
        p = f"layers.{i}."
        get = lambda k: a.get(p + k)  # noqa: E731
        dense = moe = linear = None
        if s.is_moe_layer(i):
            none = (np.zeros((0, s.hidden, s.expert_ffn), np.float32),) * 2 + (
                np.zeros((0, s.expert_ffn, s.hidden), np.float32),)
            shared = [get(f"moe.shared_{k}") for k in ("gate", "up", "down")]
            shared = none if shared[0] is None else shared
            moe = ref.MoEFFNWeights(get("moe.router"), get("moe.w_gate"), get("moe.w_up"),
                                    get("moe.w_down"), *shared,
                                    get("moe.router_bias"), get("moe.b_gate"), get("moe.b_up"),
                                    get("moe.b_down"), get("moe.shared_scale"))
        else:
            dense = ref.DenseFFNWeights(get("dense.w_gate"), get("dense.w_up"), get("dense.w_down"),
                                        get("dense.b_gate"), get("dense.b_up"), get("dense.b_down"))
        if s.is_linear_layer(i):
            linear = ref.DeltaNetWeights(**{f.name: get(f"linear.{f.name}")
                                            for f in dataclasses.fields(ref.DeltaNetWeights)})
        layers.append(ref.LayerWeights(get("attn_norm"), get("wq"), get("wk"), get("wv"), get("wo"),
                                       get("ffn_norm"), dense, moe, get("bq"), get("bk"), get("bv"),
                                       get("bo"), get("q_norm"), get("k_norm"), get("sinks"),
                                       get("wg"), linear))
    return ref.Weights(s, a["embed"], layers, a["final_norm"], a["lm_head"])
