"""Numerics in the messages: what every core computes on what it receives.

The mesh simulator (`meshrt.runtime.mesh_sim`) decides *when* each core runs
each event of its class's table; this module decides *what* the event does
to data. Every core holds its own tiles of the weights (slices of a
`reference.Weights`), its KV rows, and the parts of the kernels' values it
computed or received; a send packs a NumPy payload from that state into the
message and a receive unpacks the payloads of the messages it gathered. No
core ever reads another core's state: everything it knows arrived in a
message, or was installed by the host before the run (weights) or between
steps (the request queue the sampler reads).

What a kernel computes is read from the lowest IR itself: the
`event.kernel` records (kind, region, inputs, shapes) beside the tables;
each kind's numerics live in its folder (`meshrt/kernels/<kind>/numerics.py`,
the values and hooks in `meshrt.kernels.numerics`). Layouts follow
`meshrt.kernels.interface` (rows / cols / full / flat / partial). A value is a `Vec`: the full-width array of a micro-batch with a
mask of the entries this core holds, so gathers from several senders merge
by mask, and a compute that needs an entry the core does not hold raises a
`DataLayoutError` naming the kernel, the core and the missing range: a wrong
table, flow or layout fails loudly instead of producing numbers.

Numerics mirror `meshrt.runtime.reference`: float32 at kernel boundaries,
float64 partial sums rounded once, so the tokens match the reference.
Continuous batching metainfo (`SlotTable`) and MoE routing (`Routing`) ride
the payloads of the sends that the tables give metainfo bytes.
"""

from __future__ import annotations

import functools

import numpy as np

from meshrt import quant
from meshrt.dialects.mesh import FlowRole
from meshrt.kernels import registry
from meshrt.kernels.numerics import CoreData, DataLayoutError, KernelExec, Payload, Routing, SlotTable, Vec
from meshrt.runtime import reference as ref
from meshrt.shape import HParams

# --------------------------------------------------------------------------
# the plane
# --------------------------------------------------------------------------


def _missing(cd: CoreData, what: str, e: KeyError) -> DataLayoutError:
    """A kernel hook looked for state no earlier event on the core left (a table that
    repeats, drops or reorders an event)."""
    return DataLayoutError(f"{cd.kernel.where(cd)}: {what} needs {e.args[0]!r}, which no earlier "
                           "event on this core produced")


