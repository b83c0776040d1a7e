"""The MoE experts' compute bodies at the PE-program level (see meshrt.kernels.pe).

An expert region is w x h cores; core (i, j) holds, for each of the N experts
of its region (local index e, the expert's id in `held[e]`, as a float; -1:
none), rows j of W_gate and W_up for column i's slice of the expert width, side by side
(`wgu`: per expert, H = ceil(hidden / h) rows of F gate then F up columns,
F = ceil(expert_ffn / w)), and W_down's rows of slice i for its output rows
j (`wdn`: per expert F rows of H), with the biases where the model has them
(`bgu` on the cores of the first input rows, `bdn` on those of the first
slice; zeros elsewhere, so each is added once).

A step's (token, expert) pairs run B at a time (a pass; `expert_passes` of
them at most): the pairs are the region's experts in local order, each with
the slots the routing table sends to it (`rt_expert`, K choices per slot) or,
in the static build and on a shared expert's region, every slot. Pair q of
the step is (`pair_e[q]`, `pair_s[q]`); -1 past the step's last.

- fmac:      the pass's pairs into the pair table (`pass` says which pass),
             then per pair gu[q] = bgu[e] + sum_r x[s, r] * wgu[e, r]: this
             core's partial of the gate | up entries of its slice
- add:       gu += p, a neighbour's partial on its way down the column (received
             into the program's p)
- silu_mul:  at the column's root, a[q] = silu(gate) * up (`add_silu_mul`),
             relayed back up the column in `a`
- fmac_down: y[pair] = bdn[e] + sum_f a[q, f] * wdn[e, f]: this core's partial
             of output rows j, for the pass's pairs; the pass advances

`expert_reduce` then sums the partials of the step's pairs along the rows.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, i32

from meshrt.kernels.elementwise.pe import add_silu_mul, glu_params
from meshrt.kernels.expert_reduce.op import expert_passes, group_experts, region_experts
from meshrt.kernels.pe import Bodies, Body, Buffer
from meshrt.kernels.topk_gate.pe import ROUTING_TABLE, route_choices
from meshrt.shape import HParams


WEIGHTS = ("wgu", "wdn")  # the tiles, counted at the weights' bytes (maybe packed)


def expert_buffers(n: int, b: int, rows: int, cols: int, pairs: int, bias: bool) -> list[Buffer]:
    """The bodies' arrays for `n` experts of `rows` input rows and `cols` FFN columns a
    core, `b` pairs a pass and `pairs` a step: the resident tiles (and biases), the held
    experts' ids, the input rows, the gate|up partials sent and received (p: the
    program's working array), the activations, the output partials, the pair table and the pass."""
    bufs = [Buffer("wgu", n * rows * 2 * cols, resident=True), Buffer("wdn", n * cols * rows, resident=True)]
    if bias:
        bufs += [Buffer("bgu", n * 2 * cols, resident=True), Buffer("bdn", n * rows, resident=True)]
    # the ids as floats (exact): resident arrays are the program's float words
    return bufs + [Buffer("held", n, resident=True), Buffer("x", b * rows),
                   Buffer("gu", b * 2 * cols), Buffer("p", b * 2 * cols), Buffer("a", b * cols),
                   Buffer("y", pairs * rows), Buffer("pair_e", pairs, "i32"), Buffer("pair_s", pairs, "i32"),
                   Buffer("pass", 1, "i32")]


def computes_in_pe(packed: str | None, dtype_bytes: float, expert_dtype_bytes: float) -> bool:
    """Whether experts compute as PE bodies: held as float32 (not packed, not 16-bit).
    The others keep the kind's CSL bodies and its numerics (docs/csl-backend.md)."""
    return not packed and expert_dtype_bytes >= 4 and dtype_bytes >= 4


def in_pe(info, hp: HParams) -> bool:
    """`computes_in_pe` for expert kernel `info` (its `event.kernel` record)."""
    return computes_in_pe(info.packed_weights, hp.dtype_bytes, hp.expert_dtype_bytes)


