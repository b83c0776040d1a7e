"""The default mapper's choices: by the cost model's step time, within the control state,
on the wafers asked for (small cases; the full-size builds are in bench/bench_mapper.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshrt import driver
from meshrt.dialects import event as ev
from meshrt.dialects import graph
from meshrt.dialects.base import int_value
from meshrt.frontend import mapper as M
from meshrt.frontend import step_time
from meshrt.frontend.errors import FrontendError
from meshrt.frontend.spec import parse_spec
from meshrt.runtime.cost_model import CostModel
from meshrt.kernels.attention.op import AttentionOp
from meshrt.shape import HParams
from meshrt.targets import load_target

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "examples" / "tiny_dense.mrt"
# Three dense layers on test32 without pipelining: several block heights fit one wafer.
SMALL = ("model m { layers = 3 hidden = 64 heads = 4 vocab = 64 ffn = 64 max_seq = 16 } "
         "runtime { dynamism = [continuous_batching] }")


def _mapper(spec, target="test32", mb=1, wafers=None) -> M._Mapper:
    return M._Mapper(spec, load_target(target), mb, wafers)


def test_chooses_the_candidate_with_the_least_modelled_step(monkeypatch):
    spec = parse_spec(SMALL)
    mp = _mapper(spec)
    cands = mp.candidates(1, mp.fewest_wafers(1))
    whole = min(M._splits(lay) for lay in cands)  # whole KV heads per column come first
    cands = [lay for lay in cands if M._splits(lay) == whole]
    assert len(cands) > 1
    monkeypatch.setattr(step_time, "MAX_PROBES", len(cands))  # every candidate is probed
    steps = [step_time.step_cycles(mp, lay) for lay in cands]
    assert all(s is not None and s > 0 for s in steps)
    assert len({round(s) for s in steps}) > 1  # the choice matters
    chosen = mp.default_layout()
    best = min(range(len(cands)), key=lambda i: steps[i])
    assert (chosen.height, chosen.scale) == (cands[best].height, cands[best].scale)
    assert chosen.step_cycles == pytest.approx(steps[best])


def test_the_search_probes_the_widest_candidate_of_each_height(monkeypatch):
    """A step that falls steeply only at one height's widest scale (gpt-oss-20b on 4 wafers:
    expert tiles fit decoded only there) is off the neighbour search's path from the evenly
    spread probes; the second round (the widest of each height) finds it, and the pick is
    never slower than the first round's."""
    heights = [40 + 10 * k for k in range(12)]
    scales = (1.0, 1.25, 1.5, 2.0, 3.0)
    cands = [M.Layout([], 1, h, 1, scale=sc) for h in heights for sc in scales]
    step = {(h, sc): 1000.0 - 10 * sc - h / 10 for h in heights for sc in scales}
    target = (heights[5], scales[-1])
    step[target] = 100.0  # the threshold, at one height's widest scale
    probed = []

    def fake(_mapper, lay):
        probed.append((lay.height, lay.scale))
        return step[lay.height, lay.scale]

    monkeypatch.setattr(step_time, "step_cycles", fake)
    pick = step_time.fastest(None, cands)
    assert (pick.height, pick.scale) == target and pick.step_cycles == 100.0
    # the first round went to the other end (the neighbours of the tallest, widest) first
    assert probed.index((heights[-1], scales[-2])) < probed.index(target)
    assert len(probed) <= 2 * step_time.MAX_PROBES and len(set(probed)) == len(probed)


