"""deltanet: Gated DeltaNet linear attention (Qwen3.5) with its recurrent and conv state per slot."""

from meshrt.kernels.deltanet.op import DeltaNetOp as OP

__all__ = ["OP"]
