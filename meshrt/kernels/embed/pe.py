"""The embed kernel's compute body at the PE-program level (see meshrt.kernels.pe).

Core (i, j) of the w x h region holds rows [i * R, (i + 1) * R) of the
embedding table (R = ceil(V / w)), columns [j * K, (j + 1) * K) of each
(K = ceil(hidden / h)): `table`, R x K, resident (loaded by the host). Its
column i is its `px` less the region's first column. For each of the B
slots' token ids (`tokens`, i32, as the sampler sent them) the core writes
its K entries of the token's row into `y` where it holds the row and zeros
where it does not: the row allreduce after it sums the one row into every
core of the row (exact: one value and zeros).
"""

from __future__ import annotations

from xdsl.dialects.builtin import IndexType, i32

from meshrt.kernels.pe import Bodies, Body, Buffer


def bodies_for(info, micro_batch: int, hp, tile: tuple[int, int, int, int]) -> Bodies | None:
    """The body of embed `info` on `tile`, or None where its table is stored in 16 bits or
    quantized (the float32 body would need a float32 copy of the table; the GEMVs of such
    models are not PE bodies either)."""
    if info.packed_weights is not None or hp.dtype_bytes < 4:
        return None
    vocab, hidden = info.param("vocab"), info.param("out_width")
    return embed_bodies(info.kernel_name, micro_batch, vocab, hidden, tile)


def embed_bodies(kernel: str, b: int, vocab: int, hidden: int, tile: tuple[int, int, int, int]) -> Bodies:
    x0, _, w, h = tile
    rows, k = -(-vocab // w), -(-hidden // h)
    out = Bodies(kernel, [Buffer("tokens", b, "i32"), Buffer("y", b * k),
                          Buffer("table", rows * k, resident=True)])
    body = out.body("embed")
    px = body.param("px")
    first = body.cast(body.mul(body.cast(body.subi(px, body.const(x0, px.type)), IndexType()), rows), i32)

    def slot(bd: Body, j) -> None:
        row = bd.subi(bd.load("tokens", j), first)  # the token's row among this core's
        out_j = bd.offset(bd.dsd("y", (k,)), bd.mul(j, k))
        bd.fmovs(out_j, bd.scalar(0.0))
        held = bd.both(bd.cmpi(row, bd.const(0, i32), "sge"), bd.cmpi(row, bd.const(rows, i32), "slt"))
        bd.when(held, lambda bd2: bd2.fmovs(
            out_j, bd2.offset(bd2.dsd("table", (k,)), bd2.mul(bd2.cast(row, IndexType()), k))))

    body.each(b, slot)
    out.add("embed", body)
    return out