def test_with_fewer_heights_than_probes_the_widest_of_every_height_is_timed(monkeypatch):
    """Five heights of six scales, the step smooth but for one height's widest: the second
    round times the widest of all five heights (it took the first three only: its spread
    assumed MAX_PROBES heights), and finds it."""
    heights = [40 + 10 * k for k in range(5)]
    scales = (1.0, 1.25, 1.5, 2.0, 3.0, 4.0)
    cands = [M.Layout([], 1, h, 1, scale=sc) for h in heights for sc in scales]
    step = {(lay.height, lay.scale): 1000.0 + k for k, lay in enumerate(cands)}
    target = (heights[3], scales[-1])
    step[target] = 100.0
    probed = set()

    def fake(_mapper, lay):
        probed.add((lay.height, lay.scale))
        return step[lay.height, lay.scale]

    monkeypatch.setattr(step_time, "step_cycles", fake)
    pick = step_time.fastest(None, cands)
    assert (pick.height, pick.scale) == target
    assert {(h, scales[-1]) for h in heights} <= probed


def test_a_dense_layer_narrower_than_its_kv_heads_splits_them_unless_its_width_divides():
    """A dense layer widened to 3 or 6 columns for 8 KV heads splits head_dim as a wider
    one does (it counted as splitting only past 8 columns), so the mapper's preference
    for whole KV heads per column sees it."""
    spec = parse_spec("model m { layers = 3 hidden = 96 heads = 24 kv_heads = 8 vocab = 64 "
                      "ffn = 64 max_seq = 16 } runtime { dynamism = [continuous_batching] }")
    mp = _mapper(spec)
    dense = [p.shape for lay in mp.candidates(1, mp.fewest_wafers(1)) for p in lay.placed
             if p.unit.kind == "dense"]
    assert any(sh.widths[0] < 8 and 8 % sh.widths[0] for sh in dense)
    assert all(sh.splits_heads == (8 % sh.widths[0] != 0) for sh in dense)


def test_probe_predicts_the_full_build():
    """The probe (two layers) extrapolated to the model is the full build's cost-model step."""
    spec = parse_spec(SMALL)
    mp = _mapper(spec)
    lay = mp.default_layout()
    t = load_target("test32")
    program = driver.segment_program(M.map_model(spec, t), t)
    full = CostModel(program, t).estimate(1).cycles_per_step
    assert lay.step_cycles == pytest.approx(full, rel=0.05)


def test_stages_fit_the_control_state():
    t = load_target("test32")
    six = parse_spec(TINY.read_text().replace("layers      = 2", "layers      = 6"))
    for mb, stages in ((2, 8), (4, 8), (8, 4)):
        m = M.map_model(six, t, micro_batch=mb).body.block.first_op
        assert m.stages.value.data == stages
        assert AttentionOp.control(mb, m.hparam("kv_slots")) <= t.control_bytes
        if stages < 8:  # one more stage would not fit
            assert AttentionOp.control(mb, mb * (stages + 1)) > t.control_bytes
    with pytest.raises(FrontendError, match="16 request slots.*320 bytes of control state"):
        M.map_model(driver.load_spec(TINY), t, micro_batch=16)


def test_fixed_stages_beyond_the_control_state_are_an_error():
    spec = parse_spec(SMALL.replace("continuous_batching]", "continuous_batching, "
                                    "micro_batch_pipeline] micro_batch = 8")
                      + " mapping { stages = 5 }")
    with pytest.raises(FrontendError, match="stages = 5 do not fit: 5 stage.*micro-batch 8 keep 40 request slots"):
        M.map_model(spec, load_target("test32"))


def test_wafers_are_honoured():
    t = load_target("test32")
    spec = driver.load_spec(TINY)
    assert M.map_model(spec, t).body.block.first_op.wafers.value.data == 1
    m = M.map_model(spec, t, wafers=2).body.block.first_op
    assert m.wafers.value.data == 2
    on = {k.kernel_name: k.wafer_index for k in m.kernels()}
    assert on["embed"] == on["l0_qkv"] == 0 and on["l1_qkv"] == on["lm_head"] == 1


def test_too_few_wafers_name_the_count_needed():
    spec = driver.load_spec(REPO / "examples" / "tiny_moe.mrt")
    with pytest.raises(FrontendError, match="needs at least 2 wafers"):
        M.map_model(spec, load_target("test16"), wafers=1)


