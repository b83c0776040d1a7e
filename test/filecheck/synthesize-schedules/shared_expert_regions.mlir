// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// Two routed regions of two experts each (2 x 4 cores) and the shared expert's
// region of its own shape (1 x 4: sized for one expert, not for a routed
// region's two), one kernel: each shape has its own roles and chain flows
// (`shared_`, `.shared`), the dispatch and combine flows stay one each.
// Routed regions run min(2, top-2) = 2 passes of the micro-batch's 2 tokens,
// the shared region one (every token, one expert).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64, shared_experts = 1 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 1 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>, #mesh.cores<(8, 0, 1, 4)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK:      event.kernel @l0.moe.experts "expert_ffn" on <(4, 0, 2, 4), (6, 0, 2, 4), (8, 0, 1, 4)> {{.*}}shared_experts = 1 : i64
// CHECK:      event.flow @l0.moe.experts.down kernel @l0.moe.experts role "down" wafer 0 from <(4, 0, 2, 3), (6, 0, 2, 3)> to <(4, 1, 2, 3), (6, 1, 2, 3)> pattern "shift" by 0, 1 bytes 128 streams
// CHECK:      event.flow @l0.moe.experts.shared.down kernel @l0.moe.experts role "down" wafer 0 from <(8, 0, 1, 3)> to <(8, 1, 1, 3)> pattern "shift" by 0, 1 bytes 256 streams
// CHECK:      event.flow @l0.moe.experts.in0 kernel @l0.moe.experts role "input" operand 0 wafer 0 from <(3, 0, 1, 4)> to <{{.*}}(8, 3, 1, 1)> pattern "row" bytes 64
// CHECK:      event.flow @l0.moe.combine.in0 kernel @l0.moe.combine role "input" operand 0 wafer 0 from <(4, 0, 1, 4), (6, 0, 1, 4), (8, 0, 1, 4)> to <(3, 0, 1, 4)> pattern "row" bytes 128 routed
// CHECK:      event.sub @l0.moe.experts "edge"
// CHECK-NEXT:   event.meta_resolve "moe_routing"
// CHECK-NEXT:   event.recv @l0.moe.experts.in0
// CHECK-COUNT-2: event.send @l0.moe.experts.down bytes 128
// CHECK-NOT:    event.send
// CHECK:      }
// CHECK:      event.sub @l0.moe.reduce "root"
// CHECK:      event.sub @l0.moe.experts "shared_edge"
// CHECK-NEXT:   event.meta_resolve "moe_routing"
// CHECK-NEXT:   event.recv @l0.moe.experts.in0 bytes 64
// CHECK-NEXT:   event.compute "fmac" work 512
// CHECK-NEXT:   event.send @l0.moe.experts.shared.down bytes 256
// CHECK-NEXT:   event.recv @l0.moe.experts.shared.up bytes 128
// CHECK-NEXT:   event.compute "fmac_down" work 256
// CHECK-NEXT: }
// CHECK:      event.sub @l0.moe.reduce "shared_root"
