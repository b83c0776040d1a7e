// RUN: meshrt-opt %s | filecheck %s
// RUN: meshrt-opt %s --print-op-generic | meshrt-opt | filecheck %s

// The optional route handshakes: await [@class::@flow] and grant on a
// segment, notify / drain on a reconfigure. They print back as written.
segment.program @m target "t" mesh 16 x 16 wafers 1 stages 1 micro_batch 1 dynamism [] hparams {} budget <colors = 4, iq = 2, oq = 2, routes = 8, switches = 4, sram = 4096, ctrl = 256> colors 8 reserved [6, 7] {
  event.flow @a kernel @k0 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  event.flow @b kernel @k1 role "input" operand 0 wafer 0 from <(0, 0, 1, 1)> to <(2, 0, 1, 1)> pattern "shift" by 2, 0 bytes 32
  segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
    segment.segment 0 use <colors = 2, oq = 1> routes [@a, @b] await [@mid::@a, @mid::@b] {
      event.sub @k0 "src" after [] demand <colors = 2, oq = 1> {
        event.send @a bytes 32 meta 0
        event.send @b bytes 32 meta 0
      }
    }
  }
  segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
    segment.segment 0 use <colors = 1> routes [@a] grant [@a] {
    }
    segment.reconfigure 0 to 1 release [@a] install [@b] notify [@b] drain [@a]
    segment.segment 1 use <colors = 1> routes [@b] {
    }
    segment.reconfigure 1 to 0 release [@b] install [@a] notify [@a] drain [@b]
  }
  segment.route @a color 0 via <(0, 0, 3, 1)>
  segment.route @b color 0 via <(0, 0, 3, 1)>
}

// CHECK:      segment.core_class @src wafer 0 cores <(0, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 2, oq = 1> routes [@a, @b] await [@mid::@a, @mid::@b] {
// CHECK:      segment.core_class @mid wafer 0 cores <(1, 0, 1, 1)> {
// CHECK-NEXT:   segment.segment 0 use <colors = 1> routes [@a] grant [@a] {
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.reconfigure 0 to 1 release [@a] install [@b] notify [@b] drain [@a]
// CHECK-NEXT:   segment.segment 1 use <colors = 1> routes [@b] {
// CHECK-NEXT:   }
// CHECK-NEXT:   segment.reconfigure 1 to 0 release [@b] install [@a] notify [@a] drain [@b]
