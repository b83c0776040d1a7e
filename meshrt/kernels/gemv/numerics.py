"""What the gemv kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.kernels.attention.layout import HeadSplit
from meshrt.kernels.numerics import F32, F64, DataLayoutError, KernelExec, block_order, block_range, inverse, part


class Gemv(KernelExec):
    OPS = frozenset({"fmac", "dequant_fp8", "dequant_mxfp4"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.transposed = info.param("axis", "col") == "row"
        _, _, w, h = self.tiles[0]
        self.splits = h if self.transposed else w  # parts of the output
        self.blocks = plane.out_blocks(info)
        # the q | k | v (| gate) of an attention splitting head_dim (`attention.layout`),
        # or the output of one read as this GEMV's input
        self.out_split, self.gated = self._head_split(info, "out_heads"), len(self.blocks or ()) == 4
        self.in_split = self._head_split(info, "in_heads")
        # blocked position -> index in the blocks' plain concatenation, or None (plain)
        order = None
        if self.out_split is not None:
            order = self.out_split.qkv_order(self.gated)
        elif self.blocks:
            order = block_order(self.blocks, self.splits)
        # where the output holds each entry of the blocks' plain concatenation (readers of a
        # blocked value look entries up here, once per kernel rather than per core and step)
        self.positions = inverse(order) if order is not None else None
        rows = self.in_split.o_order if self.in_split is not None else None
        self.weight = plane.matrix(self.name, self.layer, order, rows)
        self.bias = plane.bias(self.name, self.layer, order)
        # stored quantized: each core holds its tile's codes and block scales, and decodes
        # them where it computes (the dequant event before its fmac)
        self.fmt = info.packed_weights
        self.packed = None if self.fmt is None else plane.packed_matrix(
            self.name, self.layer, self.fmt, order, rows)
        if (self.bias is not None) != (info.param("bias") is not None):
            raise DataLayoutError(f"kernel @{self.name}: the model's weights "
                                  f"{'have' if self.bias is not None else 'have no'} bias for it, "
                                  f"its IR says {'no ' if info.param('bias') is None else ''}bias")
        # its compute where it has PE bodies (float32 weights): per tile, what the CSL prints
        self.bodies = self.tile_bodies()

    def _head_split(self, info, key: str) -> HeadSplit | None:
        p = info.param(key)
        if p is None:
            return None
        heads, kv_heads, head_dim, cols = p
        sp = HeadSplit.of(heads, kv_heads, head_dim, cols, self.plane.shape.rope)
        if sp.problem():
            raise DataLayoutError(f"kernel @{self.name}: {key}: {sp.problem()}")
        return sp

    def _in_range(self, i: int, j: int, w: int, h: int, n_in: int) -> tuple[int, int]:
        """This core's rows of the input: its part of the split (over columns where
        transposed; a head-splitting attention's output, its columns' units)."""
        if not self.transposed:
            return part(n_in, h, j)
        if self.in_split is not None:
            return self.in_split.q_range(i) if i < self.in_split.cols else (n_in, n_in)
        return part(n_in, w, i)

    def _out_range(self, k: int, n_out: int) -> tuple[int, int]:
        if self.out_split is not None:
            return self.out_split.qkv_range(k, self.gated)
        return block_range(self.blocks, self.splits, k) if self.blocks else part(n_out, self.splits, k)

    def _ranges(self, pos) -> tuple[int, int, int, int]:
        """(r0, r1, c0, c1): the rows of the input and the columns of the output the core
        at `pos` holds."""
        _, i, j, w, h = self.grid_at(pos)
        n_in, n_out = self.weight.shape
        r0, r1 = self._in_range(i, j, w, h, n_in)
        c0, c1 = self._out_range(j if self.transposed else i, n_out)
        return r0, r1, c0, c1

    def resident(self, pos):
        bodies = self.bodies_at(pos)
        if bodies is None:
            return None
        r0, r1, c0, c1 = self._ranges(pos)
        rows, cols = bodies.buffer("x").elems // self.b, bodies.buffer("y").elems // self.b
        if r1 - r0 > rows or c1 - c0 > cols:
            raise DataLayoutError(f"kernel @{self.name} on core ({pos[1]}, {pos[2]}): its "
                                  f"{r1 - r0} x {c1 - c0} tile exceeds the {rows} x {cols} of its "
                                  "class's body")
        tile = np.zeros((rows, cols), F32)
        tile[:r1 - r0, :c1 - c0] = self.weight[r0:r1, c0:c1]
        out = [tile.ravel()]
        if self.bias is not None:  # on the cores of the first input rows, zeros elsewhere
            bias = np.zeros(cols, F32)
            if r0 == 0 < r1:
                bias[:c1 - c0] = self.bias[c0:c1]
            out.append(bias)
        return out

    def compute(self, cd, op):
        n_out = self.weight.shape[1]
        r0, r1, c0, c1 = self._ranges(cd.pos)
        if op != "fmac":  # dequant_*: the packed tile decoded for this step's fmac
            if self.packed is None or op != f"dequant_{self.fmt}":
                raise DataLayoutError(f"{self.where(cd)}: {op} on weights stored as "
                                      f"{self.fmt or 'floats'}")
            tile = cd.packed_tile(self.name, lambda: self.packed.slice(r0, r1, c0, c1))
            cd.acc[self.name, "w"] = tile.decode()
            return
        x = self.input(cd).need(r0, r1, self.where(cd))
        bodies = self.bodies_at(cd.pos)
        if bodies is not None:
            bufs = self.pe_buffers(cd, bodies)
            rows, cols = len(bufs["x"]) // self.b, len(bufs["y"]) // self.b
            xb = bufs["x"].reshape(self.b, rows)
            xb[:] = 0
            xb[:, :r1 - r0] = x
            self.run_body(cd, bodies, "fmac")
            partial = np.zeros((self.b, n_out), F32)
            partial[:, c0:c1] = bufs["y"].reshape(self.b, cols)[:, :c1 - c0]
            cd.values[self.name] = ("partial", c0, c1, partial)
            return
        if self.packed is None:
            weights = cd.tile(self.name, lambda: self.weight[r0:r1, c0:c1])
        elif (self.name, "w") in cd.acc:
            weights = cd.acc.pop((self.name, "w"))
        else:
            raise DataLayoutError(f"{self.where(cd)}: fmac before its {self.fmt} tile is decoded")
        partial = np.zeros((self.b, n_out), F64)
        partial[:, c0:c1] = x.astype(F64) @ weights
        if self.bias is not None and r0 == 0 < r1:  # the core of the first input rows adds it, once
            partial[:, c0:c1] += self.bias[c0:c1]
        cd.values[self.name] = ("partial", c0, c1, partial)
