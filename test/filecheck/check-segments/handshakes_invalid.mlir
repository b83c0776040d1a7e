// RUN: meshrt-opt %s -p 'check-segments' --split-input-file --verify-diagnostics | filecheck %s
// RUN: meshrt-opt %s -p 'check-segments{handshakes=false}' --split-input-file | filecheck %s --check-prefix=OFF

// The route handshakes of insert-route-handshakes, each broken in turn (the
// correct program is ../color-routes/handshakes.mlir). A program that states
// handshakes must state all of them; handshakes=false skips this part.

// @b installs @g at 0 to 1 without notifying it.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g] drain [@f, @h]
    segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 1 of core class @b installs @g but does not notify its senders (no install credit before their first send)

// -----

// @b releases the pass-through flow @f without draining it.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@h]
    segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}
// CHECK: error: 'segment.reconfigure' op reconfigure 0 to 1 of core class @b releases @f but does not drain it (its traffic may still be passing)

// -----

// @a sends @f without awaiting @b's install credit.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@h] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@f, @h]
    segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}
// CHECK: error: 'segment.segment' op segment 0 of core class @a sends @f without awaiting the install credit of @b (missing await @b::@f)

// -----

// @b does not grant @f at program start, so @a's first step would wait forever.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] grant [@h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@f, @h]
    segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}
// CHECK: error: 'segment.segment' op segment 0 of core class @b grants [@h] at program start but holds [@f, @h] for the first step's traffic

// -----

// @a awaits a credit of @f from @c, which holds @f all step and never sends one.
segment.program @race target "test32" mesh 32 x 32 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @f kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 4096
  event.flow @h kernel @ka role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 8
  event.flow @g kernel @kb role "input" operand 0 wafer 0 from <(1, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 1, 0 bytes 64
  segment.core_class @a wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] await [@b::@f, @b::@h, @c::@f] {
      event.sub @ka "src" after [] demand <colors = 2> {
        event.send @h bytes 8 meta 0
        event.send @f bytes 4096 meta 0
      }
    }
  }
  segment.core_class @b wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @h] grant [@f, @h] {
      event.sub @ka "pass" after [] demand <colors = 2> collective {
        event.recv @h bytes 8 meta 0
        event.compute "add" work 100
      }
    }
    segment.reconfigure 0 to 1 release [@f, @h] install [@g] notify [@g] drain [@f, @h]
    segment.segment 1 use <colors = 1> routes [@g] await [@b::@g] {
      event.sub @kb "src" after [@ka] demand <colors = 1> collective {
        event.send @g bytes 64 meta 0
      }
    }
    segment.reconfigure 1 to 0 release [@g] install [@f, @h] notify [@f, @h] drain [@g]
  }
  segment.core_class @c wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2> routes [@f, @g] {
      event.sub @ka "dst" after [] demand <colors = 1> {
        event.recv @f bytes 4096 meta 0
      }
      event.sub @kb "dst" after [@ka] demand <colors = 1> {
        event.recv @g bytes 64 meta 0
      }
    }
  }
  segment.route @f color 0 via <(0, 0, 3, 1)>
  segment.route @h color 1 via <(0, 0, 2, 1)>
  segment.route @g color 2 via <(1, 0, 2, 1)>
}
// CHECK: error: 'segment.segment' op segment 0 of core class @a awaits a credit of @f that @c never sends

// OFF-COUNT-5: segment.program @race
