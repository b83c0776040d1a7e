"""NumPy reference transformer: determinism, batching, GQA, MoE routing, EOS."""

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.runtime.reference import (
    KVState,
    ReferenceModel,
    RefShape,
    Trace,
    Weights,
    apply_rope,
    attention,
    attention_decode,
    dense_ffn,
    expert_load,
    expert_routing,
    greedy,
    moe_ffn,
    rmsnorm,
    softmax,
    swiglu,
)

DENSE = RefShape(layers=2, hidden=32, heads=4, kv_heads=2, head_dim=8, vocab=64, ffn=48)
MOE = RefShape(
    layers=2, hidden=32, heads=4, kv_heads=1, head_dim=8, vocab=64,
    experts=8, top_k=2, expert_ffn=16, shared_experts=1,
)


def model(shape=DENSE, seed=0):
    return ReferenceModel(shape, Weights.random(shape, seed))


# ---- shape and weights ---------------------------------------------------


def test_shape_from_any_object():
    cfg = SimpleNamespace(layers=1, hidden=8, heads=2, kv_heads=1, head_dim=4, vocab=10, ffn=16)
    s = RefShape.of(cfg)
    assert s == RefShape(1, 8, 2, 1, 4, 10, ffn=16)
    assert s.eos_token is None and not s.is_moe
    with pytest.raises(ValueError, match="lacks"):
        RefShape.of(SimpleNamespace(layers=1))


@pytest.mark.parametrize(
    "kw",
    [
        {"heads": 3, "kv_heads": 2},  # not a multiple
        {"head_dim": 7},  # RoPE needs even
        {"ffn": 0},  # dense without ffn
        {"experts": 4, "top_k": 5, "expert_ffn": 8, "ffn": 0},
        {"eos_token": 64},
    ],
)
def test_shape_rejects_inconsistent(kw):
    with pytest.raises(ValueError):
        dataclasses.replace(DENSE, **kw)


def test_weights_deterministic_per_seed_and_float32():
    a, b, c = Weights.random(MOE, 7), Weights.random(MOE, 7), Weights.random(MOE, 8)
    na, nb, nc = a.named_arrays(), b.named_arrays(), c.named_arrays()
    assert na.keys() == nb.keys()
    for k in na:
        assert na[k].dtype == np.float32
        np.testing.assert_array_equal(na[k], nb[k])
    assert any(not np.array_equal(na[k], nc[k]) for k in na)
    assert na["layers.1.moe.w_up"].shape == (8, 32, 16)
    assert na["layers.0.moe.shared_down"].shape == (1, 16, 32)


def test_weights_independent_of_eos():
    a = Weights.random(DENSE, 3).named_arrays()
    b = Weights.random(dataclasses.replace(DENSE, eos_token=5), 3).named_arrays()
    for k in a:
        np.testing.assert_array_equal(a[k], b[k])


def test_model_rejects_mismatched_weights():
    with pytest.raises(ValueError):
        ReferenceModel(MOE, Weights.random(DENSE, 0))


# ---- generation ----------------------------------------------------------


def test_generation_deterministic_per_seed_and_tokens_vary():
    out1 = model(DENSE, 0).generate([1, 2, 3], 24)
    out2 = model(DENSE, 0).generate([1, 2, 3], 24)
    out3 = model(DENSE, 1).generate([1, 2, 3], 24)
    assert out1 == out2
    assert out1 != out3
    assert len(out1) == 24 and len(set(out1)) > 3  # scaling keeps argmax moving


def test_max_new_tokens_edge_cases():
    m = model()
    assert m.generate([4], 0) == []
    assert m.generate([4], 1) == [m.prefill([4])[1]]
    with pytest.raises(ValueError):
        m.prefill([])
    with pytest.raises(ValueError):
        m.prefill([64])


