"""The MoE experts' PE bodies (meshrt.kernels.expert_ffn.pe) against the NumPy reference:
one step of a w x h expert region run core by core - the pair table, gate|up partials
summed down each column, the activation at the root, W_down per core, the partials
summed along the rows - compared with `reference.swiglu` for every (expert, slot)
pair the routing sends to the region, in (expert, slot) order."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from meshrt.backend.csl.pe_print import body_lines
from meshrt.backend.csl_lint import check_csl
from meshrt.kernels.expert_ffn.pe import expert_bodies
from meshrt.kernels.expert_reduce.op import expert_passes
from meshrt.kernels.numerics import part
from meshrt.runtime import pe_exec
from meshrt.runtime import reference as ref

F32 = np.float32


def run_region(rng, *, hidden, ffn, w, h, b, k, experts, held, routed, bias, act, table):
    """The region's step as its cores run it; {(expert, slot): output row} and the pair
    order the cores' tables give."""
    n = len(held)
    rows, cols = -(-hidden // h), -(-ffn // w)
    passes = expert_passes(n, k, routed)
    bodies = expert_bodies("e", b, n, rows, cols, passes, k, experts if routed else None, bias, act)
    ids = [e for e in held if e >= 0]
    mats = {e: [rng.standard_normal(s).astype(F32) * 0.3 for s in ((hidden, ffn), (hidden, ffn), (ffn, hidden))]
            for e in ids}
    biases = {e: [rng.standard_normal(s).astype(F32) * 0.1 for s in (ffn, ffn, hidden)] for e in ids}
    x = rng.standard_normal((b, hidden)).astype(F32)

    cores = {}
    for i in range(w):
        for j in range(h):
            r0, r1 = part(hidden, h, j)
            f0, f1 = part(ffn, w, i)
            bufs = {bf.name: np.zeros(bf.elems, pe_exec.dtype(bf.type().element_type)) for bf in bodies.buffers}
            wgu, wdn = bufs["wgu"].reshape(n, rows, 2 * cols), bufs["wdn"].reshape(n, cols, rows)
            for le, e in enumerate(held):
                bufs["held"][le] = e
                if e < 0:
                    continue
                g, u, d = mats[e]
                wgu[le, :r1 - r0, :f1 - f0] = g[r0:r1, f0:f1]
                wgu[le, :r1 - r0, cols:cols + f1 - f0] = u[r0:r1, f0:f1]
                wdn[le, :f1 - f0, :r1 - r0] = d[f0:f1, r0:r1]
                if bias and j == 0:
                    bufs["bgu"].reshape(n, 2 * cols)[le, :f1 - f0] = biases[e][0][f0:f1]
                    bufs["bgu"].reshape(n, 2 * cols)[le, cols:cols + f1 - f0] = biases[e][1][f0:f1]
                if bias and i == 0:
                    bufs["bdn"].reshape(n, rows)[le, :r1 - r0] = biases[e][2][r0:r1]
            bufs["x"].reshape(b, rows)[:, :r1 - r0] = x[:, r0:r1]
            if routed:
                bufs["rt_expert"][:] = table.ravel()
            cores[i, j] = bufs

    def body(op, bufs):
        pe_exec.run(bodies.funcs[op], bufs, {"px": 0, "py": 0})

    for _ in range(passes):
        for i in range(w):
            for j in range(h):
                body("fmac", cores[i, j])
            root = cores[i, h - 1]
            for j in range(h - 1):  # the column's partials into its root, one add each
                root["p"][:] = cores[i, j]["gu"]
                body("add", root)
            body("silu_mul", root)
            for j in range(h):
                cores[i, j]["a"][:] = root["a"]
                body("fmac_down", cores[i, j])
    # expert_reduce: the partials of each row summed over the columns
    y = np.zeros((passes * b, hidden), F32)
    for j in range(h):
        r0, r1 = part(hidden, h, j)
        for i in range(w):
            y[:, r0:r1] += cores[i, j]["y"].reshape(passes * b, rows)[:, :r1 - r0]
    got, order = {}, []
    table0 = cores[0, 0]
    for q, le in enumerate(table0["pair_e"].tolist()):
        if le >= 0:
            pair = (int(table0["held"][le]), int(table0["pair_s"][q]))
            order.append(pair)
            got[pair] = y[q]
    want = {}
    for e in ids:
        g, u, d = mats[e]
        bg, bu, bd = biases[e] if bias else (None, None, None)
        out = ref.swiglu(x, g, u, d, bg, bu, bd, act=ref.Act(*act))
        for s in range(b):
            if not routed or e >= experts or e in table[s]:
                want[e, s] = out[s]
    return got, order, want, cores


@settings(max_examples=30, deadline=None)
@given(st.data())
def test_the_region_computes_each_routed_pair(data):
    b = data.draw(st.integers(1, 3), label="micro_batch")
    k = data.draw(st.integers(1, 3), label="top_k")
    experts = data.draw(st.integers(k, 6), label="experts")
    n = data.draw(st.integers(1, 3), label="held")
    routed = data.draw(st.booleans(), label="routed")
    # routed experts (-1: a slot the region leaves empty), or a shared expert's region
    # (id `experts` on: every slot visits it)
    held = data.draw(st.one_of(
        st.lists(st.sampled_from([-1, *range(experts)]), min_size=n, max_size=n, unique=True),
        st.just([experts])), label="held ids")
    table = np.array([data.draw(st.permutations(range(experts)), label="choices")[:k] for _ in range(b)],
                     np.int32)
    act = data.draw(st.sampled_from([(1.0, 0.0, 0.0), (1.702, 7.0, 1.0)]), label="act")
    got, order, want, _ = run_region(
        np.random.default_rng(data.draw(st.integers(0, 2**16))), hidden=data.draw(st.integers(3, 12)),
        ffn=data.draw(st.integers(2, 10)), w=data.draw(st.integers(1, 3)), h=data.draw(st.integers(1, 3)),
        b=b, k=k, experts=experts, held=held, routed=routed, bias=data.draw(st.booleans()), act=act, table=table)
    assert order == sorted(want, key=lambda p: (held.index(p[0]), p[1]))  # (held expert, slot) order
    for pair, row in want.items():
        np.testing.assert_allclose(got[pair], row, rtol=2e-4, atol=2e-5)


def test_the_down_projection_reads_its_own_tiles():
    """W_down is not W_gate|up: a region whose down tiles are zero gives zero output
    however large its gate|up tiles (the old CSL read the gate|up tiles for both)."""
    rng = np.random.default_rng(0)
    got, _, want, cores = run_region(rng, hidden=6, ffn=4, w=2, h=2, b=2, k=1, experts=2, held=[1],
                                     routed=True, bias=False, act=(1.0, 0.0, 0.0),
                                     table=np.array([[1], [0]], np.int32))
    assert set(got) == {(1, 0)} and np.abs(got[1, 0]).max() > 0
    for bufs in cores.values():
        bufs["wdn"][:] = 0
        bufs["pass"][:] = 0
    for i in range(2):
        for j in range(2):
            pe_exec.run(expert_bodies("e", 2, 1, 3, 2, 1, 1, 2, False).funcs["fmac_down"], cores[i, j])
            assert not cores[i, j]["y"].any()


def test_expert_csl_is_the_executed_body_and_lints():
    bodies = expert_bodies("e", 2, 2, 4, 3, 2, 2, 8, True, (1.702, 7.0, 1.0))
    program = ["var x = @zeros([8]f32);", "var y = @zeros([16]f32);", "var p = @zeros([12]f32);",
               "var w = @zeros([200]f32);", "var rt_expert = @zeros([4]i32);",
               "const math = @import_module(\"<math>\");"]
    working = ("x", "y", "p", "rt_expert")
    renames = {b.name: (f"e_{b.name}", 0) for b in bodies.buffers if b.name not in working and not b.resident}
    off = 0
    for b in bodies.resident:
        renames[b.name] = ("w", off)
        off += b.elems
    program += [f"var {renames[b.name][0]} = @zeros([{b.elems}]{b.elem});" for b in bodies.buffers
                if b.name in renames and not b.resident]
    for op, fn in bodies.funcs.items():
        program += [f"fn e_{op}() void {{", *body_lines(fn, renames), "}"]
    text = "\n".join(program)
    assert check_csl(text, "experts.csl") == []
    # W_down read at its own offset in w (after the gate|up tiles), the pass advanced
    assert "-> w[ (d0 + 48) ]" in text and "e_pass[0] = (((e_pass[0]) + 1) % 2);" in text
