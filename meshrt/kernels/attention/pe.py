"""Attention's compute bodies at the PE-program level (see meshrt.kernels.pe), for
columns holding whole KV heads (the width divides kv_heads) reading q | k | v where
the qkv projection's reduction left them.

A column holds hk = kv_heads / w KV heads and their hq = g * hk query heads (g =
heads / kv_heads), each of d features; its core in row j holds the K and V rows
of entries [j * R, (j + 1) * R) of every slot's ring (R = ceil(max_seq / h),
none past max_seq). Per slot of the micro-batch (B slots) `x` holds the column's
q (hq * d) | k (hk * d) | v (hk * d) (| output gate, hq * d).

The cache of a slot is a ring of max_seq entries (the op's capacity: the window
on a sliding-window layer, else the context a slot holds): position p goes to
entry p mod max_seq, which row j holds when it is in [j * R, (j + 1) * R); a
query at p sees entry e when it was written (its age (p - e) mod max_seq is at
most p) and lies in the window. Below the capacity the ring is the plain
position order.

The request descriptor table says which slots are live and where: for the
micro-batch `mb`, slot j is KV slot s = mb * B + j, `rdt[4 s]` its request id (0:
none), `rdt[4 s + 1]` its status (0: running), `rdt[4 s + 2]` the position of the
token it feeds. A program prefilling chunks (`chunk` > 1: B rows are token rows, any
request's, several of one request in position order) reads each row's KV slot and
position from the row table instead: `rows[2 j]` is row j's KV slot + 1 (0: idle),
`rows[2 j + 1]` its position. Rows are computed in order, each writing its key before
the next reads, so a chunk's queries see the chunk's earlier keys (causal).

- qk:            per live slot: q and k heads RMS-normalised over d with their
                 gains (q/k norm), rotated (RoPE) by the slot's position; the new
                 key and value written into the cache row of that position where
                 this core holds it; the rows the query reaches (`reach[j]`: the
                 core's first rows up to the position, all once the ring wrapped);
                 their scores sc[j, head, r] = q . K[r] / sqrt(d) where the query
                 sees the key (causal, the sliding window), the lowest float
                 elsewhere. The output gate's sigmoid is kept for normalize.
- exp:           per head, over the reached rows: m = max score, pr = exp(sc - m)
                 (0 where no key), l = sum pr
- av:            o = sum_r pr[r] V[r] over the reached rows, into the message
                 acc = o | m | l
- softmax_merge: a neighbour's (o, m, l) from acc_in merged into acc (both rescaled
                 to the larger maximum: flash-decoding)
- normalize:     y = o / (l + exp(sink - m)) (a head's sink logit: gpt-oss), times
                 the output gate (Qwen3.5); 0 where no key was seen

The loops over KV rows end at `reach[j]`, computed at run time: a slot's attention
costs the context it has reached, not the ring's capacity.

RoPE: a pair's angle is pos * inv_freq, reduced to a fraction of a turn without
rounding (`meshrt.rope.turn_parts`), then sin and cos by polynomials on a quarter
turn: no trigonometric library call (CSL's `<math>` is not relied on for them).
"""

from __future__ import annotations

import math

from xdsl.dialects.builtin import IndexType, i32

from meshrt.kernels.attention.layout import tile_span, whole_heads
from meshrt.kernels.pe import Bodies, Body, Buffer
from meshrt.rope import rotary_dim
from meshrt.shape import HParams, ModelShape

LOWEST = -3.4028234663852886e38  # the lowest float32: a score no key gives

# Taylor coefficients of sin and cos on [-pi/4, pi/4] (|error| < 2e-9 before rounding)
_SIN = [(-1) ** k / math.factorial(2 * k + 1) for k in range(5)]
_COS = [(-1) ** k / math.factorial(2 * k) for k in range(6)]