@pytest.mark.parametrize("shape", [DENSE, MOE])
def test_prefill_matches_incremental_feeding(shape):
    m = model(shape, 2)
    prompt = [5, 17, 3, 60, 8]
    st_a, first_a = m.prefill(prompt)
    st_b, tok = m.prefill(prompt[:1])
    for t in prompt[1:]:
        tok = m.decode_step(st_b, t)
    assert tok == first_a
    assert st_a.length == st_b.length == len(prompt)
    for layer in range(shape.layers):
        np.testing.assert_allclose(st_a.keys(layer), st_b.keys(layer), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(st_a.values(layer), st_b.values(layer), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [DENSE, MOE])
def test_decode_batch_equals_one_by_one(shape):
    m = model(shape, 4)
    prompts = [[1, 2, 3], [9], [40, 41, 42, 43, 44, 45], [7, 7]]
    steps = 20
    # One by one.
    singles = [m.generate(p, steps) for p in prompts]
    # Lock-step batches over independent states (different cache lengths).
    states, toks = zip(*(m.prefill(p) for p in prompts))
    states, outs = list(states), [[t] for t in toks]
    for _ in range(steps - 1):
        nxt = m.decode_batch(states, [o[-1] for o in outs])
        for o, t in zip(outs, nxt):
            o.append(t)
    assert outs == singles
    # generate_batch retires requests at different points.
    caps = [5, 20, 1, 13]
    assert m.generate_batch(prompts, caps) == [s[:c] for s, c in zip(singles, caps)]


@settings(max_examples=15, deadline=None)
@given(
    prompts=st.lists(st.lists(st.integers(0, 63), min_size=1, max_size=6), min_size=1, max_size=5),
    steps=st.integers(1, 8),
    seed=st.integers(0, 3),
)
def test_decode_batch_equals_one_by_one_property(prompts, steps, seed):
    m = model(MOE, seed)
    assert m.generate_batch(prompts, steps) == [m.generate(p, steps) for p in prompts]


def test_decode_batch_rejects_shared_state():
    m = model()
    st_, tok = m.prefill([1])
    with pytest.raises(ValueError):
        m.decode_batch([st_, st_], [tok, tok])


def test_eos_ends_generation():
    base = model(DENSE, 5).generate([3, 1, 4], 30)
    eos = base[4]
    first = base.index(eos)  # may repeat earlier
    shape = dataclasses.replace(DENSE, eos_token=eos)
    m = ReferenceModel(shape, Weights.random(DENSE, 5))
    out = m.generate([3, 1, 4], 30)
    assert out == base[: first + 1]
    assert out[-1] == eos and eos not in out[:-1]
    # The batch path stops it too, while others keep going.
    outs = m.generate_batch([[3, 1, 4], [3, 1, 4]], [30, 2])
    assert outs[0] == out and len(outs[1]) == min(2, len(out))


# ---- building blocks -----------------------------------------------------


def test_rmsnorm_definition():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 16)).astype(np.float32)
    g = rng.standard_normal(16).astype(np.float32)
    want = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5) * g
    np.testing.assert_allclose(rmsnorm(x, g), want, rtol=1e-6)
    assert rmsnorm(x, g).dtype == np.float32


