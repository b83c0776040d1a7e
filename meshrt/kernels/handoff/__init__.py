"""handoff: the hidden state and CF payload into the next pipeline stage."""

from meshrt.kernels.handoff.op import HandoffOp as OP

__all__ = ["OP"]
