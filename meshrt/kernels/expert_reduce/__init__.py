"""expert_reduce: each expert region's output partials summed along its rows (from graph.moe_experts)."""

from meshrt.kernels.expert_reduce.op import ExpertReduceOp as OP

__all__ = ["OP"]
