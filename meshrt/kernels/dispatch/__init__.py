"""dispatch: the relay corridor that carries routed tokens from the gate to the expert regions."""

from meshrt.kernels.dispatch.op import DispatchOp as OP

__all__ = ["OP"]