def test_more_wafers_widen_dense_layers():
    """With room to spare a dense layer gets more cores (on wse3 every layer splits heads
    anyway, so widening is free to choose), and the probe says it is faster."""
    spec = parse_spec("model m { layers = 4 hidden = 512 heads = 8 kv_heads = 2 vocab = 512 "
                      "ffn = 1024 max_seq = 64 } runtime { dynamism = [continuous_batching] }")
    one, two = _mapper(spec, "wse3"), _mapper(spec, "wse3", wafers=2)
    a, b = one.default_layout(), two.default_layout()
    assert (a.wafers, b.wafers) == (1, 2)
    layer = lambda lay: next(p for p in lay.placed if p.unit.kind == "dense")
    assert layer(b).shape.width * layer(b).h >= layer(a).shape.width * layer(a).h
    assert b.step_cycles is not None and a.step_cycles is not None
    assert b.step_cycles <= a.step_cycles


def test_embedding_sized_for_its_first_layers_messages():
    """The embedding's cores hold their table slice and the largest message they send (the
    slice of the hidden vector a root core holds, with the CF payload): the message the
    flows into layer 0 carry."""
    t = load_target("test32")
    spec = driver.load_spec(REPO / "examples" / "tiny_moe.mrt")
    mp = _mapper(spec, mb=8)
    lay = mp.default_layout()
    embed = lay.placed[0]
    msg = mp.embed_message(embed.h)
    sizer = mp.planner(max(lay.stages) + 1).sizer
    assert sizer.band("embed", embed.widths[0], embed.h) + msg <= sizer.usable
    # the kernels' own budget check agrees (the build goes through), and the largest
    # message into layer 0 (sent by the stage's hand-off on the embedding's root cores, as
    # they hold the value) is the one the mapper sized the embedding for
    module = driver.segment_program(M.map_model(spec, t, micro_batch=8), t)
    sent = [op.num_bytes + int_value(op.meta) for op in module.walk()
            if isinstance(op, ev.SendOp) and op.flow_name.startswith("l0_")
            and isinstance(sub := op.parent_op(), ev.SubScheduleOp)
            and sub.kernel.root_reference.data.startswith(("embed", "handoff_s0"))]
    assert sent and max(sent) == msg


def test_width_scale_pins_the_widening_and_moe_regions_widen():
    """`mapping { width_scale = s }` pins the widening (every candidate at s); an MoE layer's
    expert regions are s times their least width where the row fits (on wse3; on test32 a
    row of regions has no room to widen: they keep their least width), while its attention
    half's one region, the gate's column and the corridor keep theirs."""
    spec = driver.load_spec(REPO / "examples" / "tiny_moe.mrt")
    text = Path(spec.source).read_text()
    shapes = {}
    for scale in (1.0, 2.0):
        pinned = parse_spec(text + f"\nmapping {{ block_height = 6  width_scale = {scale:g} }}\n")
        assert {lay.scale for lay in _mapper(pinned).candidates(4, 1)} == {scale}
        mp = _mapper(pinned, "wse3")
        moe = next(p for p in mp.default_layout().placed if p.unit.kind == "moe")
        shapes[scale] = moe.shape
        narrow = next(p for p in _mapper(pinned).default_layout().placed if p.unit.kind == "moe")
        assert narrow.shape.grid.w * narrow.shape.grid.regions <= 32
    least, wide = shapes[1.0], shapes[2.0]
    assert wide.grid.w == 2 * least.grid.w and wide.grid.rows == least.grid.rows == 1
    assert M.MOE_BANDS == ("layer", "gate", "relay") and wide.widths == least.widths


