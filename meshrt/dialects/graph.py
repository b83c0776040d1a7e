"""The `graph` dialect: the mapped computation graph G = (K, E) with M = {R_k}.

One op per logical kernel instance. SSA values are the edges E; every kernel
op carries its mapping R_k as `region` (a `#mesh.cores` set), and the layer,
pipeline stage and wafer it belongs to. `graph.model` holds the model's
hyper-parameters, the target's mesh size and the dynamism to handle.

One decode step is one pass over the block; the loop from `graph.sample`
back to `graph.embed` (the next step's tokens) is implicit: it is the edge
the continuous-batching payload rides on.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import (
    I64,
    ArrayAttr,
    DenseArrayBase,
    IntAttr,
    IntegerAttr,
    StringAttr,
    UnitAttr,
    i64,
)
from xdsl.ir import (
    Attribute,
    Dialect,
    Operation,
    ParametrizedAttribute,
    TypeAttribute,
)
from xdsl.irdl import (
    VarConstraint,
    base,
    irdl_attr_definition,
    irdl_op_definition,
    operand_def,
    opt_prop_def,
    prop_def,
    result_def,
)
from xdsl.parser import AttrParser
from xdsl.printer import Printer
from xdsl.utils.exceptions import VerifyException

from meshrt.dialects.base import (
    MappedKernelOp,
    MappedProgramOp,
    body_ops,
    enclosing_program,
    int_value,
    topological_order,
)
from meshrt.dialects.mesh import CoreSetAttr

# ---------------------------------------------------------------------------
# Types
# ---------------------------------------------------------------------------


@irdl_attr_definition
class ActType(ParametrizedAttribute, TypeAttribute):
    """Activations of one micro-batch: one row of `width` elements per slot."""

    name = "graph.act"

    width: IntAttr

    def __init__(self, width: int):
        super().__init__(IntAttr(width))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            return [IntAttr(parser.parse_integer(allow_boolean=False))]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.width.data}>")

    def verify(self) -> None:
        if self.width.data <= 0:
            raise VerifyException(f"activation width must be > 0, got {self.width.data}")


@irdl_attr_definition
class RoutingType(ParametrizedAttribute, TypeAttribute):
    """Per-token top-k expert selection over `experts` experts."""

    name = "graph.routing"

    experts: IntAttr
    top_k: IntAttr

    def __init__(self, experts: int, top_k: int):
        super().__init__(IntAttr(experts), IntAttr(top_k))

    @classmethod
    def parse_parameters(cls, parser: AttrParser) -> list[Attribute]:
        with parser.in_angle_brackets():
            e = parser.parse_integer(allow_boolean=False)
            parser.parse_punctuation(",")
            k = parser.parse_integer(allow_boolean=False)
        return [IntAttr(e), IntAttr(k)]

    def print_parameters(self, printer: Printer) -> None:
        printer.print_string(f"<{self.experts.data}, {self.top_k.data}>")

    def verify(self) -> None:
        e, k = self.experts.data, self.top_k.data
        if not 0 < k <= e:
            raise VerifyException(f"top-k {k} must be in 1..{e} (the expert count)")


@irdl_attr_definition
class TokensType(ParametrizedAttribute, TypeAttribute):
    """One sampled token id per batch slot (plus the slot's status)."""

    name = "graph.tokens"


# ---------------------------------------------------------------------------
# The model container and kernel base
# ---------------------------------------------------------------------------


@irdl_op_definition
class ModelOp(MappedProgramOp):
    """A model mapped onto one target: hyper-parameters, mesh, dynamism."""

    name = "graph.model"

    def kernels(self) -> list[KernelOp]:
        return [op for op in body_ops(self.body) if isinstance(op, KernelOp)]

    def verify_body(self) -> None:
        for op in body_ops(self.body):
            if not isinstance(op, KernelOp):
                raise VerifyException(
                    f"model @{self.program_name} may only hold graph kernels, found '{op.name}'"
                )
        # Every dynamism kind needs a kernel that produces it (DESIGN, Passes 1).
        producers = {"continuous_batching": SampleOp, "moe_routing": GateTopKOp}
        kernels = self.kernels()
        for kind in self.dynamism_kinds:
            want = producers.get(kind)
            if want is not None and not any(isinstance(k, want) for k in kernels):
                raise VerifyException(
                    f"model @{self.program_name} enables dynamism '{kind}' but no kernel "
                    f"produces it (needs a '{want.name}')"
                )


class KernelOp(MappedKernelOp):
    """A graph-level kernel instance."""


def weights_prop(fmt: str | None, decoded: bool = False) -> dict[str, Attribute]:
    """The optional `weights` property of a kernel whose matrices are stored quantized
    (`meshrt.quant.FORMATS`), and `decoded` when its cores hold them decoded; none for
    plain floats."""
    if not fmt:
        return {}
    return {"weights": StringAttr(fmt)} | ({"decoded": UnitAttr()} if decoded else {})


def verify_weights(op: Operation) -> None:
    """A `weights` property names a format `meshrt.quant` knows; `decoded` needs one."""
    from meshrt.quant import FORMATS

    fmt = getattr(op, "weights", None)
    if fmt is not None and fmt.data not in FORMATS:
        raise VerifyException(f"kernel @{op.kernel_name}: weights '{fmt.data}' is not a stored "
                              f"format (one of {', '.join(FORMATS)})")
    if getattr(op, "decoded", None) is not None and fmt is None:
        raise VerifyException(f"kernel @{op.kernel_name}: decoded needs the stored format "
                              "(weights) it decodes")


_int = int_value


def _width(v) -> int:
    t = v.type
    return t.width.data if isinstance(t, ActType) else -1


def _expect_width(op: KernelOp, what: str, got: int, want: int) -> None:
    if got != want:
        raise VerifyException(f"kernel @{op.kernel_name}: {what} has width {got}, expected {want}")


_UNARY = "$sym_name `(` $input `)` `on` $region attr-dict `:` type($input) `->` type($output)"


@irdl_op_definition
class EmbedOp(KernelOp):
    """Token embedding lookup for the step's tokens."""

    name = "graph.embed"
    vocab = prop_def(IntegerAttr[I64])
    output = result_def(ActType)
    assembly_format = "$sym_name `on` $region attr-dict `:` type($output)"

    def __init__(self, name, region, *, layer, stage, wafer, vocab: int, hidden: int):
        props = self.common_props(name, region, layer, stage, wafer)
        props["vocab"] = IntegerAttr(vocab, i64)
        super().__init__(properties=props, result_types=[ActType(hidden)])

    def verify_kernel(self) -> None:
        if _int(self.vocab) <= 0:
            raise VerifyException(f"kernel @{self.kernel_name}: vocab must be > 0")


@irdl_op_definition
class RMSNormOp(KernelOp):
    name = "graph.rmsnorm"
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, *, layer, stage, wafer):
        super().__init__(
            operands=[input],
            properties=self.common_props(name, region, layer, stage, wafer),
            result_types=[input.type],
        )

    def verify_kernel(self) -> None:
        _expect_width(self, "output", _width(self.output), _width(self.input))


