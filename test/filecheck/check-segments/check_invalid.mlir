// RUN: meshrt-opt %s -p check-segments --split-input-file --verify-diagnostics | filecheck %s

// Each case breaks one property of a correct segment program (the result of
// color-routes{colors=1} in ../color-routes/color_split.mlir).

// @q holds @a and @b in one segment, and both are on colour 0.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> routes [@a, @b] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:37:3: error: 'segment.route' op flows @a and @b are both live on colour 0 at router (1, 0) of core class @q in segment 0

// -----

// @q shrinks to (2, 0): router (1, 0) is idle and holds @a and @b
// all the time, so they cannot share colour 0.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:81:3: error: 'segment.route' op flows @a and @b are both live on colour 0 at idle router (1, 0)

// -----

// @p's boundary 0 to 1 follows @k1, not a collective, but has no marker sync.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:98:5: error: 'segment.reconfigure' op boundary 0 to 1 of core class @p does not end on a collective but has no marker sync

// -----

// The marker sync misses router (2, 0), which the reconfiguration touches.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 2, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:140:5: error: 'segment.marker_sync' op marker sync 0 to 1 of core class @p over <(0, 0, 2, 1)> misses <(2, 0, 1, 1)> of the routers its reconfiguration touches

// -----

// The recorded use of @p's segment 0 hides its output queue.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:178:5: error: 'segment.segment' op segment 0 of core class @p records use <colors = 1> below what its subs bind (<colors = 1, oq = 1>)

// -----

// The program's budget claims more SRAM than a test32 core has.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 99999, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1, sram = 50000> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1, sram = 50000> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:217:1: error: 'segment.program' op the IR is compiled for 99999 SRAM bytes per core (the program's budget), but target 'test32' has 8960

// -----

// @b is live but has no route.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:262:3: error: 'event.flow' op flow @b is live but has no segment.route

// -----

// @b's route stops short of its receiver's router.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 1 via <(0, 0, 2, 1)>
}

// CHECK: check_invalid.mlir:337:3: error: 'segment.route' op route of @b via <(0, 0, 2, 1)> misses routers of its XY route <(0, 0, 3, 1)>

// -----

// @p's table does not loop back from segment 1 to segment 0.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:348:3: error: 'segment.core_class' op core class @p has no boundary 1 to 0

// -----

// @p's reconfiguration keeps @a installed.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:396:5: error: 'segment.reconfigure' op reconfigure 0 to 1 of core class @p must release [@a] and install [@b]

// -----

// @p's segment 1 claims to hold @a, which is not live there.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  event.flow @b kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
    segment.marker_sync 0 to 1 over <(0, 0, 3, 1)>
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, oq = 1> routes [@a, @b] {
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.core_class @q wafer 0 cores <(1, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> collective {
        event.recv @a bytes 32 meta 0
      }
    }
    segment.reconfigure 0 to 1 release [@a] install [@b]
    segment.segment 1 use <colors = 1, iq = 1> routes [@b] {
      event.sub @k2 "dst" after [@k1] demand <colors = 1, iq = 1> {
        event.recv @b bytes 32 meta 0
      }
    }
    segment.marker_sync 1 to 0 over <(0, 0, 3, 1)>
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK: check_invalid.mlir:440:5: error: 'segment.segment' op segment 1 of core class @p lists routes [@a, @b] but the flows live at its routers are [@b]

// -----

// check-segments takes segment IR.
event.schedule @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @u kernel @k1 role "input" operand 0 wafer 0 from <(4, 0, 1, 1)> to <(6, 0, 1, 1)> pattern "row" bytes 32
}
// CHECK: check_invalid.mlir:472:1: error: 'event.schedule' op check-segments needs segment IR (a 'segment.program'), found event.schedule; run materialize-segments,color-routes first
