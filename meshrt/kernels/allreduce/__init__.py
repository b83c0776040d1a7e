"""allreduce: partial sums reduced down each column (or row) and relayed back (from graph.matmul)."""

from meshrt.kernels.allreduce.op import AllReduceOp as OP

__all__ = ["OP"]