@irdl_op_definition
class MatmulOp(KernelOp):
    """y = x W, W of shape (in, out) given by the operand and result types."""

    name = "graph.matmul"
    weights = opt_prop_def(StringAttr)  # the stored format of W (`meshrt.quant`); none: floats
    bias = opt_prop_def(UnitAttr)  # y = x W + b: the model has a bias for this projection
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, out_features: int, *, layer, stage, wafer,
                 weights: str | None = None, bias: bool = False):
        super().__init__(
            operands=[input],
            properties=self.common_props(name, region, layer, stage, wafer) | weights_prop(weights)
            | ({"bias": UnitAttr()} if bias else {}),
            result_types=[ActType(out_features)],
        )

    def verify_kernel(self) -> None:
        verify_weights(self)


def spill_problem(region: CoreSetAttr, spill: CoreSetAttr, spill_from: int, max_seq: int) -> str | None:
    """Why an attention on `region` (one dense rectangle) cannot keep ring entries
    spill_from.. of its max_seq on the tiles of `spill` (dense rectangles of the
    region's shape, apart from it and from each other, no more than the entries), or None."""
    rects = [*region.rects.data, *spill.rects.data]
    if len(region.rects.data) != 1 or not all(r.is_unit_step() for r in rects):
        return f"region {region} must be one dense rectangle and spill {spill} dense ones"
    shape = rects[0].tuple[2:4]
    for i, r in enumerate(rects[1:]):
        if r.tuple[2:4] != shape:
            return f"spill tile {r} must have the shape of the region {region}"
        for o in rects[:i + 1]:
            if CoreSetAttr([o]).overlaps(CoreSetAttr([r])):
                return f"spill tile {r} overlaps {o}"
    if not 0 < spill_from < max_seq:
        return f"spill_from {spill_from} must be in 1..{max_seq - 1} (max_seq {max_seq})"
    if len(rects) - 1 > max_seq - spill_from:
        return f"{len(rects) - 1} spill tiles for {max_seq - spill_from} spilled entries"
    return None


