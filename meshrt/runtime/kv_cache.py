"""KV caches a request arrives with: prefill done elsewhere (paper §5.1, Figure 8).

A decode request may arrive as (request id, the KV cache of its prompt): the
host writes the cache into the slot's KV tiles outside the per-token path and
the mesh goes on from there. Here the cache covers the prompt's first n
positions, n < the prompt's length: the mesh feeds the rest (at least the
last prompt token, whose logits give the first output, so sampling and the
end-of-sequence check stay on chip). n = prompt length - 1 is a whole prefill
done elsewhere; a smaller n a cached prefix.

File format (`.npz`, no pickles), the layout transformers' caches use per
layer without their batch dimension (a leading batch of 1 is accepted):

- ``length``: a 0-d integer, n;
- ``k.{layer}``, ``v.{layer}``: (kv_heads, n, head_dim) for every
  full-attention layer; keys after q/k norm and RoPE, as they are cached;
  every position, also on sliding-window layers;
- ``conv.{layer}``: (conv channels, linear_conv - 1), or transformers'
  (conv channels, linear_conv) of which the last linear_conv - 1 columns
  count, and ``rec.{layer}``: (v_heads, k_dim, v_dim) for every DeltaNet
  layer.

Floats of any width load as float32. A file that is not such an archive, a
missing, extra or mis-shaped array, a non-finite value, or a cache too long
for its prompt is a `WorkloadError` naming the file, before anything runs.
"""

from __future__ import annotations

import math
import os
import zipfile

import numpy as np

from meshrt.output import atomic_file
from meshrt.runtime import reference as ref
from meshrt.runtime.workloads import MAX_REQUEST_TOKENS, Request, WorkloadError


def array_shapes(shape: ref.RefShape, n: int) -> dict[str, tuple[int, ...]]:
    """The arrays of a cache of `n` positions of a model of `shape`, by name."""
    s = shape
    out: dict[str, tuple[int, ...]] = {}
    for i in range(s.layers):
        if s.is_linear_layer(i):
            out[f"conv.{i}"] = (s.linear_conv_width, s.linear_conv - 1)
            out[f"rec.{i}"] = (s.linear_v_heads, s.linear_k_dim, s.linear_v_dim)
        else:
            out[f"k.{i}"] = out[f"v.{i}"] = (s.kv_heads, n, s.head_dim)
    return out


def save_kv(path: str | os.PathLike, state: ref.KVState) -> None:
    """Write `state` (its first `length` positions) in the format `load_kv` reads."""
    s, n = state.shape, state.length
    arrays: dict[str, np.ndarray] = {"length": np.asarray(n, np.int64)}
    for name in array_shapes(s, n):
        kind, layer = name.split(".")
        i = int(layer)
        if kind == "k":
            arrays[name] = state.keys(i).transpose(1, 0, 2)
        elif kind == "v":
            arrays[name] = state.values(i).transpose(1, 0, 2)
        else:
            arrays[name] = (state.conv if kind == "conv" else state.rec)[i]
    with atomic_file(path, "wb") as f:
        np.savez(f, **arrays)


