"""The serving loop: requests in, tokens out, through the simulated mesh.

The host's only jobs are outside the per-token path: it writes arriving
requests into the waiting queue (bounded; a request that finds it full, or
that needs more KV positions than a slot holds, is rejected and counted) and
reads finished requests back. Everything per token happens on the mesh: the
sampler root (the core that produces the continuous-batching payload) reads
the waiting queue when a slot frees, and its table rides with the tokens
back to the first stage and on to every attention.

Prompts are prefilled on chip in chunks (`prefill_chunk` C, 1 by default):
a micro-batch carries b x C token rows, and each step every slot of the
micro-batch feeds its next C prompt tokens while its prompt lasts, else the
token it sampled last (one row). In a chunked program (C > 1) the rows a slot
does not use go to prompts of requests in other micro-batches' slots (the
oldest first, C rows each at most), so one request's chunks flow through the
pipeline in consecutive micro-batches, each row naming its KV slot and
position (docs/prefill.md). Time to first token is arrival -> admission ->
the prompt's chunks.

A request may instead arrive with the KV cache of its prompt but the last
token (prefill done elsewhere; or of a shorter prefix: `kv_cache`). Once the
sampler root admits it into a slot, the host writes the cache into that
slot's tiles outside the per-token path (`kv_cache.push_cycles`: a round
trip to learn the slot, then the bytes through the system I/O); the slot
stays idle (counted as padding) until the write is done, then feeds the
prompt from the first position the cache does not hold.

Static mode (the WaferLLM-style baseline, a program compiled without
dynamism): a micro-batch's slots are filled together; the batch runs until
its longest request is done (finished slots keep computing: padding); then
the host refills it, paying `host_roundtrip` cycles, and installs the new
batch's table in the attention cores (no metainfo rides the data).

Micro-batch pipelining: with `micro_batch_pipeline`, one micro-batch per
stage is in flight (the host primes the token loop once per stage), and
each owns its own KV slots.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from meshrt.activations import round_activations
from meshrt.runtime import kv_cache, reference as ref
from meshrt.kernels import registry
from meshrt.kernels.numerics import Slot, SlotTable
from meshrt.runtime.dataplane import DataPlane
from meshrt.runtime.cost_model import default_in_flight
from meshrt.runtime.mesh_sim import MeshSim, SimResult
from meshrt.runtime.workloads import Request
from meshrt.diagnostics import Loc, op_location
from meshrt.limits import check_memory
from meshrt.shape import HParams, ModelShape


@dataclass
class _Live:
    req: Request
    arrival: int  # cycles
    admitted: int
    group: int  # the micro-batch and slot it is admitted to (its KV slot)
    slot: int
    kv: int
    fed: int = 0
    out: list[int] = field(default_factory=list)
    sampled_at: list[tuple[int, int]] = field(default_factory=list)  # (step, slot) per output
    first: int | None = None
    done: bool = False
    ready: int = 0  # cycle its pushed cache is in the slot's tiles: idle until then


@dataclass
class RequestRecord:
    id: int | str
    prompt: list[int]
    tokens: list[int]
    arrival: int
    admitted: int
    first_token: int
    finished: int
    sampled_at: list[tuple[int, int]] = field(default_factory=list)  # (micro-batch step, slot) per token
    pushed: int = 0  # positions of the KV cache it arrived with (0: its prompt prefilled on chip)

    @property
    def ttft(self) -> int:
        return self.first_token - self.arrival

    @property
    def tpot(self) -> float | None:
        n = len(self.tokens)
        return (self.finished - self.first_token) / (n - 1) if n > 1 else None


class Host:
    """Host side of serving plus the sampler root's slot bookkeeping."""

    def __init__(self, requests: list[Request], *, micro_batch: int, groups: int, max_seq: int,
                 clock_hz: float, static: bool, queue_capacity: int, refill_cycles: int,
                 push_cycles: Callable[[int], int] = lambda positions: 0, chunk: int = 1):
        self.b, self.groups, self.max_seq = micro_batch, groups, max_seq
        self.chunk, self.rows = chunk, micro_batch * chunk
        self.static = static
        self.capacity = queue_capacity
        self.refill_cycles = refill_cycles
        self.push_cycles = push_cycles  # a pushed cache of n positions: cycles to write it
        arrivals = [(int(round(r.arrival * clock_hz)), i, r) for i, r in enumerate(requests)]
        self.pending = deque(sorted(arrivals))
        self.waiting: deque[tuple[int, Request]] = deque()
        self.rejected: list[tuple[int | str, str]] = []
        self.records: list[RequestRecord] = []
        self.slots: list[list[_Live | None]] = [[None] * micro_batch for _ in range(groups)]
        self.tables: dict[int, SlotTable] = {}
        self.tokens: dict[int, list[int]] = {}
        self.owners: dict[int, list[_Live | None]] = {}  # step -> the request of each row
        self.admitted: list[_Live] = []  # live requests in admission order (lent rows go there first)
        self.slot_steps = 0
        self.busy_slot_steps = 0
        self.now = lambda: 0
        self.on_done = lambda: None
        self.total = len(requests)
        self.plane: DataPlane | None = None
        self.recalibrator = None
        self.replans: list[dict] = []
        self._counted = None

    # -- admission --------------------------------------------------------
    def _arrivals(self, now: int) -> None:
        while self.pending and self.pending[0][0] <= now:
            t, _, r = self.pending.popleft()
            if r.prompt_len + r.output_len > self.max_seq:
                self.rejected.append((r.id, f"needs {r.prompt_len + r.output_len} KV positions, "
                                            f"a slot holds {self.max_seq}"))
            elif len(self.waiting) >= self.capacity:
                self.rejected.append((r.id, f"waiting queue full ({self.capacity})"))
            else:
                self.waiting.append((t, r))

    def _admit(self, g: int, now: int) -> int:
        """Fill group g's free slots from the waiting queue; the host writes the caches of
        requests that arrived with one (`kv_cache`) into their slots' tiles, each slot
        idle until its write is done. Returns the cycles of those writes."""
        self._arrivals(now)
        row = self.slots[g]
        if self.static and any(s is not None for s in row):
            return 0  # a static batch is refilled only once all its requests are done
        writes = 0
        for s in range(self.b):
            if row[s] is None and self.waiting:
                t, r = self.waiting.popleft()
                live = row[s] = _Live(r, t, now, g, s, g * self.b + s)
                self.admitted.append(live)
                if self.plane is not None:
                    self.plane.push_kv(g * self.b + s, r.kv)
                if r.kv is not None:
                    live.fed = r.kv_len
                    cycles = self.push_cycles(r.kv_len)
                    live.ready = now + cycles
                    writes += cycles
        return writes

    def _feed(self, live: _Live | None, now: int, most: int) -> list[tuple[int, int]]:
        """(position, token) of the rows `live` feeds next, at most `most`: its prompt's
        next tokens, or the token it sampled last once that is out; none while its cache
        is being written or its last sample is not back."""
        if live is None or live.done or live.ready > now:
            return []
        p = live.req.prompt
        if live.fed < len(p):
            n = min(most, len(p) - live.fed)
            out = [(live.fed + k, p[live.fed + k]) for k in range(n)]
        elif len(live.out) > live.fed - len(p):  # its token at position `fed` is sampled
            out = [(live.fed, live.out[live.fed - len(p)])] if most else []
        else:
            out = []
        live.fed += len(out)
        return out

    def _table(self, seq: int) -> None:
        """The rows step `seq` runs: each slot of its micro-batch its own (a slot of a
        program of one token a step keeps its row, idle or not), then, in a chunked
        program, the spare rows to the prompts of the oldest requests, C each at most."""
        g = seq % self.groups
        now = self.now()
        slots, toks, owners = [], [], []

        def add(live: _Live, fed: list[tuple[int, int]]) -> None:
            for pos, tok in fed:
                slots.append(Slot(_rid(live), pos, live.kv, pos < live.req.prompt_len - 1))
                toks.append(tok)
                owners.append(live)

        for s, live in enumerate(self.slots[g]):
            fed = self._feed(live, now, self.chunk)
            add(live, fed)
            if self.chunk == 1 and not fed:  # empty, its cache being written, or waiting
                slots.append(Slot(-1, 0, g * self.b + s))
                toks.append(0)
                owners.append(None)
        self.admitted = [x for x in self.admitted if not x.done]
        if self.chunk > 1:
            for live in self.admitted:
                if len(slots) >= self.rows:
                    break
                if live.group != g and live.fed < live.req.prompt_len:
                    add(live, self._feed(live, now, min(self.chunk, self.rows - len(slots))))
            while len(slots) < self.rows:
                slots.append(Slot(-1, 0, 0))
                toks.append(0)
                owners.append(None)
        self.tables[seq] = SlotTable(seq, tuple(slots))
        self.tokens[seq] = toks
        self.owners[seq] = owners

    # -- hooks (the data plane calls these) --------------------------------
    def first_tokens(self, g: int) -> list[int]:
        if g not in self.tables:
            self._admit(g, 0)
            self._table(g)
        return self.tokens[g]

    def first_table(self, g: int) -> SlotTable:
        self.first_tokens(g)
        return self.tables[g]

    def installed_table(self, seq: int) -> SlotTable | None:
        return self.tables.get(seq)

    def table_of(self, cd) -> SlotTable:
        return self.tables[cd.step + self.groups]

    def next_tokens(self, cd) -> list[int]:
        return self.tokens[cd.step + self.groups]

    def sampled(self, cd, tokens: list[int], ends: list[bool]) -> int:
        """The sampler root has the step's tokens and, per slot, whether the token is an
        EOS token (its eos_check body's flags): update the slots, admit, and build the
        table the next step of this micro-batch runs with."""
        seq = cd.step
        g = seq % self.groups
        now = self.now()
        table = self.tables.pop(seq)
        self.tokens.pop(seq, None)
        owners = self.owners.pop(seq)
        for r, slot in enumerate(table.slots):
            self.slot_steps += 1
            live = owners[r]
            if slot.rid < 0 or live is None or live.done:
                continue
            self.busy_slot_steps += 1
            if slot.prefill:
                continue  # the sampled token is not an output
            tok = tokens[r]
            live.out.append(tok)
            live.sampled_at.append((seq, r))
            if live.first is None:
                live.first = now
            if ends[r] or len(live.out) >= live.req.output_len:
                live.done = True
                self.records.append(RequestRecord(live.req.id, live.req.prompt, live.out, live.arrival,
                                                  live.admitted, live.first, now, live.sampled_at,
                                                  live.req.kv_len))
                if not self.static:
                    self.slots[live.group][live.slot] = None
        row = self.slots[g]
        refill = 0
        if self.static and all(x is None or x.done for x in row):
            if any(x is not None for x in row):
                refill = self.refill_cycles  # the host reads the batch out and writes the next
            self.slots[g] = row = [None] * self.b
        writes = self._admit(g, now)
        if self.static and writes:  # a static batch starts once its pushed caches are written
            refill += writes
            for live in self.slots[g]:
                if live is not None:
                    live.ready = now
        self._table(seq + self.groups)
        if self.recalibrator is not None:
            self._recalibrate(seq, now)
        if len(self.records) + len(self.rejected) == self.total:
            self.on_done()
        return refill

    def _recalibrate(self, seq: int, now: int) -> None:
        """Feed the step's routing (counted by the gate roots) to the recalibrator;
        a re-placement applies from the next micro-batch the sampler starts, so
        every expert core switches at the same step (a consistent cut)."""
        counts = self.plane.routing_counts
        delta = counts - self._counted if self._counted is not None else counts.copy()
        self._counted = counts.copy()
        rc = self.recalibrator
        for layer in rc.placements:
            rc.observe(layer, delta[layer].tolist())
        plan = rc.maybe_replan(seq)
        if plan is None:
            return
        first = seq + self.groups
        for layer, placement in plan.placements.items():
            cycles: dict[int, int] = {}
            for m in plan.moves:
                if m.layer == layer:
                    cycles[m.dst] = cycles.get(m.dst, 0) + m.cycles
            self.plane.replace_experts(layer, first, placement.region_of, cycles)
        self.replans.append({"decided_at_step": seq, "cycle": now, "applies_from_step": first,
                             "moves": len(plan.moves), "bytes": plan.bytes, "cycles": plan.cycles,
                             "summary": plan.summary()})

    @property
    def padding_fraction(self) -> float:
        return 1.0 - self.busy_slot_steps / self.slot_steps if self.slot_steps else 0.0


