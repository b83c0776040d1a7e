// RUN: meshrt-opt %s -p check-segments --split-input-file --verify-diagnostics | filecheck %s

// Sends and receives must pair up class by class the way the interpreter
// matches them (see meshrt/analysis/balance.py); each case breaks one
// balanced program of balance.mlir (or a small shift) by one event.

// A duplicated send: @p sends @a twice per step, @q receives it once (the
// second message would be taken by the next step's receive).
segment.program @shift target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 2, 1)>
}
// CHECK: balance_invalid.mlir:15:9: error: 'event.send' op flow @a: class @p sends 2 per step, its receivers in class @q receive 1{{$}}

// -----

// A deleted receive: @q no longer receives its part of the multicast @a.
segment.program @multicast target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(0, 0, 3, 1)> pattern "row" bytes 32
  event.flow @t kernel @k1 role "input" operand 0 wafer 0 from <(2, 0, 1, 1)> to <(0, 0, 1, 1)> pattern "all" bytes 8
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 3, iq = 2, oq = 1> routes [@a, @t] {
      event.sub @k1 "embed" after [] demand <colors = 1, iq = 1> {
        event.recv @t bytes 8 meta 0
      }
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
      }
    }
  }
  segment.core_class @r wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 1, oq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k4 "sample" after [@k3] demand <colors = 1, oq = 1> {
        event.send @t bytes 8 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @t color 1 via <(0, 0, 3, 1)>
}
// CHECK: balance_invalid.mlir:42:9: error: 'event.send' op flow @a: class @p sends 1 per step, its receivers in class @q receive 0{{$}}

// -----

// A gather missing a sender: @p2's send is deleted, so @q's receive, which
// takes one message from each sender that targets it, waits forever.
segment.program @gather target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 2)> to <(2, 0, 1, 1)> pattern "all" bytes 32
  segment.core_class @p1 wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @p2 wafer 0 cores <(0, 1, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
      }
    }
  }
  segment.core_class @q wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 2)>
}
// CHECK: balance_invalid.mlir:92:9: error: 'event.recv' op flow @a: class @p2 sends 0 per step, its receivers in class @q receive 1{{$}}

// -----

// @p is sender and receiver of @a: it takes its own part in place, once per
// send; a second receive matches nothing.
segment.program @multicast target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(0, 0, 3, 1)> pattern "row" bytes 32
  event.flow @t kernel @k1 role "input" operand 0 wafer 0 from <(2, 0, 1, 1)> to <(0, 0, 1, 1)> pattern "all" bytes 8
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 3, iq = 2, oq = 1> routes [@a, @t] {
      event.sub @k1 "embed" after [] demand <colors = 1, iq = 1> {
        event.recv @t bytes 8 meta 0
      }
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 1, oq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k4 "sample" after [@k3] demand <colors = 1, oq = 1> {
        event.send @t bytes 8 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @t color 1 via <(0, 0, 3, 1)>
}
// CHECK: balance_invalid.mlir:117:9: error: 'event.recv' op flow @a: class @p sends 1 per step, its receivers in class @p receive 2{{$}}

// -----

// A loop-carried flow is balanced too: the host primes @p's first receive of
// @t, and from then on each receive takes what @r sent the step before.
segment.program @multicast target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k2 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(0, 0, 3, 1)> pattern "row" bytes 32
  event.flow @t kernel @k1 role "input" operand 0 wafer 0 from <(2, 0, 1, 1)> to <(0, 0, 1, 1)> pattern "all" bytes 8
  segment.core_class @p wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 3, iq = 2, oq = 1> routes [@a, @t] {
      event.sub @k1 "embed" after [] demand <colors = 1, iq = 1> {
        event.recv @t bytes 8 meta 0
        event.recv @t bytes 8 meta 0
      }
      event.sub @k2 "src" after [@k1] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 1, oq = 1> routes [@a, @t] {
      event.sub @k3 "dst" after [@k2] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
      event.sub @k4 "sample" after [@k3] demand <colors = 1, oq = 1> {
        event.send @t bytes 8 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @t color 1 via <(0, 0, 3, 1)>
}
// CHECK: balance_invalid.mlir:154:9: error: 'event.recv' op flow @t: class @r sends 1 per step, its receivers in class @p receive 2{{$}}

// -----

// A receive in a class that no sender of the flow targets.
segment.program @gather target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 2)> to <(2, 0, 1, 1)> pattern "all" bytes 32
  segment.core_class @p1 wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @p2 wafer 0 cores <(0, 1, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @s wafer 0 cores <(4, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 2)>
}
// CHECK: balance_invalid.mlir:215:9: error: 'event.recv' op flow @a: class @s receives 1 per step, but no sender of the flow targets its cores{{$}}

// -----

// A send in a class none of whose cores is a sender of the flow.
segment.program @gather target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, iq = 2, oq = 2, routes = 4, switches = 2, sram = 4096, ctrl = 128> colors 8 reserved [6, 7] {
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 2)> to <(2, 0, 1, 1)> pattern "all" bytes 32
  segment.core_class @p1 wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @p2 wafer 0 cores <(0, 1, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@a] {
      event.sub @k1 "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @s wafer 0 cores <(4, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [] {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 3, 2)>
}
// CHECK: balance_invalid.mlir:252:9: error: 'event.send' op flow @a: class @s sends 1 per step, but none of its cores is a sender of the flow (senders <(0, 0, 1, 2)> on wafer 0){{$}}
