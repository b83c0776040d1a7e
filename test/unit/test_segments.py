"""materialize-segments, color-routes and check-segments over many inputs."""

from __future__ import annotations

import itertools
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from xdsl.passes import PassPipeline

from meshrt.diagnostics import MeshrtError, parse_module
from meshrt.dialects import segment as sg
from meshrt.dialects.mesh import Resources
from meshrt.analysis.coloring import dsatur, exact_colouring, greedy_clique
from meshrt.analysis.liveness import (
    arc_positions,
    arcs_meet,
    flow_window,
    hold_arcs,
    liveness_of_program,
)
from meshrt.analysis.segmenting import accumulate
from meshrt.passes.check_segments import check_segments
from meshrt.routing import RectSet
from meshrt.tools.meshrt_opt import MeshrtOptMain

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TIGHT = "colors=3 iq=2 oq=2 routes=4 switches=2 sram=4096 ctrl=128"
BUDGET = Resources(colors=3, iq=2, oq=2, routes=4, switches=2, sram=4096, ctrl=128)

_TOOL = MeshrtOptMain(args=["-"])


def parse(text: str, name: str = "<test>"):
    return parse_module(_TOOL.ctx, text, name)


def run(module, spec: str):
    PassPipeline.parse_spec(_TOOL.available_passes, spec).apply(_TOOL.ctx, module)
    return module


def program_of(module) -> sg.ProgramOp:
    return next(o for o in module.walk() if isinstance(o, sg.ProgramOp))


# ---------------------------------------------------------------------------
# Random event programs
# ---------------------------------------------------------------------------


def event_program(seed: int, scale: int = 1, n_kernels: int | None = None) -> str:
    """A random, valid event schedule on a (12 s) x (6 s) mesh.

    Classes are disjoint column strips; every coordinate and size is
    multiplied by `scale`, which must not change anything but coordinates.
    """
    rng = random.Random(seed)
    s = scale
    n_classes = rng.randint(2, 5)
    kernels = [f"k{i}" for i in range(n_kernels or rng.randint(2, 6))]
    classes = []
    for i in range(n_classes):
        y = rng.randint(0, 3)
        h = rng.randint(1, 6 - y)
        ks = sorted(rng.sample(range(len(kernels)), rng.randint(1, len(kernels))))
        classes.append((f"c{i}", (2 * i, y, 2, h), ks))

    def rect(r):
        x, y, w, h = r
        return f"({x * s}, {y * s}, {w * s}, {h * s})"

    flows = []  # (name, kernel, send kernel index, recv kernel index, src class, dst class, pattern)
    for ki, k in enumerate(kernels):
        part = [c for c in classes if ki in c[2]]
        for j in range(rng.randint(0, 2)):
            if len(part) < 2:
                break
            a, b = rng.sample(part, 2)
            pattern = rng.choice(["all", "all", "row", "col"])
            # every sender must reach a receiver and every receiver hear a sender
            # (check-segments' message balance): the strips are disjoint columns,
            # so `col` never connects them and `row` only where their rows meet
            (_, ya, _, ha), (_, yb, _, hb) = a[1], b[1]
            if pattern == "col" or pattern == "row" and max(ya, yb) >= min(ya + ha, yb + hb):
                pattern = "all"
            flows.append((f"{k}.f{j}", k, ki, ki, a, b, pattern))
    # one flow that wraps into the next step: from the class that runs the
    # last kernel to the one that runs the first
    last = max(classes, key=lambda c: c[2][-1])
    first = min(classes, key=lambda c: c[2][0])
    if first is not last:
        flows.append(("wrap", kernels[first[2][0]], last[2][-1], first[2][0], last, first, "all"))

    lines = [
        (f'event.schedule @m target "test32" mesh {12 * s} x {6 * s} wafers 1 stages 1 micro_batch 1 '
         "dynamism [] hparams {} {")
    ]
    for name, k, _, _, a, b, pattern in flows:
        lines.append(f"  event.flow @{name} kernel @{k} role \"input\" operand 0 wafer 0 from <{rect(a[1])}> to <{rect(b[1])}> "
                     f'pattern "{pattern}" bytes 32')
    for cname, r, ks in classes:
        lines.append(f"  event.core_class @{cname} wafer 0 cores <{rect(r)}> {{")
        for ki in ks:
            k = kernels[ki]
            sends = [f for f in flows if f[4][0] == cname and f[2] == ki]
            recvs = [f for f in flows if f[5][0] == cname and f[3] == ki]
            d = Resources(
                colors=min(3, rng.randint(0, 1) + len(sends) + len(recvs)),
                iq=min(2, len(recvs) + rng.randint(0, 1)),
                oq=min(2, len(sends)),
                routes=rng.randint(0, 2),
                switches=rng.randint(0, 2),
                sram=rng.choice([0, 512, 1024, 2048, 3000, 4000]),
                ctrl=rng.choice([0, 16, 64]),
            )
            coll = " collective" if rng.random() < 0.4 else ""
            after = f"[@{kernels[ki - 1]}]" if ki else "[]"
            lines.append(f'    event.sub @{k} "r" after {after} demand <{d.attr()}>{coll} {{')
            for f in sends:
                lines.append(f"      event.send @{f[0]} bytes 32 meta 0")
            lines.append('      event.compute "add" work 4')
            for f in recvs:
                lines.append(f"      event.recv @{f[0]} bytes 32 meta 0")
            lines.append("    }")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines)


