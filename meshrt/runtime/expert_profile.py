"""Expert-activation profiles and per-region performance models (`place-experts`).

Why both: a MoE layer finishes when its slowest expert region does, and a
region's time depends on how many tokens its experts receive (routing skew)
*and* on how fast its cores run (hardware variability, longer dispatch
paths). Profiles say how tokens are routed; region models say what a token
load costs on each region. `place-experts{policy=eplb}` needs only the
first, `policy=vibe` combines both (DESIGN.md, "Passes" 4).

Expert-activation profile (JSON, format "meshrt-expert-profile")
----------------------------------------------------------------
(the `//` notes explain the keys; JSON files have no comments)::

    {
      "format": "meshrt-expert-profile",   // optional; if present, exactly this
      "name": "chat",                      // optional
      "experts": 8,                        // optional; every layer must list this many
      "top_k": 2,                          // optional, informational
      "layers": {                          // model layer index -> per-expert load
        "0": [812, 95, 40, 311, 77, 150, 9, 506],
        "1": [120, 130, 90, 110, 100, 105, 99, 101]
      },
      "default": [1, 1, 1, 1, 1, 1, 1, 1]  // optional: MoE layers not listed
    }

Profiles come from a file, from counts (`ExpertProfile.from_counts`: the
`routing_counts` of a `runtime.serving.serve` run on the interpreter, or
`reference.expert_load` of the NumPy model via `ExpertProfile.measure`), or
are synthetic (`zipf`, `chat_routing`, `reasoning_routing`).

`layers` may also be a list, entry i being layer i. A load is any
non-negative number proportional to the tokens routed to the expert (token
counts exported from a serving run, or shares); placement uses each layer's
loads as *shares* of the layer's tokens (they are normalised), so a profile
from a GPU run with a different batch size applies as is. Every error in a
file is one line, `FILE:LINE:COL: error: ...` (`FrontendError`).

Per-region performance model (JSON, format "meshrt-region-models")
------------------------------------------------------------------
::

    {
      "format": "meshrt-region-models",
      "unit": "cycles",                    // what a and b are in
      "tokens_per_step": 16,               // optional: token-expert assignments per
                                           // step and layer the models were fitted for
      "layers": {"0": [{"a": 410.0, "b": 598.5}, ...one per expert region...]},
      "default": [{"a": 0, "b": 1}, ...],  // optional: layers not listed
      "fit": {...}                         // optional, free-form provenance
    }

Region r of a layer with `tokens` token-expert assignments routed to its
experts in a decode step is predicted to take `a + b * tokens`: `a` is what
does not scale with tokens (dispatch path length, metainfo, fixed
overheads), `b` the per-token cost on that region's cores, so a region of
slower cores has a larger `b`. Regions are numbered as the expert regions of
the layer's `moe_experts` / `expert_ffn` op. `meshrt.runtime.region_timing`
fits these models from mesh_sim runs; `RegionModels.from_speeds` makes
synthetic ones (a given spread of region speeds) for studies and tests.
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshrt.frontend.errors import FrontendError, Loc, locate_text
from meshrt.limits import JSONInputError, parse_json
from meshrt.output import atomic_file

PROFILE_FORMAT = "meshrt-expert-profile"
MODELS_FORMAT = "meshrt-region-models"


# ---------------------------------------------------------------------------
# Locating errors in JSON files
# ---------------------------------------------------------------------------


class _Src:
    """A JSON document's text and name, to point errors at keys."""

    def __init__(self, name: str, text: str = ""):
        self.name, self.text = name, text

    def loc(self, *keys: str) -> Loc:
        """Position of the key path `keys` ("layers", "3"), as deep as it is found."""
        if not self.text:
            return Loc(self.name)
        pos, line, col = 0, 0, 0
        for k in keys:
            i = self.text.find(json.dumps(k), pos)
            if i < 0:
                break
            pos = i + 1
            line, col = locate_text(self.text, json.dumps(k), i)
        return Loc(self.name, line, col)

    def err(self, msg: str, *keys: str) -> FrontendError:
        return FrontendError(msg, self.loc(*keys))


