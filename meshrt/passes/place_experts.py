"""`place-experts`: assign each MoE layer's experts to its expert regions.

    place-experts{policy=contiguous}
    place-experts{policy=eplb profile="P.json"}
    place-experts{policy=vibe profile="P.json" models="M.json"}
    place-experts{policy=vibe profile="P.json" spread=0.07 seed=3}

Why a pass: the slowest expert region sets a MoE layer's time, and which
region holds which expert is a mapping decision the compiler owns. The
result is the `placement` array of `graph.moe_experts` (before
lower-to-mesh-kernels, where DESIGN.md puts it) or of
`mesh_kernel.expert_ffn` (after it): lowering carries it on, the kernel
roles size each region's weights from it (experts per region), and it is
what the runtime's dispatch resolves expert -> region with. The policies
are in `meshrt.expert_placement`, profiles and region models (and their
JSON formats) in `meshrt.runtime.expert_profile`.

Options:
- `policy`: contiguous (the mapper's default), eplb (token balance), vibe
  (predicted-time balance). eplb and vibe need `profile`.
- `profile`: expert-activation profile JSON; its per-layer loads are used
  as shares of the layer's tokens.
- `models`: region-models JSON (fitted by `meshrt.runtime.region_timing`);
  or `spread=S` for synthetic ones: region slowdowns evenly spaced over
  [1, 1 + S] in an order drawn from `seed` and the layer (spread=0: all
  regions alike, and vibe gives eplb's placement). vibe needs one of them.
- `tokens`: token-expert assignments per decode step and layer, which turns
  shares into loads in the models' token unit. Default: the models file's
  `tokens_per_step`, else micro-batch x top-k.
- `refine=false`: greedy placement without the swap search (eplb is then
  DeepSeek EPLB's balanced packing exactly).

Replication of hot experts (EPLB's redundant experts) is not offered: the
IR's `placement` maps each expert to one region, the mapper sizes every
region for exactly experts/regions experts (no spare slots), and dispatch
would have to split a replicated expert's tokens between copies. The
algorithm exists (`expert_placement.eplb(slots=...)`) for studies.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import DenseArrayBase, ModuleOp, StringAttr, i64
from xdsl.ir import Operation
from xdsl.passes import ModulePass

from meshrt.diagnostics import MeshrtError
from meshrt.dialects import graph
from meshrt.dialects import mesh_kernel as mk
from meshrt.dialects.base import MappedProgramOp, body_ops, int_value, require_programs
from meshrt.dialects.mesh import CoreSetAttr
from meshrt.expert_placement import POLICIES, Placement, place
from meshrt.frontend.errors import FrontendError
from meshrt.runtime.expert_profile import ExpertProfile, RegionModels, region_slowdowns
from meshrt.shape import HParams


@dataclass(frozen=True)
class MoESite:
    """One MoE layer's expert op, whichever level it is at."""

    op: graph.MoEExpertsOp | mk.KernelOp  # a mesh kernel that PLACES_EXPERTS
    program: MappedProgramOp
    layer: int
    experts: int
    top_k: int
    regions: tuple[CoreSetAttr, ...]  # routed-expert regions (shared experts' excluded)

    @property
    def name(self) -> str:
        return self.op.kernel_name

    @property
    def placement(self) -> Placement:
        return Placement(self.op.expert_placement, len(self.regions))

    @property
    def micro_batch(self) -> int:
        return self.program.rows

    @property
    def wafer(self) -> int:
        return self.op.wafer_index

    def rects(self) -> list[tuple[int, int, int, int]]:
        """(x, y, w, h) of each routed region (dense rectangles, as the mapper makes them)."""
        out = []
        for cs in self.regions:
            r = cs.rects.data[0]
            out.append((r.x.data, r.y.data, r.w.data, r.h.data))
        return out

    def expert_bytes(self) -> int:
        """Weight bytes of one expert (gate+up and down projections)."""
        hidden = self.op.input.type.width.data
        f = int_value(self.op.expert_ffn)
        dtype = HParams.of(self.program).expert_dtype_bytes
        return int(3 * hidden * f * dtype)

    def set_placement(self, p: Placement, policy: str | None = None) -> None:
        if not p.expressible:
            raise MeshrtError("a placement with replicated experts cannot be written to the IR",
                              self.op)
        self.op.properties["placement"] = DenseArrayBase.from_list(i64, list(p.region_of))
        if policy is not None and isinstance(self.op, graph.MoEExpertsOp):
            self.op.properties["placement_policy"] = StringAttr(policy)