def _rid(live: _Live) -> int:
    return hash(live.req.id) & 0x7FFFFFFF if not isinstance(live.req.id, int) else live.req.id


def run_bytes(shape: ModelShape, kv_slots: int) -> int:
    """Bytes a checked interpreter run of `shape` allocates, estimated before
    any is: the reference's float32 weights (4 B a weight), the interpreter's
    float64 tiles of them (8 B), the float64 draw of the largest weight array
    while the weights are made, and float32 KV caches for the interpreter's
    `kv_slots` request slots plus the reference's one request, `max_seq`
    positions each."""
    s = shape
    plain, experts = s.weight_counts()
    largest = max(s.vocab * s.hidden, s.hidden * s.qkv_width, s.hidden * s.ffn,
                  s.experts * s.hidden * s.expert_ffn if s.is_moe else 0)
    kv = 4 * 2 * s.kv_heads * s.head_dim * s.max_seq * s.layers * (kv_slots + 1)
    return 12 * (plain + experts) + 8 * largest + kv


def check_runnable(shape: ModelShape, kv_slots: int, where: Loc | str | None = None) -> None:
    """Refuse, before anything is allocated, a model the reference and the
    interpreter cannot run: more memory than this machine has (`run_bytes`).
    FrontendError at `where`."""
    check_memory(run_bytes(shape, kv_slots), f"the NumPy reference and interpreter of {shape.name}",
                 "use `meshrt bench` (the cost model) for a model this size", where)