def param_buffers(d: int, rot: int, qk_norm: bool, sink_heads: int) -> list[Buffer]:
    """The model's values a core holds for attention beside its KV cache (loaded by the
    host after the cache, in this order): RoPE's turns per position (`turn_parts`), the
    q/k norm gains, the sink logits of its column's heads."""
    bufs = [Buffer("rope", 3 * (rot // 2), resident=True)] if rot // 2 else []
    if qk_norm:
        bufs += [Buffer("q_gain", d, resident=True), Buffer("k_gain", d, resident=True)]
    if sink_heads:
        bufs.append(Buffer("sinks", sink_heads, resident=True))
    return bufs


def working_buffers(b: int, hq: int, hk: int, d: int, rows: int, rot: int, gated: bool) -> list[Buffer]:
    """The bodies' working arrays for `b` slots of hq query and hk KV heads and `rows` KV
    rows: the heads normalised (hv), their sums of squares, the slot's rotation, the
    heads rotated (qk), scores and their exponentials, the partial softmax sent and
    received (acc, acc_in: o | max | sum), the inverse sums (or merge factors), the
    KV rows each slot's query reaches (`reach`), the output gate."""
    nh = hq + hk
    bufs = [Buffer("hv", b * nh * d), Buffer("ssq", b * nh), Buffer("rot", b * 2 * (rot // 2)),
            Buffer("qk", b * nh * d), Buffer("sc", b * hq * rows), Buffer("pr", b * hq * rows),
            Buffer("acc", b * hq * (d + 2)), Buffer("acc_in", b * hq * (d + 2)), Buffer("inv", b * hq),
            Buffer("reach", b, "i32")]
    return bufs + [Buffer("gate", b * hq * d)] if gated else bufs


def in_pe(info, hp: HParams) -> bool:
    """Whether attention `info` (its `event.kernel` record) computes as PE bodies: its
    columns hold whole KV heads, it reads q | k | v in place, in float32. The others
    (head_dim split over columns, an input arriving on a flow, 16-bit values or caches)
    keep the kind's CSL bodies and its numerics (docs/csl-backend.md)."""
    w = info.region.rects.data[0].tuple[2]
    return (whole_heads(info.param("kv_heads"), w) and info.param("qkv_in_place") is not None
            and hp.dtype_bytes >= 4 and hp.kv_bytes >= 4)


def bodies_for(info, micro_batch: int, hp: HParams, tile: tuple[int, int, int, int]) -> Bodies | None:
    """The bodies of attention `info` on `tile`, or None (`in_pe`)."""
    if not in_pe(info, hp):
        return None
    p = info.param
    kv, w, h = p("kv_heads"), tile[2], tile[3]
    shape = ModelShape.from_hparams(hp)
    layer = p("layer", -1)
    rects = [r.tuple[:4] for r in info.region.rects.data]
    first, held = tile_span(p("max_seq"), p("spill_from", None), len(rects), rects.index(tile))
    return attention_bodies(
        info.kernel_name, micro_batch, p("heads"), kv, p("head_dim"), p("max_seq"), p("slots"),
        w, h, tile[1], rot=rotary_dim(shape.rope, p("head_dim")), factor=shape.rope.attention_factor,
        window=shape.window(layer), qk_norm=shape.qk_norm, eps=shape.rms_eps,
        sinks=shape.attn_sinks, gated=bool(p("gated", 0)), chunk=hp.int("prefill_chunk", 1),
        first=first, held=held)


def attention_bodies(kernel: str, b: int, heads: int, kv_heads: int, d: int, max_seq: int, slots: int,
                     w: int, h: int, y0: int, *, rot: int, factor: float = 1.0, window: int = 0,
                     qk_norm: bool = False, eps: float = 1e-6, sinks: bool = False,
                     gated: bool = False, chunk: int = 1, first: int = 0,
                     held: int | None = None) -> Bodies:
    """The bodies of attention `kernel` on a w x h tile whose first row is mesh row `y0`:
    `b` rows a micro-batch, `slots` KV slots, `rot` rotated features a head (RoPE's
    cos and sin scaled by `factor`), a sliding `window` (0: none); `chunk` > 1: rows name
    their KV slot and position in the row table. The tile holds `held` ring entries from
    `first` (default: all max_seq; a spilling attention's tiles each hold part)."""
    hk, hq = kv_heads // w, heads // w
    g = heads // kv_heads
    nh = hq + hk  # the heads a slot normalises and rotates: its q heads, then its k heads
    nq, nk = hq * d, hk * d
    share = 2 * nq + 2 * nk if gated else nq + 2 * nk
    held = max_seq if held is None else held
    rows = -(-held // h)
    end = first + held  # past the tile's entries
    half = rot // 2
    m_at, l_at = b * nq, b * nq + b * hq  # where acc holds the maxima and the sums
    table = [Buffer("rows", 2 * b, "i32")] if chunk > 1 else [Buffer("rdt", 4 * slots, "i32"),
                                                               Buffer("mb", 1, "i32")]
    bufs = [Buffer("x", b * share), Buffer("y", b * nq), *table,
            Buffer("kv", 2 * slots * rows * nk, resident=True),
            *param_buffers(d, rot, qk_norm, hq if sinks else 0),
            *working_buffers(b, hq, hk, d, rows, rot, gated)]
    out = Bodies(kernel, bufs)

    def kv_row(bd: Body, which: int, s, r):
        """The first element of KV slot s's cache row r (K: which 0, V: 1)."""
        return bd.mul(bd.add(bd.mul(bd.plus(s, which * slots), rows), r), nk)

    # -- qk ------------------------------------------------------------------------
    body = out.body("qk")
    body.fmovs(body.dsd("sc", (b * hq * rows,)), body.scalar(LOWEST))
    py = body.param("py")
    r0 = body.mul(body.cast(body.subi(py, body.const(y0, py.type)), i32), rows)  # first entry held
    if first:
        r0 = body.plus(r0, first)

    def turns(bd: Body, posf, i):
        """(cos, sin) x factor of pair i at position posf."""
        t = bd.mulf(posf, bd.load("rope", bd.plus(i, 2 * half)))
        for k in range(2):  # exact products: their fractions of a turn are exact
            v = bd.mulf(posf, bd.load("rope", bd.plus(i, k * half)))
            t = bd.addf(t, bd.subf(v, bd.to_float(bd.to_int(v))))
        # quarter turns q (rounded half away from 0) and the rest a, in [-pi/4, pi/4]
        q = bd.to_int(bd.addf(bd.mulf(t, bd.scalar(4.0)),
                              bd.select(bd.cmpf(t, bd.scalar(0.0), "oge"), bd.scalar(0.5), bd.scalar(-0.5))))
        a = bd.mulf(bd.subf(t, bd.mulf(bd.to_float(q), bd.scalar(0.25))), bd.scalar(2 * math.pi))
        a2 = bd.mulf(a, a)

        def poly(coeffs):
            acc = bd.scalar(coeffs[-1])
            for c in reversed(coeffs[:-1]):
                acc = bd.addf(bd.scalar(c), bd.mulf(a2, acc))
            return acc

        s, c = bd.mulf(a, poly(_SIN)), poly(_COS)
        k = bd.remi(bd.plus(bd.remi(q, bd.const(4, i32)), 4), bd.const(4, i32))  # quadrant, 0..3
        odd = bd.cmpi(bd.remi(k, bd.const(2, i32)), bd.const(1, i32), "eq")
        sin, cos = bd.select(odd, c, s), bd.select(odd, s, c)
        sin = bd.select(bd.cmpi(k, bd.const(2, i32), "sge"), bd.mulf(sin, bd.scalar(-factor)),
                        bd.mulf(sin, bd.scalar(factor)))
        flip = bd.either(bd.cmpi(k, bd.const(1, i32), "eq"), bd.cmpi(k, bd.const(2, i32), "eq"))
        cos = bd.select(flip, bd.mulf(cos, bd.scalar(-factor)), bd.mulf(cos, bd.scalar(factor)))
        return cos, sin

    def live_slot(bd: Body, j, s, pos, n) -> None:
        posf = bd.to_float(pos)
        xs = bd.mul(j, share)
        hv = qk = bd.mul(j, nh * d)  # the slot's heads: in hv normalised, in qk rotated
        src = bd.offset(bd.dsd("x", (nh, d)), xs)
        dst = bd.offset(bd.dsd("hv", (nh, d)), hv)
        if qk_norm:  # each head over its d features: x / rms(x) * gain
            ssq = bd.offset(bd.dsd("ssq", (nh,)), bd.mul(j, nh))
            bd.fmuls(dst, src, src)
            bd.fmovs(ssq, bd.scalar(0.0))
            acc = bd.offset(bd.dsd("ssq", (nh, d), (1, 0)), bd.mul(j, nh))
            bd.fadds(acc, acc, dst)

            def inverse_rms(bd2: Body, t) -> None:
                at = bd2.add(bd2.mul(j, nh), t)
                mean = bd2.divf(bd2.load("ssq", at), bd2.scalar(float(d)))
                bd2.store(bd2.divf(bd2.scalar(1.0), bd2.call("sqrt_f32", bd2.addf(mean, bd2.scalar(eps)))),
                          "ssq", at)

            bd.each(nh, inverse_rms)
            bd.fmuls(dst, src, bd.offset(bd.dsd("ssq", (nh, d), (1, 0)), bd.mul(j, nh)))
            qpart = bd.offset(bd.dsd("hv", (hq, d)), hv)
            kpart = bd.offset(bd.dsd("hv", (hk, d)), bd.plus(hv, nq))
            bd.fmuls(qpart, qpart, bd.dsd("q_gain", (hq, d), (0, 1)))
            bd.fmuls(kpart, kpart, bd.dsd("k_gain", (hk, d), (0, 1)))
        else:
            bd.fmovs(dst, src)
        if half:
            def pair(bd2: Body, i) -> None:
                cos, sin = turns(bd2, posf, i)
                at = bd2.add(bd2.mul(j, 2 * half), i)
                bd2.store(cos, "rot", at)
                bd2.store(sin, "rot", bd2.plus(at, half))

            bd.each(half, pair)

        def rotate(bd2: Body, t) -> None:
            head = bd2.mul(t, d)
            if rot < d:  # features past the rotary part pass
                tail = bd2.plus(bd2.add(head, hv), rot)
                bd2.fmovs(bd2.offset(bd2.dsd("qk", (d - rot,)), bd2.plus(bd2.add(head, qk), rot)),
                          bd2.offset(bd2.dsd("hv", (d - rot,)), tail))

            def one(bd3: Body, i) -> None:
                a_at = bd3.add(bd3.add(hv, head), i)
                a, c = bd3.load("hv", a_at), bd3.load("rot", bd3.add(bd3.mul(j, 2 * half), i))
                z = bd3.load("hv", bd3.plus(a_at, half))
                s_ = bd3.load("rot", bd3.plus(bd3.add(bd3.mul(j, 2 * half), i), half))
                out_at = bd3.add(bd3.add(qk, head), i)
                bd3.store(bd3.subf(bd3.mulf(a, c), bd3.mulf(z, s_)), "qk", out_at)
                bd3.store(bd3.addf(bd3.mulf(z, c), bd3.mulf(a, s_)), "qk", bd3.plus(out_at, half))

            if half:
                bd2.each(half, one)

        bd.each(nh, rotate)
        # the new key and value into its ring entry (pos mod max_seq), where this core holds it
        ring = bd.const(max_seq, i32)
        entry = bd.remi(pos, ring)
        row = bd.subi(entry, r0)
        mine = bd.both(bd.cmpi(row, bd.const(0, i32), "sge"), bd.cmpi(row, bd.const(rows, i32), "slt"))
        if end < max_seq:  # the tile's last row may reach past its entries
            mine = bd.both(mine, bd.cmpi(entry, bd.const(end, i32), "slt"))

        def append(bd2: Body) -> None:
            r = bd2.cast(row, IndexType())
            bd2.fmovs(bd2.offset(bd2.dsd("kv", (nk,)), kv_row(bd2, 0, s, r)),
                      bd2.offset(bd2.dsd("qk", (nk,)), bd2.plus(qk, nq)))
            bd2.fmovs(bd2.offset(bd2.dsd("kv", (nk,)), kv_row(bd2, 1, s, r)),
                      bd2.offset(bd2.dsd("x", (nk,)), bd2.plus(xs, nq + nk)))

        bd.when(mine, append)

        # scores of the rows the query reaches: per row r, q . K[r] of each query head (the
        # products into hv's slot, free once rotated, summed into the score), then scaled
        qs = bd.offset(bd.dsd("qk", (nq,)), qk)
        prod = bd.offset(bd.dsd("hv", (nq,)), hv)

        def score(bd2: Body, r) -> None:
            keys = bd2.offset(bd2.dsd("kv", (hk, g, d), (d, 0, 1)), kv_row(bd2, 0, s, r))  # a query head's KV head
            bd2.fmuls(prod, qs, keys)
            at = bd2.add(bd2.mul(bd2.mul(j, hq), rows), r)
            row_scores = bd2.offset(bd2.dsd("sc", (hq,), (rows,)), at)
            bd2.fmovs(row_scores, bd2.scalar(0.0))
            acc = bd2.offset(bd2.dsd("sc", (hq, d), (rows, 0)), at)
            bd2.fadds(acc, acc, bd2.offset(bd2.dsd("hv", (hq, d)), hv))
            bd2.fmuls(row_scores, row_scores, bd2.scalar(1.0 / math.sqrt(d)))

        bd.each(n, score)

        # reached rows holding no key this query sees: never written (their age
        # (pos - e) mod max_seq past pos; a ring that wrapped), older than its window
        def head(bd2: Body, hh) -> None:
            def mask(bd3: Body, r) -> None:
                e = bd3.add(r0, bd3.cast(r, i32))
                age = bd3.remi(bd3.plus(bd3.subi(pos, e), max_seq), ring)  # pos - e > -max_seq
                hidden = bd3.cmpi(age, pos, "sgt")
                if window:
                    hidden = bd3.either(hidden, bd3.cmpi(age, bd3.const(window, i32), "sge"))
                at = bd3.add(bd3.mul(bd3.add(bd3.mul(j, hq), hh), rows), r)
                bd3.store(bd3.select(hidden, bd3.scalar(LOWEST), bd3.load("sc", at)), "sc", at)

            bd2.each(n, mask)

        bd.each(hq, head)

    def reached(bd: Body, pos):
        """The KV rows of this core a query at `pos` reaches (`reach`): the ring fills in
        position order, so they are its first rows up to the position (every row once the
        ring wrapped), none past the tile's entries. Attention's work follows it."""
        top = bd.subi(bd.select(bd.cmpi(pos, bd.const(end - 1, i32), "slt"), bd.plus(pos, 1),
                                bd.const(end, i32)), r0)
        top = bd.select(bd.cmpi(top, bd.const(rows, i32), "slt"), top, bd.const(rows, i32))
        return bd.select(bd.cmpi(top, bd.const(0, i32), "sgt"), top, bd.const(0, i32))

    def row_slot(bd: Body, j):
        """Row j's KV slot (an index), the position it feeds and whether it is live."""
        if chunk > 1:
            at = bd.mul(j, 2)
            held = bd.load("rows", at)
            s = bd.cast(bd.subi(bd.select(bd.cmpi(held, bd.const(0, i32), "sgt"), held,
                                          bd.const(1, i32)), bd.const(1, i32)), IndexType())
            return s, bd.load("rows", bd.plus(at, 1)), bd.cmpi(held, bd.const(0, i32), "sgt")
        s = bd.add(bd.mul(bd.cast(bd.load("mb", bd.const(0)), IndexType()), b), j)
        word = bd.mul(s, 4)
        live = bd.both(bd.cmpi(bd.load("rdt", word), bd.const(0, i32), "ne"),
                       bd.cmpi(bd.load("rdt", bd.plus(word, 1)), bd.const(0, i32), "eq"))
        return s, bd.load("rdt", bd.plus(word, 2)), live

    def slot(bd: Body, j) -> None:
        s, pos, live = row_slot(bd, j)
        n = bd.select(live, reached(bd, pos), bd.const(0, i32))
        bd.store(n, "reach", j)
        bd.when(live, lambda bd2: live_slot(bd2, j, s, pos, bd2.cast(n, IndexType())))

    body.each(b, slot)
    if gated:  # the output gate's sigmoid, for normalize (x may be overwritten by then)
        def gate_slot(bd: Body, j) -> None:
            def one(bd2: Body, i) -> None:
                z = bd2.load("x", bd2.add(bd2.plus(bd2.mul(j, share), nq + 2 * nk), i))
                e = bd2.call("exp_f32", bd2.mulf(bd2.scalar(-1.0), z))
                bd2.store(bd2.divf(bd2.scalar(1.0), bd2.addf(bd2.scalar(1.0), e)), "gate",
                          bd2.add(bd2.mul(j, nq), i))

            bd.each(nq, one)

        body.each(b, gate_slot)
    out.add("qk", body)

    # -- exp: per (slot, head) row of scores, its maximum, the exponentials and their sum,
    # over the rows the slot's query reached
    body = out.body("exp")

    def exp_slot(bd: Body, j) -> None:
        n = bd.cast(bd.load("reach", j), IndexType())

        def exp_row(bd2: Body, hh) -> None:
            t = bd2.add(bd2.mul(j, hq), hh)
            base = bd2.mul(t, rows)
            (m,) = bd2.fold(n, [bd2.scalar(LOWEST)],
                            lambda bd3, r, acc: [bd3.maxf(acc, bd3.load("sc", bd3.add(base, r)))])
            seen = bd2.cmpf(m, bd2.scalar(LOWEST), "ogt")

            def term(bd3: Body, r, acc):
                at = bd3.add(base, r)
                e = bd3.select(seen, bd3.call("exp_f32", bd3.subf(bd3.load("sc", at), m)), bd3.scalar(0.0))
                bd3.store(e, "pr", at)
                return [bd3.addf(acc, e)]

            (total,) = bd2.fold(n, [bd2.scalar(0.0)], term)
            bd2.store(m, "acc", bd2.plus(t, m_at))
            bd2.store(total, "acc", bd2.plus(t, l_at))

        bd.each(hq, exp_row)

    body.each(b, exp_slot)
    out.add("exp", body)

    # -- av: o = sum_r pr[r] V[r] per (slot, head), into acc
    body = out.body("av")

    def av_slot(bd: Body, j) -> None:
        s = row_slot(bd, j)[0]  # (an idle row reaches no row)
        n = bd.cast(bd.load("reach", j), IndexType())

        def kv_head(bd2: Body, kh) -> None:
            def query(bd3: Body, gi) -> None:
                t = bd3.add(bd3.mul(j, hq), bd3.add(bd3.mul(kh, g), gi))
                o = bd3.offset(bd3.dsd("acc", (d,)), bd3.mul(t, d))
                bd3.fmovs(o, bd3.scalar(0.0))
                vrow = bd3.offset(bd3.dsd("kv", (d,)), bd3.add(kv_row(bd3, 1, s, bd3.const(0)), bd3.mul(kh, d)))

                def key(bd4: Body, r) -> None:
                    bd4.fmacs(o, o, bd4.offset(vrow, bd4.mul(r, nk)),
                              bd4.load("pr", bd4.add(bd4.mul(t, rows), r)))

                bd3.each(n, key)

            bd2.each(g, query)

        bd.each(hk, kv_head)

    body.each(b, av_slot)
    out.add("av", body)

    # -- softmax_merge: acc and a neighbour's acc_in rescaled to their larger maximum
    body = out.body("softmax_merge")
    n = b * hq

    def factors(bd: Body, t) -> None:
        ma, mb = bd.load("acc", bd.plus(t, m_at)), bd.load("acc_in", bd.plus(t, m_at))
        m = bd.maxf(ma, mb)
        fa, fb = bd.call("exp_f32", bd.subf(ma, m)), bd.call("exp_f32", bd.subf(mb, m))
        la, lb = bd.load("acc", bd.plus(t, l_at)), bd.load("acc_in", bd.plus(t, l_at))
        bd.store(m, "acc", bd.plus(t, m_at))
        bd.store(bd.addf(bd.mulf(la, fa), bd.mulf(lb, fb)), "acc", bd.plus(t, l_at))
        bd.store(fa, "inv", t)
        bd.store(fb, "acc_in", bd.plus(t, m_at))  # its maximum is used: its factor in its place

    body.each(n, factors)
    o, o_in = body.dsd("acc", (n, d)), body.dsd("acc_in", (n, d))
    body.fmuls(o, o, body.dsd("inv", (n, d), (1, 0)))
    body.fmuls(o_in, o_in, body.dsd("acc_in", (n, d), (1, 0), offset=m_at))
    body.fadds(o, o, o_in)
    out.add("softmax_merge", body)

    # -- normalize: o / (l + the sink's term), times the output gate
    body = out.body("normalize")

    def norm_slot(bd: Body, j) -> None:
        def head(bd2: Body, hh) -> None:
            t = bd2.add(bd2.mul(j, hq), hh)
            total = bd2.load("acc", bd2.plus(t, l_at))
            seen = bd2.cmpf(total, bd2.scalar(0.0), "ogt")
            if sinks:  # (its maximum where a key was seen: no overflow where none was)
                sink = bd2.load("sinks", hh)
                m = bd2.select(seen, bd2.load("acc", bd2.plus(t, m_at)), sink)
                total = bd2.addf(total, bd2.select(seen, bd2.call("exp_f32", bd2.subf(sink, m)), bd2.scalar(0.0)))
            one = bd2.scalar(1.0)  # (no division by zero where nothing was seen)
            bd2.store(bd2.select(seen, bd2.divf(one, bd2.select(seen, total, one)), bd2.scalar(0.0)), "inv", t)

        bd.each(hq, head)

    body.each(b, norm_slot)
    y = body.dsd("y", (n, d))
    body.fmuls(y, body.dsd("acc", (n, d)), body.dsd("inv", (n, d), (1, 0)))
    if gated:
        body.fmuls(body.dsd("y", (b * nq,)), body.dsd("y", (b * nq,)), body.dsd("gate", (b * nq,)))
    out.add("normalize", body)
    return out