def test_expert_grid_takes_more_experts_per_region_before_it_stacks():
    """Where a row of one-expert regions is wider than the room, the grid keeps one row of
    full-height regions (rows aligned with the corridor's: dispatch and combine along the
    rows) by giving each region more experts; with `experts_per_region` pinned it stacks."""
    spec = driver.load_spec(REPO / "examples" / "tiny_moe.mrt")
    planner = _mapper(spec).planner(1)
    assert planner.group == 1 and planner.groups() == [1, 2, 4, 8]
    assert planner.grid(10, 0, 16) == M.ExpertGrid(8, 1, 2, 10, 1)  # the row fits
    # 8 x 2 columns do not fit 12; 4 regions of two experts, 3 columns each, do
    assert planner.grid(10, 0, 12) == M.ExpertGrid(4, 1, 3, 10, 2)
    pinned = M.Planner(planner.sizer, 1, planner.max_width, merges=False)
    assert pinned.groups() == [1] and pinned.grid(10, 0, 12).rows > 1
    text = Path(spec.source).read_text() + "\nmapping { experts_per_region = 1 }\n"
    assert not _mapper(parse_spec(text)).planner(1).merges


def test_shared_experts_get_regions_sized_for_one_expert():
    """A shared expert's region is sized for its one expert, not for a routed region's
    group: where the routed regions take two experts each (3 columns), the shared one keeps
    the least width of one expert (2 columns) and the row is 4 x 3 + 2 wide, not 5 x 3.
    The emitted regions follow (routed, then shared; one kernel), and the interpreter's
    tokens equal NumPy's on that mapping."""
    text = (REPO / "examples" / "tiny_moe.mrt").read_text().replace(
        "expert_ffn  = 128", "expert_ffn  = 128\n  shared_experts = 1")
    spec = parse_spec(text)
    planner = _mapper(spec).planner(1)
    assert planner.regions(2) == 4 and planner.shared_width(10) == planner.expert_width(10, 1) == 2
    assert planner.grid(10, 0, 14) == M.ExpertGrid(4, 1, 3, 10, 2, 1, 2)
    assert planner.grid(10, 0, 14).width == 14
    # stacked (rows > 1): the shared region fills the last column's free slot
    grid = M.ExpertGrid(8, 3, 2, 3, 1, 1, 2)
    assert grid.width == 3 * 2 and grid.rects()[-1] == (4, 6, 2, 3)
    full = M.ExpertGrid(9, 3, 3, 3, 1, 1, 2)  # no free slot: a column of its own width
    assert full.rects()[8] == (6, 6, 3, 3) and full.rects()[-1] == (9, 0, 2, 3)
    assert full.width == 11


def test_mapper_probes_both_grid_arrangements_and_takes_the_faster():
    """tiny_moe at micro-batch 2 on two test16 wafers with 2 stages: at height 16 a row of
    2-expert regions (3 x 16 each) fits beside the bands, and so do stacked 1-expert
    regions (7 x 2). Both are probed at the same (height, scale) point; the merged
    regions are narrow, so their columns reduce long vectors down 16 rows and the probe
    prices them slower here: the stacked grid wins. The merged grid is sized for the
    static build's micro_batch x group token pairs, so its static counterpart fits too."""
    mp = _mapper(driver.load_spec(REPO / "examples" / "tiny_moe.mrt"), "test16", mb=2)
    cands = [lay for lay in mp.candidates(2, 2) if lay.height == 16 and lay.scale == 1.0]
    grids = {next(p.shape.grid for p in lay.placed if p.shape.grid): lay for lay in cands}
    merged = next(g for g in grids if g.group > 1)
    stacked = next(g for g in grids if g.rows > 1)
    assert merged.rows == 1 and merged.h == 16 and stacked.group == 1
    t_merged = step_time.step_cycles(mp, grids[merged])
    t_stacked = step_time.step_cycles(mp, grids[stacked])
    assert t_merged is not None and t_stacked is not None and t_stacked < t_merged
    assert step_time.fastest(mp, [grids[merged], grids[stacked]]) is grids[stacked]
    assert step_time.fastest(mp, [grids[stacked], grids[merged]]) is grids[stacked]