def test_rope_rotates_pairs_and_preserves_norm():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 2, 8)).astype(np.float32)
    pos = np.array([0, 1, 100])
    y = apply_rope(x, pos)
    np.testing.assert_allclose(y[0], x[0], rtol=1e-6)  # position 0 is identity
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-5)
    # Element i pairs with i + d/2, angle pos * 10000^(-2i/d).
    i, d, p = 1, 8, 100
    a = p * 10000 ** (-2 * i / d)
    x1, x2 = x[2, 0, i], x[2, 0, i + d // 2]
    np.testing.assert_allclose(y[2, 0, i], x1 * math.cos(a) - x2 * math.sin(a), rtol=1e-5)
    np.testing.assert_allclose(y[2, 0, i + d // 2], x2 * math.cos(a) + x1 * math.sin(a), rtol=1e-5)
    # Relative-position property: q·k depends only on the position difference.
    q, k = x[0:1], x[1:2]
    s1 = (apply_rope(q, np.array([5])) * apply_rope(k, np.array([3]))).sum()
    s2 = (apply_rope(q, np.array([12])) * apply_rope(k, np.array([10]))).sum()
    np.testing.assert_allclose(s1, s2, rtol=1e-4)


def _explicit_attention(q, k, v, q_start):
    tq, heads, d = q.shape
    group = heads // k.shape[1]
    out = np.zeros_like(q, dtype=np.float64)
    for t in range(tq):
        visible = q_start + t + 1
        for h in range(heads):
            kv = h // group
            s = k[:visible, kv].astype(np.float64) @ q[t, h] / math.sqrt(d)
            p = np.exp(s - s.max())
            p /= p.sum()
            out[t, h] = p @ v[:visible, kv]
    return out


@settings(max_examples=25, deadline=None)
@given(
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 3]),
    t=st.integers(1, 9),
    seed=st.integers(0, 1000),
)
def test_gqa_decode_matches_per_head_loop(kv_heads, group, t, seed):
    rng = np.random.default_rng(seed)
    heads, d = kv_heads * group, 4
    q = rng.standard_normal((heads, d)).astype(np.float32)
    k = rng.standard_normal((t, kv_heads, d)).astype(np.float32)
    v = rng.standard_normal((t, kv_heads, d)).astype(np.float32)
    got = attention_decode(q, k, v)
    np.testing.assert_allclose(got, _explicit_attention(q[None], k, v, t - 1)[0], rtol=1e-5, atol=1e-6)


def test_gqa_prefill_is_causal_and_matches_loop():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((5, 6, 4)).astype(np.float32)
    k = rng.standard_normal((7, 2, 4)).astype(np.float32)
    v = rng.standard_normal((7, 2, 4)).astype(np.float32)
    got = attention(q, k, v, q_start=2)
    np.testing.assert_allclose(got, _explicit_attention(q, k, v, 2), rtol=1e-5, atol=1e-6)
    # Changing a future key must not change earlier queries.
    k2 = k.copy()
    k2[6] += 10
    np.testing.assert_array_equal(attention(q, k2, v, 2)[:4], got[:4])
    with pytest.raises(ValueError):
        attention(q, k[:5], v[:5], q_start=2)


def test_kv_heads_share_cache_in_groups():
    # With kv_heads=1 every head reads the same cache; identical q rows ->
    # identical outputs.
    rng = np.random.default_rng(0)
    q = np.repeat(rng.standard_normal((1, 4)).astype(np.float32), 4, axis=0)
    k = rng.standard_normal((5, 1, 4)).astype(np.float32)
    v = rng.standard_normal((5, 1, 4)).astype(np.float32)
    out = attention_decode(q, k, v)
    for h in range(1, 4):
        np.testing.assert_array_equal(out[h], out[0])


def test_softmax_and_greedy_ties():
    p = softmax(np.array([[1.0, 2.0, 3.0]], np.float32))
    assert p.dtype == np.float32
    np.testing.assert_allclose(p.sum(), 1.0, rtol=1e-6)
    assert greedy(np.array([0.5, 2.0, 2.0, 1.0])) == 1
    assert list(greedy(np.array([[3.0, 3.0], [0.0, 1.0]]))) == [0, 1]


def test_expert_routing_topk_renormalised():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((50, 16)).astype(np.float32)
    router = rng.standard_normal((16, 6)).astype(np.float32)
    ids, w = expert_routing(x, router, 3)
    assert ids.shape == w.shape == (50, 3)
    np.testing.assert_allclose(w.sum(-1), 1.0, rtol=1e-6)
    probs = softmax(x.astype(np.float64) @ router)
    for r in range(50):
        want = np.argsort(-probs[r], kind="stable")[:3]
        assert list(ids[r]) == list(want)
        assert len(set(ids[r])) == 3
        np.testing.assert_allclose(w[r], probs[r][want] / probs[r][want].sum(), rtol=1e-5)
        assert (np.diff(w[r]) <= 0).all()  # descending


def test_expert_routing_ties_go_to_lower_index():
    x = np.ones((2, 4), np.float32)
    router = np.zeros((4, 5), np.float32)  # all experts equal
    ids, w = expert_routing(x, router, 2)
    assert ids.tolist() == [[0, 1], [0, 1]]
    np.testing.assert_allclose(w, 0.5)
    router[:, 3] = 1.0  # expert 3 strictly best, rest tied
    ids, _ = expert_routing(x, router, 3)
    assert ids.tolist()[0] == [3, 0, 1]


def _moe_weights(seed=0, experts=4, shared=1, h=8, f=6):
    rng = np.random.default_rng(seed)
    top_k = min(2, experts)
    w = Weights.random(
        RefShape(1, h, 2, 1, 4, 10, experts=experts, top_k=top_k, expert_ffn=f, shared_experts=shared), seed
    )
    return w.layers[0].moe, rng


def test_moe_ffn_is_weighted_sum_of_experts_plus_shared():
    moe, rng = _moe_weights(shared=2)
    x = rng.standard_normal((7, 8)).astype(np.float32)
    counts = np.zeros(4, np.int64)
    got = moe_ffn(x, moe, 2, counts=counts)
    ids, w = expert_routing(x, moe.router, 2)
    for r in range(7):
        want = sum(
            w[r, j] * swiglu(x[r : r + 1], moe.w_gate[e], moe.w_up[e], moe.w_down[e])[0]
            for j, e in enumerate(ids[r])
        )
        want = want + sum(
            swiglu(x[r : r + 1], moe.shared_gate[s], moe.shared_up[s], moe.shared_down[s])[0] for s in range(2)
        )
        np.testing.assert_allclose(got[r], want, rtol=1e-5, atol=1e-6)
    assert counts.sum() == 7 * 2
    np.testing.assert_array_equal(counts, np.bincount(ids.ravel(), minlength=4))


def test_moe_with_one_expert_equals_dense_and_differs_otherwise():
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 8)).astype(np.float32)
    moe, _ = _moe_weights(experts=1, shared=0)
    dense = dense_ffn(x, moe.w_gate[0], moe.w_up[0], moe.w_down[0])
    np.testing.assert_allclose(moe_ffn(x, moe, 1), dense, rtol=1e-6)
    # With several experts the routed mixture is not the dense FFN of expert 0.
    moe4, _ = _moe_weights(experts=4, shared=0)
    assert not np.allclose(moe_ffn(x, moe4, 2), dense_ffn(x, moe4.w_gate[0], moe4.w_up[0], moe4.w_down[0]))


