"""embed: the first stage's embedding rows for the sampled tokens."""

from meshrt.kernels.embed.op import EmbedOp as OP

__all__ = ["OP"]