@irdl_op_definition
class AttentionOp(KernelOp):
    """Decode attention over a per-slot KV cache of `max_seq` entries: every position of a
    request, or on a sliding-window layer a ring of its last window ones."""

    name = "graph.attention"
    heads = prop_def(IntegerAttr[I64])
    kv_heads = prop_def(IntegerAttr[I64])
    head_dim = prop_def(IntegerAttr[I64])
    max_seq = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    gated = opt_prop_def(IntegerAttr[I64])  # 1: Qwen3.5's output gate follows q, k, v in the input
    # KV spill (docs/kernels.md, "KV spill"): ring entries from `spill_from` on live on
    # the tiles of `spill`, rectangles of the layer's FFN cores shaped like the region
    spill = opt_prop_def(CoreSetAttr)
    spill_from = opt_prop_def(IntegerAttr[I64])

    def __init__(self, name, region, input, *, heads, kv_heads, head_dim, max_seq,
                 layer, stage, wafer, gated: bool = False,
                 spill: CoreSetAttr | None = None, spill_from: int | None = None):
        props = self.common_props(name, region, layer, stage, wafer)
        for k, v in (("heads", heads), ("kv_heads", kv_heads), ("head_dim", head_dim),
                     ("max_seq", max_seq)) + ((("gated", 1),) if gated else ()):
            props[k] = IntegerAttr(v, i64)
        if spill is not None:
            props["spill"] = spill
            props["spill_from"] = IntegerAttr(spill_from, i64)
        super().__init__(operands=[input], properties=props,
                         result_types=[ActType(heads * head_dim)])

    @property
    def is_gated(self) -> bool:
        return self.gated is not None and _int(self.gated) == 1

    def verify_kernel(self) -> None:
        h, kv, d = _int(self.heads), _int(self.kv_heads), _int(self.head_dim)
        if h <= 0 or kv <= 0 or d <= 0 or _int(self.max_seq) <= 0:
            raise VerifyException(
                f"kernel @{self.kernel_name}: heads, kv_heads, head_dim and max_seq must be > 0"
            )
        if h % kv:
            raise VerifyException(
                f"kernel @{self.kernel_name}: heads {h} is not a multiple of kv_heads {kv}"
            )
        if self.gated is not None and _int(self.gated) not in (0, 1):
            raise VerifyException(f"kernel @{self.kernel_name}: gated must be 0 or 1")
        if (self.spill is None) != (self.spill_from is None):
            raise VerifyException(f"kernel @{self.kernel_name}: spill and spill_from go together")
        if self.spill is not None:
            problem = spill_problem(self.region, self.spill, _int(self.spill_from), _int(self.max_seq))
            if problem:
                raise VerifyException(f"kernel @{self.kernel_name}: {problem}")
        gate = h if self.is_gated else 0
        _expect_width(self, "input (q, k, v" + (", gate)" if gate else ")"), _width(self.input),
                      (h + 2 * kv + gate) * d)
        _expect_width(self, "output", _width(self.output), h * d)


