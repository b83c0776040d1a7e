// RUN: meshrt-opt %s -p synthesize-schedules | filecheck %s

// The paper's Figure 5: an AllReduce over one row of four cores. On test32
// (fewer than 8 user colours) the root stays at the end of the row. The
// partials stream (`streams`): the edge sends its partial; mid cores
// receive, add and forward as the wavelets pass; the root adds the last
// stream and multicasts the result along the row in one message (a
// streaming `row` flow), which every other core receives. No metainfo.
mesh_kernel.program @fig5 target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {dtype_bytes = 4 : i64} {
  %x = mesh_kernel.embed @embed on <(0, 0, 4, 1)> {layer = -1 : i64, stage = 0 : i64, wafer = 0 : i64, vocab = 16 : i64} : !graph.act<16>
  %g = mesh_kernel.gemv @g(%x) on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64} : !graph.act<16> -> !graph.act<16>
  %r = mesh_kernel.allreduce @ar(%g) on <(0, 0, 4, 1)> {layer = 0 : i64, stage = 0 : i64, wafer = 0 : i64, axis = "row"} : !graph.act<16> -> !graph.act<16>
}

// CHECK-NOT:  event.meta_
// CHECK:      event.kernel @ar "allreduce" on <(0, 0, 4, 1)> inputs [@g] params {{.*}}axis = "row"
// CHECK:      event.flow @ar.down kernel @ar role "down" wafer 0 from <(0, 0, 3, 1)> to <(1, 0, 3, 1)> pattern "shift" by 1, 0 bytes 64 streams
// CHECK-NEXT: event.flow @ar.up kernel @ar role "up" wafer 0 from <(3, 0, 1, 1)> to <(0, 0, 3, 1)> pattern "row" bytes 64 streams
// CHECK:      event.core_class @ar.edge wafer 0 cores <(0, 0, 1, 1)> {
// CHECK:        event.sub @ar "edge" after [@g] demand <colors = 2, iq = 1, oq = 1, routes = 2, switches = 1, sram = 64> collective {
// CHECK-NEXT:     event.send @ar.down bytes 64 meta 0
// CHECK-NEXT:     event.recv @ar.up bytes 64 meta 0
// CHECK-NEXT:   }
// CHECK:      event.core_class @ar.mid wafer 0 cores <(1, 0, 2, 1)> {
// CHECK:        event.sub @ar "mid" after [@g] demand <{{.*}}> collective {
// CHECK-NEXT:     event.recv @ar.down bytes 64 meta 0
// CHECK-NEXT:     event.compute "add" work 16
// CHECK-NEXT:     event.send @ar.down bytes 64 meta 0
// CHECK-NEXT:     event.recv @ar.up bytes 64 meta 0
// CHECK-NEXT:   }
// CHECK:      event.core_class @ar.root wafer 0 cores <(3, 0, 1, 1)> {
// CHECK:        event.sub @ar "root" after [@g] demand <{{.*}}> collective {
// CHECK-NEXT:     event.recv @ar.down bytes 64 meta 0
// CHECK-NEXT:     event.compute "add" work 16
// CHECK-NEXT:     event.send @ar.up bytes 64 meta 0
// CHECK-NEXT:   }
// CHECK-NOT:  event.meta_
