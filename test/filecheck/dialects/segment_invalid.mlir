// RUN: meshrt-opt %s --split-input-file --verify-diagnostics | filecheck %s

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <colors = 3> {
    }
  }
}
// CHECK: segment_invalid.mlir:5:5: error: 'segment.segment' op segment 0 of core class @c uses 3 colours but the budget is 2

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> budget <colors = 4> {
    segment.segment 0 use <colors = 3, iq = 2> {
    }
  }
}
// CHECK: error: 'segment.segment' op segment 0 of core class @c uses 2 input queues but the budget is 0

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.segment 1 use <> {
    }
  }
}
// CHECK: error: 'segment.core_class' op core class @c: segment 1 is not preceded by 'segment.reconfigure 0 to 1'

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.reconfigure 0 to 1 release [] install []
    segment.marker_sync 0 to 1 over <(0, 0, 2, 1)>
    segment.segment 1 use <> {
    }
  }
}
// CHECK: error: 'segment.core_class' op core class @c: marker sync 0 to 1 must come right after segment 0 and before its reconfigure

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.reconfigure 0 to 2 release [] install []
  }
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 2 must go to the next segment

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.marker_sync 0 to 1 over <(0, 0, 16, 16)>
    segment.reconfigure 0 to 1 release [] install []
    segment.segment 1 use <> {
    }
  }
}
// CHECK: error: 'segment.marker_sync' op marker sync spans the whole chip; it must stay within the affected region

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
  segment.route @f color 6 via <(0, 0, 2, 2)>
}
// CHECK: error: 'segment.route' op route of @f uses reserved colour 6

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
  segment.route @f color 9 via <(0, 0, 2, 2)>
}
// CHECK: error: 'segment.route' op route of @f uses colour 9, outside 0..7

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.route @g color 1 via <(0, 0, 2, 2)>
}
// CHECK: error: 'segment.route' op references unknown flow @g

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
  }
}
// CHECK: error: 'segment.core_class' op core class @c has no segment

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2> colors 8 reserved [9] {
  event.flow @f kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(0, 1, 2, 1)> pattern "col" bytes 8
}
// CHECK: error: 'segment.program' op program @m: reserved colours [9] are outside 0..7

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.reconfigure 0 to 1 release [] install []
    segment.segment 1 use <> {
    }
    segment.reconfigure 1 to 0 release [] install []
    segment.segment 2 use <> {
    }
  }
}
// CHECK: error: 'segment.core_class' op core class @c: 'segment.segment' after the closing reconfigure back to segment 0

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> {
    }
    segment.reconfigure 0 to 0 release [] install []
  }
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 0 must go to the next segment or, closing the table, back to segment 0

// -----

segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 2, iq = 1, oq = 1> colors 8 reserved [6, 7] {
  segment.core_class @c wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <> routes [@nope] {
    }
  }
}
// CHECK: error: 'segment.segment' op references unknown flow @nope