class DataPlane:
    """Weights, kernels and per-core data of one interpreted run."""

    def __init__(self, program, weights: ref.Weights, host):
        self.weights = weights
        self.shape = weights.shape
        self.act = ref.Act.of(self.shape)  # the FFNs' activation (`reference.glu`)
        self.b = program.rows
        self.moe_routing = "moe_routing" in program.dynamism_kinds
        self.cb = "continuous_batching" in program.dynamism_kinds
        self.host = host
        self.kernels = {}
        self.declared: dict[str, frozenset[str]] = {}  # kernel -> the compute ops its kind declares
        # kernel -> the activation format its value is rounded to where a consumer reads it
        # (kinds whose value is VALUE_IN_FP32, and every kernel of an f32 model: none)
        self.hp = HParams.of(program)  # the model's parameters as the IR carries them
        act = self.hp.act_format
        self.rounded: dict[str, str] = {}
        for info in program.kernels():
            kind = registry.kind(info.kind.data)
            if act != "f32" and not kind.VALUE_IN_FP32:
                self.rounded[info.kernel_name] = act
            if kind.NUMERICS is None:
                raise DataLayoutError(f"kernel @{info.kernel_name}: kind {info.kind.data} has no numerics")
            self.kernels[info.kernel_name] = kind.NUMERICS(info, self)
            self.declared[info.kernel_name] = frozenset(c.name for c in kind.COMPUTE)
        self.routing_counts = np.zeros((self.shape.layers, max(self.shape.experts, 1)), np.int64)
        # flow name -> role: the kernels' hooks see a flow's role, not its name
        self.roles = {f.flow_name: f.flow_role for f in program.flows()}
        self.consumer = {f.flow_name: f.kernel.root_reference.data for f in program.flows()}
        # live re-placements: layer -> [(first step, placement, cycles per destination region)]
        self.replacements: dict[int, list[tuple[int, tuple[int, ...], dict[int, int]]]] = {}
        # per-kernel values of one micro-batch step, kept when asked (`watch`, a step
        # number): every value a core held or received as it ended that step, merged
        # over the cores. `serving` compares them with the reference's when tokens differ.
        self.watch: int | None = None
        self.watched: dict[str, Vec] = {}
        # KV slot -> (serial, the cache the host pushed into it: `reference.KVState`); each
        # core writes its rows once, before the slot's first step reads them (`pushed`)
        self.pushes: dict[int, tuple[int, object]] = {}
        self._serial = 0

    def placement(self, layer: int, step: int, compiled: tuple[int, ...]) -> tuple[int, ...]:
        """The expert -> region map micro-batch `step` runs with."""
        current = compiled
        for first, placement, _ in self.replacements.get(layer, ()):
            if step >= first:
                current = placement
        return current

    def move_cycles(self, layer: int, step: int, region: int) -> int:
        for first, _, cycles in self.replacements.get(layer, ()):
            if step == first:
                return cycles.get(region, 0)
        return 0

    def replace_experts(self, layer: int, first_step: int, placement: tuple[int, ...],
                        cycles_by_region: dict[int, int]) -> None:
        """From micro-batch `first_step` on, layer's experts run where `placement` says;
        the regions receiving weights first wait for them (cycles per region)."""
        self.replacements.setdefault(layer, []).append((first_step, tuple(placement), cycles_by_region))

    # weights by kernel name (the lowering's naming: l{i}_qkv, l{i}_o, ...)
    def out_blocks(self, info) -> tuple[int, ...] | None:
        """The blocks a GEMV's output is laid out in per column (`numerics.block_order`), or
        None (plain), as the kernel says (`blocks`: q | k | v for an attention reading in
        place, gate | up for the silu_mul after a fused up projection)."""
        blocks = info.param("blocks")
        return tuple(blocks) if blocks else None

    def matrix(self, name: str, layer: int, cols=None, rows=None) -> np.ndarray:
        """Gemv `name`'s weight matrix, its columns in order `cols` (a blocked output's
        positions) and its rows in order `rows` (an input laid out
        otherwise than plainly), where given."""
        return self._gemv_array(name, layer, cols, rows, bias=False)

    def bias(self, name: str, layer: int, cols=None) -> np.ndarray | None:
        """The bias of gemv `name` laid out as its matrix's columns, or None (no bias)."""
        return self._gemv_array(name, layer, cols, None, bias=True)

    def packed_matrix(self, name: str, layer: int, fmt: str, cols=None, rows=None) -> quant.Packed:
        """Gemv `name`'s weight matrix as stored (`fmt` codes and block scales), laid out
        as `matrix` lays out its values."""
        parts = [self.weights.packed.get(n) for n in self._gemv_parts(name, layer, bias=False)]
        if any(p is None or p.fmt != fmt for p in parts):
            raise DataLayoutError(f"kernel @{name}: its weights are stored as {fmt}, the "
                                  "model's are not")
        p = quant.Packed.concat(parts)
        p = p.columns(cols) if cols is not None else p
        return p.rows_in(rows) if rows is not None else p

    def _gemv_parts(self, name: str, layer: int, *, bias: bool) -> list[str]:
        """The `Weights.named_arrays` names gemv `name` concatenates along its output."""
        if name == "lm_head":
            return [] if bias else ["lm_head"]
        lw, p = self.weights.layers[layer], f"layers.{layer}."
        suffix = name.split("_", 1)[1]
        if lw.linear is not None and suffix in ("qkv", "o"):  # a DeltaNet layer's projections
            parts = [] if bias else (["linear.w_qkv", "linear.w_z", "linear.w_b", "linear.w_a"]
                                     if suffix == "qkv" else ["linear.w_out"])
        elif suffix == "qkv":  # Qwen3.5's output gate after q, k and v
            parts = ["bq", "bk", "bv"] if bias else ["wq", "wk", "wv"] + (
                [] if lw.wg is None else ["wg"])
        elif suffix == "o":
            parts = ["bo" if bias else "wo"]
        elif suffix == "up" and lw.dense is not None:
            parts = ["dense.b_gate", "dense.b_up"] if bias else ["dense.w_gate", "dense.w_up"]
        elif suffix == "down" and lw.dense is not None:
            parts = ["dense.b_down" if bias else "dense.w_down"]
        else:
            raise DataLayoutError(f"kernel @{name}: no weight matrix of that name")
        return [p + n for n in parts]

    def _gemv_array(self, name: str, layer: int, cols, rows, *, bias: bool):
        names = self._gemv_parts(name, layer, bias=bias)
        arrays = self._named
        if not names or arrays.get(names[0]) is None:
            return None
        a = np.concatenate([arrays[n] for n in names], axis=-1)
        a = a[..., cols] if cols is not None else a
        return a[rows] if rows is not None else a

    @functools.cached_property
    def _named(self) -> dict[str, np.ndarray]:
        return self.weights.named_arrays()

    # the reference's traced value (`reference.Trace`) each kernel's output is, by the
    # same naming; a reduction (`l0_qkv.reduce`) holds the value of its product
    _TRACED = {"embed": "embed", "final_norm": "final_in", "lm_head": "logits"}
    _TRACED_IN_LAYER = {"norm1": "attn_in", "qkv": "qkv", "attn": "attn_out", "o": "attn_proj",
                        "add1": "resid_mid", "norm2": "ffn_in", "down": "ffn_out",
                        "add2": "resid_out"}

    def reference_key(self, name: str) -> tuple[int, str] | None:
        """(layer, name) of the reference's traced value that kernel `name`'s
        output is (-1: outside the layers), or None where it has none."""
        base, _, tail = name.partition(".")
        if tail not in ("", "reduce") or name not in self.kernels:
            return None
        if base in self._TRACED:
            return -1, self._TRACED[base]
        layer = self.kernels[name].layer
        traced = self._TRACED_IN_LAYER.get(base.split("_", 1)[-1])
        return (layer, traced) if traced is not None and layer >= 0 else None

    def positions(self, name: str) -> np.ndarray | None:
        """Where kernel `name`'s value (a blocked GEMV's, or its reduction's) holds each entry
        of the plain concatenation of its blocks, or None if it is laid out plainly."""
        return getattr(self.kernels.get(name.partition(".")[0]), "positions", None)

    def in_reference_order(self, name: str, row: np.ndarray) -> np.ndarray:
        """One slot's entries of kernel `name`'s value in the reference's order."""
        pos = self.positions(name)
        return row if pos is None or row.shape[-1] != len(pos) else row[pos]

    def norm_gain(self, name: str, layer: int) -> np.ndarray:
        if name == "final_norm":
            return self.weights.final_norm
        lw = self.weights.layers[layer]
        return lw.attn_norm if name.endswith("norm1") else lw.ffn_norm

    def qk_gains(self, layer: int) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The q and k norm gains of `layer` (None, None: the model has no q/k norm)."""
        lw = self.weights.layers[layer]
        return lw.q_norm, lw.k_norm

    def sinks(self, layer: int) -> np.ndarray | None:
        """The attention sink logit of every head of `layer` (None: no sinks)."""
        return self.weights.layers[layer].sinks

    def deltanet(self, layer: int) -> ref.DeltaNetWeights:
        """The Gated DeltaNet weights of `layer` (a layer in linear_layers)."""
        d = self.weights.layers[layer].linear
        if d is None:
            raise DataLayoutError(f"layer {layer}: a deltanet kernel on a full-attention layer")
        return d

    def moe(self, layer: int) -> ref.MoEFFNWeights:
        m = self.weights.layers[layer].moe
        if m is None:
            raise DataLayoutError(f"layer {layer}: MoE kernels on a layer the model has dense")
        return m

    def packed_experts(self, layer: int, fmt: str, shared: bool = False
                       ) -> tuple[quant.Packed, quant.Packed, quant.Packed]:
        """Layer's routed (or shared) expert gate, up and down matrices as stored (`fmt`
        codes and scales)."""
        names = ("shared_gate", "shared_up", "shared_down") if shared else ("w_gate", "w_up", "w_down")
        got = tuple(self.weights.packed.get(f"layers.{layer}.moe.{n}") for n in names)
        if any(p is None or p.fmt != fmt for p in got):
            raise DataLayoutError(f"layer {layer}: its experts are stored as {fmt}, the "
                                  "model's are not")
        return got

    def count_routing(self, layer, ids, cd) -> None:
        """The gate root counts each live slot's choices once: the live activation
        profile recalibration and placement studies read."""
        live = [s for s, sl in enumerate(cd.cb.slots) if sl.rid >= 0] if cd.cb is not None \
            else range(self.b)
        for s in live:
            for e in ids[s]:
                self.routing_counts[layer, int(e)] += 1

    def push_kv(self, kv: int, state) -> None:
        """The host writes a request's cache (`meshrt.runtime.kv_cache`) into KV slot `kv`'s
        tiles; None: the slot's new request brings none. The slot is idle until the write
        is done (`serving.Host`), so each core writes its rows when it next runs the slot:
        the same values at the same point of its program as the host's write."""
        if state is None:
            self.pushes.pop(kv, None)
        else:
            self._serial += 1
            self.pushes[kv] = (self._serial, state)

    def pushed(self, cd: CoreData, kernel: str, kv: int):
        """The cache pushed into slot `kv` that this core has not yet written for `kernel`,
        or None."""
        got = self.pushes.get(kv)
        if got is None or cd.pushed.get((kernel, kv)) == got[0]:
            return None
        cd.pushed[kernel, kv] = got[0]
        return got[1]

    # hooks called by MeshSim ----------------------------------------------
    def core_data(self, pos: tuple[int, int, int]) -> CoreData:
        return CoreData(pos)

    def host_prime(self, cd: CoreData, flow: str, group: int) -> Payload:
        """The host's first message of micro-batch `group` on a loop-carried flow."""
        return Payload("host", self.host.first_tokens(group), cb=self.host.first_table(group))

    def _known(self, kernel: str) -> str:
        if kernel not in self.kernels:  # IR whose event.kernel record was lost
            raise DataLayoutError(f"kernel @{kernel} runs events but has no event.kernel record")
        return kernel

    def sub(self, cd: CoreData, kernel: str) -> None:
        cd.kernel = self.kernels[self._known(kernel)]

    def computes(self, kernel: str, op: str) -> bool:
        """Whether compute `op` of `kernel` has a numeric effect (ops its kind declares as
        timing only skip the hook; ops it does not declare are an error)."""
        if op not in self.declared[self._known(kernel)]:
            k = self.kernels[kernel]
            raise DataLayoutError(f"kernel @{kernel} (kind {k.info.kind.data}) runs compute op "
                                  f"\"{op}\", which its kind does not declare")
        return op in self.kernels[kernel].OPS

    def compute(self, cd: CoreData, op: str) -> int | None:
        """Returns extra cycles of host work the event waited for, if any."""
        try:
            return cd.kernel.compute(cd, op)
        except KeyError as e:
            raise _missing(cd, f"compute \"{op}\"", e) from None

    def reached(self, cd: CoreData, op: str) -> float:
        """The share of its static work compute `op` of the core's kernel did this step
        (`KernelExec.reached`)."""
        return cd.kernel.reached(cd, op)

    def send(self, cd: CoreData, flow: str, meta: int) -> Payload:
        k = cd.kernel
        role = self.roles[flow]
        try:
            value = k.send(cd, role)
        except KeyError as e:
            raise _missing(cd, f"the send on @{flow}", e) from None
        src = k.payload_src(role)
        gathered = cd.recvd.get(src) if self._flow_kind(role) == "input" else None
        if gathered is not None and isinstance(value, Vec):
            # a relay (synthesize_schedules._relayed): the slices it gathered of its own
            # kernel's value go on with its own
            value = Vec(value.data.copy(), value.mask.copy())
            value.merge(gathered, k.where(cd))
        cb, route = k.metainfo(cd, role, meta)
        return Payload(src, value, cb, route)

    @staticmethod
    def _flow_kind(role: FlowRole) -> str:
        """"tokens", "internal" (chain/relay flows: they serve the kernel the core runs, as
        kernels whose chains take one route share its flow) or "input"."""
        if role is FlowRole.TOKENS:
            return "tokens"
        return "internal" if role.internal else "input"

    def recv(self, cd: CoreData, flow: str, payloads: list[Payload]) -> None:
        k = cd.kernel
        role = self.roles[flow]
        kind = self._flow_kind(role)
        for p in payloads:
            if p.cb is not None:
                cd.cb = p.cb
            if p.route is not None:
                cd.route = p.route
        internal = kind == "internal"
        if kind == "tokens":
            cd.values["tokens"] = payloads[0].value
            for p in payloads[1:]:
                if list(p.value) != list(payloads[0].value):
                    raise DataLayoutError(f"{k.where(cd)}: samplers disagree on the tokens")
            return
        if internal:
            k.recv(cd, role, [p.value for p in payloads])
            return
        if k.RAW_INPUTS and self.consumer[flow] == k.name:  # not a relay gathering k's own value
            k.recv(cd, role, [p.value for p in payloads])
            return
        for p in payloads:
            key = p.src  # what a core received is there for every kernel it runs this step
            v = p.value
            if not isinstance(v, Vec):
                raise DataLayoutError(f"{k.where(cd)}: unexpected payload on @{flow}")
            have = cd.recvd.get(key)
            if have is None:
                cd.recvd[key] = Vec(v.data.copy(), v.mask.copy())
            else:
                have.merge(v, k.where(cd))

    def end_step(self, cd: CoreData) -> None:
        """A core finished a pass over its table: drop the step's received values."""
        if cd.step == self.watch:
            self._keep(cd)
        cd.recvd.clear()
        cd.values = {k: v for k, v in cd.values.items() if k == "tokens"}
        cd.step += 1

    def _keep(self, cd: CoreData) -> None:
        held = [*cd.values.items(), *cd.recvd.items()]  # recvd: producer -> what arrived
        for name, v in held:
            if not isinstance(v, Vec):
                continue
            have = self.watched.get(name)
            if have is None:
                self.watched[name] = Vec(v.data.copy(), v.mask.copy())
            else:  # no merge check: a disagreement is what the comparison looks for
                have.data[v.mask] = v.data[v.mask]
                have.mask |= v.mask
