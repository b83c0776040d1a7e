"""Attention wider than its KV heads: head_dim split over each KV head's columns
(`meshrt.kernels.attention.layout`), its layout's invariants and its numerics."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt import driver, quant
from meshrt.frontend.mapper import map_model
from meshrt.frontend.model import MappingSpec, RectChoice
from meshrt.kernels.attention.layout import HeadSplit, kv_share, qkv_share, splits_heads
from meshrt.runtime.serving import serve
from meshrt.runtime.workloads import Request

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "test" / "data" / "hf"


@st.composite
def head_splits(draw):
    kv = draw(st.integers(1, 6))
    g = draw(st.integers(1, 4))
    d = 2 * draw(st.integers(1, 12))
    rot = 2 * draw(st.integers(0, d // 2))
    cols = draw(st.integers(kv + 1, 4 * kv + d))
    return HeadSplit(kv * g, kv, d, rot, cols)


@settings(max_examples=150, deadline=None)
@given(head_splits(), st.booleans())
def test_a_head_split_partitions_every_vector_into_aligned_units(sp, gated):
    assert sp.problem() is None
    hd, kvd, g, d = sp.heads * sp.head_dim, sp.kv_heads * sp.head_dim, sp.g, sp.head_dim
    for order, n in ((sp.q_order, hd), (sp.k_order, kvd), (sp.o_order, hd)):
        assert sorted(order.tolist()) == list(range(n))  # a permutation
    kv_ranges = [sp.kv_range(i) for i in range(sp.cols)]
    # the columns' ranges tile k (and q, g per k position) in column order
    assert kv_ranges[0][0] == 0 and kv_ranges[-1][1] == kvd
    assert all(a[1] == b[0] for a, b in zip(kv_ranges, kv_ranges[1:]))
    half = sp.rotary // 2
    for i in range(sp.cols):
        k0, k1 = kv_ranges[i]
        q0, q1 = sp.q_range(i)
        assert (q0, q1) == (g * k0, g * k1)
        kv_head, _, _ = sp.group(i)
        feats = sp.k_order[k0:k1] - kv_head * d  # this column's features of its KV head
        assert ((sp.k_order[k0:k1] // d) == kv_head).all()
        # each query head of the group holds the same features: partial dots are local
        q = sp.q_order[q0:q1]
        assert set((q // d) // g) <= {kv_head}
        for j in range(g):
            assert sorted((q[(q // d) % g == j] % d).tolist()) == sorted(feats.tolist())
        # every RoPE pair whole on one column
        held = set(feats.tolist())
        assert all((m + half in held) == (m in held) for m in range(half))
        # o and the gate: the same heads, the features v holds (natural order)
        o = sp.o_order[q0:q1]
        assert sorted((o % d).tolist()) == sorted(np.repeat(np.arange(k0, k1) - kv_head * d, g).tolist())
    sizes = [k1 - k0 for k0, k1 in kv_ranges]
    assert max(sizes) == kv_share(sp.kv_heads, d, sp.cols)  # the footprints' formula
    blocked = sp.qkv_order(gated)
    total = hd + 2 * kvd + (hd if gated else 0)
    assert sorted(blocked.tolist()) == list(range(total))
    ranges = [sp.qkv_range(i, gated) for i in range(sp.cols)]
    assert ranges[-1][1] == total
    assert max(b - a for a, b in ranges) == qkv_share(sp.heads, sp.kv_heads, d, sp.cols, gated)


@settings(max_examples=150, deadline=None)
@given(head_splits(), st.integers(1, 300), st.integers(1, 40))
def test_a_groups_columns_split_its_rows_positions(sp, max_seq, h):
    """Split by rows, a group's columns' ring entries on a row partition the row's
    block, the columns past the groups hold none, and the fullest core holds the
    layout's `kv_rows` (the footprint's and the roles' count)."""
    from meshrt.kernels.attention.layout import split_layout
    from meshrt.kernels.numerics import part

    most = 0
    for j in range(h):
        r0, r1 = part(max_seq, h, j)
        for lo, c in sp.group_columns():
            held = [sp.entries(i, r0, r1).tolist() for i in range(lo, lo + c)]
            assert sorted(e for es in held for e in es) == list(range(r0, r1))
            most = max([most] + [len(es) for es in held])
        for i in range(sp.group_width * sp.kv_heads, sp.cols):
            assert len(sp.entries(i, r0, r1)) == 0
    lay = split_layout(sp.heads, sp.kv_heads, sp.head_dim, max_seq, 1, 4, 1, sp.cols, h)
    assert most == (lay.kv_rows if lay.rows else -(-(-(-max_seq // h)) // sp.group_width))


def test_groups_share_one_width_and_the_columns_past_them_hold_nothing():
    sp = HeadSplit(4, 2, 4, 4, 7)  # 2 units a head; groups of 3 columns, column 6 idle
    assert sp.group_columns() == [(0, 3), (3, 3)]
    assert [sp.kv_range(i)[1] - sp.kv_range(i)[0] for i in range(7)] == [0, 2, 2, 0, 2, 2, 0]
    assert sp.kv_range(6) == (8, 8) and sp.q_range(6) == (16, 16)
    assert not splits_heads(4, 4) and not splits_heads(4, 2) and splits_heads(4, 5)


@pytest.mark.parametrize("fmt, block", [("fp8", (4, 8)), ("mxfp4", None)])
def test_packed_rows_in_keeps_each_rows_scale(fmt, block):
    rng = np.random.default_rng(0)
    w = rng.normal(size=(64, 8)).astype(np.float32)
    p = quant.pack(w, fmt, block)
    order = rng.permutation(64)
    moved = p.rows_in(order)
    assert np.array_equal(moved.decode(), p.decode()[order])
    assert np.array_equal(moved.slice(5, 20, 2, 6).decode(), p.decode()[order][5:20, 2:6])


def _roomier_test32(tmp_path) -> Path:
    """test32 with a user input queue and two colours more."""
    toml = (REPO / "meshrt" / "targets" / "test32.toml").read_text()
    for a, b in (('name = "test32"', 'name = "test32q6"'), ("colors = 8", "colors = 10"),
                 ("reserved_colors = [6, 7]", "reserved_colors = [8, 9]"),
                 ("reserved_task_ids = [6, 7, 15]", "reserved_task_ids = [8, 9, 15]"),
                 ("input_queues = 5", "input_queues = 6")):
        assert a in toml
        toml = toml.replace(a, b)
    target = tmp_path / "test32q6.toml"
    target.write_text(toml)
    return target


def _split_program(spec, width: int, target, height: int = 8):
    """`spec` with explicit regions: every layer `width` columns, `height` rows."""
    n = spec.shape.layers
    m = MappingSpec(layers={i: RectChoice(4 + i * width, 0, width, height) for i in range(n)},
                    embed=RectChoice(0, 0, 4, height), lm_head=RectChoice(4 + n * width, 0, 4, height))
    spec = dataclasses.replace(spec, mapping=m)
    return driver.segment_program(map_model(spec, driver.load_target(target), None, None, None),
                                  target)


def test_a_head_split_computes_every_attention_feature(tmp_path):
    """Two KV heads on five columns (two a head, the fifth idle): q/k norm, partial rotary,
    biases, sinks and a sliding window, on test32, two asynchrony seeds: the reference's
    tokens."""
    (tmp_path / "m.mrt").write_text((REPO / "examples" / "tiny_dense.mrt").read_text()
                                    .replace("kv_heads    = 4", "kv_heads    = 2"))
    spec = driver.load_spec(tmp_path / "m.mrt")
    shape = dataclasses.replace(spec.shape, attn_sinks=True, sliding_window=5, window_layers=(1,),
                                qk_norm=True, rope_partial=0.5, qkv_bias=True, o_bias=True)
    program = _split_program(dataclasses.replace(spec, shape=shape), 5, "test32")
    (attn,) = [k for k in program.kernels() if k.kernel_name == "l0_attn"]
    assert attn.region.rects.data[0].tuple[2] == 5
    assert "l0_attn.scores.down" in {f.flow_name for f in program.flows()}
    rng = np.random.default_rng(3)
    reqs = [Request(i, 0.0, rng.integers(0, 256, 2 + i % 4).tolist(), 2 + i % 4, 6, 6)
            for i in range(6)]
    for seed in range(2):
        res = serve(program, driver.load_target("test32"), reqs, seed=seed)
        assert len(res.records) == 6 and not res.sim.reports
        assert res.outputs_match_reference, seed


def test_a_head_split_by_rows_computes_every_attention_feature(tmp_path, test32_with):
    """The same attention with a context of 256 on regions two rows high: layer 0's group
    splits its rows (128 entries a row's block: its scores outweigh whole heads'
    vectors, `layout.split_layout`), layer 1's sliding window of 5 keeps the features
    layout. q/k norm, partial rotary, biases, sinks, on test32 with room for the caches,
    two asynchrony seeds, half the requests arriving with a pushed cache: the
    reference's tokens."""
    import importlib.util

    from meshrt.runtime.serving import reference_shape

    spec_ = importlib.util.spec_from_file_location("kv_push", Path(__file__).parent / "test_kv_push.py")
    kv_push = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(kv_push)
    target = test32_with("test32big", ("sram_bytes = 12288", "sram_bytes = 131072"))
    (tmp_path / "m.mrt").write_text((REPO / "examples" / "tiny_dense.mrt").read_text()
                                    .replace("kv_heads    = 4", "kv_heads    = 2")
                                    .replace("max_seq     = 12", "max_seq     = 256"))
    spec = driver.load_spec(tmp_path / "m.mrt")
    shape = dataclasses.replace(spec.shape, attn_sinks=True, sliding_window=5, window_layers=(1,),
                                qk_norm=True, rope_partial=0.5, qkv_bias=True, o_bias=True)
    program = _split_program(dataclasses.replace(spec, shape=shape), 5, target, height=2)
    flows = {f.flow_name for f in program.flows()}
    assert "l0_attn.group.gather.down" in flows and "l1_attn.scores.down" in flows
    rshape = reference_shape(program)
    rng = np.random.default_rng(5)
    reqs = [Request(i, 0.0, rng.integers(0, 256, 3 + i % 4).tolist(), 3 + i % 4, 6, 6)
            for i in range(6)]
    for r in reqs[::2]:
        r.kv = kv_push.random_cache(rshape, r.prompt_len - 1, 20 + r.id)
    for seed in range(2):
        res = serve(program, driver.load_target(target), reqs, seed=seed)
        assert len(res.records) == 6 and not res.sim.reports
        assert res.outputs_match_reference, seed


def test_a_gated_partial_rotary_head_split_equals_the_checkpoint(tmp_path):
    """The qwen3_5 fixture (output gate, partial rotary 0.25, q/k norm) with its full-attention
    layer's four KV heads over twelve columns (groups of three), on test32 with a user input
    queue more (a three-core group's middle core receives on four flows: its row's scores
    and their sums, its column's partials and result) and two colours more (the DeltaNet
    layers' relay, as in test_hf_parity): the transformers-checked reference's tokens."""
    import importlib.util

    from meshrt.runtime.checkpoint import load_checkpoint
    from meshrt.runtime.serving import reference_shape

    target = _roomier_test32(tmp_path)
    spec_ = importlib.util.spec_from_file_location("hf_parity", REPO / "bench" / "hf_parity.py")
    hf_parity = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(hf_parity)
    d = DATA / "qwen3_5"
    spec = driver.load_spec(d)
    n = spec.shape.layers
    m = MappingSpec(layers={i: RectChoice(4 + i * 12, 0, 12, 16) for i in range(n)},
                    embed=RectChoice(0, 0, 4, 16), lm_head=RectChoice(4 + n * 12, 0, 4, 16))
    graph = map_model(dataclasses.replace(spec, mapping=m), driver.load_target(target), None, None, None)
    program = driver.segment_program(hf_parity.f32_activations(graph), target)
    attn = [k for k in program.kernels() if k.kind.data == "attention"]
    assert attn and all(k.region.rects.data[0].tuple[2] == 12 for k in attn)
    weights = load_checkpoint(d, reference_shape(program))
    exp = json.loads((d / "expected.json").read_text())
    _, want, _ = hf_parity.reference_outputs(d)
    reqs = [Request(i, 0.0, list(p), len(p), hf_parity.NEW_TOKENS, hf_parity.NEW_TOKENS)
            for i, p in enumerate(exp["prompts"])]
    res = serve(program, driver.load_target(target), reqs, seed=0, weights=weights)
    got = {r.id: r.tokens for r in res.records}
    assert [got.get(i) for i in range(len(reqs))] == want
    assert res.outputs_match_reference and not res.sim.reports


def test_a_head_split_reading_its_input_from_elsewhere_computes(tmp_path):
    """Layer 0's attention moved off its layer's columns (printed graph IR, edited): it
    gathers q | k | v from the qkv reduction in plain order and picks its units, and the o
    projection, no longer transposed, takes its rows in the attention's order. On test32 with
    a queue more (the input flow beside the row and column chains), three seeds."""
    import contextlib
    import io
    import re

    from meshrt.tools.cli import main

    (tmp_path / "m.mrt").write_text(
        (REPO / "examples" / "tiny_dense.mrt").read_text().replace("kv_heads    = 4", "kv_heads    = 2")
        + "mapping {\n  embed region (0, 0, 4, 8)\n  layer 0 region (4, 0, 5, 8)\n"
          "  layer 1 region (9, 0, 5, 8)\n  lm_head region (14, 0, 4, 8)\n}\n")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["compile", str(tmp_path / "m.mrt"), "--target", "test32", "--emit", "graph"]) == 0
    ir, n = re.subn(r"(graph\.attention @l0_attn\(%\d+\) on )<\(4, 0, 5, 8\)>", r"\1<(20, 10, 5, 8)>",
                    out.getvalue())
    assert n == 1
    (tmp_path / "g.mlir").write_text(ir)
    target = _roomier_test32(tmp_path)
    kernels = {k.kernel_name: k for k in driver.program_of(driver.lower(
        driver.read_ir(tmp_path / "g.mlir"), "kernels", target)).walk() if hasattr(k, "kernel_name")}
    assert kernels["l0_attn"].qkv_in_place is None
    assert kernels["l0_o"].in_heads.get_values() == (4, 2, 16, 5) and kernels["l0_o"].axis is None
    for seed in ("0", "1", "2"):
        got = io.StringIO()
        with contextlib.redirect_stdout(got):
            rc = main(["run", str(tmp_path / "g.mlir"), "--target", str(target), "--requests", "4",
                       "--seed", seed, "--json"])
        assert rc == 0 and json.loads(got.getvalue())["outputs_match_reference"], seed
