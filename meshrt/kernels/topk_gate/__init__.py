"""topk_gate: router logits reduced down the columns and the top-k experts of each token."""

from meshrt.kernels.topk_gate.op import TopKGateOp as OP

__all__ = ["OP"]
