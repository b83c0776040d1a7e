// RUN: meshrt-opt %s -p check-segments --split-input-file | filecheck %s

// Sends and receives pair up the way the interpreter matches them; each of
// these programs balances and passes untouched.

// A gather: @q's one recv of @a takes one message from each of the two
// sender classes (an `all` flow from two cores).
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
  segment.route @a color 0 via <(0, 0, 3, 2)>
}
// CHECK: segment.program @gather

// -----

// A multicast to two receiver classes, one of which also sends: a core
// never sends to itself, so @p takes its own part in place and its recv of
// @a still pairs with its send; and a loop-carried flow @t, received before
// its send in the step, whose first messages the host primes.
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
// CHECK: segment.program @multicast
