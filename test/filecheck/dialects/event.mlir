// RUN: meshrt-opt %s | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | meshrt-opt | filecheck %s

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 2 dynamism [#mesh.dyn<continuous_batching>] hparams {} {
  event.kernel @r "allreduce" on <(0, 1, 4, 4)> inputs [@qkv] params {axis = "row", in_widths = array<i64: 64>, out_width = 64 : i64}
  event.flow @r.up kernel @r role "up" wafer 0 from <(0, 1, 3, 4)> to <(1, 1, 3, 4)> pattern "shift" by 1, 0 bytes 64 streams
  event.flow @r.bc kernel @r role "up" wafer 0 from <(3, 1, 1, 4)> to <(0, 1, 4, 4)> pattern "row" bytes 64
  event.flow @r.in0 kernel @r role "input" operand 0 wafer 0 from <(0, 0, 4, 1)> to <(0, 1, 4, 1)> pattern "col" bytes 64
  event.flow @tok kernel @sample role "tokens" wafer 0 from <(0, 6, 4, 1)> to <(0, 0, 4, 1)> pattern "col" bytes 8
  event.flow @c.in0 kernel @c role "input" operand 0 wafer 0 from <(9, 0, 1, 4), (12, 0, 1, 4)> to <(8, 0, 1, 4)> pattern "row" bytes 32 routed
  event.core_class @edge wafer 0 cores <(0, 1, 1, 4)> params {upstream = "west"} {
    event.sub @r "edge" after [@qkv] demand <colors = 2, iq = 1, oq = 1, routes = 2, sram = 256> collective {
      event.send @r.up bytes 64 meta 0
      event.recv @r.bc bytes 64 meta 0
    }
  }
  event.core_class @root wafer 0 cores <(3, 1, 1, 4)> {
    event.sub @r "root" after [@qkv] demand <colors = 2> collective {
      event.recv @r.up bytes 64 meta 0
      event.compute "add" work 16
      event.send @r.bc bytes 64 meta 0
    }
  }
  event.core_class @first wafer 0 cores <(0, 0, 4, 1)> {
    event.sub @embed "token_in" after [] demand <iq = 1, ctrl = 64> {
      event.meta_resolve "continuous_batching" from @tok bytes 4
      event.recv @tok bytes 4 meta 4
      event.compute "embed" work 16
    }
  }
  event.core_class @last wafer 0 cores <(0, 6, 4, 1)> {
    event.sub @sample "argmax" after [@lm_head] demand <oq = 1, ctrl = 32> {
      event.compute "argmax" work 32
      event.meta_produce "continuous_batching" onto @tok bytes 4
      event.send @tok bytes 4 meta 4
    }
  }
}

// CHECK:      event.schedule @m target "t" mesh 16 x 16
// CHECK-NEXT:   event.kernel @r "allreduce" on <(0, 1, 4, 4)> inputs [@qkv] params {axis = "row", in_widths = array<i64: 64>, out_width = 64 : i64}
// CHECK-NEXT:   event.flow @r.up kernel @r role "up" wafer 0 from <(0, 1, 3, 4)> to <(1, 1, 3, 4)> pattern "shift" by 1, 0 bytes 64 streams{{$}}
// CHECK-NEXT:   event.flow @r.bc kernel @r role "up" wafer 0 from <(3, 1, 1, 4)> to <(0, 1, 4, 4)> pattern "row" bytes 64
// CHECK-NEXT:   event.flow @r.in0 kernel @r role "input" operand 0 wafer 0 from <(0, 0, 4, 1)> to <(0, 1, 4, 1)> pattern "col" bytes 64
// CHECK-NEXT:   event.flow @tok kernel @sample role "tokens" wafer 0 from
// CHECK-NEXT:   event.flow @c.in0 kernel @c role "input" operand 0 wafer 0 from <(9, 0, 1, 4), (12, 0, 1, 4)> to <(8, 0, 1, 4)> pattern "row" bytes 32 routed{{$}}
// CHECK-NEXT:   event.core_class @edge wafer 0 cores <(0, 1, 1, 4)> params {upstream = "west"} {
// CHECK-NEXT:     event.sub @r "edge" after [@qkv] demand <colors = 2, iq = 1, oq = 1, routes = 2, sram = 256> collective {
// CHECK-NEXT:       event.send @r.up bytes 64 meta 0
// CHECK-NEXT:       event.recv @r.bc bytes 64 meta 0
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK:        event.core_class @root wafer 0 cores <(3, 1, 1, 4)> {
// CHECK-NEXT:     event.sub @r "root" after [@qkv] demand <colors = 2> collective {
// CHECK-NEXT:       event.recv @r.up bytes 64 meta 0
// CHECK-NEXT:       event.compute "add" work 16
// CHECK-NEXT:       event.send @r.bc bytes 64 meta 0
// CHECK:          event.sub @embed "token_in" after [] demand <iq = 1, ctrl = 64> {
// CHECK-NEXT:       event.meta_resolve "continuous_batching" from @tok bytes 4
// CHECK:          event.sub @sample "argmax" after [@lm_head] demand <oq = 1, ctrl = 32> {
// CHECK-NEXT:       event.compute "argmax" work 32
// CHECK-NEXT:       event.meta_produce "continuous_batching" onto @tok bytes 4
// CHECK-NEXT:       event.send @tok bytes 4 meta 4