def _read_json(path: str | os.PathLike, what: str) -> tuple[Any, _Src]:
    name = os.fspath(path)
    try:
        with open(name, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise FrontendError(f"no such {what} file", name) from None
    except (OSError, UnicodeDecodeError) as e:
        raise FrontendError(f"cannot read {what}: {e}", name) from None
    return _parse_json(text, name, what)


def _parse_json(text: str, name: str, what: str) -> tuple[Any, _Src]:
    try:
        data = parse_json(text)
    except JSONInputError as e:
        raise FrontendError(f"{what} is not valid JSON: {e.msg}", e.loc(name)) from None
    src = _Src(name, text)
    if not isinstance(data, dict):
        raise FrontendError(f"{what} must be a JSON object", Loc(name, 1, 1))
    return data, src


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _layer_table(data: dict, src: _Src, what: str) -> dict[int, tuple[Any, tuple[str, ...]]]:
    """`layers` as {layer: (entry, key path)}; dict keys must be layer numbers."""
    if "layers" not in data:
        if "default" in data:
            return {}
        raise src.err(f"{what} needs a \"layers\" or a \"default\" entry")
    layers = data["layers"]
    out: dict[int, tuple[Any, tuple[str, ...]]] = {}
    if isinstance(layers, list):
        for i, entry in enumerate(layers):
            out[i] = (entry, ("layers",))
    elif isinstance(layers, dict):
        for k, entry in layers.items():
            try:
                i = int(k)
            except ValueError:
                raise src.err(f"layer key '{k}' is not a layer number", "layers", k) from None
            if i < 0:
                raise src.err(f"layer {i} must not be negative", "layers", k)
            out[i] = (entry, ("layers", k))
    else:
        raise src.err("\"layers\" must be an object (layer -> entry) or a list", "layers")
    return out


def _check_format(data: dict, src: _Src, fmt: str) -> None:
    if "format" in data and data["format"] != fmt:
        raise src.err(f"format is '{data['format']}', expected '{fmt}'", "format")


# ---------------------------------------------------------------------------
# Expert-activation profiles
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertProfile:
    """Per layer, per expert load (token counts or shares; see the module docstring)."""

    experts: int
    layers: Mapping[int, tuple[float, ...]]
    default: tuple[float, ...] | None = None
    top_k: int | None = None
    name: str = ""
    source: str = field(default="", compare=False)
    locs: Mapping[int, Loc] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for layer, loads in list(self.layers.items()) + [(-1, self.default or ())]:
            if any(x < 0 or not math.isfinite(x) for x in loads):
                raise ValueError(f"profile layer {layer}: loads must be finite and >= 0")

    def has(self, layer: int) -> bool:
        return layer in self.layers or self.default is not None

    def loads(self, layer: int) -> tuple[float, ...]:
        """The raw loads of `layer` (KeyError if neither listed nor defaulted)."""
        if layer in self.layers:
            return self.layers[layer]
        if self.default is not None:
            return self.default
        raise KeyError(layer)

    def shares(self, layer: int) -> tuple[float, ...]:
        """`layer`'s loads normalised to sum to 1 (uniform if they are all 0)."""
        loads = self.loads(layer)
        total = sum(loads)
        if total <= 0:
            return tuple(1.0 / len(loads) for _ in loads)
        return tuple(x / total for x in loads)

    def where(self, layer: int) -> Loc:
        return self.locs.get(layer) or Loc(self.source or "<profile>")

    # -- JSON ------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"format": PROFILE_FORMAT}
        if self.name:
            out["name"] = self.name
        out["experts"] = self.experts
        if self.top_k is not None:
            out["top_k"] = self.top_k
        out["layers"] = {str(k): list(v) for k, v in sorted(self.layers.items())}
        if self.default is not None:
            out["default"] = list(self.default)
        return out

    def save(self, path: str | os.PathLike) -> None:
        with atomic_file(path) as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> ExpertProfile:
        data, src = _read_json(path, "expert profile")
        return cls._from(data, src)

    @classmethod
    def from_text(cls, text: str, name: str = "<profile>") -> ExpertProfile:
        data, src = _parse_json(text, name, "expert profile")
        return cls._from(data, src)

    @classmethod
    def _from(cls, data: dict, src: _Src) -> ExpertProfile:
        _check_format(data, src, PROFILE_FORMAT)
        known = {"format", "name", "experts", "top_k", "layers", "default"}
        for k in data:
            if k not in known:
                raise src.err(f"unknown profile key '{k}', expected one of {', '.join(sorted(known))}", k)
        experts = data.get("experts")
        if experts is not None and (not isinstance(experts, int) or isinstance(experts, bool)
                                    or experts < 1):
            raise src.err(f"experts must be a positive integer, got {experts!r}", "experts")
        top_k = data.get("top_k")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or top_k < 1):
            raise src.err(f"top_k must be a positive integer, got {top_k!r}", "top_k")

        def loads_of(entry: Any, keys: tuple[str, ...], label: str) -> tuple[float, ...]:
            if not isinstance(entry, list) or not entry:
                raise src.err(f"{label} must be a non-empty list of per-expert loads", *keys)
            for i, x in enumerate(entry):
                if not _is_num(x) or x < 0:
                    raise src.err(f"{label}: load of expert {i} must be a non-negative number, "
                                  f"got {json.dumps(x)}", *keys)
            if experts is not None and len(entry) != experts:
                raise src.err(f"{label} lists {len(entry)} experts, the profile declares "
                              f"\"experts\": {experts}", *keys)
            return tuple(float(x) for x in entry)

        layers: dict[int, tuple[float, ...]] = {}
        locs: dict[int, Loc] = {}
        for layer, (entry, keys) in _layer_table(data, src, "an expert profile").items():
            layers[layer] = loads_of(entry, keys, f"layer {layer}")
            locs[layer] = src.loc(*keys)
        locs[-1] = src.loc("layers")
        default = loads_of(data["default"], ("default",), "default") if "default" in data else None
        counts = {len(v) for v in layers.values()} | ({len(default)} if default else set())
        if len(counts) > 1:
            raise src.err(f"layers list different expert counts {sorted(counts)}", "layers")
        n = experts if experts is not None else (counts.pop() if counts else 0)
        if n == 0:
            raise src.err("the profile lists no layers", "layers")
        return cls(n, layers, default, top_k, str(data.get("name", "")), src.name, locs)

    @classmethod
    def from_counts(cls, counts: Sequence[Sequence[float]] | Mapping[int, Sequence[float]],
                    layers: Sequence[int] | None = None, *, top_k: int | None = None,
                    name: str = "measured") -> ExpertProfile:
        """A profile from per-layer expert token counts: rows of a (layers, experts)
        array (e.g. `reference.expert_load`), or {layer: counts}; `layers`
        keeps only those rows (the MoE layers of a model with dense ones)."""
        table = dict(counts.items()) if isinstance(counts, Mapping) else dict(enumerate(counts))
        keep = table if layers is None else {i: table[i] for i in layers}
        rows = {int(i): tuple(float(x) for x in v) for i, v in keep.items()}
        sizes = {len(v) for v in rows.values()}
        if len(sizes) != 1:
            raise ValueError(f"counts list different expert counts {sorted(sizes)}")
        return cls(sizes.pop(), rows, None, top_k, name)

    @classmethod
    def measure(cls, model, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                include_prefill: bool = False, name: str = "measured") -> ExpertProfile:
        """Run a workload through the NumPy reference (`reference.ReferenceModel`)
        and count its routing: the profile of *that* model on *that* workload."""
        from meshrt.runtime.reference import expert_load

        counts = expert_load(model, prompts, max_new_tokens, include_prefill=include_prefill)
        return cls.from_counts(counts.tolist(), top_k=model.shape.top_k, name=name)

    # -- synthetic -------------------------------------------------------
    @classmethod
    def zipf(cls, experts: int, layers: Sequence[int], *, s: float = 1.0, seed: int = 0,
             tokens: float = 1.0, name: str = "", top_k: int | None = None) -> ExpertProfile:
        """Zipf(s) loads, hot experts at seeded random positions per layer.

        Expert popularity in MoE routing is heavy-tailed and differs per
        layer; s = 0 is uniform routing, s ~ 1 a typical skew. `tokens` scales
        the loads (they sum to `tokens` in each layer).
        """
        rng = random.Random(seed)
        weights = [1.0 / (i + 1) ** s for i in range(experts)]
        total = sum(weights)
        out = {}
        for layer in layers:
            perm = list(range(experts))
            rng.shuffle(perm)
            loads = [0.0] * experts
            for rank, e in enumerate(perm):
                loads[e] = tokens * weights[rank] / total
            out[layer] = tuple(loads)
        return cls(experts, out, None, top_k, name or f"zipf{s:g}")

    @classmethod
    def uniform(cls, experts: int, layers: Sequence[int], tokens: float = 1.0) -> ExpertProfile:
        return cls(experts, {layer: (tokens / experts,) * experts for layer in layers}, None, None,
                   "uniform")