def tile_shape(info, tile: tuple[int, int, int, int]) -> tuple[int, int, int]:
    """(experts held, input rows, FFN columns) of a core of `tile`: the most a region of
    the tile's shape holds (`group_experts`: such regions share their roles and
    classes, so their bodies are one)."""
    tiles = [r.tuple[:4] for r in info.region.rects.data]
    held = region_experts(len(tiles), info.param("placement"), info.param("shared_experts", 0))
    n = group_experts(tiles, held)[tiles.index(tuple(tile))]
    return n, -(-info.param("in_widths")[0] // tile[3]), -(-info.param("expert_ffn") // tile[2])


def bodies_for(info, micro_batch: int, hp: HParams, tile: tuple[int, int, int, int]) -> Bodies | None:
    if not in_pe(info, hp):
        return None
    n, rows, cols = tile_shape(info, tile)
    routed = bool(info.param("routed", 0))
    k = hp.int("top_k")
    return expert_bodies(info.kernel_name, micro_batch, n, rows, cols, expert_passes(n, k, routed),
                         route_choices(k, hp.int("shared_experts")),
                         len(info.param("placement")) if routed else None,
                         bool(hp.int("expert_bias")), glu_params(hp))


def expert_bodies(kernel: str, b: int, n: int, rows: int, cols: int, passes: int, k: int,
                  routed: int | None, bias: bool, act: tuple[float, float, float] = (1.0, 0.0, 0.0)) -> Bodies:
    """The bodies of expert kernel `kernel` on a core: `n` experts of `rows` x `cols`, `b`
    pairs a pass, `passes` passes; `routed`: the number of routed experts, whose slots
    the routing table's `k` entries per slot say (`route_choices`; a shared expert, id
    `routed` on, takes every slot), None in the static build (every slot visits each
    expert); `act`: `glu_params`."""
    pairs = passes * b
    bufs = expert_buffers(n, b, rows, cols, pairs, bias)
    if routed is not None:
        bufs.append(Buffer(ROUTING_TABLE[0], b * k, "i32"))
    out = Bodies(kernel, bufs)
    _add_up(out, b, n, rows, cols, k, routed, bias)

    body = out.body("add")
    body.fadds(body.dsd("gu", (b * 2 * cols,)), body.dsd("gu", (b * 2 * cols,)), body.dsd("p", (b * 2 * cols,)))
    out.add("add", body)

    add_silu_mul(out, "silu_mul", b, cols, "gu", "a", *act)
    _add_down(out, b, rows, cols, passes, bias)
    return out


def _as_index(bd: Body, v):
    return bd.cast(v, IndexType())


def _add_up(out: Bodies, b: int, n: int, rows: int, cols: int, k: int, routed: int | None,
            bias: bool) -> None:
    body = out.body("fmac")
    first = body.mul(body.load("pass", body.const(0)), b)  # i32: the pass's first pair
    last = body.plus(first, b)
    none = body.const(-1, i32)

    def clear(bd: Body, q) -> None:
        bd.store(none, "pair_e", bd.add(_as_index(bd, first), q))
    body.each(b, clear)

    def expert(bd: Body, e, count):
        held = bd.load("held", e)

        def slot(bd2: Body, s, count):
            # every slot visits a held expert in the static build and a shared one; a
            # routed one, the slots that chose it among their K
            every = bd2.cmpf(held, bd2.scalar(-1.0 if routed is None else routed - 0.5), "ogt")
            hit = bd2.select(every, bd2.const(1, i32), bd2.const(0, i32))
            if routed is not None:
                (hit,) = bd2.fold(k, [hit], lambda bd3, c, h: [bd3.select(bd3.cmpf(
                    bd3.to_float(bd3.load(ROUTING_TABLE[0], bd3.add(bd3.mul(s, k), c))), held, "oeq"),
                    bd3.const(1, i32), h)])
            mine = bd2.both(bd2.cmpi(hit, bd2.const(0, i32), "ne"),
                            bd2.both(bd2.cmpi(count, first, "sge"), bd2.cmpi(count, last, "slt")))

            def take(bd3: Body) -> None:
                at = _as_index(bd3, count)
                bd3.store(bd3.cast(e, i32), "pair_e", at)
                bd3.store(bd3.cast(s, i32), "pair_s", at)
            bd2.when(mine, take)
            return [bd2.add(count, hit)]

        return bd.fold(b, [count], slot)

    body.fold(n, [body.const(0, i32)], expert)

    def pair(bd: Body, q) -> None:
        at = bd.add(_as_index(bd, first), q)
        y = bd.offset(bd.dsd("gu", (2 * cols,)), bd.mul(q, 2 * cols))
        bd.fmovs(y, bd.scalar(0.0))
        e = bd.load("pair_e", at)

        def product(bd2: Body) -> None:
            ei = _as_index(bd2, e)
            s = _as_index(bd2, bd2.load("pair_s", at))
            if bias:
                bd2.fmovs(y, bd2.offset(bd2.dsd("bgu", (2 * cols,)), bd2.mul(ei, 2 * cols)))

            def row(bd3: Body, r) -> None:
                w = bd3.offset(bd3.dsd("wgu", (2 * cols,)), bd3.mul(bd3.add(bd3.mul(ei, rows), r), 2 * cols))
                bd3.fmacs(y, y, w, bd3.load("x", bd3.add(bd3.mul(s, rows), r)))
            bd2.each(rows, row)
        bd.when(bd.cmpi(e, none, "sgt"), product)

    body.each(b, pair)
    out.add("fmac", body)


def _add_down(out: Bodies, b: int, rows: int, cols: int, passes: int, bias: bool) -> None:
    body = out.body("fmac_down")
    p = body.load("pass", body.const(0))
    first = _as_index(body, body.mul(p, b))
    none = body.const(-1, i32)

    def pair(bd: Body, q) -> None:
        at = bd.add(first, q)
        y = bd.offset(bd.dsd("y", (rows,)), bd.mul(at, rows))
        bd.fmovs(y, bd.scalar(0.0))
        e = bd.load("pair_e", at)

        def product(bd2: Body) -> None:
            ei = _as_index(bd2, e)
            if bias:
                bd2.fmovs(y, bd2.offset(bd2.dsd("bdn", (rows,)), bd2.mul(ei, rows)))

            def col(bd3: Body, f) -> None:
                w = bd3.offset(bd3.dsd("wdn", (rows,)), bd3.mul(bd3.add(bd3.mul(ei, cols), f), rows))
                bd3.fmacs(y, y, w, bd3.load("a", bd3.add(bd3.mul(q, cols), f)))
            bd2.each(cols, col)
        bd.when(bd.cmpi(e, none, "sgt"), product)

    body.each(b, pair)
    body.store(body.remi(body.plus(p, 1), body.const(passes, i32)), "pass", body.const(0))
    out.add("fmac_down", body)
