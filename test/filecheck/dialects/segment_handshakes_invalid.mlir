// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s

// An await names a class that does not exist.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] await [@nobody::@a] {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: segment_handshakes_invalid.mlir:8:5: error: 'segment.segment' op segment 0 of @src awaits a credit from unknown core class @nobody

// -----

// An await names a flow that does not exist.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] await [@mid::@zz] {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.segment' op references unknown flow @zz

// -----

// An await for a flow the segment does not send.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] await [@mid::@b] {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.segment' op segment 0 of @src awaits credits for @b but sends no @b in this segment

// -----

// An await entry must be @class::@flow.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] await [@a] {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.segment' op segment 0 of @src: await entry @a must be @class::@flow

// -----

// Only segment 0 grants credits at program start.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a]  {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b] grant [@b] {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.segment' op segment 1 of @mid: only segment 0 may grant credits at program start

// -----

// A grant of a flow the segment does not hold.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a]  {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a] grant [@b] {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] 
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.segment' op segment 0 of @mid grants @b but does not hold its route

// -----

// notify names a flow the reconfigure does not install.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a]  {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] notify [@a]
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 1: notify @a but it does not install @a

// -----

// drain names a flow the reconfigure does not release.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a]  {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] drain [@b]
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 1: drain @b but it does not release @b

// -----

// drain names an unknown flow.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a]  {
      event.sub @k0 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a]  {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] drain [@zz]
    segment.segment 1 use <colors = 1> routes [@b]  {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a]
  }
}
// CHECK: error: 'segment.reconfigure' op references unknown flow @zz
