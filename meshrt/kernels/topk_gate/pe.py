"""The MoE gate's compute bodies at the PE-program level (see meshrt.kernels.pe).

The gate is a column of h cores: core j holds R = ceil(n / h) rows of the
router (n the model's width), all C logit columns (the routed experts', then
one per shared expert whose sigmoid gate rides the router), and the bias on
the first rows' core where the router has one. Per slot (B of them):

- fmac:  y[j] = bias + sum_r x[j, r] * W[r] (the GEMV's body, gemv/pe.py)
- add:   y += p, a neighbour's partial logits on their way to the root
- topk:  at the root, per token, the softmax of the E routed logits (the max
         subtracted, `<math>`'s exp_f32) into `prob`, then K times the
         largest remaining probability, the first of equal ones (a strict `>`
         in expert order, as a stable sort of the reference takes them),
         into the routing table (`rt_expert`, `rt_weight`); the K weights
         renormalised to sum to 1 where the model does (norm_topk); then one
         choice per shared expert (ids E, E + 1, ...), weighted by the sigmoid
         of its gate's logit where the model gates it (1/(1 + exp_f32(-z))),
         else 1.

The routing table holds `route_choices` entries per token, the routing
metainfo carries them (an i32 id and an f32 weight each: two words), and
every core that reads the table (experts, dispatch, combine) reads that
stride.
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, i32

from meshrt.kernels.gemv.pe import add_fmac, gemv_buffers
from meshrt.kernels.pe import Bodies, Body, Buffer

# The program's routing table (`PROGRAM_ARRAYS`): expert id and gate weight per (token,
# choice); the resolver of moe_routing metainfo fills it on the cores that receive it.
ROUTING_TABLE = ("rt_expert", "rt_weight")


def route_choices(top_k: int, shared: int) -> int:
    """Entries per token of the routing table (and of the routing metainfo): its top_k
    routed experts, then each shared expert."""
    return top_k + shared


def logit_columns(experts: int, shared: int, gated: bool) -> int:
    """Router columns: one per routed expert, plus one per shared expert where a sigmoid
    gate scales it (its x . w_sg rides the router's product)."""
    return experts + (shared if gated else 0)


def bodies_for(info, micro_batch: int, hp, tile: tuple[int, int, int, int]) -> Bodies:
    experts, k = info.param("experts"), info.param("top_k")
    cols = logit_columns(experts, hp.int("shared_experts"), bool(hp.int("shared_expert_gate")))
    rows = -(-info.param("in_widths")[0] // tile[3])
    # the router's product in float32 where the program's weights are float32; else the
    # fmac and the chain's adds keep their previous bodies and only the selection is here
    fmac = info.packed_weights is None and hp.dtype_bytes >= 4
    return gate_bodies(info.kernel_name, micro_batch, rows, cols, experts, k, bool(hp.int("norm_topk")),
                       bool(hp.int("router_bias")), fmac, hp.int("shared_experts"),
                       bool(hp.int("shared_expert_gate")))


def gate_bodies(kernel: str, b: int, rows: int, cols: int, experts: int, k: int, normalize: bool,
                bias: bool, fmac: bool = True, shared: int = 0, gated: bool = False) -> Bodies:
    """`shared` experts follow the K routed choices of each token in the routing table;
    `gated`: each is weighted by the sigmoid of its logit column (E + s), else by 1."""
    n = route_choices(k, shared)
    out = Bodies(kernel, [*gemv_buffers(b, rows, cols, bias), Buffer("p", b * cols), Buffer("prob", experts),
                          Buffer(ROUTING_TABLE[0], b * n, "i32"), Buffer(ROUTING_TABLE[1], b * n)])
    if fmac:
        add_fmac(out, b, rows, cols, bias)
        body = out.body("add")
        body.fadds(body.dsd("y", (b * cols,)), body.dsd("y", (b * cols,)), body.dsd("p", (b * cols,)))
        out.add("add", body)

    body = out.body("topk")

    def token(bd: Body, t) -> None:
        row = bd.mul(t, cols)

        def entry(bd2: Body, c):
            """Token t's choice c in the routing table."""
            return bd2.add(bd2.mul(t, n), c)

        def logit(bd2: Body, e):
            return bd2.widen(bd2.load("y", bd2.add(row, e)))

        (top,) = bd.fold(experts, [logit(bd, bd.const(0))], lambda bd2, e, m: [bd2.maxf(logit(bd2, e), m)])

        def exp(bd2: Body, e, s):
            v = bd2.call("exp_f32", bd2.subf(logit(bd2, e), top))
            bd2.store(v, "prob", e)
            return [bd2.addf(s, v)]

        (total,) = bd.fold(experts, [bd.scalar(0.0)], exp)
        bd.each(experts, lambda bd2, e: bd2.store(bd2.divf(bd2.load("prob", e), total), "prob", e))

        def choose(bd2: Body, c):
            def scan(bd3: Body, e, best, at):
                v = bd3.load("prob", e)
                take = bd3.cmpf(v, best, "ogt")
                return [bd3.select(take, v, best), bd3.select(take, bd3.cast(e, i32), at)]

            best, at = bd2.fold(experts, [bd2.scalar(-1.0), bd2.const(0, i32)], scan)
            slot = entry(bd2, c)
            bd2.store(at, ROUTING_TABLE[0], slot)
            bd2.store(best, ROUTING_TABLE[1], slot)
            bd2.store(bd2.scalar(-1.0), "prob", bd2.cast(at, IndexType()))  # taken

        bd.each(k, choose)
        if normalize:
            (chosen,) = bd.fold(k, [bd.scalar(0.0)], lambda bd2, c, s: [bd2.addf(
                s, bd2.load(ROUTING_TABLE[1], entry(bd2, c)))])
            bd.each(k, lambda bd2, c: bd2.store(
                bd2.divf(bd2.load(ROUTING_TABLE[1], entry(bd2, c)), chosen), ROUTING_TABLE[1], entry(bd2, c)))

        def share(bd2: Body, c) -> None:
            at = bd2.plus(entry(bd2, c), k)
            bd2.store(bd2.cast(bd2.plus(c, experts), i32), ROUTING_TABLE[0], at)
            weight = bd2.scalar(1.0)
            if gated:
                z = bd2.widen(bd2.load("y", bd2.plus(bd2.add(row, c), experts)))
                e = bd2.call("exp_f32", bd2.subf(bd2.scalar(0.0), z))
                weight = bd2.divf(bd2.scalar(1.0), bd2.addf(bd2.scalar(1.0), e))
            bd2.store(weight, ROUTING_TABLE[1], at)

        if shared:
            bd.each(shared, share)

    body.each(b, token)
    out.add("topk", body)
    return out
