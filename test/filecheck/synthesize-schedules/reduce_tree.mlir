// RUN: meshrt-opt %s -p 'synthesize-schedules{target=wse3 reduce-tree=tree}' | filecheck %s
// RUN: meshrt-opt %s -p 'synthesize-schedules{target=wse3}' | filecheck %s --check-prefix=CHAIN

// A row of 64 cores reducing 64 values: with reduce-tree=tree the plan centres
// the root (x = 31) and both halves stream toward it in parallel; by default
// one chain streams into the root at the row's end (x = 63).
mesh_kernel.program @long target "wse3" mesh 64 x 8 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 64, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 64 : i64} : !graph.act<64>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, 64, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<64> -> !graph.act<64>
  %r = mesh_kernel.allreduce @ar(%g) on <(0, 0, 64, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<64> -> !graph.act<64>
}

// CHECK:     event.flow @ar.down kernel @ar role "down" wafer 0 from <(0, 0, 31, 1)> to <(1, 0, 31, 1)> pattern "shift" by 1, 0 bytes 256 streams
// CHECK-NEXT: event.flow @ar.down_r kernel @ar role "down" wafer 0 from <(32, 0, 32, 1)> to <(31, 0, 32, 1)> pattern "shift" by -1, 0 bytes 256 streams
// CHECK-NEXT: event.flow @ar.up kernel @ar role "up" wafer 0 from <(31, 0, 1, 1)> to <(0, 0, 31, 1), (32, 0, 32, 1)> pattern "row" bytes 256 streams

// CHAIN:     event.flow @ar.down kernel @ar role "down" wafer 0 from <(0, 0, 63, 1)> to <(1, 0, 63, 1)> pattern "shift" by 1, 0 bytes 256 streams
// CHAIN-NOT: _r
// CHAIN:     event.flow @ar.up kernel @ar role "up" wafer 0 from <(63, 0, 1, 1)> to <(0, 0, 63, 1)> pattern "row" bytes 256 streams
