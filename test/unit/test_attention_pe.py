"""Attention's PE bodies (meshrt.kernels.attention.pe) against the NumPy reference:
decode steps on every core of a w x h tile, the partial softmaxes merged down each
column, compared with `reference.attention` over the whole context."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from meshrt.backend.csl.pe_print import body_lines
from meshrt.backend.csl_lint import check_csl
from meshrt.kernels.attention.pe import attention_bodies
from meshrt.kernels.pe import Bodies
from meshrt.rope import Rope, rotary_dim, turn_parts
from meshrt.runtime import pe_exec
from meshrt.runtime import reference as ref

F32 = np.float32


@dataclasses.dataclass
class Case:
    heads: int
    kv: int
    d: int
    w: int
    h: int
    max_seq: int
    b: int = 2
    slots: int = 4
    rope: Rope = Rope()
    window: int = 0
    qk_norm: bool = False
    sinks: bool = False
    gated: bool = False
    eps: float = 1e-6


class Tile:
    """The bodies and every core's arrays of one attention tile (mesh rows from y0 = 3)."""

    Y0 = 3

    def __init__(self, c: Case, rng):
        self.c = c
        self.hq, self.hk = c.heads // c.w, c.kv // c.w
        self.rot = rotary_dim(c.rope, c.d)
        self.bodies: Bodies = attention_bodies(
            "attn", c.b, c.heads, c.kv, c.d, c.max_seq, c.slots, c.w, c.h, self.Y0, rot=self.rot,
            factor=c.rope.attention_factor, window=c.window, qk_norm=c.qk_norm, eps=c.eps,
            sinks=c.sinks, gated=c.gated)
        self.q_gain = (rng.standard_normal(c.d) * 0.3 + 1).astype(F32) if c.qk_norm else None
        self.k_gain = (rng.standard_normal(c.d) * 0.3 + 1).astype(F32) if c.qk_norm else None
        self.sink = rng.standard_normal(c.heads).astype(F32) if c.sinks else None
        self.cores = {}
        for i in range(c.w):
            for j in range(c.h):
                bufs = {b.name: np.zeros(b.elems, pe_exec.dtype(b.type().element_type))
                        for b in self.bodies.buffers}
                if self.rot // 2:
                    bufs["rope"][:] = turn_parts(c.rope, self.rot).ravel()
                if c.qk_norm:
                    bufs["q_gain"][:], bufs["k_gain"][:] = self.q_gain, self.k_gain
                if c.sinks:
                    bufs["sinks"][:] = self.sink[i * self.hq:(i + 1) * self.hq]
                self.cores[i, j] = bufs

    def step(self, mb: int, live: dict[int, int], q, k, v, gate, order) -> np.ndarray:
        """One decode step of micro-batch `mb`: slot j of it (KV slot mb * b + j) at
        position live[j] (absent: idle); q (b, heads, d), k, v (b, kv, d), gate (b, heads
        * d). Each column's partials merged into row 0 in `order`; its output (b, heads * d)."""
        c = self.c
        nq, nk = self.hq * c.d, self.hk * c.d
        out = np.zeros((c.b, c.heads * c.d), F32)
        for i in range(c.w):
            for j in range(c.h):
                bufs = self.cores[i, j]
                x = bufs["x"].reshape(c.b, -1)
                x[:, :nq] = q[:, i * self.hq:(i + 1) * self.hq].reshape(c.b, -1)
                x[:, nq:nq + nk] = k[:, i * self.hk:(i + 1) * self.hk].reshape(c.b, -1)
                x[:, nq + nk:nq + 2 * nk] = v[:, i * self.hk:(i + 1) * self.hk].reshape(c.b, -1)
                if c.gated:
                    x[:, nq + 2 * nk:] = gate[:, i * nq:(i + 1) * nq]
                bufs["mb"][0] = mb
                bufs["rdt"][:] = 0
                for s in range(c.b):
                    kv = mb * c.b + s
                    bufs["rdt"][4 * kv:4 * kv + 3] = (s + 11, 0, live[s]) if s in live else (0, 1, 0)
                for op in ("qk", "exp", "av"):
                    pe_exec.run(self.bodies.funcs[op], bufs, {"px": 20 + i, "py": self.Y0 + j})
            root, *rest = order
            for j in rest:
                self.cores[i, root]["acc_in"][:] = self.cores[i, j]["acc"]
                pe_exec.run(self.bodies.funcs["softmax_merge"], self.cores[i, root])
            pe_exec.run(self.bodies.funcs["normalize"], self.cores[i, root])
            out[:, i * nq:(i + 1) * nq] = self.cores[i, root]["y"].reshape(c.b, nq)
        return out