@irdl_op_definition
class DeltaNetOp(KernelOp):
    """Gated DeltaNet linear attention (Qwen3.5) with a recurrent state and a short
    causal conv state per request slot. Input: the in projection [q | k | v | z | b | a]
    (2 k_heads k_dim + 2 v_heads v_dim + 2 v_heads); output: the gated, normed
    v_heads x v_dim before out_proj."""

    name = "graph.deltanet"
    k_heads = prop_def(IntegerAttr[I64])
    v_heads = prop_def(IntegerAttr[I64])
    k_dim = prop_def(IntegerAttr[I64])
    v_dim = prop_def(IntegerAttr[I64])
    conv = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, *, k_heads, v_heads, k_dim, v_dim, conv,
                 layer, stage, wafer):
        props = self.common_props(name, region, layer, stage, wafer)
        for k, v in (("k_heads", k_heads), ("v_heads", v_heads), ("k_dim", k_dim),
                     ("v_dim", v_dim), ("conv", conv)):
            props[k] = IntegerAttr(v, i64)
        super().__init__(operands=[input], properties=props,
                         result_types=[ActType(v_heads * v_dim)])

    def verify_kernel(self) -> None:
        kh, vh, kd, vd = (_int(p) for p in (self.k_heads, self.v_heads, self.k_dim, self.v_dim))
        if min(kh, vh, kd, vd) <= 0 or _int(self.conv) < 2:
            raise VerifyException(f"kernel @{self.kernel_name}: k_heads, v_heads, k_dim and v_dim "
                                  "must be > 0 and conv at least 2")
        if vh % kh:
            raise VerifyException(f"kernel @{self.kernel_name}: v_heads {vh} is not a multiple "
                                  f"of k_heads {kh}")
        _expect_width(self, "input (q, k, v, z, b, a)", _width(self.input),
                      2 * kh * kd + 2 * vh * vd + 2 * vh)
        _expect_width(self, "output", _width(self.output), vh * vd)


@irdl_op_definition
class GateTopKOp(KernelOp):
    """MoE router: logits over experts, top-k selection per token."""

    name = "graph.gate_topk"
    input = operand_def(ActType)
    output = result_def(RoutingType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, *, experts, top_k, layer, stage, wafer):
        super().__init__(
            operands=[input],
            properties=self.common_props(name, region, layer, stage, wafer),
            result_types=[RoutingType(experts, top_k)],
        )


