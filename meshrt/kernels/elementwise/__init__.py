"""elementwise: rmsnorm (a column reduction of squares), residual add and silu_mul."""

from meshrt.kernels.elementwise.op import ElementwiseOp as OP

__all__ = ["OP"]