def _reference(t: Tile, qs, ks, vs, gate, pos):
    """reference.attention for the query at `pos` over keys 0..pos (float32 out)."""
    c = t.c
    q = ref.apply_rope(ref.qk_norm(qs[None], t.q_gain, c.eps), np.asarray([pos]), c.rope)
    k = ref.apply_rope(ref.qk_norm(ks, t.k_gain, c.eps), np.arange(len(ks)), c.rope)
    o = ref.attention(q, k, vs, pos, c.window, t.sink)[0].reshape(-1)
    return (o * ref.sigmoid(gate)).astype(F32) if c.gated else o


@st.composite
def cases(draw):
    kv = draw(st.sampled_from([1, 2, 4]))
    w = draw(st.sampled_from([x for x in (1, 2, 4) if kv % x == 0]))
    heads = kv * draw(st.integers(1, 3))
    d = draw(st.sampled_from([4, 8, 16]))
    rope = draw(st.sampled_from([
        Rope(), Rope(theta=1e6), Rope(partial=0.5), Rope(partial=0.25, theta=1e7),
        Rope(theta=150000.0, type="yarn", factor=32.0, original_max=4096),
        Rope(theta=500000.0, type="llama3", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
             original_max=8192)]))
    assume(rotary_dim(rope, d) % 2 == 0)  # real models rotate pairs
    max_seq = draw(st.integers(1, 11))
    return Case(heads, kv, d, w, draw(st.integers(1, 4)), max_seq, rope=rope,
                window=draw(st.sampled_from([0, 0, 1, 3])), qk_norm=draw(st.booleans()),
                sinks=draw(st.booleans()), gated=draw(st.booleans()))


@settings(max_examples=40, deadline=None)
@given(c=cases(), seed=st.integers(0, 2**16), data=st.data())
def test_decode_steps_on_the_tile_compute_the_reference_attention(c, seed, data):
    """Every step's output equals the reference over the context so far: RoPE (any
    scaling, partial), q/k norm, GQA, causal and sliding-window masks, sinks, the output
    gate, a context split over h rows merged in any order, idle slots, two micro-batches
    sharing the cache."""
    rng = np.random.default_rng(seed)
    t = Tile(c, rng)
    order = data.draw(st.permutations(range(c.h)))
    steps = c.max_seq
    hist = {}  # KV slot -> (q, k, v, gate) per position so far
    for p in range(steps):
        for mb in (0, 1):
            live = {s: p for s in range(c.b) if (s + mb + p) % 5 != 4 or p == 0}
            live = {s: len(hist.get(mb * c.b + s, [])) for s in live}
            q = rng.standard_normal((c.b, c.heads, c.d)).astype(F32)
            k = rng.standard_normal((c.b, c.kv, c.d)).astype(F32)
            v = rng.standard_normal((c.b, c.kv, c.d)).astype(F32)
            gate = rng.standard_normal((c.b, c.heads * c.d)).astype(F32)
            live = {s: pos for s, pos in live.items() if pos < c.max_seq}
            out = t.step(mb, live, q, k, v, gate, order)
            for s in range(c.b):
                if s not in live:
                    assert not out[s].any(), "an idle slot's output is zeros"
                    continue
                h = hist.setdefault(mb * c.b + s, [])
                h.append((q[s], k[s], v[s], gate[s]))
                ks, vs = np.stack([e[1] for e in h]), np.stack([e[2] for e in h])
                want = _reference(t, q[s], ks, vs, gate[s], live[s])
                np.testing.assert_allclose(out[s], want, rtol=2e-4, atol=2e-5)


