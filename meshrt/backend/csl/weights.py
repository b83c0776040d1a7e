"""The weight tiles the host loads: each core class's resident array `w`, per core.

For every core of a class (its rectangles in order, each row by row: the
order `run.py` hands them to memcpy), the region of `w` each kernel's
sub-schedule holds is filled with what the kernel's PE bodies keep resident
(`KernelExec.resident`: the values the interpreter loads into the same
buffers, from the same weights), in the bodies' order. Regions of kernels
whose compute is not yet PE bodies (attention's KV, the MoE experts,
quantized or 16-bit tiles) stay zero: their CSL reads layouts of its own
(docs/csl-backend.md, "Compute").
"""

from __future__ import annotations

import numpy as np

from meshrt.backend.csl.model import CoreClass


def class_weights(cls: CoreClass, nw: int, regions: list[tuple[str, str, int, int]], plane) -> np.ndarray | None:
    """`w` of every core of `cls` (cores x nw, float32), or None where no region of the
    class holds a PE body's resident values."""
    held = [(plane.kernels[k], off, n) for k, array, off, n in regions
            if array == "w" and k in plane.kernels]
    out = np.zeros((cls.cores, nw), np.float32)
    filled = False
    row = 0
    for x0, y0, x1, y1 in (b[:4] for b in cls.boxes):
        for y in range(y0, y1):
            for x in range(x0, x1):
                for kernel, off, n in held:
                    parts = kernel.resident((cls.wafer, x, y))
                    if parts is None:
                        continue
                    data = np.concatenate(parts) if parts else np.zeros(0, np.float32)
                    if len(data) > n:
                        raise ValueError(f"kernel @{kernel.name} keeps {len(data)} resident values "
                                         f"on core ({x}, {y}); its region of w holds {n}")
                    out[row, off:off + len(data)] = data
                    filled = True
                row += 1
    return out if filled else None