def reference_shape(program) -> ref.RefShape:
    """The NumPy reference's shape from the program's hyper-parameters."""
    return ref.RefShape.of(ModelShape.from_hparams(program, program.program_name))


@dataclass
class ServingResult:
    sim: SimResult
    records: list[RequestRecord]
    rejected: list[tuple[int | str, str]]
    mismatches: list[tuple[int | str, list[int], list[int]]]
    padding_fraction: float
    static: bool
    total: int
    routing_counts: np.ndarray
    clock_hz: float
    replans: list[dict] = field(default_factory=list)
    divergence: Divergence | None = None  # where the outputs first differ from NumPy's

    @property
    def outputs_match_reference(self) -> bool:
        return not self.mismatches and not self.sim.reports

    def summary(self) -> dict:
        recs = self.records
        cycles = self.sim.cycles
        tpots = [r.tpot for r in recs if r.tpot is not None]
        out_tokens = sum(len(r.tokens) for r in recs)
        reports = self.sim.reports
        stalls: dict[str, int] = {}
        by_class: dict[str, dict[str, int]] = {}
        cls_of = dict(self.sim.cores)
        for pos, per in self.sim.stalls.items():
            mine = by_class.setdefault(cls_of.get(pos, "?"), {})
            for k, v in per.items():
                stalls[k] = stalls.get(k, 0) + v
                mine[k] = mine.get(k, 0) + v
        return {
            "outputs_match_reference": self.outputs_match_reference,
            "requests_completed": len(recs),
            "requests_rejected": len(self.rejected),
            # still queued or in a slot when the run stopped (time bound, a report)
            "requests_unfinished": self.total - len(recs) - len(self.rejected),
            "rejections": [f"{rid}: {why}" for rid, why in self.rejected],
            "deadlock": any(type(r).__name__ == "DeadlockReport" for r in reports),
            "corruption": any(type(r).__name__ == "CorruptionReport" for r in reports),
            "data_error": any(type(r).__name__ == "DataReport" for r in reports),
            "time_bound": any(type(r).__name__ == "TimeBoundReport" for r in reports),
            "reports": [str(r) for r in reports] + ([str(self.divergence)] if self.divergence else []),
            "first_mismatch": self.divergence.as_dict() if self.divergence else None,
            "static": self.static,
            "cycles": cycles,
            "decode_steps": self.sim.steps,
            "cycles_per_step": (sum(self.sim.step_cycles) / len(self.sim.step_cycles)
                                if self.sim.step_cycles else None),
            "tpot_cycles": sum(tpots) / len(tpots) if tpots else None,
            "ttft_cycles": sum(r.ttft for r in recs) / len(recs) if recs else None,
            "requests_pushed_kv": sum(1 for r in recs if r.pushed),  # of those completed
            "output_tokens": out_tokens,
            "system_tokens_per_mcycle": out_tokens / cycles * 1e6 if cycles else 0.0,
            "padding_fraction": self.padding_fraction,
            "stall_cycles": stalls,  # summed over cores: waiting to receive, to send, ...
            "stall_cycles_by_class": by_class,
            "link_utilisation": self.sim.link_utilisation,
            "events": self.sim.events,
            "events_per_second": self.sim.events_per_second,
            "wall_seconds": self.sim.wall_seconds,
            "seed": self.sim.seed,
            "recalibrations": self.replans,
        }