def test_fastest_probes_both_arrangements_of_every_point_it_probes(monkeypatch):
    """16 (height, scale) points, each with a merged and a stacked twin; the fastest of all
    is the stacked twin of the sixth point. Probing twins together finds it with the first,
    evenly spread probes; probing candidates one by one (the twins as neighbours in the
    order) spends the spread on other candidates and never reaches it."""
    mp = _mapper(driver.load_spec(TINY))
    cands, cycles = [], {}
    for h in range(1, 17):
        for t in (100.0 + h, 200.0 + h):  # merged, stacked
            lay = M.Layout([], 1, h, 1)
            cycles[id(lay)] = 50.0 if (h, t) == (6, 206.0) else t
            cands.append(lay)
    probed = []

    def step_cycles(mapper, lay):
        probed.append(lay)
        return cycles[id(lay)]

    monkeypatch.setattr(step_time, "step_cycles", step_cycles)
    pick = step_time.fastest(mp, cands)
    assert pick is cands[11] and pick.step_cycles == 50.0
    # every probed point had both twins probed
    assert {lay.height for lay in probed} == {lay.height for lay in probed[::2]}
    assert len(probed) % 2 == 0


def test_block_height_pins_the_rows():
    spec = driver.load_spec(REPO / "examples" / "tiny_moe.mrt")
    for rows in (5, 6):
        pinned = parse_spec(spec.source and Path(spec.source).read_text()
                            + f"\nmapping {{ block_height = {rows} }}\n")
        mp = _mapper(pinned)
        assert {lay.height for lay in mp.candidates(4, 1)} == {rows}
        assert {p.h for p in mp.default_layout().placed} == {rows}


def test_pipelined_stages_by_modelled_throughput(monkeypatch):
    """The rate (stages / modelled step) is not monotone: where more KV slots crowd the
    expert regions out of one row the step jumps. The most and the least are timed, then
    the halvings between that could still beat the best rate."""
    mp = _mapper(driver.load_spec(TINY), mb=2)
    tried = []

    def layout(stages, wafers):
        tried.append(stages)
        return M.Layout([], 1, 1, 1, step_cycles=steps.get(stages))

    monkeypatch.setattr(mp, "layout", layout)
    monkeypatch.setattr(step_time, "step_cycles", lambda mapper, lay: None)  # no probe
    steps = {10: 20.9e6, 5: 21.0e6, 3: 3.2e6}  # gpt-oss-20b at micro-batch 8 on 3 wafers
    assert mp.pipelined_stages(3, 10, 3) == 3 and tried == [10, 3, 5]
    tried.clear()
    steps = {20: 30e6, 10: 2.2e6, 5: 2.1e6, 2: 2.0e6}
    assert mp.pipelined_stages(2, 20, 3) == 10 and tried == [20, 2, 10]  # 5 / 2M < 10 / 2.2M
    steps = {10: 2.0e6, 5: 1.5e6, 3: 1.2e6}  # more stages pay: the most that fit
    assert mp.pipelined_stages(3, 10, 3) == 10
    steps = {5: 1.0e6, 3: 1.0e6}  # the most has no modelled step: kept, as before
    assert mp.pipelined_stages(3, 10, 3) == 10


@pytest.mark.slow  # about a minute
def test_gpt_oss_20b_at_micro_batch_8_keeps_its_experts_in_one_row():
    """At the most stages that fit (10 on 3 wafers, 80 KV slots) the attention bands widen
    and the expert regions stack (combine then gathers: 21.9M cycles a step); three stages
    keep one row of regions along the corridor's rows (3.3M)."""
    cfg = REPO / "examples" / "configs" / "gpt-oss-20b.json"
    module = driver.compile(cfg, "wse3", "graph", micro_batch=8)
    m = module.body.block.first_op
    assert m.stages.value.data == 3
    ops = [op for op in module.walk() if op.name == "graph.moe_experts"]
    assert all(len({r.rects.data[0].y.data for r in op.expert_regions.data}) == 1 for op in ops)