seeds = st.integers(0, 10**6)
SLOW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def compile_random(seed: int, scale: int = 1, spec: str = f"materialize-segments{{{TIGHT}}},color-routes"):
    return run(parse(event_program(seed, scale)), spec)


# ---------------------------------------------------------------------------
# materialize-segments
# ---------------------------------------------------------------------------


@SLOW
@given(seeds)
def test_segments_fit_are_greedy_and_keep_the_table(seed):
    text = event_program(seed)
    original = {
        line.split()[1]: [] for line in text.splitlines() if line.strip().startswith("event.core_class")
    }
    cls = None
    for line in text.splitlines():
        t = line.strip()
        if t.startswith("event.core_class"):
            cls = t.split()[1]
        elif t.startswith("event.sub"):
            original[cls].append(t.split()[1])
    program = program_of(run(parse(text), f"materialize-segments{{{TIGHT}}}"))
    for c in program.core_classes():
        segs = c.segments()
        assert ["@" + s.kernel_name for seg in segs for s in seg.subs()] == original["@" + c.class_name]
        uses = []
        for seg in segs:
            use = Resources()
            for s in seg.subs():
                use = accumulate(use, s.demand.value)
            assert not use.exceeded(BUDGET)
            assert seg.use.value == use
            uses.append(use)
        # greedy: the first sub of every next segment did not fit the one before
        for i in range(len(segs) - 1):
            nxt = segs[i + 1].subs()[0].demand.value
            assert accumulate(uses[i], nxt).exceeded(BUDGET)
        # boundaries: i -> i+1, and back to 0; marker sync iff not after a collective
        bounds = c.boundaries()
        n = len(segs)
        assert [(a, b) for a, b, _, _ in bounds] == [(i, i + 1) for i in range(n - 1)] + ([(n - 1, 0)] if n > 1 else [])
        for a, _b, sync, _rec in bounds:
            assert (sync is None) == segs[a].subs()[-1].is_collective
            if sync is not None:
                region = RectSet.from_cores(sync.over)
                assert region.covers(RectSet.from_cores(c.cores))
                assert region == region.clip(*program.mesh_size)


@SLOW
@given(seeds)
def test_pipeline_output_passes_the_checker(seed):
    try:
        module = compile_random(seed)
    except MeshrtError as e:
        # the only admissible failure: a colouring that cannot exist, named
        assert "cannot colour flow @" in e.message
        return
    assert check_segments(module) == []


@pytest.fixture(scope="module")
def wide_test32(tmp_path_factory) -> Path:
    """test32's figures on a mesh that holds the programs scaled by 50."""
    text = (REPO / "meshrt" / "targets" / "test32.toml").read_text()
    text = text.replace("width = 32\n", "width = 600\n").replace("height = 32\n", "height = 300\n")
    path = tmp_path_factory.mktemp("targets") / "wide.toml"
    path.write_text(text)
    return path


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seeds)
def test_work_and_ir_do_not_grow_with_mesh_area(wide_test32, seed):
    """Scaling every region by 50 (2,500x the cores) changes coordinates only."""
    spec = f'materialize-segments{{target="{wide_test32}" {TIGHT}}},color-routes'
    try:
        small = program_of(compile_random(seed, 1, spec))
    except MeshrtError:
        return
    big = program_of(compile_random(seed, 50, spec))

    def shape(p):
        return (
            [(c.class_name, [(s.use.value, s.route_names()) for s in c.segments()],
              [(a, b, sync is not None, [r.root_reference.data for r in rec.release.data])
               for a, b, sync, rec in c.boundaries()]) for c in p.core_classes()],
            [(r.flow_name, r.color_id, len(r.via.rects.data)) for r in p.routes()],
        )

    assert shape(small) == shape(big)


