"""sample: argmax over the vocabulary tiles and EOS detection (the CF payload's source)."""

from meshrt.kernels.sample.op import SampleOp as OP

__all__ = ["OP"]
