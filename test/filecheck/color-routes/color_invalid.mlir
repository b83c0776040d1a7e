// RUN: meshrt-opt %s -p 'color-routes{colors=1}' --split-input-file --verify-diagnostics | filecheck %s
// RUN: meshrt-opt %s -p 'color-routes{colors=1 split=false}' --split-input-file --verify-diagnostics | filecheck %s --check-prefix=NOSPLIT
// RUN: meshrt-opt %s -p 'color-routes{colors=0}' --split-input-file --verify-diagnostics | filecheck %s --check-prefix=ZERO

// One sub sends @a and @b over the same routers: they are live together in
// every segment, and no split can separate them.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, oq = 2, iq = 2> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 2> {
      event.sub @k1 "src" after [] demand <colors = 2, oq = 2> {
        event.send @a bytes 32 meta 0
        event.send @b bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 2, iq = 2> {
        event.recv @a bytes 32 meta 0
        event.recv @b bytes 32 meta 0
      }
    }
  }
}
// CHECK: color_invalid.mlir:9:3: error: 'event.flow' op cannot colour flow @b: flows @a, @b are live together at router (0, 0) of core class @p in its segment 0, but only 1 user colour exists; no split of that segment separates them
// ZERO: color_invalid.mlir:7:1: error: 'segment.program' op color-routes: colors=0 leaves no colour to route with

// -----

// @u and @v run in different kernels, and splitting @r4's and @r6's
// segments separates them there, but the idle router (5, 0) between them
// has no table to reconfigure it: it holds both routes all the time.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, oq = 2, iq = 2> colors 8 reserved [6, 7] {
  event.flow @u kernel @k1 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
  event.flow @v kernel @k2 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @r4 wafer 0 cores <(4, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 2> {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> collective {
        event.send @u bytes 32 meta 0
      }
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> collective {
        event.send @v bytes 32 meta 0
      }
    }
  }
  segment.core_class @r6 wafer 0 cores <(6, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @u bytes 32 meta 0
      }
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> collective {
        event.recv @v bytes 32 meta 0
      }
    }
  }
}
// CHECK: color_invalid.mlir:37:3: error: 'event.flow' op cannot colour flow @v: flows @u, @v are live together at idle router (5, 0) on wafer 0, but only 1 user colour exists; an idle router cannot be reconfigured

// -----

// color-routes takes segment IR.
event.schedule @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @u kernel @k1 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
}
// CHECK: color_invalid.mlir:64:1: error: 'event.schedule' op color-routes needs segment IR (a 'segment.program'), found event.schedule; run materialize-segments first

// -----

// Splittable: fine with splitting (the first RUN prints the split IR), an
// error naming both flows and the router without it.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, oq = 2, iq = 2> colors 8 reserved [6, 7] {
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
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
  }
}
// CHECK:   segment.route @a color 0 via <(0, 0, 3, 1)>
// CHECK:   segment.route @b color 0 via <(0, 0, 3, 1)>
// NOSPLIT: color_invalid.mlir:75:3: error: 'event.flow' op cannot colour flow @b: flows @a, @b are live together at router (0, 0) of core class @p in its segment 0, but only 1 user colour exists