def test_budget_overrides_cut_more():
    text = event_program(7, n_kernels=6)
    loose = program_of(run(parse(text), "materialize-segments"))
    tight = program_of(run(parse(text), f"materialize-segments{{{TIGHT}}}"))
    assert sum(len(c.segments()) for c in tight.core_classes()) > sum(
        len(c.segments()) for c in loose.core_classes())
    assert tight.budget.value == BUDGET


def test_sub_over_budget_names_kernel_class_resource_demand_capacity():
    text = """event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c12 wafer 0 cores <(0, 0, 2, 2)> {
    event.sub @l0.qkv "tile" after [] demand <sram = 9000> {
    }
  }
}"""
    with pytest.raises(MeshrtError) as e:
        run(parse(text, "x.mlir"), "materialize-segments{sram=6144}")
    assert str(e.value) == (
        "x.mlir:3:5: error: 'event.sub' op sub-schedule of kernel @l0.qkv role \"tile\" in core "
        "class @c12 needs 9000 SRAM bytes, capacity 6144"
    )


# ---------------------------------------------------------------------------
# color-routes and the checker
# ---------------------------------------------------------------------------


@SLOW
@given(seeds, st.data())
def test_checker_catches_a_shared_colour_between_interfering_flows(seed, data):
    try:
        module = compile_random(seed)
    except MeshrtError:
        return
    program = program_of(module)
    live = liveness_of_program(program)
    edges = live.interference()
    if not edges:
        return
    i, j = data.draw(st.sampled_from(sorted(edges)))
    routes = {r.flow_name: r for r in program.routes()}
    a, b = routes[live.flows[i].name], routes[live.flows[j].name]
    from xdsl.dialects.builtin import IntegerAttr, i64

    b.color = IntegerAttr(a.color_id, i64)
    problems = check_segments(module)
    assert any("both live on colour" in p and f"@{live.flows[i].name}" in p and f"@{live.flows[j].name}" in p
               for p in problems), problems


@SLOW
@given(seeds)
def test_checker_catches_a_dropped_marker_sync(seed):
    try:
        module = compile_random(seed)
    except MeshrtError:
        return
    syncs = [op for op in module.walk() if isinstance(op, sg.MarkerSyncOp)]
    if not syncs:
        return
    syncs[0].detach()
    syncs[0].erase()
    assert any("has no marker sync" in p for p in check_segments(module))


def test_one_colour_is_reused_across_segments_and_split_when_needed():
    # With one colour, every two interfering flows force splits until none
    # are live together; the checker then proves the result.
    for seed in range(30):
        try:
            module = compile_random(seed, spec=f"materialize-segments{{{TIGHT}}},color-routes{{colors=1}}")
        except MeshrtError as e:
            assert "cannot colour flow @" in e.message
            continue
        assert check_segments(module) == []
        assert {r.color_id for r in program_of(module).routes()} <= {0}


# ---------------------------------------------------------------------------
# The liveness definitions, against brute force
# ---------------------------------------------------------------------------


@given(st.integers(1, 12), st.data())
def test_arcs_meet_iff_they_share_a_position(k, data):
    a = (data.draw(st.integers(0, k - 1)), data.draw(st.integers(0, k - 1)))
    b = (data.draw(st.integers(0, k - 1)), data.draw(st.integers(0, k - 1)))
    assert arcs_meet(a, b, k) == bool(set(arc_positions(a, k)) & set(arc_positions(b, k)))


@given(st.lists(st.tuples(st.integers(0, 9), st.booleans()), min_size=1, max_size=6))
def test_flow_window_starts_at_the_first_send_and_covers_every_use(refs):
    k = 10
    start, length = flow_window(refs, k)
    covered = set(arc_positions((start, length), k))
    assert {p for p, _ in refs} <= covered
    sends = [p for p, s in refs if s]
    assert start == (min(sends) if sends else min(p for p, _ in refs))
    # minimal: dropping the last position loses a use
    if length > 0:
        assert not {p for p, _ in refs} <= set(arc_positions((start, length - 1), k))


