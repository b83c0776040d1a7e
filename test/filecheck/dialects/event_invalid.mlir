// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    event.sub @k "r" after [] demand <> {
      event.recv @nowhere bytes 8 meta 0
    }
  }
}
// CHECK: event_invalid.mlir:6:7: error: 'event.recv' op references unknown flow @nowhere

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(2, 0, 2, 1)> pattern "shift" by 1, 0 bytes 8
}
// CHECK: error: 'event.flow' op flow @f: receivers (2, 0, 2, 1) are not the senders (0, 0, 2, 1) shifted by (1, 0)

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(2, 0, 2, 1)> pattern "teleport" bytes 8
}
// CHECK: error: 'event.flow' op flow @f: unknown pattern 'teleport', expected one of shift, row, col, all

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 15, 2, 2)> pattern "col" bytes 8
}
// CHECK: error: 'event.flow' op flow @f: receivers (0, 15, 2, 2) lie outside the 16 x 16 mesh

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 0
}
// CHECK: error: 'event.flow' op flow @f: bytes must be > 0, got 0

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c wafer 0 cores <(0, 0, 20, 1)> {
  }
}
// CHECK: error: 'event.core_class' op core class @c: cores (0, 0, 20, 1) lie outside the 16 x 16 mesh

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
  event.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    event.sub @k "r" after [@k] demand <> {
      event.send @f bytes 8 meta 0
    }
  }
}
// CHECK: error: 'event.sub' op sub-schedule @k is guarded by itself

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
  event.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    event.sub @k "r" after [] demand <> {
      event.meta_resolve "weather" from @f bytes 8
    }
  }
}
// CHECK: error: 'event.meta_resolve' op event.meta_resolve on @f: unknown dynamism kind 'weather'

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    event.sub @k "r" after [] demand <colors = -1> {
    }
  }
}
// CHECK: error: resource colors is negative

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    event.sub @k "r" after [] demand <colours = 1> {
    }
  }
}
// CHECK: error: unknown resource 'colours', expected one of colors, iq, oq, routes, switches, sram, ctrl

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.kernel @k "conv2d" on <(0, 0, 2, 1)> inputs [] params {}
}
// CHECK: error: 'event.kernel' op kernel @k: unknown kernel kind "conv2d", expected one of allreduce, attention, combine, deltanet, dispatch, elementwise, embed, expert_ffn, expert_reduce, gemv, handoff, sample, topk_gate

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.kernel @k "gemv" on <(15, 0, 2, 1)> inputs [] params {}
}
// CHECK: error: 'event.kernel' op kernel @k region (15, 0, 2, 1) lie outside the 16 x 16 mesh

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @k.side kernel @k role "sideways" wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
}
// CHECK: error: 'event.flow' op flow @k.side: unknown role 'sideways', expected one of down, up, hop, input, tokens

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @k.in0 kernel @k role "input" wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
}
// CHECK: error: 'event.flow' op flow @k.in0: an operand index goes with role "input", and only with it

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @k.down kernel @k role "down" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
}
// CHECK: error: 'event.flow' op flow @k.down: an operand index goes with role "input", and only with it

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "down" wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 2)> pattern "all" bytes 8 streams
}
// CHECK: error: 'event.flow' op flow @f: only shift, row and col flows on one wafer stream (pattern 'all')

// -----

// Only a row or all gather from expert regions carries data conditionally (routed).
event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "shift" by 0, 1 bytes 8 routed
}
// CHECK: error: 'event.flow' op flow @f: only row and all flows that do not stream are routed (pattern 'shift')

// -----

event.schedule @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 2)> to <(1, 0, 1, 2)> pattern "row" bytes 8 streams routed
}
// CHECK: error: 'event.flow' op flow @f: only row and all flows that do not stream are routed (pattern 'row', streaming)