def test_dense_and_moe_models_differ():
    a = model(DENSE, 0).generate([1, 2, 3], 16)
    b = model(dataclasses.replace(MOE, kv_heads=2), 0).generate([1, 2, 3], 16)
    assert a != b


def test_trace_records_intermediates():
    m = model(MOE, 0)
    tr = Trace()
    st_, tok = m.prefill([1, 2, 3], tr)
    assert tr.tensors[(0, "q")].shape == (3, 4, 8)
    assert tr.tensors[(1, "router_ids")].shape == (3, 2)
    assert int(np.argmax(tr.tensors[(-1, "logits")][0])) == tok
    lw = m.weights.layers[0]
    x = m.weights.embed[[1, 2, 3]]
    np.testing.assert_array_equal(tr.tensors[(0, "attn_in")], rmsnorm(x, lw.attn_norm))
    np.testing.assert_allclose(
        tr.tensors[(0, "ffn_out")], moe_ffn(tr.tensors[(0, "ffn_in")], lw.moe, 2), rtol=1e-6
    )
    np.testing.assert_array_equal(tr.tensors[(0, "k")], st_.keys(0))


def test_expert_load_counts_every_routed_token():
    m = model(MOE, 1)
    prompts = [[1, 2, 3], [4, 5], [6]]
    outs = m.generate_batch(prompts, 10)
    load = expert_load(m, prompts, 10)
    assert load.shape == (MOE.layers, MOE.experts) and load.dtype == np.int64
    # Tokens fed: whole prompt plus every generated token except the last.
    fed = sum(len(p) + len(o) - 1 for p, o in zip(prompts, outs))
    np.testing.assert_array_equal(load.sum(axis=1), fed * MOE.top_k)
    decode_only = expert_load(m, prompts, 10, include_prefill=False)
    np.testing.assert_array_equal(decode_only.sum(axis=1), sum(len(o) - 1 for o in outs) * MOE.top_k)
    assert (load >= decode_only).all()
    with pytest.raises(ValueError):
        expert_load(model(DENSE), prompts, 4)


def test_kv_state_grows_past_initial_capacity():
    m = model()
    st_, tok = m.prefill([1])
    for _ in range(40):
        tok = m.decode_step(st_, tok)
    assert st_.length == 41 and st_.keys(0).shape == (41, DENSE.kv_heads, DENSE.head_dim)
    c = st_.copy()
    assert m.decode_step(c, tok) == m.decode_step(st_, tok)
    assert isinstance(c, KVState)


# -- Qwen3.5: Gated DeltaNet, gated attention, partial rotary --------------------------

from meshrt import rope as _rope  # noqa: E402
from meshrt.runtime import reference as _ref  # noqa: E402

QWEN35 = RefShape(4, 32, 4, 2, 16, 64, ffn=48, linear_layers=(0, 1, 2), linear_k_heads=2,
                  linear_v_heads=4, linear_k_dim=8, linear_v_dim=6, linear_conv=4,
                  attn_gate=True, qk_norm=True, rope_partial=0.25)


def test_deltanet_state_carries_a_request_across_calls():
    """A prompt fed whole, in pieces or token by token leaves the same conv and recurrent
    state and gives the same logits; batching requests together changes nothing."""
    m = model(QWEN35, 3)
    prompt = [5, 9, 2, 33, 17, 8]
    whole = m.new_state()
    a = m.forward([(whole, prompt)])
    pieces = m.new_state()
    m.forward([(pieces, prompt[:2])])
    b = m.forward([(pieces, prompt[2:])])
    np.testing.assert_array_equal(a, b)
    for i in QWEN35.linear_layers:
        np.testing.assert_allclose(whole.rec[i], pieces.rec[i], rtol=1e-6)
        np.testing.assert_array_equal(whole.conv[i], pieces.conv[i])
    # the conv state holds the layer's last linear_conv - 1 pre-conv inputs
    assert whole.conv[0].shape == (QWEN35.linear_conv_width, QWEN35.linear_conv - 1)
    alone = [m.generate(p, 6) for p in ([1, 2, 3], [60, 61])]
    assert m.generate_batch([[1, 2, 3], [60, 61]], 6) == alone
    # and a fresh request does not see another's state
    assert m.generate([60, 61], 6) == alone[1]


