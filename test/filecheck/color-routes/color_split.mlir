// RUN: meshrt-opt %s -p 'color-routes{colors=1},check-segments' | filecheck %s

// One colour, and @a (kernel @k1) and @b (kernel @k2) cross the same
// routers while @p and @q each hold one segment: no colouring exists.
// color-routes hands the overflow back to materialization, which splits
// @p's segment between @k1 and @k2 (a marker sync: @k1 is no collective),
// then @q's (no marker sync: its @k1 part is a collective); then @a and @b
// share colour 0, rebound by each class's reconfiguration.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 2> {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
  }
}

// CHECK:      segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
// CHECK-NEXT:     event.sub @k1 "src"
// CHECK:        segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
// CHECK-NEXT:   segment.reconfigure 0 to 1 release [@a] install [@b]
// CHECK-NEXT:   segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
// CHECK-NEXT:     event.sub @k2 "src"
// CHECK:        segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
// CHECK-NEXT:   segment.reconfigure 1 to 0 release [@b] install [@a]
// CHECK-NEXT: }
// CHECK-NEXT: segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
// CHECK-NEXT:     event.sub @k1 "dst"
// CHECK:        }
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.reconfigure 0 to 1 release [@a] install [@b]
// CHECK-NEXT:   segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
// CHECK:        segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
// CHECK-NEXT:   segment.reconfigure 1 to 0 release [@b] install [@a]
// CHECK-NEXT: }
// CHECK-NEXT: segment.route @a color 0 via <(0, 0, 3, 1)>
// CHECK-NEXT: segment.route @b color 0 via <(0, 0, 3, 1)>
