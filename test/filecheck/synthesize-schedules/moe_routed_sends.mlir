// RUN: meshrt-opt %s --split-input-file -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s

// With MoE routing, the expert regions' outputs travel into combine on a
// routed flow: the tables keep one send per root core and one recv per
// corridor core, but in a step only the regions a token chose send (the
// interpreter, the cost model and the CSL read the flag).
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK:      event.flow @l0.moe.combine.in0 kernel @l0.moe.combine role "input" operand 0 wafer 0 from <(4, 0, 1, 4), (6, 0, 1, 4)> to <(3, 0, 1, 4)> pattern "row" bytes 128 routed{{$}}
// Nothing else is routed: the tokens go to every region along the rows (one multicast).
// CHECK-NOT:  routed
// CHECK:      event.send @l0.moe.combine.in0 bytes 128 meta 32

// -----

// The static build (no routing dynamism): every expert computes every token,
// so every region's message carries its outputs; nothing is routed.
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 4)>, #mesh.cores<(6, 0, 2, 4)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK:      event.flow @l0.moe.combine.in0 kernel @l0.moe.combine role "input" operand 0 wafer 0 from <(4, 0, 1, 4), (6, 0, 1, 4)> to <(3, 0, 1, 4)> pattern "row" bytes {{[0-9]+}}{{$}}
// CHECK-NOT:  routed
