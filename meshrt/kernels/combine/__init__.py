"""combine: the relay corridor run backwards, summing the weighted expert outputs."""

from meshrt.kernels.combine.op import CombineOp as OP

__all__ = ["OP"]
