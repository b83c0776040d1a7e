// RUN: rm -rf %t && mkdir -p %t
// RUN: sed -e 's/^switch_colors = .*/switch_colors = [1, 2]/' %targets/test32.toml > %t/narrow.toml
// RUN: sed -e 's/^switch_colors = .*/switch_colors = [1]/' %targets/test32.toml > %t/one.toml
// RUN: meshrt-opt %s -p color-routes,check-segments --split-input-file | filecheck %s --check-prefix=ALL
// RUN: meshrt-opt %s -p 'color-routes{target="%t/narrow.toml"}',check-segments --split-input-file | filecheck %s --check-prefix=NARROW
// RUN: meshrt-opt %s -p 'color-routes{target="%t/one.toml" split=false}' --split-input-file --verify-diagnostics | filecheck %s --check-prefix=ONE

// @c gathers from two senders of one row, so its transport chains them
// through router switches (streams.switch_chained); @a has one sender. Both
// cross the routers (2, 0) and (3, 0) at once. On test32 every colour has
// switch positions and @c, first in order, takes colour 0; on a target with
// switches on colours 1 and 2 only, @c must take one of those and @a keeps 0.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, oq = 2, iq = 2> colors 8 reserved [6, 7] {
  event.flow @c kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(3, 0, 1, 1)> pattern "row" bytes 32
  event.flow @a kernel @k1 role "input" operand 0 wafer 0 from <(2, 0, 1, 1)> to <(3, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> {
      event.sub @k1 "src" after [] demand <colors = 1, oq = 1> {
        event.send @c bytes 32 meta 0
      }
    }
  }
  segment.core_class @s wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 1> {
      event.sub @k1 "src" after [] demand <colors = 2, oq = 1> {
        event.send @a bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(3, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 2, iq = 2> {
        event.recv @c bytes 32 meta 0
        event.recv @a bytes 32 meta 0
      }
    }
  }
}
// ALL: segment.route @c color 0 via <(0, 0, 4, 1)>
// ALL: segment.route @a color 1 via <(2, 0, 2, 1)>
// NARROW: segment.route @c color 1 via <(0, 0, 4, 1)>
// NARROW: segment.route @a color 0 via <(2, 0, 2, 1)>
// ONE: segment.route @c color 1
// ONE: segment.route @a color 0

// -----

// Two gathers of two senders each, live together: with switches on one
// colour only, no colouring exists, and the error says why.
segment.program @m target "test32" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 3, oq = 2, iq = 2> colors 8 reserved [6, 7] {
  event.flow @c kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(3, 0, 1, 1)> pattern "row" bytes 32
  event.flow @d kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(3, 0, 1, 1)> pattern "row" bytes 32
  segment.core_class @p wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <colors = 2, oq = 2> {
      event.sub @k1 "src" after [] demand <colors = 2, oq = 2> {
        event.send @c bytes 32 meta 0
        event.send @d bytes 32 meta 0
      }
    }
  }
  segment.core_class @q wafer 0 cores <(3, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, iq = 2> {
      event.sub @k1 "dst" after [] demand <colors = 2, iq = 2> {
        event.recv @c bytes 32 meta 0
        event.recv @d bytes 32 meta 0
      }
    }
  }
}
// ALL: segment.route @c color 0
// ALL: segment.route @d color 1
// NARROW: segment.route @c color 1
// NARROW: segment.route @d color 2
// ONE: switch_colors.mlir:[[# @LINE - 22]]:3: error: 'event.flow' op cannot colour flow @d: switch-chained flows @c, @d are live together at router (0, 0) of core class @p in its segment 0, but only 1 of the 6 user colours has switch positions{{$}}
