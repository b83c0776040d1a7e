"""attention: decode attention over KV tiles split by sequence rows, merged flash-decoding style."""

from meshrt.kernels.attention.op import AttentionOp as OP

__all__ = ["OP"]
