"""Elementwise compute bodies at the PE-program level (see meshrt.kernels.pe).

silu_mul: y = silu(gate) * up (or gpt-oss's clamped form), gate and up side by
side per slot in x.

add: y = x + x1, the two operands where the program holds them
(meshrt.backend.csl.values: a residual add reads the layer's input, kept
since it arrived, and the reduced projection).

An RMSNorm over a column of h cores: each core holds K = ceil(n / h) of the
n features of every slot (B slots), in `x` slot by slot. Buffers are the
CSL program's: `x` the input, `y` the output (its first B elements carry
the partial sums down the column and the inverse RMS back up), `p` what a
chain neighbour sent, `scale` the inverse RMS per slot, `gain` this core's
K gains (resident, loaded by the host).

- square_sum: y[j] = sum_i x[j, i]^2 (squares into y, summed into scale)
- add:        y[j] += p[j] (a neighbour's partial, on the way to the root)
- rsqrt:      scale[j] = 1 / sqrt(y[j] * (1 / n) + eps), copied into y (the
              relay sends it) and p (where the root's own scale reads it)
- scale:      y[j, i] = x[j, i] * f[j] * gain[i], f the inverse RMS: `p` in a
              column of several cores (received from the root, or the root's
              own copy), `scale` on a lone core
"""

from __future__ import annotations

from meshrt.kernels.pe import Bodies, Body, Buffer
from meshrt.shape import HParams


def bodies_for(info, micro_batch: int, hp: HParams, tile: tuple[int, int, int, int]) -> Bodies | None:
    """The PE bodies of elementwise kernel `info` (its `event.kernel` record) on `tile`
    (x, y, w, h)."""
    kind, n = info.param("kind"), info.param("out_width")
    w, h = tile[2], tile[3]
    if kind == "rmsnorm":  # a column of h cores
        return rmsnorm_bodies(info.kernel_name, micro_batch, -(-n // h), n, hp.float("rms_eps"), h > 1)
    split = h if info.param("layout", "cols") == "rows" else w  # its vectors' split
    if kind == "add":
        return add_bodies(info.kernel_name, micro_batch, -(-n // split))
    if kind == "silu_mul":
        return silu_mul_bodies(info.kernel_name, micro_batch, -(-n // split), *glu_params(hp))
    return None


def glu_params(hp: HParams) -> tuple[float, float, float]:
    """The model's FFN activation as `add_silu_mul` takes it: alpha, limit, shift."""
    return tuple(hp.float(k) for k in ("swiglu_alpha", "swiglu_limit", "swiglu_shift"))


def add_bodies(kernel: str, b: int, k: int) -> Bodies:
    """y = x + x1 on this core's `k` entries of each of `b` slots (x, x1: the operands,
    wherever the program holds them)."""
    out = Bodies(kernel, [Buffer("x", b * k), Buffer("x1", b * k), Buffer("y", b * k)])
    body = out.body("add")
    body.fadds(body.dsd("y", (b * k,)), body.dsd("x", (b * k,)), body.dsd("x1", (b * k,)))
    out.add("add", body)
    return out


def rmsnorm_bodies(kernel: str, b: int, k: int, n: int, eps: float, chained: bool) -> Bodies:
    """The bodies of RMSNorm kernel `kernel`: `b` slots, `k` features a core, width `n`;
    `chained`: the column has more than one core (partials and the inverse RMS travel
    through `p`; a lone core keeps its inverse RMS in `scale`)."""
    has_p, factor = chained, ("p" if chained else "scale")
    bufs = [Buffer("x", b * k), Buffer("y", b * k), Buffer("scale", b), Buffer("gain", k, resident=True)]
    if has_p:
        bufs.append(Buffer("p", b))
    out = Bodies(kernel, bufs)

    body = out.body("square_sum")
    body.fmuls(body.dsd("y", (b, k)), body.dsd("x", (b, k)), body.dsd("x", (b, k)))
    body.fmovs(body.dsd("scale", (b,)), body.scalar(0.0))
    acc = body.dsd("scale", (b, k), (1, 0))
    body.fadds(acc, acc, body.dsd("y", (b, k)))
    body.fmovs(body.dsd("y", (b,)), body.dsd("scale", (b,)))
    out.add("square_sum", body)

    if has_p:
        body = out.body("add")
        body.fadds(body.dsd("y", (b,)), body.dsd("y", (b,)), body.dsd("p", (b,)))
        out.add("add", body)

    body = out.body("rsqrt")
    body.fmuls(body.dsd("scale", (b,)), body.dsd("y", (b,)), body.scalar(1.0 / n))
    body.fadds(body.dsd("scale", (b,)), body.dsd("scale", (b,)), body.scalar(eps))

    def inverse_sqrt(bd: Body, j) -> None:
        bd.store(bd.divf(bd.scalar(1.0), bd.call("sqrt_f32", bd.load("scale", j))), "scale", j)

    body.each(b, inverse_sqrt)
    body.fmovs(body.dsd("y", (b,)), body.dsd("scale", (b,)))
    if has_p:
        body.fmovs(body.dsd("p", (b,)), body.dsd("scale", (b,)))
    out.add("rsqrt", body)

    body = out.body("scale")
    body.fmuls(body.dsd("y", (b, k)), body.dsd("x", (b, k)), body.dsd(factor, (b, k), (1, 0)))
    body.fmuls(body.dsd("y", (b, k)), body.dsd("y", (b, k)), body.dsd("gain", (b, k), (0, 1)))
    out.add("scale", body)
    return out


def silu_mul_bodies(kernel: str, b: int, k: int, alpha: float = 1.0, limit: float = 0.0,
                    shift: float = 0.0) -> Bodies:
    """y[j, i] = g / (1 + exp(-alpha g)) * (u + shift) for this core's `k` entries of each
    of `b` slots, g and u the gate and up entries: in x, per slot, the core's k gate
    entries then its k up entries (the fused up projection's gate | up blocks, as this
    core's column of it holds them). `limit` > 0: g = min(g, limit), u clipped to
    +-limit first (gpt-oss); alpha 1, no limit, shift 0 is SiLU (`reference.glu`)."""
    out = Bodies(kernel, [Buffer("x", b * 2 * k), Buffer("y", b * k)])
    add_silu_mul(out, "silu_mul", b, k, "x", "y", alpha, limit, shift)
    return out


def add_silu_mul(out: Bodies, op: str, b: int, k: int, src: str, dst: str, alpha: float = 1.0,
                 limit: float = 0.0, shift: float = 0.0) -> None:
    """The silu_mul body as compute op `op` of `out`: `src` holds per slot k gate then k
    up entries, `dst` gets the k products (`silu_mul_bodies`)."""
    body = out.body(op)

    def entry(bd: Body, j, i) -> None:
        g = bd.load(src, bd.add(bd.mul(j, 2 * k), i))
        u = bd.load(src, bd.plus(bd.add(bd.mul(j, 2 * k), i), k))
        if limit:
            g = bd.minf(g, bd.scalar(limit))
            u = bd.maxf(bd.minf(u, bd.scalar(limit)), bd.scalar(-limit))
        e = bd.call("exp_f32", bd.mulf(bd.scalar(-alpha), g))
        act = bd.divf(g, bd.addf(bd.scalar(1.0), e))
        if shift:
            u = bd.addf(u, bd.scalar(shift))
        bd.store(bd.mulf(act, u), dst, bd.add(bd.mul(j, k), i))

    body.each(b, lambda bd, j: bd.each(k, lambda bd2, i: entry(bd2, j, i)))
    out.add(op, body)
