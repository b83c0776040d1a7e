// RUN: meshrt-opt %s -p lower-to-mesh-kernels,synthesize-schedules --split-input-file | filecheck %s

// Gated DeltaNet on a 2 x 4 region: one value head (v_dim 4) and its key head
// (k_dim 8) per column, so a column's convolved q / k is 16 channels, split over
// its 4 rows. Each core convolves its 4 q / k channels and its v slice of 1 over
// 3 taps (work 15), the column all-gathers the convolved q / k before the rule
// (64 bytes streaming down to the root, merged by `qk_merge`, multicast back up),
// then the head outputs (16 bytes) are gathered down the column for the root's
// gated norm and relayed back. Both passes take the in projection's reduction
// route, so they share its flows. The in projection's value reaches the DeltaNet
// from its last row, which lies inside the DeltaNet's region: its two cores'
// trees would cross each other's routers, so the row's end core gathers the
// other's slice (@l0_delta.in0.relay) and multicasts the value alone.
graph.model @dn target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64, kv_slots = 2 : i64, linear_k_heads = 1 : i64, linear_v_heads = 2 : i64, linear_k_dim = 8 : i64, linear_v_dim = 4 : i64, linear_conv = 3 : i64, linear_layers = array<i64: 0>} {
  %x = graph.embed @embed on <(0, 0, 2, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %p = graph.matmul @l0_in(%x) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<36>
  %d = graph.deltanet @l0_delta(%p) on <(2, 0, 2, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 1 : i64, v_heads = 2 : i64, k_dim = 8 : i64, v_dim = 4 : i64, conv = 3 : i64} : !graph.act<36> -> !graph.act<8>
}

// CHECK:      event.flow @l0_delta.in0.relay kernel @l0_delta role "input" operand 0 wafer 0 from <(2, 3, 1, 1)> to <(3, 3, 1, 1)> pattern "all" bytes 72
// CHECK-NEXT: event.flow @l0_delta.in0 kernel @l0_delta role "input" operand 0 wafer 0 from <(3, 3, 1, 1)> to <(2, 1, 2, 2), (2, 0, 2, 1), (2, 3, 2, 1)> pattern "all" bytes 72
// CHECK:      event.core_class @l0_delta.edge wafer 0 cores <(2, 0, 2, 1)> {
// CHECK:        event.sub @l0_delta "edge"
// CHECK-NEXT:     event.recv @l0_delta.in0 bytes 72
// CHECK-NEXT:     event.compute "delta_conv" work 15
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 64
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 64
// CHECK-NEXT:     event.compute "delta" work 32
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 16
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 16
// CHECK-NEXT:   }
// CHECK:      event.core_class @l0_delta.mid wafer 0 cores <(2, 1, 2, 2)> {
// CHECK:        event.sub @l0_delta "mid"
// CHECK-NEXT:     event.recv @l0_delta.in0 bytes 72
// CHECK-NEXT:     event.compute "delta_conv" work 15
// CHECK-NEXT:     event.recv @l0_in.reduce.down bytes 64
// CHECK-NEXT:     event.compute "qk_merge" work 16
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 64
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 64
// CHECK-NEXT:     event.compute "delta" work 32
// CHECK-NEXT:     event.recv @l0_in.reduce.down bytes 16
// CHECK-NEXT:     event.compute "delta_merge" work 4
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 16
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 16
// CHECK-NEXT:   }
// CHECK:      event.core_class @l0_delta.root wafer 0 cores <(2, 3, 1, 1)> {
// CHECK:        event.sub @l0_in.reduce "root
// CHECK:          event.send @l0_in.reduce.up bytes 72
// CHECK-NEXT:     event.send @l0_delta.in0.relay bytes 72
// CHECK-NEXT:   }
// CHECK:        event.sub @l0_delta "root"
// CHECK-NEXT:     event.recv @l0_delta.in0 bytes 72
// CHECK-NEXT:     event.compute "delta_conv" work 15
// CHECK-NEXT:     event.recv @l0_in.reduce.down bytes 64
// CHECK-NEXT:     event.compute "qk_merge" work 16
// CHECK-NEXT:     event.send @l0_in.reduce.up bytes 64
// CHECK-NEXT:     event.compute "delta" work 32
// CHECK-NEXT:     event.recv @l0_in.reduce.down bytes 16
// CHECK-NEXT:     event.compute "delta_merge" work 4
// CHECK-NEXT:     event.compute "norm_gate" work 4
// CHECK-NEXT:     event.send @l0_in.reduce.up bytes 16
// CHECK-NEXT:   }
// CHECK:      event.core_class @l0_delta.root.2 wafer 0 cores <(3, 3, 1, 1)> {
// CHECK:        event.sub @l0_in.reduce "root"
// CHECK:          event.send @l0_in.reduce.up bytes 72
// CHECK-NEXT:     event.recv @l0_delta.in0.relay bytes 72
// CHECK-NEXT:     event.send @l0_delta.in0 bytes 72
// CHECK-NEXT:   }
// CHECK:        event.sub @l0_delta "root"
// CHECK-NEXT:     event.recv @l0_delta.in0 bytes 72

// -----

// The same heads on a region twice as wide at micro-batch 2: two token groups of
// two columns side by side (lowering sets groups = 2), each running one token of the
// micro-batch over its own slot's state (slots 2 / 2 groups). Per core the work and
// the messages are one token's, as at micro-batch 1 above, and no flow joins the groups.
graph.model @dn target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 2 dynamism [] hparams {dtype_bytes = 4 : i64, kv_slots = 2 : i64, linear_k_heads = 1 : i64, linear_v_heads = 2 : i64, linear_k_dim = 8 : i64, linear_v_dim = 4 : i64, linear_conv = 3 : i64, linear_layers = array<i64: 0>} {
  %x = graph.embed @embed on <(0, 0, 4, 4)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<32>
  %p = graph.matmul @l0_in(%x) on <(4, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<32> -> !graph.act<36>
  %d = graph.deltanet @l0_delta(%p) on <(4, 0, 4, 4)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, k_heads = 1 : i64, v_heads = 2 : i64, k_dim = 8 : i64, v_dim = 4 : i64, conv = 3 : i64} : !graph.act<36> -> !graph.act<8>
}

// CHECK:      event.kernel @l0_delta "deltanet" on <(4, 0, 4, 4)> {{.*}}slots = 2 : i64, groups = 2 : i64
// CHECK:      event.core_class @l0_delta.edge wafer 0 cores <(4, 0, 4, 1)> {
// CHECK:        event.sub @l0_delta "edge"
// CHECK-NEXT:     event.recv @l0_delta.in0 bytes 72
// CHECK-NEXT:     event.compute "delta_conv" work 15
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 64
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 64
// CHECK-NEXT:     event.compute "delta" work 32
// CHECK-NEXT:     event.send @l0_in.reduce.down bytes 16
// CHECK-NEXT:     event.recv @l0_in.reduce.up bytes 16
// CHECK-NEXT:   }
// CHECK:      event.core_class @l0_delta.root wafer 0 cores <(4, 3, 3, 1)> {
// CHECK:        event.compute "norm_gate" work 4
// CHECK:      event.core_class @l0_delta.root.2 wafer 0 cores <(7, 3, 1, 1)> {
// CHECK:          event.recv @l0_delta.in0.relay bytes 72
// CHECK-NEXT:     event.send @l0_delta.in0 bytes 72
// CHECK:        event.compute "norm_gate" work 4