@irdl_op_definition
class MoEExpertsOp(KernelOp):
    """Dispatch, expert FFNs on disjoint expert regions, and combine.

    `region` is the relay region the tokens cross; expert `e` runs on
    `expert_regions[placement[e]]`.
    """

    name = "graph.moe_experts"
    expert_ffn = prop_def(IntegerAttr[I64])
    shared_experts = prop_def(IntegerAttr[I64])
    expert_regions = prop_def(ArrayAttr[CoreSetAttr])
    placement = prop_def(DenseArrayBase)
    placement_policy = opt_prop_def(StringAttr)
    weights = opt_prop_def(StringAttr)  # the experts' stored format (`meshrt.quant`)
    decoded = opt_prop_def(UnitAttr)  # held decoded, as the model's floats (see packed_format)
    input = operand_def(ActType)
    routing = operand_def(RoutingType)
    output = result_def(ActType)
    assembly_format = (
        "$sym_name `(` $input `,` $routing `)` `on` $region attr-dict `:` "
        "type($input) `,` type($routing) `->` type($output)"
    )

    def __init__(self, name, region, input, routing, *, expert_ffn, shared_experts,
                 expert_regions: Sequence[CoreSetAttr], placement: Sequence[int],
                 layer, stage, wafer, policy: str | None = None, weights: str | None = None,
                 decoded: bool = False):
        props = self.common_props(name, region, layer, stage, wafer) | weights_prop(weights, decoded)
        props["expert_ffn"] = IntegerAttr(expert_ffn, i64)
        props["shared_experts"] = IntegerAttr(shared_experts, i64)
        props["expert_regions"] = ArrayAttr(expert_regions)
        props["placement"] = DenseArrayBase.from_list(i64, list(placement))
        if policy is not None:
            props["placement_policy"] = StringAttr(policy)
        super().__init__(operands=[input, routing], properties=props,
                         result_types=[input.type])

    @property
    def expert_placement(self) -> tuple[int, ...]:
        return tuple(self.placement.get_values())

    def verify_kernel(self) -> None:
        verify_weights(self)
        rt = self.routing.type
        assert isinstance(rt, RoutingType)
        experts = rt.experts.data
        place = self.expert_placement
        regions = self.expert_regions.data
        if len(place) != experts:
            raise VerifyException(
                f"kernel @{self.kernel_name}: placement lists {len(place)} experts, "
                f"routing selects among {experts}"
            )
        shared = _int(self.shared_experts)
        if not 0 <= shared < len(regions):
            raise VerifyException(
                f"kernel @{self.kernel_name}: {shared} shared experts need as many of the "
                f"{len(regions)} expert regions (the last ones) and leave none for the routed")
        for e, r in enumerate(place):
            if not 0 <= r < len(regions):
                raise VerifyException(
                    f"kernel @{self.kernel_name}: expert {e} placed on region {r}, "
                    f"but only {len(regions)} expert regions exist"
                )
            if r >= len(regions) - shared:
                raise VerifyException(
                    f"kernel @{self.kernel_name}: expert {e} placed on region {r}, which holds "
                    f"shared expert {r - (len(regions) - shared)} (the last {shared} regions)")
        for i, a in enumerate(regions):
            for j in range(i + 1, len(regions)):
                if a.overlaps(regions[j]):
                    raise VerifyException(
                        f"kernel @{self.kernel_name}: expert regions {i} ({a}) and {j} "
                        f"({regions[j]}) overlap; expert regions must be disjoint"
                    )
        model = enclosing_program(self)
        if model is not None:
            w, h = model.mesh_size
            for i, r in enumerate(regions):
                if not r.fits_mesh(w, h):
                    raise VerifyException(
                        f"kernel @{self.kernel_name}: expert region {i} ({r}) lies outside "
                        f"the {w} x {h} mesh"
                    )
        _expect_width(self, "output", _width(self.output), _width(self.input))
        if _int(self.expert_ffn) <= 0:
            raise VerifyException(f"kernel @{self.kernel_name}: expert_ffn must be > 0")


@irdl_op_definition
class AddOp(KernelOp):
    """Residual add."""

    name = "graph.add"
    T: ClassVar = VarConstraint("T", base(ActType))
    lhs = operand_def(T)
    rhs = operand_def(T)
    output = result_def(T)
    assembly_format = (
        "$sym_name `(` $lhs `,` $rhs `)` `on` $region attr-dict `:` type($output)"
    )

    def __init__(self, name, region, lhs, rhs, *, layer, stage, wafer):
        super().__init__(operands=[lhs, rhs],
                         properties=self.common_props(name, region, layer, stage, wafer),
                         result_types=[lhs.type])

    def verify_kernel(self) -> None:
        if self.lhs.type != self.rhs.type or self.lhs.type != self.output.type:
            raise VerifyException(f"kernel @{self.kernel_name}: add operands and result differ in width")


ELEMENTWISE_KINDS = {"silu_mul": 2, "gelu": 1, "silu": 1}  # input width / output width


