"""expert_ffn: the SwiGLU experts of an MoE layer on same-shaped expert regions (from graph.moe_experts)."""

from meshrt.kernels.expert_ffn.op import ExpertFFNOp as OP

__all__ = ["OP"]