def serve(program, target, requests: list[Request], *, seed: int = 0, weight_seed: int = 0,
          weights: ref.Weights | None = None, queue_capacity: int = 16,
          max_cycles: int = 200_000_000, max_seconds: float | None = None,
          check: bool = True, trace: bool = False,
          safe: bool = True, speed_scale=None, recalibrator=None,
          progress: Callable[[int, int], None] | None = None) -> ServingResult:
    """Serve `requests` on `program` (coloured segment IR) and compare with the reference.

    `recalibrator` (a `meshrt.runtime.recalibration.Recalibrator` over the
    program's MoE layers) sees every step's routing and may re-place experts
    between decode steps; `ServingResult.replans` says when and what moved.
    `progress(cycles, requests done)` is called now and then during the run;
    `max_seconds` bounds its wall time (a `TimeBoundReport`, like `max_cycles`).
    When tokens differ, `ServingResult.divergence` says where first (see
    `first_divergence`)."""
    if weights is None:
        check_runnable(ModelShape.from_hparams(program, program.program_name),
                       HParams.of(program).kv_slots(program), op_location(program))
    shape = reference_shape(program)
    kv_cache.attach(requests, shape)
    weights = weights if weights is not None else ref.Weights.random(shape, weight_seed)
    kw = dict(seed=seed, queue_capacity=queue_capacity, max_cycles=max_cycles, safe=safe,
              speed_scale=speed_scale)
    spare = copy.deepcopy(recalibrator) if check and recalibrator is not None else None
    result, host, plane = _interpret(program, target, requests, weights, trace=trace,
                                     recalibrator=recalibrator, progress=progress,
                                     max_seconds=max_seconds, **kw)
    mismatches = []
    divergence = None
    if check:
        model = ref.ReferenceModel(shape, weights)
        for r in host.records:
            req = next(q for q in requests if q.id == r.id)
            want = model.generate(req.prompt, req.output_len, kv=req.kv)
            if want != r.tokens:
                mismatches.append((r.id, r.tokens, want))
        if mismatches:
            def rerun(step: int) -> tuple[list[RequestRecord], DataPlane]:
                # deterministic: it reaches the step the first run reached, whatever stopped
                # that one (so no wall-time limit here)
                _, again, watched = _interpret(program, target, requests, weights, watch=step,
                                               recalibrator=spare, **kw)
                return again.records, watched

            divergence = first_divergence(program, requests, host.records, mismatches, model,
                                          rerun)
    return ServingResult(result, host.records, host.rejected, mismatches, host.padding_fraction,
                         host.static, host.total, plane.routing_counts, target.clock_hz, host.replans,
                         divergence)