@irdl_op_definition
class ElementwiseOp(KernelOp):
    """A per-element operation; `silu_mul` is SwiGLU's silu(gate) * up."""

    name = "graph.elementwise"
    kind = prop_def(StringAttr)
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, kind: str, *, layer, stage, wafer):
        props = self.common_props(name, region, layer, stage, wafer)
        props["kind"] = StringAttr(kind)
        ratio = ELEMENTWISE_KINDS.get(kind, 1)
        super().__init__(operands=[input], properties=props,
                         result_types=[ActType(_width(input) // ratio)])

    def verify_kernel(self) -> None:
        kind = self.kind.data
        if kind not in ELEMENTWISE_KINDS:
            raise VerifyException(
                f"kernel @{self.kernel_name}: unknown elementwise kind '{kind}', expected one of "
                + ", ".join(ELEMENTWISE_KINDS)
            )
        _expect_width(self, "input", _width(self.input), _width(self.output) * ELEMENTWISE_KINDS[kind])


@irdl_op_definition
class SampleOp(KernelOp):
    """Greedy sampling (argmax over the vocabulary) and EOS detection."""

    name = "graph.sample"
    eos = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(TokensType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, *, eos: int, layer, stage, wafer):
        props = self.common_props(name, region, layer, stage, wafer)
        props["eos"] = IntegerAttr(eos, i64)
        super().__init__(operands=[input], properties=props, result_types=[TokensType()])

    def verify_kernel(self) -> None:
        vocab = _width(self.input)
        if not -1 <= _int(self.eos) < vocab:  # -1: the model has no EOS token
            raise VerifyException(
                f"kernel @{self.kernel_name}: eos token {_int(self.eos)} is outside the vocabulary 0..{vocab - 1}"
            )


@irdl_op_definition
class HandoffOp(KernelOp):
    """Hidden state (and its control payload) moving to the next pipeline stage.

    `stage`/`wafer` are the sending side; `to_stage`/`to_wafer` the receiving
    side. A handoff with `to_wafer != wafer` crosses the wafer-to-wafer link.
    """

    name = "graph.handoff"
    to_stage = prop_def(IntegerAttr[I64])
    to_wafer = prop_def(IntegerAttr[I64])
    input = operand_def(ActType)
    output = result_def(ActType)
    assembly_format = _UNARY

    def __init__(self, name, region, input, *, layer, stage, wafer, to_stage, to_wafer):
        props = self.common_props(name, region, layer, stage, wafer)
        props["to_stage"] = IntegerAttr(to_stage, i64)
        props["to_wafer"] = IntegerAttr(to_wafer, i64)
        super().__init__(operands=[input], properties=props, result_types=[input.type])

    @property
    def crosses_wafer(self) -> bool:
        return _int(self.to_wafer) != self.wafer_index

    def verify_kernel(self) -> None:
        if _int(self.to_stage) != self.stage_index + 1:
            raise VerifyException(
                f"kernel @{self.kernel_name}: hands off from stage {self.stage_index} to "
                f"stage {_int(self.to_stage)}; a handoff must go to the next stage"
            )
        if _int(self.to_wafer) < self.wafer_index:
            raise VerifyException(
                f"kernel @{self.kernel_name}: hands off backwards from wafer {self.wafer_index} "
                f"to wafer {_int(self.to_wafer)}"
            )
        _expect_width(self, "output", _width(self.output), _width(self.input))


def graph_order(model: ModelOp) -> list[KernelOp]:
    """The model's kernels in topological order (VerifyException on a cycle)."""
    return topological_order(model.kernels())  # type: ignore[return-value]


Graph = Dialect(
    "graph",
    [
        ModelOp,
        EmbedOp,
        RMSNormOp,
        MatmulOp,
        AttentionOp,
        DeltaNetOp,
        GateTopKOp,
        MoEExpertsOp,
        AddOp,
        ElementwiseOp,
        SampleOp,
        HandoffOp,
    ],
    [ActType, RoutingType, TokensType],
)
