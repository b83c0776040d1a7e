"""What the frontend knows about a model: its shape, dynamism and mapping choices.

`ModelSpec` (with its `ModelShape`, from meshrt.shape) is built by the `.mrt`
parser (spec.py) and the Hugging Face importer (hf_config.py) and consumed by
the default mapper. Construction validates it: an impossible number raises a
FrontendError located at the field that holds it (`locs` maps field names to
positions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from meshrt.dialects.mesh import DYNAMISM_KINDS
from meshrt.frontend.errors import FrontendError, Loc
from meshrt.shape import DEFAULT_MAX_SEQ, ModelShape, field_loc

SCALES = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
"""Widths the default layout's widening units are tried at, times their least width, where the
wafers have room (`mapping { width_scale = ... }` pins one)."""


__all__ = ["DEFAULT_DYNAMISM", "DEFAULT_MAX_SEQ", "SUPPORTED_DYNAMISM", "MappingSpec", "ModelShape",
           "ModelSpec", "RectChoice"]

DEFAULT_DYNAMISM = ("continuous_batching", "micro_batch_pipeline")
# Dynamism kinds a kernel of the graph dialect can produce today.
SUPPORTED_DYNAMISM = ("continuous_batching", "moe_routing", "micro_batch_pipeline",
                      "expert_rebalance")


@dataclass(frozen=True)
class RectChoice:
    """An explicit rectangle of cores (x, y, w, h) on one wafer."""

    x: int
    y: int
    w: int
    h: int
    wafer: int = 0
    loc: Loc | None = field(default=None, compare=False)

    @property
    def tuple(self) -> tuple[int, int, int, int]:
        return self.x, self.y, self.w, self.h

    def overlaps(self, o: RectChoice) -> bool:
        return (self.wafer == o.wafer and self.x < o.x + o.w and o.x < self.x + self.w
                and self.y < o.y + o.h and o.y < self.y + self.h)

    def __str__(self) -> str:
        return f"({self.x}, {self.y}, {self.w}, {self.h})"


@dataclass(frozen=True)
class MappingSpec:
    """Mapping choices that override the default mapper.

    `layers[i]` is layer i's block (all its kernels); `experts[i]` its expert
    regions (one per expert, or per group of experts/len consecutive
    experts). Explicit blocks are all-or-nothing: with any layer given, every
    layer and the embed and lm_head blocks must be given.
    """

    stages: int | None = None
    experts_per_region: int | None = None
    placement: str = "contiguous"
    block_height: int | None = None  # the default layout's row height (None: the mapper's choice)
    # how much wider than their least width the default layout's widening units are
    # (None: the mapper's choice among SCALES)
    width_scale: float | None = None
    layers: Mapping[int, RectChoice] = field(default_factory=dict, hash=False)
    experts: Mapping[int, tuple[RectChoice, ...]] = field(default_factory=dict, hash=False)
    embed: RectChoice | None = None
    lm_head: RectChoice | None = None
    locs: Mapping[str, Loc] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @property
    def explicit(self) -> bool:
        return bool(self.layers or self.embed or self.lm_head)


@dataclass(frozen=True)
class ModelSpec:
    """A model plus the runtime behaviour and mapping asked for."""

    shape: ModelShape
    dynamism: tuple[str, ...] = DEFAULT_DYNAMISM
    micro_batch: int = 1
    wafers: int | None = None  # None: as many as the model needs
    mapping: MappingSpec = field(default_factory=MappingSpec)
    # the positions the model was trained for (a config's max_position_embeddings), None:
    # not given; the most a `--context` may ask
    max_positions: int | None = None
    source: str = field(default="<model>", compare=False)
    locs: Mapping[str, Loc] = field(default_factory=dict, compare=False, hash=False, repr=False)

    def __post_init__(self) -> None:
        def err(key: str, msg: str, item: int | None = None) -> FrontendError:
            loc = self.locs.get(f"{key}[{item}]") if item is not None else None
            return FrontendError(msg, loc or field_loc(self.locs, key, self.source))

        for i, kind in enumerate(self.dynamism):
            if kind not in DYNAMISM_KINDS:
                raise err("dynamism", f"unknown dynamism '{kind}', expected one of "
                          + ", ".join(SUPPORTED_DYNAMISM), i)
            if kind not in SUPPORTED_DYNAMISM:
                raise err("dynamism", f"dynamism '{kind}' is not supported by the frontend yet", i)
            if kind in ("moe_routing", "expert_rebalance") and not self.shape.is_moe:
                raise err("dynamism", f"dynamism '{kind}' needs an MoE model (experts > 0)", i)
            if kind in self.dynamism[:i]:
                raise err("dynamism", f"dynamism lists '{kind}' twice", i)
        if self.micro_batch < 1:
            raise err("micro_batch", f"micro_batch must be at least 1, got {self.micro_batch}")
        if self.wafers is not None and self.wafers < 1:
            raise err("wafers", f"wafers must be at least 1, got {self.wafers}")
        self._check_mapping()

    @property
    def pipelined(self) -> bool:
        return "micro_batch_pipeline" in self.dynamism

    def _check_mapping(self) -> None:
        m, s = self.mapping, self.shape

        def err(key: str, msg: str, loc: Loc | None = None) -> FrontendError:
            return FrontendError(msg, loc or field_loc(m.locs, key, self.source))

        if m.stages is not None and m.stages < 1:
            raise err("stages", f"stages must be at least 1, got {m.stages}")
        if m.block_height is not None:
            if m.block_height < 1:
                raise err("block_height", f"block_height must be at least 1, got {m.block_height}")
            if m.explicit:
                raise err("block_height", "block_height applies to the default layout, not to "
                          "explicit regions")
        if m.width_scale is not None:
            if m.width_scale not in SCALES:
                raise err("width_scale", f"width_scale must be one of "
                          f"{', '.join(f'{x:g}' for x in SCALES)}, got {m.width_scale:g}")
            if m.explicit:
                raise err("width_scale", "width_scale applies to the default layout, not to "
                          "explicit regions")
        if m.placement != "contiguous":
            raise err("placement", f"unknown expert placement '{m.placement}' for the frontend, "
                      "expected contiguous (eplb and vibe are the place-experts pass)")
        if m.experts_per_region is not None:
            if not s.is_moe:
                raise err("experts_per_region", "experts_per_region needs an MoE model")
            if m.experts_per_region < 1 or s.experts % m.experts_per_region:
                raise err("experts_per_region",
                          f"experts_per_region {m.experts_per_region} must divide the expert "
                          f"count {s.experts}")
        for i, r in list(m.layers.items()) + [(i, r) for i, rs in m.experts.items() for r in rs]:
            if not 0 <= i < s.layers:
                raise err("", f"layer {i} does not exist (the model has layers 0..{s.layers - 1})",
                          r.loc)
        for r in self._rects():
            if r.w < 1 or r.h < 1:
                raise err("", f"region {r} is empty: width and height must be at least 1", r.loc)
            if r.x < 0 or r.y < 0:
                raise err("", f"region {r} has a negative origin", r.loc)
            if self.wafers is not None and r.wafer >= self.wafers:
                raise err("", f"region {r} is on wafer {r.wafer}, but only {self.wafers} "
                          f"wafer(s) are available", r.loc)
        for i, rs in m.experts.items():
            if not s.is_moe_layer(i):
                raise err("", f"layer {i} is dense and has no experts", rs[0].loc)
            n = len(rs) - s.shared_experts
            if n < 1 or s.experts % n:
                raise err("", f"layer {i} lists {len(rs)} expert regions; expected the number of "
                          f"expert regions (a divisor of {s.experts}) plus {s.shared_experts} "
                          "shared-expert region(s)", rs[0].loc)
            if i not in m.layers:
                raise err("", f"layer {i} has explicit expert regions but no explicit region",
                          rs[0].loc)
            # one kernel runs them: a shape's regions share roles, and every region's rows
            # hold the same slices of the output (meshrt.kernels.expert_ffn)
            for what, part in (("routed", rs[:n]), ("shared-expert", rs[n:])):
                odd = next((r for r in part if (r.w, r.h) != (part[0].w, part[0].h)), None)
                if odd is not None:
                    raise err("", f"layer {i}: {what} region {odd} is {odd.w} x {odd.h}, but "
                              f"{part[0]} is {part[0].w} x {part[0].h}; the {what} regions of "
                              "a layer share one shape", odd.loc)
            odd = next((r for r in rs if r.h != rs[0].h), None)
            if odd is not None:
                raise err("", f"layer {i}: expert region {odd} is {odd.h} rows high, but "
                          f"{rs[0]} is {rs[0].h}; a layer's expert regions share one height "
                          "(their rows hold the same slices of the output)", odd.loc)
        if m.explicit:
            missing = [f"layer {i}" for i in range(s.layers) if i not in m.layers]
            missing += [k for k in ("embed", "lm_head") if getattr(m, k) is None]
            if missing:
                raise err("mapping", "an explicit mapping must place every block; missing "
                          + ", ".join(missing[:4]) + (" ..." if len(missing) > 4 else ""))
        rects = list(self._rects())
        for a_i, a in enumerate(rects):
            for b in rects[a_i + 1:]:
                if a.overlaps(b):
                    raise err("", f"region {b} overlaps region {a} (line {a.loc.line if a.loc else '?'})"
                              " on the same wafer", b.loc)

    def _rects(self):
        m = self.mapping
        yield from (r for r in (m.embed,) if r is not None)
        for i in sorted(m.layers):
            yield m.layers[i]
            yield from m.experts.get(i, ())
        yield from (r for r in (m.lm_head,) if r is not None)