@pytest.mark.parametrize("pos", [0, 1, 4095, 65_537, 131_071])
def test_rope_at_large_positions_is_the_float64_rotation(pos):
    """The rotation's angle reduced exactly (`turn_parts`): at position 131,071 the q
    head matches the float64 rotation to float32 rounding (a float32 angle would be off
    by up to 0.008 rad)."""
    c = Case(heads=2, kv=1, d=128, w=1, h=4096, max_seq=131_072, b=1, slots=1, rope=Rope(theta=1e6))
    bodies = attention_bodies("attn", 1, 2, 1, 128, c.max_seq, 1, 1, c.h, 0, rot=128)
    bufs = {b.name: np.zeros(b.elems, pe_exec.dtype(b.type().element_type)) for b in bodies.buffers}
    bufs["rope"][:] = turn_parts(c.rope, 128).ravel()
    rng = np.random.default_rng(pos)
    x = rng.standard_normal(bufs["x"].size).astype(F32)
    bufs["x"][:] = x
    bufs["rdt"][:3] = (1, 0, pos)
    pe_exec.run(bodies.funcs["qk"], bufs, {"px": 0, "py": pos // 32})
    got = bufs["qk"].reshape(3, 128)  # two q heads, then the k head
    want = ref.apply_rope(x[:3 * 128].reshape(1, 3, 128), np.asarray([pos]), c.rope)[0]
    np.testing.assert_allclose(got, want, rtol=0, atol=3e-6 * np.abs(x).max())
    # the new key landed in the cache row of its position, on the core holding it
    np.testing.assert_array_equal(bufs["kv"][(pos % 32) * 128:(pos % 32 + 1) * 128], got[2])


def test_attention_csl_is_the_executed_body_and_lints():
    bodies = attention_bodies("a", 2, 4, 2, 8, 9, 4, 2, 3, 0, rot=4, window=3, qk_norm=True,
                              sinks=True, gated=True)
    program = ["param py: i16;", "var x = @zeros([200]f32);", "var y = @zeros([40]f32);",
               "var w = @zeros([400]f32);", "var rdt = @zeros([16]i32);", "var mb = @zeros([1]i32);",
               "const math = @import_module(\"<math>\");"]
    renames = {b.name: (f"a_{b.name}", 0) for b in bodies.buffers
               if b.name not in ("x", "y", "rdt", "mb") and not b.resident}
    renames.update({b.name: ("w", 10 + 20 * k) for k, b in enumerate(bodies.resident)})
    program += [f"var {renames[b.name][0]} = @zeros([{b.elems}]{b.elem});" for b in bodies.buffers
                if b.name in renames and not b.resident]
    for op, fn in bodies.funcs.items():
        program += [f"fn a_{op}() void {{", *body_lines(fn, renames), "}"]
    text = "\n".join(program)
    assert check_csl(text, "attention.csl") == []
    # resident scalars read at their offset in w; no trigonometric library call
    assert "w[((" in text and "sin" not in text and "cos" not in text


@settings(max_examples=60, deadline=None)
@given(max_seq=st.integers(1, 40), h=st.integers(1, 6), split=st.integers(0, 40), tile=st.integers(0, 1),
       positions=st.lists(st.integers(0, 100), min_size=2, max_size=2), live=st.lists(st.booleans(), min_size=2, max_size=2))
def test_the_bodies_reach_the_rows_numerics_count(max_seq, h, split, tile, positions, live):
    """What the interpreter charges attention for is what its loops run: each row's
    `reach` from the qk body (any ring, window wrap, a spill tile's part of it) is
    `numerics.reach` of the core's entries, 0 for an idle row."""
    from meshrt.kernels.attention.layout import tile_span
    from meshrt.kernels.attention.numerics import reach
    from meshrt.kernels.numerics import part

    spill = split if 0 < split < max_seq else None
    tiles = 2 if spill is not None else 1
    assume(tile < tiles)
    first, held = tile_span(max_seq, spill, tiles, tile)
    assume(held > 0)
    bodies = attention_bodies("a", 2, 2, 1, 4, max_seq, 2, 1, h, 0, rot=4, first=first, held=held)
    for j in range(h):
        r0, r1 = part(held, h, j)
        bufs = {b.name: np.zeros(b.elems, pe_exec.dtype(b.type().element_type)) for b in bodies.buffers}
        for s, (p, on) in enumerate(zip(positions, live)):
            bufs["rdt"][4 * s:4 * s + 3] = (s + 1, 0, p) if on else (0, 1, 0)
        pe_exec.run(bodies.funcs["qk"], bufs, {"px": 0, "py": j})
        entries = np.arange(first + r0, first + r1)
        want = [reach(entries, p) if on else 0 for p, on in zip(positions, live)]
        assert bufs["reach"].tolist() == want, (first, held, j)

