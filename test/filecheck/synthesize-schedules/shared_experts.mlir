// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// A shared expert with a sigmoid gate (Qwen3.5-MoE): the gate's router gains one
// column per shared expert (its x . w_sg), so each gate core's fmac covers 8 input
// rows x (4 experts + 1) columns for 2 slots (80), and the root's topk pass 2 x 5.
// Every token's routing carries its 2 routed choices and the shared one, 4 bytes
// each: 24 bytes of metainfo per micro-batch on every routed flow. The shared
// expert's region, the last one, runs the expert roles beside the routed regions.
graph.model @shared target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64, shared_experts = 1 : i64, shared_expert_gate = 1 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 1 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>, #mesh.cores<(6, 0, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK:      event.core_class @l0.gate.edge wafer 0 cores <(2, 0, 1, 1)> {
// CHECK-NEXT:   event.sub @l0.gate "edge"
// CHECK-NEXT:     event.recv
// CHECK-NEXT:     event.compute "fmac" work 80
// CHECK:          event.send @l0.moe.dispatch.in0 bytes 64 meta 48
// CHECK:      event.core_class @l0.moe.combine.slice
// CHECK:          event.recv @l0.moe.combine.in0 bytes 256 meta 48
// CHECK:      event.core_class @l0.moe.reduce.root wafer 0 cores <(4, 0, 1, 1), (6, 0, 1, 1), (4, 2, 1, 1)> {
// CHECK-NEXT:   event.sub @l0.moe.experts "edge"
// CHECK-NEXT:     event.meta_resolve "moe_routing" from @l0.moe.experts.in0 bytes 48
// CHECK:      event.core_class @l0.gate.root wafer 0 cores <(2, 3, 1, 1)> {
// CHECK:          event.compute "topk" work 10
