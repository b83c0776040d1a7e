"""What the gemv kernel's events do to data in the interpreter."""

from __future__ import annotations

import numpy as np

from meshrt.kernels.numerics import F64, DataLayoutError, KernelExec, block_order, block_range, part


class Gemv(KernelExec):
    OPS = frozenset({"fmac", "dequant_fp8", "dequant_mxfp4"})

    def __init__(self, info, plane):
        super().__init__(info, plane)
        self.transposed = info.param("axis", "col") == "row"
        _, _, w, h = self.tiles[0]
        self.splits = h if self.transposed else w  # parts of the output
        self.blocks = plane.out_blocks(info)
        # where the output holds each entry of the blocks' plain concatenation (readers of a
        # blocked value look entries up here, once per kernel rather than per core and step)
        self.positions = None
        if self.blocks:
            self.positions = np.empty(sum(self.blocks), np.int64)
            self.positions[block_order(self.blocks, self.splits)] = np.arange(sum(self.blocks))
        self.weight = plane.matrix(self.name, self.layer, self.blocks, self.splits)
        self.bias = plane.bias(self.name, self.layer, self.blocks, self.splits)
        # stored quantized: each core holds its tile's codes and block scales, and decodes
        # them where it computes (the dequant event before its fmac)
        self.fmt = info.packed_weights
        self.packed = None if self.fmt is None else plane.packed_matrix(
            self.name, self.layer, self.fmt, self.blocks, self.splits)

    def compute(self, cd, op):
        _, i, j, w, h = self.grid_pos(cd)
        n_in, n_out = self.weight.shape
        r0, r1 = part(n_in, w, i) if self.transposed else part(n_in, h, j)  # the input's split
        k = j if self.transposed else i  # this core's part of the output
        c0, c1 = block_range(self.blocks, self.splits, k) if self.blocks else part(n_out, self.splits, k)
        if op != "fmac":  # dequant_*: the packed tile decoded for this step's fmac
            if self.packed is None or op != f"dequant_{self.fmt}":
                raise DataLayoutError(f"{self.where(cd)}: {op} on weights stored as "
                                      f"{self.fmt or 'floats'}")
            tile = cd.packed_tile(self.name, lambda: self.packed.slice(r0, r1, c0, c1))
            cd.acc[self.name, "w"] = tile.decode()
            return
        x = self.input(cd).need(r0, r1, self.where(cd))
        if self.packed is None:
            weights = cd.tile(self.name, lambda: self.weight[r0:r1, c0:c1])
        elif (self.name, "w") in cd.acc:
            weights = cd.acc.pop((self.name, "w"))
        else:
            raise DataLayoutError(f"{self.where(cd)}: fmac before its {self.fmt} tile is decoded")
        partial = np.zeros((self.b, n_out), F64)
        partial[:, c0:c1] = x.astype(F64) @ weights
        if self.bias is not None and r0 == 0:  # the core of the first input rows adds it, once
            partial[:, c0:c1] += self.bias[c0:c1]
        cd.values[self.name] = ("partial", c0, c1, partial)
