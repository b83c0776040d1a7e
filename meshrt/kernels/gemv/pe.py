"""The GEMV's compute body at the PE-program level (see meshrt.kernels.pe).

A core holds its tile of W: R input rows by C output columns (`tile_shape`,
the fullest core's; a core with fewer leaves the rest zero), row-major, and
where the model has one, its columns' bias. For each of the B slots of the
micro-batch, its input part x[j] (R elements) becomes the partial sums

    y[j] = bias + sum_r x[j, r] * W[r]          (one @fmacs per input element)

which the allreduce after the GEMV adds up. The bias is held by the cores of
the first input rows (the others hold zeros), so it is added once.
"""

from __future__ import annotations

from meshrt.kernels.gemv.tiles import tile_shape
from meshrt.kernels.pe import Bodies, Body, Buffer
from meshrt.shape import HParams


def gemv_buffers(b: int, rows: int, cols: int, bias: bool) -> list[Buffer]:
    """The buffers the fmac body reads and writes."""
    bufs = [Buffer("x", b * rows), Buffer("y", b * cols), Buffer("w", rows * cols, resident=True)]
    if bias:
        bufs.append(Buffer("bias", cols, resident=True))
    return bufs


def gemv_bodies(kernel: str, b: int, rows: int, cols: int, bias: bool) -> Bodies:
    out = Bodies(kernel, gemv_buffers(b, rows, cols, bias))
    add_fmac(out, b, rows, cols, bias)
    return out


def add_fmac(out: Bodies, b: int, rows: int, cols: int, bias: bool) -> None:
    """The fmac body, into `out` (which has `gemv_buffers`)."""
    body = out.body("fmac")

    def slot(bd: Body, j) -> None:
        y = bd.offset(bd.dsd("y", (cols,)), bd.mul(j, cols))
        bd.fmovs(y, bd.dsd("bias", (cols,)) if bias else bd.scalar(0.0))

        def row(bd: Body, r) -> None:
            w = bd.offset(bd.dsd("w", (cols,)), bd.mul(r, cols))
            bd.fmacs(y, y, w, bd.load("x", bd.add(bd.mul(j, rows), r)))

        bd.each(rows, row)

    body.each(b, slot)
    out.add("fmac", body)


def bodies_for(info, micro_batch: int, hp: HParams, tile: tuple[int, int, int, int]) -> Bodies | None:
    """The body of GEMV `info` (its `event.kernel` record) on `tile`, or None where its
    weights are stored quantized (decoded as the fmac reads them) or in 16 bits: not yet
    PE bodies (they need element types beside float32; docs/csl-backend.md)."""
    if info.packed_weights is not None or hp.dtype_bytes < 4:
        return None
    _, _, w, h = tile
    rows, cols = tile_shape(info.param("in_widths")[0], info.param("out_width"), w, h,
                            info.param("axis", "col"), info.param("blocks"), info.param("out_heads"),
                            info.param("in_heads"))
    return gemv_bodies(info.kernel_name, micro_batch, rows, cols, info.param("bias") is not None)