@given(st.lists(st.integers(0, 11), min_size=1, max_size=12).map(sorted), st.data())
def test_segment_holds_cover_the_step_and_their_own_subs(positions, data):
    k = 12
    cuts = sorted(data.draw(st.sets(st.integers(1, len(positions) - 1))) if len(positions) > 1 else [])
    bounds = [0, *cuts, len(positions)]
    segs = [positions[a:b] for a, b in itertools.pairwise(bounds)]
    holds = hold_arcs(segs, k)
    covered = set()
    for seg, h in zip(segs, holds):
        pos = set(arc_positions(h, k))
        assert set(seg) <= pos  # a segment is held while its subs run
        covered |= pos
    assert covered == set(range(k))  # some segment is current at every position


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 7), st.integers(1, 4), st.integers(0, 10**6), st.booleans())
def test_colouring_is_proper_and_exact_search_is_complete(n, p, seed, narrow):
    """Also with some nodes restricted to part of the palette (flows that need a
    switch-capable colour): DSatur's and the exact search's colours respect the
    restriction, and the exact search finds a colouring whenever one exists. The greedy
    clique is a clique (so one larger than the palette rules a colouring out)."""
    rng = random.Random(seed)
    nodes = list(range(n))
    adj = {v: set() for v in nodes}
    for a, b in itertools.combinations(nodes, 2):
        if rng.random() < 0.5:
            adj[a].add(b)
            adj[b].add(a)
    palette = list(range(10, 10 + p))
    some = [c for c in palette if rng.random() < 0.5] or palette[:1]
    restricted = {v for v in nodes if narrow and rng.random() < 0.5}

    def allowed(v):
        return some if v in restricted else palette

    order = {v: v for v in nodes}
    col, failed = dsatur(nodes, adj, allowed, order)
    for v, c in col.items():
        assert all(col.get(u) != c for u in adj[v])
        assert c in allowed(v)
    exists = any(
        all(assign[a] != assign[b] for a in nodes for b in adj[a])
        and all(palette[assign[v]] in allowed(v) for v in nodes)
        for assign in itertools.product(range(p), repeat=n)
    )
    exact = exact_colouring(nodes, adj, palette, order, allowed=allowed if restricted else None)
    assert (exact is not None) == exists
    clique = greedy_clique(nodes, adj)  # colour_flows skips the search past the palette
    assert clique and all(b in adj[a] for a, b in itertools.combinations(clique, 2))
    if len(clique) > p:
        assert not exists
    if exact is not None:
        assert all(exact[a] != exact[b] for a in nodes for b in adj[a])
        assert all(exact[v] in allowed(v) for v in nodes)
    if failed is None:
        assert exists


# ---------------------------------------------------------------------------
# The bundled examples on every target
# ---------------------------------------------------------------------------


def _events(model: str, target: str) -> str | None:
    r = subprocess.run(
        [sys.executable, "-m", "meshrt.tools.cli", "compile", str(EXAMPLES / model), "--target", target,
         "--emit", "events"],
        capture_output=True, text=True, check=False,
    )
    return r.stdout if r.returncode == 0 else None


@pytest.mark.parametrize("target", ["test32", "test16", "wse2", "wse3"])
@pytest.mark.parametrize("model", ["tiny_dense.mrt", "tiny_moe.mrt"])
def test_examples_pass_the_checker_on_every_target(model, target):
    text = _events(model, target)
    assert text is not None, f"{model} does not lower to events on {target}"
    module = parse(text, model)
    run(module, "materialize-segments,color-routes")
    assert check_segments(module, target) == []
    program = program_of(module)
    if target in ("test32", "test16"):  # the tight targets need several segments somewhere
        assert max(len(c.segments()) for c in program.core_classes()) >= 2
        assert any(b[2] is not None for c in program.core_classes() for b in c.boundaries())


