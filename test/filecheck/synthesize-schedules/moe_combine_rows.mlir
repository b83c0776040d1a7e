// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// Full-height expert regions beside the corridor, whose rows are the gate
// column's: every move of the layer's tokens runs along the rows. Each
// corridor core takes its slice from the gate core of its row and multicasts
// it along its row into the expert regions; the regions' outputs come back
// the same way: only the root column of every region (the one facing the
// corridor) sends, one message per region and row; no gather remains.
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK:      event.flow @l0.moe.dispatch.in0 kernel @l0.moe.dispatch role "input" operand 0 wafer 0 from <(2, 1, 1, 2), (2, 0, 1, 1), (2, 3, 1, 1)> to <(3, 0, 1, 4)> pattern "row" bytes 64
// CHECK:      event.flow @l0.moe.experts.in0 kernel @l0.moe.experts role "input" operand 0 wafer 0 from <(3, 0, 1, 4)> to <{{.*}}> pattern "row" bytes 64

// The reduction streams west along each row of both regions at once; a
// region holds two experts, so a core's message is 2 slots x 2 experts x
// 8 rows of fp32 (the top-2 routing sends each token to at most two of them).
// CHECK:      event.flow @l0.moe.reduce.down_r kernel @l0.moe.reduce role "down" wafer 0 from <(5, 0, 1, 4), (7, 0, 1, 4)> to <(4, 0, 1, 4), (6, 0, 1, 4)> pattern "shift" by -1, 0 bytes 128 streams
// CHECK-NEXT: event.flow @l0.moe.combine.in0 kernel @l0.moe.combine role "input" operand 0 wafer 0 from <(4, 0, 1, 4), (6, 0, 1, 4)> to <(3, 0, 1, 4)> pattern "row" bytes 128
// CHECK-NOT:  pattern "all" bytes 128

// Each corridor core weights and sums the two messages of its row; its slice
// of the result stays where the residual add would read it.
// CHECK:      event.sub @l0.moe.combine "slice" after [@l0.moe.reduce, @l0.gate]
// CHECK-NEXT:   event.meta_resolve "moe_routing" from @l0.moe.combine.in0 bytes 32
// CHECK-NEXT:   event.recv @l0.moe.combine.in0 bytes 128 meta 32
// CHECK-NEXT:   event.compute "combine" work 32
// CHECK-NEXT: }

// The two root columns of a row send on one colour: their routers take turns
// (a switch chain), so the roots' sub-schedules need two switch positions;
// the cores that only stream the reduction along the row need one.
// CHECK:      event.sub @l0.moe.reduce "root" after [@l0.moe.experts] demand <colors = 2, iq = 1, oq = 1, routes = 2, switches = 2, sram = 160> collective {
// CHECK:      event.sub @l0.moe.reduce "edge_r" after [@l0.moe.experts] demand <colors = 1, oq = 1, routes = 1, switches = 1, sram = 128> collective {
