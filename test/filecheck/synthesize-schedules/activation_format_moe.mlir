// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// MoE: the gated tokens travel as bf16 into the experts (8 values x 2 slots x 2 B),
// the experts' outputs stay fp32 into the combine, which sums them (as the fp32
// build in moe_routing.mlir: 256 bytes).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 2 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}
// CHECK-LABEL: event.schedule @moe
// CHECK:       event.flow @l0.moe.experts.in0 {{.*}} bytes 32
// CHECK:       event.flow @l0.moe.combine.in0 {{.*}} bytes 256