def _interpret(program, target, requests, weights, *, seed, queue_capacity, max_cycles, safe,
               speed_scale, trace=False, recalibrator=None, watch: int | None = None,
               max_seconds: float | None = None, progress: Callable[[int, int], None] | None = None):
    """One interpreted run: (its SimResult, the Host, the DataPlane); `watch`:
    keep the per-kernel values of that micro-batch step (`DataPlane.watched`)."""
    dyn = program.dynamism_kinds
    groups = default_in_flight(program)
    shape = ModelShape.from_hparams(program, program.program_name)  # its KV format
    max_seq = HParams.of(program).int("max_seq")
    host = Host(list(requests), micro_batch=program.micro_batch_size, groups=groups, max_seq=max_seq,
                clock_hz=target.clock_hz, chunk=program.chunk,
                static="continuous_batching" not in dyn, queue_capacity=queue_capacity,
                refill_cycles=int(target.costs.get("host_roundtrip", 0)),
                push_cycles=lambda n: kv_cache.push_cycles(shape, n, target))
    plane = DataPlane(program, weights, host)
    plane.watch = watch
    host.plane = plane
    host.recalibrator = recalibrator
    sim = MeshSim(program, target, seed=seed, safe=safe, max_cycles=max_cycles,
                  max_seconds=max_seconds, trace=trace, data=plane, inflight=groups, speed_scale=speed_scale)
    host.now = lambda: sim.now

    def done() -> None:
        sim.stop = True

    host.on_done = done
    report = None if progress is None else (
        lambda s: progress(s.now, len(host.records) + len(host.rejected)))
    return sim.run(steps=1 << 40, progress=report), host, plane


