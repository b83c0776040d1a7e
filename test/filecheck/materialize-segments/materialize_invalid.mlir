// RUN: meshrt-opt %s -p 'materialize-segments{colors=3 iq=2 oq=2 routes=4 switches=2 sram=4096 ctrl=128}' --split-input-file --verify-diagnostics | filecheck %s
// RUN: meshrt-opt %s -p 'materialize-segments{sram=99999999}' --split-input-file --verify-diagnostics | filecheck %s --check-prefix=OVERRIDE

// A sub-schedule that alone needs more SRAM than a core has.
event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c12 wafer 0 cores <(0, 0, 2, 2)> {
    event.sub @l0.norm "tile" after [] demand <sram = 1024> {
      event.compute "rsqrt" work 8
    }
    event.sub @l0.qkv "tile" after [@l0.norm] demand <sram = 9000> {
      event.compute "fmac" work 64
    }
  }
}
// CHECK: materialize_invalid.mlir:10:5: error: 'event.sub' op sub-schedule of kernel @l0.qkv role "tile" in core class @c12 needs 9000 SRAM bytes, capacity 4096
// OVERRIDE: materialize_invalid.mlir:5:1: error: 'event.schedule' op materialize-segments: sram=99999999 exceeds the {{[0-9]+}} SRAM bytes target test32 has per core; overrides may only tighten the budget

// -----

// Too many colours for one sub (the budget is 3 here).
event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @hub wafer 0 cores <(0, 0, 1, 1)> {
    event.sub @mix "relay" after [] demand <colors = 4, iq = 1> {
      event.compute "add" work 8
    }
  }
}
// CHECK: materialize_invalid.mlir:23:5: error: 'event.sub' op sub-schedule of kernel @mix role "relay" in core class @hub needs 4 colours, capacity 3

// -----

// Input queues, named as such.
event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @mid wafer 0 cores <(1, 0, 2, 1)> {
    event.sub @r "mid" after [] demand <colors = 2, iq = 3> collective {
      event.compute "add" work 8
    }
  }
}
// CHECK: materialize_invalid.mlir:35:5: error: 'event.sub' op sub-schedule of kernel @r role "mid" in core class @mid needs 3 input queues, capacity 2

// -----

// The program's target must exist.
event.schedule @m target "nosuch" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
}
// CHECK: materialize_invalid.mlir:45:1: error: 'event.schedule' op unknown target 'nosuch': expected one of {{.*}} or the path of a target .toml file

// -----

// Two tables that run the same two kernels in opposite orders have no
// common step order.
event.schedule @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    event.sub @k1 "x" after [] demand <sram = 16> {
    }
    event.sub @k2 "x" after [] demand <sram = 16> {
    }
  }
  event.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    event.sub @k2 "y" after [] demand <sram = 16> {
    }
    event.sub @k1 "y" after [] demand <sram = 16> {
    }
  }
}
// CHECK: materialize_invalid.mlir:58:5: error: 'event.sub' op core class tables and guards order kernels in a cycle: @k1 -> @k2 -> @k1; every table must follow one step order

// -----

// A boundary whose released routes cover the whole (4 x 1) mesh would need
// a chip-wide marker sync.
event.schedule @m target "test32" mesh 4 x 1 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @wide kernel @a role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 3, 1)> pattern "row" bytes 8
  event.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    event.sub @a "src" after [] demand <oq = 1, sram = 4000> {
      event.send @wide bytes 8 meta 0
    }
    event.sub @b "local" after [@a] demand <sram = 4000> {
    }
  }
}
// CHECK: materialize_invalid.mlir:77:5: error: 'event.sub' op core class @src: the marker sync for boundary 0 to 1 would span the whole 4 x 1 mesh (the released and installed routes cover it)

// -----

// materialize-segments takes event IR, not segment IR.
segment.program @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2> colors 8 reserved [6, 7] {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
}
// CHECK: materialize_invalid.mlir:89:1: error: 'segment.program' op materialize-segments needs event IR (an 'event.schedule'), found segment.program{{$}}
