// RUN: meshrt-opt %s -p 'materialize-segments{colors=3 iq=2 oq=2 routes=4 switches=2 sram=4096 ctrl=128}' | filecheck %s
// RUN: meshrt-opt %s -p 'materialize-segments{colors=3 iq=2 oq=2 routes=4 switches=2 sram=4096 ctrl=128},color-routes,check-segments' | filecheck %s --check-prefix=SAFE
// RUN: meshrt-opt %s -p 'materialize-segments{sram=8192 colors=2}' | filecheck %s --check-prefix=ROOMY

// A reduction row on an 8 x 4 mesh: @edge (0, 0) and @mid (1..2, 0) shift
// partial sums east to @root (3, 0); the root then multicasts down column 3
// (@bc.down to @col) and sends to an output block (@out.x to @sink).
// Under the tight budget @root needs three segments:
//  - 0 | 1 after the collective @r: a consistent cut, no marker sync;
//  - 1 | 2 after @out (not a collective): marker sync over the routers of
//    the released routes @bc.down and @out.x and @root's own core;
//  - 2 | 0 closes the table for the next decode step; @tail is not a
//    collective, so it has a marker sync over @r.up's routers.
event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @r.up kernel @r role "up" wafer 0 from <(0, 0, 3, 1)> to <(1, 0, 3, 1)> pattern "shift" by 1, 0 bytes 64
  event.flow @bc.down kernel @bc role "down" wafer 0 from <(3, 0, 1, 1)> to <(3, 1, 1, 3)> pattern "col" bytes 64
  event.flow @out.x kernel @out role "input" operand 0 wafer 0 from <(3, 0, 1, 1)> to <(6, 2, 2, 2)> pattern "all" bytes 32
  event.core_class @edge wafer 0 cores <(0, 0, 1, 1)> {
    event.sub @r "edge" after [] demand <colors = 1, oq = 1, sram = 1024> collective {
      event.send @r.up bytes 64 meta 0
    }
  }
  event.core_class @mid wafer 0 cores <(1, 0, 2, 1)> {
    event.sub @r "mid" after [] demand <colors = 1, iq = 1, oq = 1, sram = 1024> collective {
      event.recv @r.up bytes 64 meta 0
      event.send @r.up bytes 64 meta 0
    }
  }
  event.core_class @root wafer 0 cores <(3, 0, 1, 1)> {
    event.sub @r "root" after [] demand <colors = 1, iq = 1, sram = 3072> collective {
      event.recv @r.up bytes 64 meta 0
      event.compute "add" work 64
    }
    event.sub @bc "src" after [@r] demand <colors = 1, oq = 1, sram = 2048> {
      event.send @bc.down bytes 64 meta 0
    }
    event.sub @out "src" after [@bc] demand <colors = 1, oq = 1, sram = 1024> {
      event.compute "scale" work 16
      event.send @out.x bytes 32 meta 0
    }
    event.sub @tail "local" after [@out] demand <sram = 3000> {
      event.compute "rsqrt" work 16
    }
  }
  event.core_class @col wafer 0 cores <(3, 1, 1, 3)> {
    event.sub @bc "dst" after [@r] demand <colors = 1, iq = 1, sram = 512> {
      event.recv @bc.down bytes 64 meta 0
    }
  }
  event.core_class @sink wafer 0 cores <(6, 2, 2, 2)> {
    event.sub @out "dst" after [@bc] demand <colors = 1, iq = 1, sram = 512> {
      event.recv @out.x bytes 32 meta 0
    }
  }
}

// CHECK:      segment.program @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
// CHECK-NEXT:   event.flow @r.up
// CHECK-NEXT:   event.flow @bc.down
// CHECK-NEXT:   event.flow @out.x
// CHECK-NEXT:   segment.core_class @edge wafer 0 cores <(0, 0, 1, 1)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, oq = 1, sram = 1024> routes [@r.up] {
// CHECK-NEXT:       event.sub @r "edge"
// CHECK-NEXT:         event.send @r.up bytes 64 meta 0
// CHECK-NEXT:       }
// CHECK-NEXT:     }
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.core_class @mid wafer 0 cores <(1, 0, 2, 1)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, iq = 1, oq = 1, sram = 1024> routes [@r.up] {
// CHECK:        segment.core_class @root wafer 0 cores <(3, 0, 1, 1)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, iq = 1, sram = 3072> routes [@r.up] {
// CHECK-NEXT:       event.sub @r "root" after [] demand <colors = 1, iq = 1, sram = 3072> collective {
// CHECK:          segment.reconfigure 0 to 1 release [@r.up] install [@bc.down, @out.x]
// CHECK-NEXT:     segment.segment 1 use <colors = 2, oq = 2, sram = 3072> routes [@bc.down, @out.x] {
// CHECK-NEXT:       event.sub @bc "src"
// CHECK:            event.sub @out "src"
// CHECK:          segment.marker_sync 1 to 2 over <(3, 0, 5, 1), (3, 1, 1, 3), (6, 1, 2, 3)>
// CHECK-NEXT:     segment.reconfigure 1 to 2 release [@bc.down, @out.x] install []
// CHECK-NEXT:     segment.segment 2 use <sram = 3000> routes [] {
// CHECK-NEXT:       event.sub @tail "local"
// CHECK:          segment.marker_sync 2 to 0 over <(0, 0, 4, 1)>
// CHECK-NEXT:     segment.reconfigure 2 to 0 release [] install [@r.up]
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.core_class @col wafer 0 cores <(3, 1, 1, 3)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, iq = 1, sram = 512> routes [@bc.down] {
// CHECK-NOT:    segment.reconfigure
// CHECK:        segment.core_class @sink wafer 0 cores <(6, 2, 2, 2)> {
// CHECK-NEXT:     segment.segment 0 use <colors = 1, iq = 1, sram = 512> routes [@out.x] {
// CHECK-NOT:    segment.reconfigure

// The checker accepts the coloured result. @bc.down and @out.x leave
// @root's router together in its segment 1 and need two colours; @r.up is
// released before them, so @bc.down reuses its colour 0.
// SAFE:      segment.marker_sync 1 to 2
// SAFE:      segment.route @r.up color 0 via <(0, 0, 4, 1)>
// SAFE-NEXT: segment.route @bc.down color 0 via <(3, 0, 1, 4)>
// SAFE-NEXT: segment.route @out.x color 1 via <(3, 0, 5, 1), (6, 1, 2, 3)>

// With 8 KiB but two colours @root cuts once, when @out would bind a third
// colour: after @bc, not a collective.
// ROOMY:      segment.core_class @root
// ROOMY-NEXT:   segment.segment 0 use <colors = 2, iq = 1, oq = 1, sram = 5120> routes [@r.up, @bc.down] {
// ROOMY:        segment.marker_sync 0 to 1 over <(0, 0, 8, 1), (3, 1, 1, 3), (6, 1, 2, 3)>
// ROOMY-NEXT:   segment.reconfigure 0 to 1 release [@r.up, @bc.down] install [@out.x]
// ROOMY-NEXT:   segment.segment 1 use <colors = 1, oq = 1, sram = 4024> routes [@out.x] {
// ROOMY:        segment.marker_sync 1 to 0
// ROOMY-NEXT:   segment.reconfigure 1 to 0 release [@out.x] install [@r.up, @bc.down]