def moe_sites(module: Operation) -> list[MoESite]:
    """Every MoE layer of the graph / mesh_kernel programs in `module`, in program order."""
    out = []
    for program in body_ops(module.regions[0]):
        if not isinstance(program, graph.ModelOp | mk.ProgramOp):
            continue
        for op in body_ops(program.body):
            if isinstance(op, graph.MoEExpertsOp):
                shared = int_value(op.shared_experts)
            elif isinstance(op, mk.KernelOp) and op.PLACES_EXPERTS:
                shared = HParams.of(program).int("shared_experts")
            else:
                continue
            rt = op.routing.type
            regions = tuple(op.expert_regions.data)
            routed = regions[: len(regions) - shared] if shared else regions
            out.append(MoESite(op, program, op.layer_index, rt.experts.data, rt.top_k.data, routed))
    return out


@dataclass(frozen=True)
class PlaceExperts(ModulePass):
    """Write each MoE layer's expert placement (see the module docstring)."""

    name = "place-experts"

    policy: str = "contiguous"
    profile: str | None = None
    models: str | None = None
    spread: float | int | None = None
    seed: int = 0
    tokens: float | int | None = None
    refine: bool = True

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        anchor = require_programs(op, self.name, graph.ModelOp, mk.ProgramOp)[0]
        self._check_options(anchor)
        profile = self._load(ExpertProfile.load, self.profile) if self.profile else None
        models = self._load(RegionModels.load, self.models) if self.models else None
        for site in moe_sites(op):
            site.set_placement(self.placement_for(site, profile, models), self.policy)

    def _check_options(self, anchor: Operation) -> None:
        def bad(msg: str) -> MeshrtError:
            return MeshrtError(f"place-experts: {msg}", anchor)

        if self.policy not in POLICIES:
            raise MeshrtError(f"pass 'place-experts': option 'policy': unknown policy "
                              f"'{self.policy}', expected one of {', '.join(POLICIES)}", anchor)
        if self.policy != "contiguous" and not self.profile:
            raise bad(f"policy={self.policy} needs profile=\"FILE\" (an expert-activation profile)")
        if self.policy == "vibe" and self.models is None and self.spread is None:
            raise bad("policy=vibe needs region models: models=\"FILE\", or spread=S for "
                      "synthetic region speeds (spread=0: all regions alike)")
        if self.models is not None and self.spread is not None:
            raise bad("give models=\"FILE\" or spread=S, not both")
        if self.spread is not None and not 0 <= self.spread < 10:
            raise MeshrtError(f"pass 'place-experts': option 'spread': must be in [0, 10), "
                              f"got {self.spread}", anchor)
        if self.tokens is not None and self.tokens <= 0:
            raise MeshrtError(f"pass 'place-experts': option 'tokens': must be > 0, "
                              f"got {self.tokens}", anchor)

    @staticmethod
    def _load(loader, path: str):
        try:
            return loader(path)
        except FrontendError as e:
            raise MeshrtError.located(str(e)) from None

    def placement_for(self, site: MoESite, profile: ExpertProfile | None,
                      models: RegionModels | None) -> Placement:
        R = len(site.regions)
        if site.experts % R:
            raise MeshrtError(f"place-experts: {site.experts} experts cannot be spread evenly "
                              f"over {R} expert regions", site.op)
        if self.policy == "contiguous":
            return place("contiguous", [0.0] * site.experts, R)
        assert profile is not None
        if not profile.has(site.layer):
            raise MeshrtError.located(str(FrontendError(
                f"the profile has no entry for MoE layer {site.layer} (@{site.name}) and no "
                "\"default\"", profile.where(-1))))
        shares = profile.shares(site.layer)
        if len(shares) != site.experts:
            raise MeshrtError.located(str(FrontendError(
                f"layer {site.layer} lists {len(shares)} experts, but @{site.name} routes among "
                f"{site.experts}", profile.where(site.layer))))
        total = self.tokens or (models.tokens_per_step if models else None) \
            or site.micro_batch * site.top_k
        tokens = [s * total for s in shares]
        region_models = None
        if self.policy == "vibe":
            if models is not None:
                if not models.has(site.layer):
                    raise MeshrtError.located(str(FrontendError(
                        f"the region models have no entry for MoE layer {site.layer} "
                        f"(@{site.name}) and no \"default\"", models.where(-1))))
                region_models = models.for_layer(site.layer)
                if len(region_models) != R:
                    raise MeshrtError.located(str(FrontendError(
                        f"layer {site.layer} has {len(region_models)} region models, but "
                        f"@{site.name} has {R} expert regions", models.where(site.layer))))
            else:
                slow = region_slowdowns(R, float(self.spread or 0), self.seed * 7919 + site.layer)
                region_models = RegionModels.from_speeds(slow).for_layer(site.layer)
        return place(self.policy, tokens, R, region_models, refine=self.refine)