def chat_routing(experts: int, layers: Sequence[int], seed: int = 0) -> ExpertProfile:
    """Synthetic chat-like routing: moderate skew (Zipf 0.6).

    Not measured from any model: it stands in for the routing of short,
    general chat turns, whose hot experts differ from reasoning traces'.
    """
    return ExpertProfile.zipf(experts, layers, s=0.6, seed=seed, name="chat-like")


def reasoning_routing(experts: int, layers: Sequence[int], seed: int = 1) -> ExpertProfile:
    """Synthetic reasoning-like routing: stronger skew (Zipf 1.0) on other experts."""
    return ExpertProfile.zipf(experts, layers, s=1.0, seed=seed + 7919, name="reasoning-like")


def sample_counts(shares: Sequence[float], tokens: int, top_k: int, rng: random.Random) -> list[int]:
    """Per-expert token counts of one decode step: each of `tokens` tokens picks
    `top_k` distinct experts with probability proportional to `shares`
    (sequential sampling without replacement, what a top-k router does to a
    token whose logits follow the profile)."""
    n = len(shares)
    k = min(top_k, n)
    counts = [0] * n
    for _ in range(tokens):
        avail = list(range(n))
        w = [max(shares[e], 1e-12) for e in avail]
        for _ in range(k):
            pick = rng.choices(range(len(avail)), weights=w)[0]
            counts[avail[pick]] += 1
            del avail[pick], w[pick]
    return counts


