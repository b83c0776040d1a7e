// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s
// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules | filecheck %s --check-prefix=ROLES

// MoE routing: the gate's root produces routing metainfo ahead of the token
// data it sends into the dispatch corridor; every dispatch relay, expert and
// combine role resolves it; nothing else touches it.
graph.model @moe target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<moe_routing>] hparams {dtype_bytes = 4 : i64, top_k = 2 : i64} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %g = graph.gate_topk @l0.gate(%x) on <(2, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.routing<4, 2>
  %e = graph.moe_experts @l0.moe(%x, %g) on <(3, 0, 1, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, expert_ffn = 16 : i64, shared_experts = 0 : i64, expert_regions = [#mesh.cores<(4, 0, 2, 2)>, #mesh.cores<(4, 2, 2, 2)>], placement = array<i64: 0, 0, 1, 1>} : !graph.act<32>, !graph.routing<4, 2> -> !graph.act<32>
}

// CHECK-NOT:  "continuous_batching"
// Every corridor core takes its slice of the gated tokens from the gate core
// of its row (no relay along the corridor) and resolves the routing riding it.
// CHECK:      event.core_class @l0.moe.combine.slice wafer 0 cores <(3, 0, 1, 4)> {
// CHECK-NEXT:   event.sub @l0.moe.dispatch "slice" after [@embed.reduce, @l0.gate]
// CHECK-NEXT:     event.meta_resolve "moe_routing" from @l0.moe.dispatch.in0 bytes 32
// CHECK-NEXT:     event.recv @l0.moe.dispatch.in0 bytes 64 meta 32
// CHECK-NEXT:     event.compute "route" work 4
// The corridor holds the tokens over its four rows and every stacked region gathers
// them: each corridor core multicasts the slice it holds (8 values x 2 slots x 4 B).
// CHECK-NEXT:     event.send @l0.moe.experts.in0 bytes 64 meta 32
// CHECK:      event.sub @l0.moe.combine "slice" after [@l0.moe.reduce, @l0.gate]
// CHECK-NEXT:   event.meta_resolve "moe_routing" from @l0.moe.combine.in0 bytes 32
// CHECK-NEXT:   event.recv @l0.moe.combine.in0 bytes 256 meta 32
// CHECK:      event.core_class @l0.moe.reduce.root wafer 0 cores <(4, 0, 1, 1), (4, 2, 1, 1)> {
// CHECK-NEXT:   event.sub @l0.moe.experts "edge" after [@l0.moe.dispatch, @l0.gate] demand <{{.*}}> collective {
// CHECK-NEXT:     event.meta_resolve "moe_routing" from @l0.moe.experts.in0 bytes 32
// The expert outputs leave each region's root column, not every expert core,
// with the routing metainfo the experts resolved; expert_reduce itself resolves nothing.
// CHECK:        event.sub @l0.moe.reduce "root" after [@l0.moe.experts] demand <{{.*}}> collective {
// CHECK-NEXT:     event.recv @l0.moe.reduce.down_r bytes 256 meta 0
// CHECK-NEXT:     event.compute "add" work 64
// CHECK-NEXT:     event.send @l0.moe.combine.in0 bytes 256 meta 32
// CHECK-NEXT:   }
// CHECK:      event.core_class @l0.moe.reduce.edge_r wafer 0 cores <(5, 0, 1, 1), (5, 2, 1, 1)> {
// CHECK:        event.sub @l0.moe.reduce "edge_r" after [@l0.moe.experts]
// CHECK-NEXT:     event.send @l0.moe.reduce.down_r bytes 256 meta 0
// CHECK:      event.sub @l0.gate "root"
// CHECK:        event.compute "topk" work 8
// CHECK-NEXT:   event.send @l0.gate.up
// CHECK-NEXT:   event.meta_produce "moe_routing" onto @l0.moe.dispatch.in0 bytes 32
// CHECK-NEXT:   event.send @l0.moe.dispatch.in0 bytes {{[0-9]+}} meta 32
// CHECK-NOT:  event.meta_produce


// Every flow says what it carries: a chain's partials and its result
// (multicast from the root; relayed back where tiles share columns, as the
// expert regions here do), or another kernel's value and the operand it feeds.
// ROLES:      event.flow @l0.gate.down kernel @l0.gate role "down" wafer 0
// ROLES-NEXT: event.flow @l0.gate.up kernel @l0.gate role "up" wafer 0
// ROLES-NEXT: event.flow @l0.gate.in0 kernel @l0.gate role "input" operand 0 wafer 0
// ROLES-NEXT: event.flow @l0.moe.dispatch.in0 kernel @l0.moe.dispatch role "input" operand 0 wafer 0 from <(2, 1, 1, 2), (2, 0, 1, 1), (2, 3, 1, 1)> to <(3, 0, 1, 4)> pattern "row" bytes 64
// ROLES-NEXT: event.flow @l0.moe.experts.down kernel @l0.moe.experts role "down" wafer 0
// ROLES-NEXT: event.flow @l0.moe.experts.up kernel @l0.moe.experts role "up" wafer 0
// ROLES-NEXT: event.flow @l0.moe.experts.in0 kernel @l0.moe.experts role "input" operand 0 wafer 0
// ROLES-NEXT: event.flow @l0.moe.reduce.down_r kernel @l0.moe.reduce role "down" wafer 0
// The expert regions are stacked, so their rows are not the corridor's: every
// root column's outputs go to every corridor core (an `all` gather of 4 cores).
// It is routed: only the regions a token chose send.
// ROLES-NEXT: event.flow @l0.moe.combine.in0 kernel @l0.moe.combine role "input" operand 0 wafer 0 from <(4, 0, 1, 2), (4, 2, 1, 2)> to <(3, 0, 1, 4)> pattern "all" bytes 256 routed{{$}}