def load_kv(path: str | os.PathLike, shape: ref.RefShape, prompt_len: int | None = None) -> ref.KVState:
    """The cache in file `path` for a model of `shape` (WorkloadError naming the file); for a
    prompt of `prompt_len` tokens, checked to fit it before its arrays are read."""
    p = os.fspath(path)

    def bad(reason: str) -> WorkloadError:
        return WorkloadError(reason, p)

    try:
        with zipfile.ZipFile(p) as zf:
            headers = {m.filename.removesuffix(".npy"): _header(zf, m, bad) for m in zf.infolist()}
    except (OSError, zipfile.BadZipFile) as e:
        raise bad(f"not a .npz KV cache: {getattr(e, 'strerror', None) or e}") from None
    if "length" not in headers:
        raise bad("no 'length' array (the positions the cache holds)")
    dims, dtype = headers["length"]
    if dims != () or dtype.kind not in "iu":
        raise bad(f"'length' must be a 0-d integer, got {dtype} of shape {dims}")
    try:
        z = np.load(p, allow_pickle=False)
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise bad(f"not a .npz KV cache: {str(e).splitlines()[0] if str(e) else e}") from None
    with z:
        n = int(_read(z, "length", bad))
        if not 1 <= n <= MAX_REQUEST_TOKENS:
            raise bad(f"length {n} outside 1..{MAX_REQUEST_TOKENS}")
        if prompt_len is not None and n >= prompt_len:
            raise bad(_too_long(n, prompt_len))
        want = array_shapes(shape, n)
        extra = sorted(set(headers) - set(want) - {"length"})
        if extra:
            raise bad(f"unknown array {extra[0]!r} for this model (expected: length, "
                      f"{', '.join(want)})")
        for name, dims in want.items():  # every header before any array is read
            if name not in headers:
                raise bad(f"missing array {name!r} of shape {dims}")
            got, dtype = headers[name]
            if dtype.kind != "f":
                raise bad(f"array {name!r} must hold floats, got {dtype}")
            if got[:1] == (1,) and len(got) == len(dims) + 1:  # transformers' batch of one
                got = got[1:]
            conv = name.startswith("conv") and got == (dims[0], dims[1] + 1)
            if got != dims and not conv:  # transformers keeps linear_conv inputs of a conv
                raise bad(f"array {name!r} has shape {got}, this model needs {dims}")
        st = ref.KVState(shape, capacity=n)
        for name, dims in want.items():
            a = _read(z, name, bad).reshape(-1, *headers[name][0][-len(dims):])[-1]
            if a.shape != dims:  # a conv state of linear_conv inputs: the oldest unused
                a = a[:, 1:]
            if not np.isfinite(a).all():
                raise bad(f"array {name!r} holds a value that is not finite")
            kind, layer = name.split(".")
            i = int(layer)
            a = a.astype(np.float32)
            if kind in ("k", "v"):
                (st._k if kind == "k" else st._v)[i][:n] = a.transpose(1, 0, 2)  # (n, heads, d)
            else:
                (st.conv if kind == "conv" else st.rec)[i] = a
        st.length = n
    return st


def _header(zf: zipfile.ZipFile, member: zipfile.ZipInfo, bad) -> tuple[tuple[int, ...], np.dtype]:
    """(shape, dtype) a member's .npy header declares, read without its data (an archive
    may declare any size: nothing is allocated before the shapes are checked)."""
    if not member.filename.endswith(".npy"):
        raise bad(f"member {member.filename!r} is not a .npy array")
    try:
        with zf.open(member) as f:
            version = np.lib.format.read_magic(f)
            read = {(1, 0): np.lib.format.read_array_header_1_0,
                    (2, 0): np.lib.format.read_array_header_2_0}.get(version)
            if read is None:
                raise ValueError(f"unsupported .npy version {version}")
            dims, _, dtype = read(f)
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        name = member.filename.removesuffix(".npy")
        raise bad(f"array {name!r} cannot be read: {str(e).splitlines()[0] if str(e) else e}") from None
    if dtype.hasobject:
        raise bad(f"array {member.filename.removesuffix('.npy')!r} holds Python objects")
    return tuple(dims), dtype


def _read(z, name: str, bad) -> np.ndarray:
    try:
        return z[name]
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as e:
        raise bad(f"array {name!r} cannot be read: {str(e).splitlines()[0] if str(e) else e}") from None


def attach(requests: list[Request], shape: ref.RefShape) -> None:
    """Load every request's KV file into `Request.kv`; check every cache fits its prompt."""
    for r in requests:
        if r.kv_file is not None and r.kv is None:
            r.kv = load_kv(r.kv_file, shape, r.prompt_len)
        if r.kv is not None and r.kv_len >= r.prompt_len:
            raise WorkloadError(f"request {r.id}: {_too_long(r.kv_len, r.prompt_len)}", r.kv_file)


def _too_long(n: int, prompt_len: int) -> str:
    return (f"a KV cache of {n} positions for a {prompt_len}-token prompt: it may hold all "
            "but the last, which the mesh feeds to sample the first output")


def prefilled_elsewhere(requests: list[Request], model: ref.ReferenceModel) -> None:
    """Give every request the cache of its prompt but the last token, prefilled by the
    NumPy reference (standing in for a prefill system); one-token prompts keep none."""
    for r in requests:
        if r.prompt_len > 1:
            r.kv = ref.KVState(model.shape, capacity=r.prompt_len)
            model.forward([(r.kv, r.prompt[:-1])])


def push_cycles(shape, positions: int, target) -> int:
    """Cycles from a request's admission until its pushed cache is in its slot's tiles:
    the host hears of the slot (a round trip) and writes the cache through the system
    I/O, the link the wafers' handoffs use (`wafer_link_bytes_per_cycle`)."""
    nbytes = shape.request_state_bytes(positions)
    return int(target.costs.get("host_roundtrip", 0)) + math.ceil(nbytes / target.wafer_link_bytes_per_cycle)
