"""dispatch: the corridor cores that hand routed tokens from the gate to the expert regions."""

from meshrt.kernels.dispatch.op import DispatchOp as OP

__all__ = ["OP"]