# -- where outputs first differ from the reference ---------------------------------

# Per-kernel values match the reference to float32 rounding of float64 sums.
KERNEL_RTOL, KERNEL_ATOL = 1e-3, 1e-4


@dataclass(frozen=True)
class Divergence:
    """The first output token that differs from NumPy's, and where it can be
    found, the first kernel (in the program's order) whose value differs."""

    request: int | str
    token: int  # index in the request's output
    got: int | None  # None: the run gave fewer tokens
    want: int | None
    step: int | None  # the micro-batch step that sampled it
    slot: int | None
    position: int  # the KV position of the token fed at that step
    kernel: str | None = None
    detail: str = ""  # what differs in that kernel, or why no kernel is named

    def __str__(self) -> str:
        got = "nothing" if self.got is None else self.got
        want = "nothing" if self.want is None else self.want
        at = "" if self.step is None else f", micro-batch step {self.step}, slot {self.slot}"
        line = (f"outputs differ from NumPy: request {self.request}, output token {self.token} "
                f"(position {self.position}{at}): the interpreter gave {got}, NumPy {want}")
        if self.kernel is not None:
            return f"{line}; first kernel whose value differs: @{self.kernel}: {self.detail}"
        return f"{line}; {self.detail}" if self.detail else line

    def as_dict(self) -> dict:
        return dataclasses.asdict(self) | {"message": str(self)}


def kernel_values(program, plane: DataPlane, trace: ref.Trace, slot: int):
    """(kernel, the reference's (layer, name), its value at `slot` as its consumers read it,
    NumPy's), in the program's order, for every kernel whose value the plane watched whole
    at that slot and the reference traced (`DataPlane.reference_key`)."""
    for info in program.kernels():
        name = info.kernel_name
        key, held = plane.reference_key(name), plane.watched.get(name)
        if key is None or held is None or key not in trace.tensors or not held.mask[slot].all():
            continue
        expect = np.asarray(trace.tensors[key][-1], np.float64).reshape(-1)
        value = held.data[slot]
        if name in plane.rounded:  # as its consumers read it (the reference rounds it so)
            value = round_activations(value, plane.rounded[name])
        value = plane.in_reference_order(name, value.astype(np.float64))
        if value.shape == expect.shape:
            yield name, key, value, expect


