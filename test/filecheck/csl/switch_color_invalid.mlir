// RUN: not meshrt-opt %s -t csl 2>&1 | filecheck %s
// RUN: sed -e 's/target "wse3"/target "wse2"/' %s | meshrt-opt -t 'csl{arch=wse2}' | filecheck %s --check-prefix=WSE2

// A switch chain needs switch positions on its colour; WSE-3 has them on
// colours 0-9, 12, 13, 16, 17, 20, 21 only (the target's `switch_colors`),
// so a gather on colour 10 is a located error there (color-routes would not
// choose it). WSE-2 has them on every colour.

segment.program @m target "wse3" mesh 8 x 2 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 21, iq = 4, oq = 4, routes = 24, switches = 4, sram = 23552, ctrl = 1024> colors 24 reserved [21, 22, 23] {
  event.flow @g kernel @k role "input" operand 0 wafer 0 from <(0, 0, 2, 1)> to <(2, 0, 1, 1)> pattern "all" bytes 16
  // CHECK: switch_color_invalid.mlir:[[# @LINE + 1]]:3: error: 'segment.core_class' op core class @s: flow @g is switch-chained (several senders) on colour 10, which has no switch positions on target wse3 (switch-capable: 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 13, 16, 17, 20, 21)
  segment.core_class @s wafer 0 cores <(0, 0, 2, 1)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@g] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @g bytes 16 meta 0
      }
    }
  }
  segment.core_class @r wafer 0 cores <(2, 0, 1, 1)> {
    segment.segment 0 use <colors = 1, iq = 1> routes [@g] {
      event.sub @k "dst" after [] demand <colors = 1, iq = 1> {
        event.recv @g bytes 16 meta 0
      }
    }
  }
  segment.route @g color 10 via <(0, 0, 3, 1)>
}
// WSE2: @set_color_config(0, 0, @get_color(10), .{ .routes = .{ .rx = .{ RAMP }, .tx = .{ EAST } }, .switches = chain_switches });