# ---------------------------------------------------------------------------
# Per-region performance models
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RegionModel:
    """Predicted time of one expert region: `a + b * tokens` (see the module docstring)."""

    a: float
    b: float

    def time(self, tokens: float) -> float:
        return self.a + self.b * tokens


def region_slowdowns(regions: int, spread: float, seed: int = 0) -> list[float]:
    """Per-region slowdown factors evenly spaced over [1, 1 + spread], in seeded order.

    Evenly spaced (not drawn) so that `spread` is exactly the ratio of the
    slowest region's cycle costs to the fastest's: "3 % spread" means that,
    whatever the seed; the seed only decides which region is which.
    """
    if regions <= 1 or spread == 0:
        return [1.0] * regions
    factors = [1.0 + spread * i / (regions - 1) for i in range(regions)]
    random.Random(seed).shuffle(factors)
    return factors


@dataclass(frozen=True)
class RegionModels:
    """Per layer, one `RegionModel` per expert region."""

    layers: Mapping[int, tuple[RegionModel, ...]]
    default: tuple[RegionModel, ...] | None = None
    unit: str = "cycles"
    tokens_per_step: float | None = None
    fit: Mapping[str, Any] = field(default_factory=dict, compare=False)
    source: str = field(default="", compare=False)
    locs: Mapping[int, Loc] = field(default_factory=dict, compare=False, repr=False)

    def has(self, layer: int) -> bool:
        return layer in self.layers or self.default is not None

    def for_layer(self, layer: int) -> tuple[RegionModel, ...]:
        if layer in self.layers:
            return self.layers[layer]
        if self.default is not None:
            return self.default
        raise KeyError(layer)

    def where(self, layer: int) -> Loc:
        return self.locs.get(layer) or Loc(self.source or "<models>")

    @classmethod
    def uniform(cls, regions: int, a: float = 0.0, b: float = 1.0) -> RegionModels:
        """Every region alike: placement by time is placement by tokens."""
        return cls({}, (RegionModel(a, b),) * regions, unit="relative")

    @classmethod
    def from_speeds(cls, slowdowns: Mapping[int, Sequence[float]] | Sequence[float],
                    a: float = 0.0, b: float = 1.0, unit: str = "relative") -> RegionModels:
        """Region r takes `slowdown[r] * (a + b * tokens)`: a region of uniformly slower cores.

        `slowdowns` is one list for every layer, or {layer: list}.
        """
        if isinstance(slowdowns, Mapping):
            return cls({k: tuple(RegionModel(a * f, b * f) for f in v) for k, v in slowdowns.items()},
                       unit=unit)
        return cls({}, tuple(RegionModel(a * f, b * f) for f in slowdowns), unit=unit)

    # -- JSON ------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        def enc(ms):
            return [{"a": round(m.a, 6), "b": round(m.b, 6)} for m in ms]

        out: dict[str, Any] = {"format": MODELS_FORMAT, "unit": self.unit}
        if self.tokens_per_step is not None:
            out["tokens_per_step"] = self.tokens_per_step
        out["layers"] = {str(k): enc(v) for k, v in sorted(self.layers.items())}
        if self.default is not None:
            out["default"] = enc(self.default)
        if self.fit:
            out["fit"] = dict(self.fit)
        return out

    def save(self, path: str | os.PathLike) -> None:
        with atomic_file(path) as f:
            json.dump(self.to_json(), f, indent=1)
            f.write("\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> RegionModels:
        data, src = _read_json(path, "region models")
        return cls._from(data, src)

    @classmethod
    def from_text(cls, text: str, name: str = "<models>") -> RegionModels:
        data, src = _parse_json(text, name, "region models")
        return cls._from(data, src)

    @classmethod
    def _from(cls, data: dict, src: _Src) -> RegionModels:
        _check_format(data, src, MODELS_FORMAT)
        known = {"format", "unit", "tokens_per_step", "layers", "default", "fit"}
        for k in data:
            if k not in known:
                raise src.err(f"unknown region-models key '{k}', expected one of "
                              f"{', '.join(sorted(known))}", k)
        unit = data.get("unit", "cycles")
        if not isinstance(unit, str):
            raise src.err("unit must be a string", "unit")
        tps = data.get("tokens_per_step")
        if tps is not None and (not _is_num(tps) or tps <= 0):
            raise src.err(f"tokens_per_step must be a positive number, got {json.dumps(tps)}",
                          "tokens_per_step")

        def models_of(entry: Any, keys: tuple[str, ...], label: str) -> tuple[RegionModel, ...]:
            if not isinstance(entry, list) or not entry:
                raise src.err(f"{label} must be a non-empty list of {{\"a\": .., \"b\": ..}}, "
                              "one per expert region", *keys)
            out = []
            for r, m in enumerate(entry):
                if not isinstance(m, dict) or set(m) != {"a", "b"}:
                    raise src.err(f"{label}: region {r} must be {{\"a\": A, \"b\": B}}, got "
                                  f"{json.dumps(m)}", *keys)
                if not (_is_num(m["a"]) and _is_num(m["b"])) or m["a"] < 0 or m["b"] < 0:
                    raise src.err(f"{label}: region {r} needs non-negative numbers a and b, got "
                                  f"{json.dumps(m)}", *keys)
                out.append(RegionModel(float(m["a"]), float(m["b"])))
            return tuple(out)

        layers, locs = {}, {}
        for layer, (entry, keys) in _layer_table(data, src, "a region-models file").items():
            layers[layer] = models_of(entry, keys, f"layer {layer}")
            locs[layer] = src.loc(*keys)
        locs[-1] = src.loc("layers")
        default = models_of(data["default"], ("default",), "default") if "default" in data else None
        fit = data.get("fit", {})
        if not isinstance(fit, dict):
            raise src.err("fit must be an object", "fit")
        return cls(layers, default, unit, float(tps) if tps is not None else None, fit, src.name, locs)
