// RUN: meshrt-opt %s -p color-routes,check-segments | filecheck %s

// Hand-written segment IR on an 8 x 2 mesh (two wafers; wafer 1 only receives @w).
// @p sends @x and @z to @q in kernel @k1 (segment 0 of both) and @y in
// kernel @k2 (their segment 1); all three take the routers (0..2, 0).
// @r4 sends @u (in @k1) and @v (in @k2) to @r6 across the idle router
// (5, 0), which belongs to no class. @w goes over the wafer link.
//  - @x and @z are live together: two colours;
//  - @y is live only after the reconfiguration that releases @x and @z at
//    every router it crosses: it reuses colour 0;
//  - @u and @v are never live at the same time in @r4 or @r6, but the idle
//    router (5, 0) cannot be reconfigured, so they need different colours;
//  - @w has no on-mesh route and gets none.
segment.program @m target "test32" mesh 8 x 2 wafers 2 stages 2 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @x kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @z kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @y kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @u kernel @k1 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
  event.flow @v kernel @k2 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
  event.flow @w kernel @k3 role "input" operand 0 wafer 0 from <(0, 1, 1, 1)> to <(7, 1, 1, 1)> cross_wafer pattern "all" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 2> {
      event.sub @k1 "src" after [] demand <colors = 2, oq = 2> {
        event.send @x bytes 32 meta 0
        event.send @z bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@x, @z] install [@y]
    segment.segment 1 use <colors = 1, oq = 1> {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @y bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@y] install [@x, @z]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 2, iq = 2> {
        event.recv @x bytes 32 meta 0
        event.recv @z bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@x, @z] install [@y]
    segment.segment 1 use <colors = 1, iq = 1> {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @y bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@y] install [@x, @z]
  }
  segment.core_class @r4 wafer 0 cores <(4, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @u bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(4, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@u] install [@v]
    segment.segment 1 use <colors = 1, oq = 1> {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @v bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(4, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@v] install [@u]
  }
  segment.core_class @r6 wafer 0 cores <(6, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @u bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(4, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@u] install [@v]
    segment.segment 1 use <colors = 1, iq = 1> {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @v bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(4, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@v] install [@u]
  }
  segment.core_class @far wafer 0 cores <(0, 1, 1, 1)> {
    segment.segment 0 use <oq = 1> {
      event.sub @k3 "src" after [@k2] demand <oq = 1> {
        event.send @w bytes 32 meta 0
      }
    }
  }
  segment.core_class @sink wafer 1 cores <(7, 1, 1, 1)> {
    segment.segment 0 use <iq = 1> {
      event.sub @k3 "dst" after [@k2] demand <iq = 1> {
        event.recv @w bytes 32 meta 0
      }
    }
  }
}

// CHECK:      segment.core_class @far
// CHECK:      segment.core_class @sink
// CHECK:      segment.route @x color 0 via <(0, 0, 3, 1)>
// CHECK-NEXT: segment.route @z color 1 via <(0, 0, 3, 1)>
// CHECK-NEXT: segment.route @y color 0 via <(0, 0, 3, 1)>
// CHECK-NEXT: segment.route @u color 0 via <(4, 0, 3, 1)>
// CHECK-NEXT: segment.route @v color 1 via <(4, 0, 3, 1)>
// CHECK-NEXT: }
// CHECK-NOT:  segment.route