def test_other_stages_flows_stay_installed_through_a_pipelined_class():
    """With micro-batches in flight, a flow passing through a class from pipeline stages
    none of the class's kernels is in (the sampled tokens crossing the first layer's region
    back to the embedding) is live in every segment of that class: no boundary releases it,
    so the class never drains another micro-batch's message, and the stages overlap.
    Releasing it (as the lockstep positions alone say) ran tiny_moe's pipeline on test32 one
    micro-batch at a time: an initiation interval of 7,901 cycles, over half the step (tiny_moe's
    layout on test32 no longer routes the tokens through a multi-segment class; tiny_dense's
    does). The checker re-derives the rule: dropping such a flow from a segment's routes is
    an error."""
    from meshrt.analysis.liveness import StageSets
    from meshrt.runtime.cost_model import CostModel
    from meshrt.targets import load_target

    module = parse(_events("tiny_dense.mrt", "test32"), "tiny_dense")
    run(module, "materialize-segments,color-routes")
    program = program_of(module)
    live = liveness_of_program(program)
    stages = StageSets.of(program, live.tables)
    apart = [(c, f) for c in program.core_classes() if len(c.segments()) > 1
             for f in live.flows if f.routed
             and RectSet.from_cores(c.cores).intersects(f.routers)
             and stages.apart(c.class_name, f.name)]
    assert apart, "no multi-segment class carries another stage's flow: the case is gone"
    for cls, f in apart:
        moved = {r.root_reference.data for *_, op in cls.boundaries()
                 for r in (*op.release.data, *op.install.data)}
        assert f.name not in moved, (cls.class_name, f.name)
        assert all(f.name in {r.root_reference.data for r in seg.routes.data}
                   for seg in cls.segments())
    model = CostModel(program, load_target("test32"))
    step, interval = model.estimate(1).cycles_per_step, model.estimate(program.num_stages)
    assert program.num_stages >= 3 and 2 * interval.cycles_per_step < step
    cls, f = apart[0]
    seg = cls.segments()[-1]
    seg.properties["routes"] = type(seg.routes)(
        [r for r in seg.routes.data if r.root_reference.data != f.name])
    assert any(f"segment {seg.index_value} of core class @{cls.class_name} lists routes" in p
               for p in check_segments(module))


# ---------------------------------------------------------------------------
# Route handshakes (insert-route-handshakes, checked by check-segments)
# ---------------------------------------------------------------------------

HANDSHAKES = f"materialize-segments{{{TIGHT}}},color-routes,insert-route-handshakes"


@SLOW
@given(seeds)
def test_handshakes_of_random_programs_pass_the_checker(seed):
    try:
        module = compile_random(seed, spec=HANDSHAKES)
    except MeshrtError as e:
        assert "cannot colour flow @" in e.message
        return
    assert check_segments(module, handshakes=True) == []
    program = program_of(module)
    # every install a sender could race is notified, every release drained
    for c in program.core_classes():
        for _, _, _, rec in c.boundaries():
            assert set(rec.notify_names()) <= {r.root_reference.data for r in rec.install.data}
            assert set(rec.drain_names()) <= {r.root_reference.data for r in rec.release.data}
        if len(c.segments()) == 1:
            assert c.segments()[0].grant is None


@SLOW
@given(seeds, st.data())
def test_checker_catches_a_dropped_handshake(seed, data):
    try:
        module = compile_random(seed, spec=HANDSHAKES)
    except MeshrtError:
        return
    program = program_of(module)
    sites = [(rec, "notify") for c in program.core_classes() for *_, rec in c.boundaries() if rec.notify]
    sites += [(rec, "drain") for c in program.core_classes() for *_, rec in c.boundaries() if rec.drain]
    sites += [(seg, "awaits") for c in program.core_classes() for seg in c.segments() if seg.awaits]
    sites += [(seg, "grant") for c in program.core_classes() for seg in c.segments() if seg.grant]
    if not sites:
        return
    op, what = data.draw(st.sampled_from(sites))
    setattr(op, what, None)
    problems = check_segments(module)
    expect = {"notify": "does not notify", "drain": "does not drain", "awaits": "without awaiting",
              "grant": "at program start"}[what]
    assert any(expect in p for p in problems), problems


def test_lockstep_programs_need_handshakes_only_when_asked():
    module = compile_random(3)
    assert check_segments(module) == []  # states no handshake: a lockstep program
    problems = check_segments(module, handshakes=True)
    assert problems and any("does not notify" in p or "without awaiting" in p for p in problems)
    run(module, "insert-route-handshakes")
    assert check_segments(module, handshakes=True) == []


@pytest.mark.parametrize("target", ["test32", "test16", "wse2", "wse3"])
@pytest.mark.parametrize("model", ["tiny_dense.mrt", "tiny_moe.mrt"])
def test_examples_handshakes_pass_the_checker(model, target):
    text = _events(model, target)
    assert text is not None
    module = parse(text, model)
    run(module, "materialize-segments,color-routes,insert-route-handshakes")
    assert check_segments(module, target, handshakes=True) == []
    program = program_of(module)
    stated = any(seg.awaits is not None for c in program.core_classes() for seg in c.segments())
    multi = any(len(c.segments()) > 1 for c in program.core_classes())
    assert stated == multi  # one-segment programs (the roomy targets) need no handshake