def first_divergence(program, requests: list[Request], records: list[RequestRecord],
                     mismatches, model: ref.ReferenceModel, rerun) -> Divergence:
    """The earliest differing token of `mismatches` ((id, got, want) per
    request), and the first kernel whose value differs at the step that
    sampled it: `rerun(step)` runs again keeping that step's per-kernel values
    ((records, DataPlane)), which are compared, kernel by kernel in the
    program's order, with the reference's values for the same token."""
    by_id = {r.id: r for r in records}
    firsts = []
    for rid, got, want in mismatches:
        i = next((k for k, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
        at = by_id[rid].sampled_at
        step, slot = at[i] if i < len(at) else (None, None)
        firsts.append((step if step is not None else 1 << 62, rid, i, got, want, slot))
    step, rid, i, got, want, slot = min(firsts, key=lambda f: f[0])
    req = next(q for q in requests if q.id == rid)
    d = Divergence(rid, i, got[i] if i < len(got) else None, want[i] if i < len(want) else None,
                   None if step == 1 << 62 else step, slot, len(req.prompt) - 1 + i)
    if d.step is None:
        return dataclasses.replace(d, detail="no step sampled it, so no kernel is compared")
    again, plane = rerun(d.step)
    if [r.tokens for r in again] != [r.tokens for r in records]:
        return dataclasses.replace(d, detail="a second run gave other tokens, so no kernel is compared")
    trace = ref.Trace()
    state, _ = model.prefill(req.prompt, trace if i == 0 else None, req.kv)
    for k in range(1, i + 1):
        model.decode_step(state, want[k - 1], trace if k == i else None)
    compared = 0
    for name, key, value, expect in kernel_values(program, plane, trace, d.slot):
        compared += 1
        off = ~np.isclose(value, expect, rtol=KERNEL_RTOL, atol=KERNEL_ATOL)
        if off.any():
            e = int(np.argmax(np.abs(value - expect)))
            where = "" if key[0] < 0 else f" of layer {key[0]}"
            before = compared - 1
            return dataclasses.replace(d, kernel=name, detail=(
                f"{int(off.sum())} of its {value.size} entries differ from NumPy's {key[1]}{where} "
                f"(most at entry {e}: {value[e]:.6g}, NumPy {expect[e]:.6g}); "
                f"{_kernels(before)} compared before it agree{'s' if before == 1 else ''}"))
    return dataclasses.replace(d, detail=f"{_kernels(compared)} compared with NumPy at that step "
                                         f"agree{'s' if compared == 1 else ''}, so the difference "
                                         "lies in a kernel without a NumPy counterpart")


def _kernels(n: int) -> str:
    return f"{n} kernel" + ("" if n == 1 else "s")


def recalibrator_for(program, target, profile, models, **kw):
    """A `Recalibrator` over the MoE layers of a segment program, starting from
    the placements it was compiled with; weight moves priced on the target's links."""
    from meshrt.runtime.recalibration import MoveCost, Recalibrator

    hp = HParams.of(program)
    hidden, f, dbytes = hp.int("hidden"), hp.int("expert_ffn"), hp.expert_dtype_bytes
    placements, regions = {}, {}
    for k in program.kernels():
        if registry.kind(k.kind.data).PLACES_EXPERTS:
            layer = k.param("layer")
            placements[layer] = k.param("placement")
            regions[layer] = [r.rects.data[0].tuple[:4] for r in k.param("expert_regions")]
    move = MoveCost(int(3 * hidden * f * dbytes), float(target.link_bytes_per_cycle),
                    float(target.hop_latency_cycles), regions)
    kw.setdefault("move_cost", move)
    return Recalibrator(placements, profile, models, **kw)


def tiny_workload(name: str, n: int, seed: int, max_seq: int, vocab: int, clock_hz: float,
                  rate_per_mcycle: float | None):
    """A synthetic workload scaled to a tiny model's KV capacity (same length shape)."""
    from meshrt.runtime.workloads import CHAT_OUTPUT, REASONING_OUTPUT, get_workload

    cap = {"chat": CHAT_OUTPUT.cap, "reasoning": REASONING_OUTPUT.cap}.get(name)
    rate = rate_per_mcycle * clock_hz / 1e6 if rate_per_mcycle else None
    if cap is None:  # a JSONL file: its own lengths and arrivals
        return get_workload(name, n, seed, vocab=vocab)
    half = max(1, max_seq // 2)
    return get_workload(name, n, seed, rate, scale=max(half / cap, 1e-9) * 4, vocab=vocab,
                        max_prompt_len=half, max_output_len=half)
