"""A lower bound on one decode step of a build: how far its TPOT is from the limit.

    bound = sum over layers of (the layer's compute at the SIMD rate / the cores the layer uses)
          + the longest dependent chain of collectives, each at least one hop per core along it
          + one wafer-link latency per hand-off to another wafer on that chain

- compute: every `event.compute` of the build's tables priced by the target
  (`meshrt.runtime.schedule.flatten`, the same `op_cycles` as the interpreter
  and the cost model; the SIMD width is folded into the cost keys), times the
  cores that run it, summed per layer (the `event.kernel`s with the same
  `layer` and `stage` params) and divided by the cores of the union of the
  layer's kernel regions: as if the layer's work were spread evenly over every
  core the build gives the layer, with no communication at all. Expert kernels
  count the work their tables charge (with routing, each region's capacity of
  min(experts per region, top_k) tokens per request).
- collectives: a kernel with a reduction (a `down` flow, `FlowRole.DOWN`) over
  tiles s cores long along the flow's direction needs at least s - 1 hops
  before the far ends' partials meet (`hop_latency_cycles` each). Kernels
  depend on their inputs (`event.kernel` inputs); the bound takes the longest
  chain of such hops through that graph, so parallel branches (expert regions,
  a residual's two inputs) are not added up.
- wafers: a hand-off kernel whose `to_wafer` differs from its wafer adds one
  `wafer_link_latency_cycles` on that chain.

Compute and hops are added, not overlapped: the figure the issue names
("compute at the SIMD rate over the cores a layer uses, plus one hop per
core along each dependent collective"). Sends, receives, task switches,
metainfo and reconfigurations are left out; so is the bandwidth a hand-off
between two layers' regions needs. With several micro-batches in flight the
TPOT is at least one step of one micro-batch, so the bound holds for it too.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from meshrt.dialects import segment as sg
from meshrt.dialects.mesh import FlowRole
from meshrt.routing import RectSet
from meshrt.runtime.schedule import Compute, flatten


@dataclass(frozen=True)
class LayerBound:
    """One layer's share of the bound: its compute spread over its cores."""

    layer: int  # the kernels' `layer` param (-1: embedding / head kernels)
    stage: int
    kernels: tuple[str, ...]
    cores: int  # cores of the union of the layer's kernel regions
    work_cycles: float  # compute cycles summed over every core that runs them
    compute_cycles: float  # work_cycles / cores


@dataclass(frozen=True)
class LowerBound:
    """A lower bound on the decode step of one micro-batch (cycles) and its parts."""

    layers: tuple[LayerBound, ...]
    collectives: dict[str, int]  # reducing kernel -> cores along its reduction
    chain: tuple[str, ...]  # the kernels of the longest dependent chain of hops
    hop_cycles: float  # hops along that chain
    wafer_cycles: float  # wafer-link latencies along that chain

    @property
    def compute_cycles(self) -> float:
        return sum(layer.compute_cycles for layer in self.layers)

    @property
    def cycles(self) -> float:
        return self.compute_cycles + self.hop_cycles + self.wafer_cycles


def lower_bound(program: sg.ProgramOp, target) -> LowerBound:
    """The lower bound of `program`'s decode step on `target` (see the module docstring)."""
    kernels = {k.kernel_name: k for k in program.kernels()}
    work: dict[str, float] = defaultdict(float)
    for cs in flatten(program, target).classes:
        n = cs.cores.count
        for ins in cs.instrs:
            if type(ins) is Compute:
                work[ins.kernel] += ins.cycles * n

    groups: dict[tuple[int, int], list[str]] = defaultdict(list)
    for name, k in kernels.items():
        groups[(int(k.param("layer", -1)), k.stage_index)].append(name)
    layers = []
    for (layer, stage), names in groups.items():  # in program order of their first kernel
        cores = RectSet()
        for name in names:
            cores = cores | RectSet.from_cores(kernels[name].region)
        w = sum(work[n] for n in names)
        layers.append(LayerBound(layer, stage, tuple(names), cores.count, w,
                                 w / cores.count if cores.count else 0.0))

    collectives = {}
    for f in program.flows():
        if f.flow_role is FlowRole.DOWN and f.kernel.root_reference.data in kernels:
            k = f.kernel.root_reference.data
            along_x = bool(f.dx is not None and f.dx.value.data)
            span = max((b[2] - b[0]) if along_x else (b[3] - b[1])
                       for b in RectSet.from_cores(kernels[k].region))
            collectives[k] = max(collectives.get(k, 0), span)

    hop = float(target.hop_latency_cycles)
    link = float(target.wafer_link_latency_cycles)

    def own(name: str) -> tuple[float, float]:
        k = kernels[name]
        crosses = k.param("to_wafer") is not None and k.param("to_wafer") != k.param("wafer")
        return max(collectives.get(name, 0) - 1, 0) * hop, link if crosses else 0.0

    # longest chain ending at each kernel, (hop cycles, wafer cycles, kernels), in an order
    # where every kernel comes after its inputs
    longest: dict[str, tuple[float, float, tuple[str, ...]]] = {}
    for name in _topological(kernels):
        h, w = own(name)
        best = max((longest[i] for i in kernels[name].input_names if i in kernels),
                   key=lambda c: c[0] + c[1], default=(0.0, 0.0, ()))
        longest[name] = (best[0] + h, best[1] + w, best[2] + (name,))
    h, w, path = max(longest.values(), key=lambda c: c[0] + c[1], default=(0.0, 0.0, ()))
    chain = tuple(n for n in path if own(n) != (0.0, 0.0))
    return LowerBound(tuple(layers), collectives, chain, h, w)


def _topological(kernels: dict) -> list[str]:
    """Kernel names with every kernel after its inputs (program order breaks ties)."""
    order, done = [], set()
    for root in kernels:
        stack = [(root, False)]
        while stack:
            name, expanded = stack.pop()
            if name in done:
                continue
            if expanded:
                done.add(name)
                order.append(name)
                continue
            stack.append((name, True))
            stack.extend((i, False) for i in reversed(kernels[name].input_names)
                         if i in kernels and i not in done)
    return order
