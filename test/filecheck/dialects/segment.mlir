// RUN: meshrt-opt %s | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | meshrt-opt | filecheck %s

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 3, 1)> to <(1, 0, 3, 1)> pattern "shift" by 1, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 3, 1)> to <(1, 0, 3, 1)> pattern "shift" by 1, 0 bytes 32
  segment.core_class @c0 wafer 0 cores <(0, 0, 3, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> {
      event.sub @k0 "sender" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 4, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> {
      event.sub @k1 "sender" after [@k0] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
  }
  segment.core_class @c1 wafer 0 cores <(3, 0, 1, 1)> budget <colors = 2, iq = 1> {
    segment.segment 0 use <colors = 2, iq = 1> {
    }
  }
  segment.core_class @c2 wafer 0 cores <(0, 1, 3, 1)> params {upstream = "west"} {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
    }
    segment.marker_sync 1 to 0 over <(0, 0, 4, 2)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 4, 1)>
  segment.route @b color 0 via <(0, 0, 4, 1)>
}

// CHECK:      segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
// CHECK-NEXT:   event.flow @a
// CHECK-NEXT:   event.flow @b
// CHECK-NEXT:   segment.core_class @c0 wafer 0 cores <(0, 0, 3, 1)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, oq = 1> {
// CHECK-NEXT:       event.sub @k0 "sender" after [] demand <colors = 1, oq = 1> {
// CHECK-NEXT:         event.send @a bytes 32 meta 0
// CHECK-NEXT:       }
// CHECK-NEXT:     }
// CHECK-NEXT:     segment.marker_sync 0 to 1 over <(0, 0, 4, 1)>
// CHECK-NEXT:     segment.reconfigure 0 to 1 release [@a] install [@b]
// CHECK-NEXT:     segment.segment 1 use <colors = 1, oq = 1> {
// CHECK:        segment.core_class @c1 wafer 0 cores <(3, 0, 1, 1)> budget <colors = 2, iq = 1> {
// CHECK:        segment.core_class @c2 wafer 0 cores <(0, 1, 3, 1)> params {upstream = "west"} {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
// CHECK-NEXT:     }
// CHECK-NEXT:     segment.reconfigure 0 to 1 release [@a] install [@b]
// CHECK-NEXT:     segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
// CHECK-NEXT:     }
// CHECK-NEXT:     segment.marker_sync 1 to 0 over <(0, 0, 4, 2)>
// CHECK-NEXT:     segment.reconfigure 1 to 0 release [@b] install [@a]
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.route @a color 0 via <(0, 0, 4, 1)>
// CHECK-NEXT:   segment.route @b color 0 via <(0, 0, 4, 1)>