def test_causal_conv_is_a_depthwise_convolution_with_its_history():
    rng = np.random.default_rng(0)
    x, taps = rng.standard_normal((5, 3)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    y, state = _ref.causal_conv(x, np.zeros((3, 3), np.float32), taps)
    for c in range(3):
        full = np.convolve(x[:, c].astype(np.float64), taps[c, ::-1].astype(np.float64))[:5]
        np.testing.assert_allclose(y[:, c], full / (1 + np.exp(-full)), rtol=1e-5)
    np.testing.assert_array_equal(state, x[-3:].T)
    # two calls with the state between them are one call
    y1, s1 = _ref.causal_conv(x[:2], np.zeros((3, 3), np.float32), taps)
    y2, _ = _ref.causal_conv(x[2:], s1, taps)
    np.testing.assert_allclose(np.concatenate([y1, y2]), y, rtol=1e-6)


def test_delta_rule_reads_back_what_it_wrote():
    """With no decay and beta 1 the state stores v under a unit key: reading that key
    returns v (the delta rule's associative memory)."""
    k = np.zeros((1, 1, 4), np.float32)
    k[0, 0, 1] = 1.0
    v = np.asarray([[[0.5, -2.0, 3.0]]], np.float32)
    out, st = _ref.delta_rule(k, k, v, np.zeros((1, 1), np.float32), np.ones((1, 1), np.float32),
                              np.zeros((1, 4, 3), np.float32))
    np.testing.assert_allclose(out[0, 0], v[0, 0])
    out2, _ = _ref.delta_rule(k, k, 2 * v, np.full((1, 1), -np.inf, np.float32),
                              np.ones((1, 1), np.float32), st)
    np.testing.assert_allclose(out2[0, 0], 2 * v[0, 0])  # full decay forgets, then rewrites


def test_partial_rotary_rotates_only_the_leading_dims():
    r = _rope.Rope(theta=10000.0, partial=0.25)
    x = np.random.default_rng(0).standard_normal((3, 2, 16)).astype(np.float32)
    y = _ref.apply_rope(x, np.asarray([0, 5, 9]), r)
    np.testing.assert_array_equal(y[..., 4:], x[..., 4:])
    np.testing.assert_allclose(y[..., :4], _ref.apply_rope(x[..., :4], np.asarray([0, 5, 9])),
                               rtol=1e-6)
    assert not np.allclose(y[1:, :, :4], x[1:, :, :4])


def test_gated_attention_and_shapes_of_the_new_weights():
    w = _ref.Weights.random(QWEN35, 0)
    assert w.layers[0].wq is None and w.layers[0].linear is not None
    assert w.layers[3].wg.shape == (QWEN35.hidden, QWEN35.heads * QWEN35.head_dim)
    tr = _ref.Trace()
    _ref.ReferenceModel(QWEN35, w).forward([(KVState(QWEN35), [3, 4])], tr)
    n1, att = tr.tensors[(3, "attn_in")], tr.tensors[(3, "attn_out")]  # attn_out is gated
    np.testing.assert_allclose(tr.tensors[(3, "attn_proj")],
                               _ref._mm(att.reshape(2, -1), w.layers[3].wo), rtol=1e-5)
    # With W_g = 0 the gate is sigmoid(0) = 1/2: twice that output is the ungated attention.
    w0 = _ref.Weights.random(QWEN35, 0)
    w0.layers[3].wg = np.zeros_like(w0.layers[3].wg)
    tr0 = _ref.Trace()
    _ref.ReferenceModel(QWEN35, w0).forward([(KVState(QWEN35), [3, 4])], tr0)
    ungated = 2 * tr0.tensors[(3, "attn_out")].reshape(2, -1)
    gate = _ref.sigmoid(_ref._mm(n1, w.layers[3].wg))
    np.testing.assert_allclose(att.reshape(2, -1), ungated * gate, rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="rotates 3 of head_dim 12"):
        dataclasses.replace(QWEN35, head_dim=12)
    with pytest.raises(ValueError, match="linear_layers lists layer 4"):
        dataclasses.replace(QWEN35, linear_layers=(4,))
