"""gemv: a weight matrix tiled over a grid, the input split over rows (lowered from graph.matmul)."""

from meshrt.kernels.gemv.op import GemvOp as OP

__all__ = ["OP"]