def test_quantized_experts_are_held_decoded_where_decoded_tiles_fit():
    """gpt-oss-20b's MXFP4 experts: on one wafer their regions are sized by the packed
    tiles and decoding them would not fit, so they stay packed; on four the widened
    regions hold so few weights a core that decoded 16-bit tiles fit, and the mapper
    marks every MoE layer `decoded` (no per-token decode)."""
    cfg = REPO / "examples" / "configs" / "gpt-oss-20b.json"
    t = load_target("wse3")
    for wafers, decoded in ((1, False), (4, True)):
        module = driver.compile(cfg, t, "graph", wafers=wafers)
        ops = [op for op in module.walk() if op.name == "graph.moe_experts"]
        assert len(ops) == 24 and {op.decoded is not None for op in ops} == {decoded}, wafers
        spec = driver.load_spec(cfg)
        sizer = M.Sizer(spec.shape, 1, 1, int(t.usable_sram_bytes * (1 - M.SRAM_HEADROOM)))
        x0, y0, x1, y1 = ops[0].expert_regions.data[0].extent
        group = spec.shape.experts // len(ops[0].expert_regions.data)
        assert sizer.decoded_experts_fit(group, x1 - x0, y1 - y0) == decoded


def test_qwen3_5_9b_maps_at_micro_batch_2():
    """The DeltaNet's q / k conv state is split over its column's rows (the convolved q / k
    all-gathered along the column), not kept whole on every row: 12 request slots (2 x 6
    stages) fit, where 14 slots of the replicated state left no block height."""
    cfg = REPO / "examples" / "configs" / "qwen3.5-9b.json"
    module = driver.compile(cfg, "wse3", "graph", micro_batch=2)
    model = next(op for op in module.walk() if isinstance(op, graph.ModelOp))
    assert HParams.of(model).int("kv_slots") == 2 * int_value(model.stages) > 2


@pytest.mark.parametrize("micro_batch", [4, 8])
def test_qwen3_5_9b_maps_at_micro_batch_4_and_8_with_deltanet_token_groups(micro_batch):
    """With one value head per column a DeltaNet holds every slot's state on 32 columns:
    at micro-batch 4 that left each stage needing more wafers than it added, and no
    mapping. As token groups side by side (each its share of the tokens and their slots)
    it spreads over its layer's band, and the model maps."""
    cfg = REPO / "examples" / "configs" / "qwen3.5-9b.json"
    module = driver.compile(cfg, "wse3", "graph", micro_batch=micro_batch)
    model = next(op for op in module.walk() if isinstance(op, graph.ModelOp))
    assert HParams.of(model).int("kv_slots") == micro_batch * int_value(model.stages)
    widths = {op.region.extent[2] - op.region.extent[0]
              for op in module.walk() if isinstance(op, graph.DeltaNetOp)}
    (w,) = widths
    assert w % 32 == 0 and micro_batch % (w // 32) == 0 and w // 32 > 1


def test_a_model_that_fits_no_wafer_names_the_unit_that_does_not_tile():
    """Qwen3.5-9B at micro-batch 16: the LM head's per-token buffers leave its GEMV no
    block height where it tiles onto one wafer; the error names it and the slots (it
    named the embedding, as large, which tiles)."""
    cfg = REPO / "examples" / "configs" / "qwen3.5-9b.json"
    with pytest.raises(FrontendError) as e:
        driver.compile(cfg, "wse3", "graph", micro_batch=16)
    msg = str(e.value)
    assert "model does not fit: lm_head " in msg and "request slots of KV: micro-batch 16 x" in msg
    assert "tile onto one wafer's mesh at no block height" in msg and "embed needs" not in msg
