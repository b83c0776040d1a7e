// RUN: meshrt-opt %s -p 'synthesize-schedules{reduce-group=2}' | filecheck %s
// RUN: meshrt-opt %s -p 'synthesize-schedules{reduce-group=1}' | filecheck %s --check-prefix=CHAIN
// RUN: not meshrt-opt %s -p 'synthesize-schedules{reduce-group=-1}' 2>&1 | filecheck %s --check-prefix=BAD
// RUN: meshrt-opt %s -p 'synthesize-schedules{target=wse3}' | filecheck %s --check-prefix=END
// RUN: not meshrt-opt %s -p 'synthesize-schedules{reduce-tree=ring}' 2>&1 | filecheck %s --check-prefix=BADTREE

// A two-level streaming tree over a row of 9 cores, rooted at its centre
// (x = 4): groups of 2 on each side. Side a (x < 4) streams toward +x, side
// b (x > 4, roles `_r`) toward -x. Group 0 of each side is one core next to
// the root; the leads at distance 2 and 4 add their group's stream, and the
// leads' stream runs 2 hops a step toward the root (`across`). The root
// adds the four streams and multicasts the sum along the row.
mesh_kernel.program @two target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 9, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, 9, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %r = mesh_kernel.allreduce @ar(%g) on <(0, 0, 9, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
}

// CHECK:      event.flow @ar.down kernel @ar role "down" wafer 0 from <(1, 0, 1, 1), (3, 0, 1, 1)> to <(2, 0, 1, 1), (4, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64 streams
// CHECK-NEXT: event.flow @ar.across kernel @ar role "down" wafer 0 from <(0, 0, 1, 1), (2, 0, 1, 1)> to <(2, 0, 1, 1), (4, 0, 1, 1)> pattern "shift" by 2, 0 bytes 64 streams
// CHECK-NEXT: event.flow @ar.down_r kernel @ar role "down" wafer 0 from <(5, 0, 1, 1), (7, 0, 1, 1)> to <(4, 0, 1, 1), (6, 0, 1, 1)> pattern "shift" by -1, 0 bytes 64 streams
// CHECK-NEXT: event.flow @ar.across_r kernel @ar role "down" wafer 0 from <(6, 0, 1, 1), (8, 0, 1, 1)> to <(4, 0, 1, 1), (6, 0, 1, 1)> pattern "shift" by -2, 0 bytes 64 streams
// CHECK-NEXT: event.flow @ar.up kernel @ar role "up" wafer 0 from <(4, 0, 1, 1)> to <(0, 0, 4, 1), (5, 0, 4, 1)> pattern "row" bytes 64 streams
// the farthest lead (x = 0) has no group of its own: it only sends
// CHECK:      event.sub @ar "lead.1" after [@g]
// CHECK-NEXT:   event.send @ar.across bytes 64 meta 0
// CHECK-NEXT:   event.recv @ar.up bytes 64 meta 0
// CHECK:      event.sub @ar "edge" after [@g]
// CHECK-NEXT:   event.send @ar.down bytes 64 meta 0
// CHECK-NEXT:   event.recv @ar.up bytes 64 meta 0
// the nearer lead adds its group's stream, then adds into the farther lead's stream and forwards it
// CHECK:      event.sub @ar "lead" after [@g]
// CHECK-NEXT:   event.recv @ar.down bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.recv @ar.across bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.send @ar.across bytes 64 meta 0
// CHECK-NEXT:   event.recv @ar.up bytes 64 meta 0
// CHECK:      event.sub @ar "root" after [@g]
// CHECK-NEXT:   event.recv @ar.down bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.recv @ar.down_r bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.recv @ar.across bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.recv @ar.across_r bytes 64 meta 0
// CHECK-NEXT:   event.compute "add" work 16
// CHECK-NEXT:   event.send @ar.up bytes 64 meta 0
// CHECK:      event.sub @ar "edge_r" after [@g]
// CHECK:      event.sub @ar "lead_r" after [@g]
// CHECK:      event.sub @ar "lead_r.1" after [@g]

// CHAIN:     event.flow @ar.down kernel @ar role "down" wafer 0 from <(0, 0, 4, 1)> to <(1, 0, 4, 1)> pattern "shift" by 1, 0 bytes 64 streams
// CHAIN:     event.flow @ar.down_r kernel @ar role "down" wafer 0 from <(5, 0, 4, 1)> to <(4, 0, 4, 1)> pattern "shift" by -1, 0 bytes 64 streams
// CHAIN-NOT: across

// BAD: synthesize-schedules: reduce-group must be >= 0, got -1

// By default (reduce-tree=chain) the row streams into a root at its end (x = 8),
// even on a target with the colours and queues a centred root needs.
// END:      event.flow @ar.down kernel @ar role "down" wafer 0 from <(0, 0, 8, 1)> to <(1, 0, 8, 1)> pattern "shift" by 1, 0 bytes 64 streams
// END-NOT:  down_r
// END:      event.flow @ar.up kernel @ar role "up" wafer 0 from <(8, 0, 1, 1)>

// BADTREE: synthesize-schedules: reduce-tree must be chain or tree, got 'ring'
