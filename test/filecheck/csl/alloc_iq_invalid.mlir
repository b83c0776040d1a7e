// RUN: not meshrt-opt %s -t csl 2>&1 | filecheck %s
// RUN: not meshrt-opt %s -t 'csl{arch=wse2}' 2>&1 | filecheck %s --check-prefix=WSE2

// Over-allocation is a compile error naming the class, the resource, the
// demand and the capacity, never a silent overflow: @r receives four flows in
// one segment (its recorded `use` understates it), on four colours, and
// test32 has three user input queues (queue 0 is memcpy's).

segment.program @m target "test32" mesh 8 x 4 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 6, iq = 3, oq = 3, routes = 8, switches = 4, sram = 8960, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(1, 0, 1, 1)> pattern "shift" by 1, 0 bytes 16
  event.flow @b kernel @k role "input" operand 0 wafer 0 from <(0, 1, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  event.flow @c kernel @k role "input" operand 0 wafer 0 from <(0, 2, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  event.flow @d kernel @k role "input" operand 0 wafer 0 from <(0, 3, 1, 1)> to <(1, 0, 1, 1)> pattern "all" bytes 16
  segment.core_class @s wafer 0 cores <(0, 0, 1, 4)> {
    segment.segment 0 use <colors = 1, oq = 1> routes [@a, @b, @c, @d] {
      event.sub @k "src" after [] demand <colors = 1, oq = 1> {
        event.send @a bytes 16 meta 0
      }
    }
  }
  // CHECK: alloc_iq_invalid.mlir:[[# @LINE + 1]]:3: error: 'segment.core_class' op core class @r needs 4 input queues at once but wse3 on target test32 has 3 (segment 0 uses colours 0, 1, 2, 3; user input queues are 2, 3, 4)
  segment.core_class @r wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 4, iq = 1> routes [@a, @b, @c, @d] {
      event.sub @k "dst" after [] demand <colors = 4, iq = 1> {
        event.recv @a bytes 16 meta 0
        event.recv @b bytes 16 meta 0
        event.recv @c bytes 16 meta 0
        event.recv @d bytes 16 meta 0
      }
    }
  }
  segment.route @a color 0 via <(0, 0, 2, 1)>
  segment.route @b color 1 via <(0, 0, 2, 2)>
  segment.route @c color 2 via <(0, 0, 2, 3)>
  segment.route @d color 3 via <(0, 0, 2, 4)>
}
// WSE2: error: 'segment.core_class' op core class @r needs 4 input queues at once but wse2 on target test32 has 3
